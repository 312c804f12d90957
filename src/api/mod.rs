//! The gRPC face of the advisor: `coloc.v1.ColocationAdvisor`, and `coloc.v1.ProfilingAgents`
//! for profiling agents (`agents.rs`). Handlers convert the request
//! into domain types, call the advisor, and convert the answer back; nothing else.

mod agents;
mod auth;
mod cluster;
pub mod convert;
mod policy;
mod sharing;

pub use sharing::sharing_mode_to_pb;
mod middleware;
mod status;
mod undo;

use std::sync::Arc;

use tonic::{Request, Response, Status};

/// Versions GetModel shows as history.
const HISTORY_LENGTH: u32 = 10;
/// GetModelReport: runs when the request names no limit, and the most it returns (about
/// 50 bytes a run: well inside a 4 MiB message).
const REPORT_RUNS_DEFAULT: u32 = 10_000;
const REPORT_RUNS_MAX: u32 = 50_000;

use crate::{
    advisor::{Advisor, ReportOutcome, Trigger},
    domain::{now_ms, GpuName, SharingMode},
    proto::{self as pb, colocation_advisor_server::ColocationAdvisor},
};

pub use agents::{AgentsService, ProfilingAgentsServer};
pub use auth::AuthLayer;
pub use convert::timestamp;
pub use middleware::{HeavyLimitLayer, RpcLayer};
pub use pb::colocation_advisor_server::ColocationAdvisorServer;

/// The advisor's RPCs. How many heavy ones (Rank, Predict, Place) run at once is bounded
/// before they are read, by [`HeavyLimitLayer`].
pub struct AdvisorService {
    advisor: Arc<Advisor>,
}

impl AdvisorService {
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self { advisor }
    }

    /// What GetModel and friends report alongside a model.
    async fn context(&self, gpu: &GpuName) -> Result<convert::ModelContext, Status> {
        Ok(convert::ModelContext {
            serving_version: self.advisor.current_model(gpu).ok().map(|m| m.version),
            pinned_version: self.advisor.pinned_version(gpu).await?,
            rolling_error: self.advisor.rolling_error(gpu),
        })
    }

    /// The GPU model named by a request field, else the server's default.
    fn gpu(&self, raw: &str) -> Result<GpuName, Status> {
        let requested = convert::optional_gpu("gpu", raw)?;
        Ok(self.advisor.resolve_gpu(requested)?)
    }
}

#[tonic::async_trait]
impl ColocationAdvisor for AdvisorService {
    async fn register_workload(
        &self,
        request: Request<pb::RegisterWorkloadRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let workload = convert::new_workload(request.into_inner(), now_ms())?;
        let record = self.advisor.register(workload).await?;
        Ok(Response::new(convert::workload_to_pb(record)))
    }

    async fn get_workload(
        &self,
        request: Request<pb::GetWorkloadRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let name = convert::workload_name("name", &request.into_inner().name)?;
        let record = self.advisor.get(&name).await?;
        let mut workload = convert::workload_to_pb(record);
        workload.suspect_profiles = self
            .advisor
            .suspect_profiles_of(&name)
            .into_iter()
            .map(|(gpu, s)| pb::SuspectProfile {
                gpu: gpu.to_string(),
                profile_exclusive_throughput: s.profile_exclusive,
                corrected_exclusive_throughput: s.corrected_exclusive,
                runs_above: s.runs_above as u64,
                runs: s.runs as u64,
            })
            .collect();
        Ok(Response::new(workload))
    }

    async fn list_workloads(
        &self,
        request: Request<pb::ListWorkloadsRequest>,
    ) -> Result<Response<pb::ListWorkloadsResponse>, Status> {
        let request = request.into_inner();
        let state = convert::state_filter(request.state)?;
        let (page, next_page_token) = self
            .advisor
            .list(request.page_size, &request.page_token, state)
            .await?;
        Ok(Response::new(pb::ListWorkloadsResponse {
            workloads: page.into_iter().map(convert::workload_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn delete_workload(
        &self,
        request: Request<pb::DeleteWorkloadRequest>,
    ) -> Result<Response<pb::DeleteWorkloadResponse>, Status> {
        let name = convert::workload_name("name", &request.into_inner().name)?;
        self.advisor.delete(&name).await?;
        Ok(Response::new(pb::DeleteWorkloadResponse {}))
    }

    async fn put_profile(
        &self,
        request: Request<pb::PutProfileRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let request = request.into_inner();
        let name = convert::workload_name("name", &request.name)?;
        let profile = convert::profile(request.profile, now_ms())?;
        let record = self.advisor.put_profile(&name, profile).await?;
        Ok(Response::new(convert::workload_to_pb(record)))
    }

    async fn rank(
        &self,
        request: Request<pb::RankRequest>,
    ) -> Result<Response<pb::RankResponse>, Status> {
        let request = request.into_inner();
        let mode = sharing::sharing_mode(request.sharing_mode)?;
        let query = convert::rank_query(request, &self.advisor.policy())?;
        let result = self.advisor.rank(query).await?;
        let evidence = self.advisor.mode_evidence(&result.gpu, mode);
        Ok(Response::new(sharing::rank_with_mode(
            convert::rank_to_pb(result),
            evidence,
        )))
    }

    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        let request = request.into_inner();
        let mode = sharing::sharing_mode(request.sharing_mode)?;
        let query = convert::predict_query(request)?;
        let result = self.advisor.predict(query).await?;
        let evidence = self.advisor.mode_evidence(&result.gpu, mode);
        Ok(Response::new(sharing::predict_with_mode(
            convert::predict_to_pb(result),
            evidence,
        )))
    }

    async fn place(
        &self,
        request: Request<pb::PlaceRequest>,
    ) -> Result<Response<pb::PlaceResponse>, Status> {
        let request = request.into_inner();
        let mode = sharing::sharing_mode(request.sharing_mode)?
            .unwrap_or(self.advisor.default_sharing_mode());
        let query = convert::place_query(request, &self.advisor.policy())?;
        let answer = self.advisor.place(query).await?;
        let evidence = |gpu: &str| {
            let gpu = GpuName::parse("gpu", gpu).ok()?;
            Some(self.advisor.mode_evidence(&gpu, Some(mode)))
        };
        Ok(Response::new(sharing::place_with_mode(
            convert::place_to_pb(answer),
            mode,
            evidence,
        )))
    }

    async fn assign_job(
        &self,
        request: Request<pb::AssignJobRequest>,
    ) -> Result<Response<pb::AssignJobResponse>, Status> {
        let assignment = convert::job_assignment(request.into_inner())?;
        let assigned = self.advisor.assign_job(assignment).await?;
        Ok(Response::new(convert::assigned_to_pb(assigned)))
    }

    async fn release_job(
        &self,
        request: Request<pb::ReleaseJobRequest>,
    ) -> Result<Response<pb::ReleaseJobResponse>, Status> {
        let job_id = convert::job_id(request.into_inner().job_id)?;
        let released = self.advisor.release_job(job_id).await?;
        Ok(Response::new(pb::ReleaseJobResponse { released }))
    }

    async fn list_gpus(
        &self,
        request: Request<pb::ListGpusRequest>,
    ) -> Result<Response<pb::ListGpusResponse>, Status> {
        let request = request.into_inner();
        let filter = convert::gpu_filter(request.nodes, &request.gpu)?;
        let (page, next_page_token) =
            self.advisor
                .list_gpus(request.page_size, &request.page_token, &filter)?;
        Ok(Response::new(pb::ListGpusResponse {
            gpus: page.into_iter().map(cluster::cluster_gpu_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn report_colocation(
        &self,
        request: Request<pb::ReportColocationRequest>,
    ) -> Result<Response<pb::ReportColocationResponse>, Status> {
        let request = request.into_inner();
        let rejected = |status: Status| {
            self.advisor.stats().report(ReportOutcome::Rejected);
            status
        };
        // An empty gpu means the GPU's model when gpu_id names a GPU of the occupancy,
        // else the default, as everywhere.
        let requested =
            convert::optional_gpu("gpu", &request.gpu).map_err(|e| rejected(e.into()))?;
        let gpu_id = convert::optional_id("gpu_id", &request.gpu_id)
            .map_err(|e| rejected(e.into()))?
            .map(str::to_owned);
        // Unset: MPS, the mode of every shipped dataset (not the server's default for
        // requests: a run's mode is a fact of the run).
        let sharing_mode = sharing::sharing_mode(request.sharing_mode)
            .map_err(|e| rejected(e.into()))?
            .unwrap_or(SharingMode::Mps);
        let gpu = self
            .advisor
            .gpu_of_run(requested, gpu_id.as_deref())
            .map_err(|e| rejected(e.into()))?;
        let mut observation =
            convert::observation(request, gpu, now_ms()).map_err(|e| rejected(e.into()))?;
        observation.gpu_id = gpu_id.unwrap_or_default();
        observation.sharing_mode = sharing_mode;
        let (id, created) = self.advisor.report(observation).await?;
        Ok(Response::new(pb::ReportColocationResponse {
            observation_id: id as u64,
            created,
        }))
    }

    async fn train(
        &self,
        request: Request<pb::TrainRequest>,
    ) -> Result<Response<pb::TrainResponse>, Status> {
        let request = request.into_inner();
        let kind = convert::model_kind(&request.kind)?;
        let gpu = self.gpu(&request.gpu)?;
        let outcome = self.advisor.train(&gpu, kind, Trigger::Request).await?;
        let context = self.context(&gpu).await?;
        Ok(Response::new(pb::TrainResponse {
            model: Some(convert::model_to_pb(&outcome.model, &context)),
            unusable_observations: outcome.unusable_observations as u64,
            promoted: outcome.promoted,
            champion_version: context.serving_version.unwrap_or_default(),
        }))
    }

    async fn get_model(
        &self,
        request: Request<pb::GetModelRequest>,
    ) -> Result<Response<pb::Model>, Status> {
        let request = request.into_inner();
        let gpu = self.gpu(&request.gpu)?;
        let version = (request.version != 0).then_some(request.version);
        let model = self.advisor.model_version(&gpu, version).await?;
        let context = self.context(&gpu).await?;
        let mut answer = convert::model_to_pb(&model, &context);
        answer.history = self
            .advisor
            .models(&gpu, HISTORY_LENGTH)
            .await?
            .iter()
            .map(|m| convert::model_to_pb(m, &context))
            .collect();
        Ok(Response::new(answer))
    }

    async fn list_models(
        &self,
        request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let request = request.into_inner();
        let gpu = self.gpu(&request.gpu)?;
        let limit = match request.limit {
            0 => 100,
            n => n.min(1000),
        };
        let context = self.context(&gpu).await?;
        let models = self.advisor.models(&gpu, limit).await?;
        Ok(Response::new(pb::ListModelsResponse {
            models: models
                .iter()
                .map(|m| convert::model_to_pb(m, &context))
                .collect(),
        }))
    }

    async fn get_model_report(
        &self,
        request: Request<pb::GetModelReportRequest>,
    ) -> Result<Response<pb::ModelReport>, Status> {
        let request = request.into_inner();
        let gpu = self.gpu(&request.gpu)?;
        let limit = match request.limit {
            0 => REPORT_RUNS_DEFAULT,
            n => n.min(REPORT_RUNS_MAX),
        };
        let (runs, models) = self.advisor.model_report(&gpu, limit as usize).await?;
        let context = self.context(&gpu).await?;
        Ok(Response::new(pb::ModelReport {
            gpu: gpu.as_str().to_string(),
            runs: runs.iter().map(convert::predicted_run_to_pb).collect(),
            models: models
                .iter()
                .map(|m| convert::model_to_pb(m, &context))
                .collect(),
        }))
    }

    async fn delete_runs(
        &self,
        request: Request<pb::DeleteRunsRequest>,
    ) -> Result<Response<pb::UndoResponse>, Status> {
        undo::delete_runs(&self.advisor, request).await
    }

    async fn forget_gpus(
        &self,
        request: Request<pb::ForgetGpusRequest>,
    ) -> Result<Response<pb::UndoResponse>, Status> {
        undo::forget_gpus(&self.advisor, request).await
    }

    async fn delete_profile(
        &self,
        request: Request<pb::DeleteProfileRequest>,
    ) -> Result<Response<pb::UndoResponse>, Status> {
        undo::delete_profile(&self.advisor, request).await
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        undo::list_audit(&self.advisor, request).await
    }

    async fn pin_model(
        &self,
        request: Request<pb::PinModelRequest>,
    ) -> Result<Response<pb::Model>, Status> {
        let request = request.into_inner();
        let gpu = self.gpu(&request.gpu)?;
        if request.version == 0 {
            return Err(
                crate::advisor::Error::from(crate::domain::ValidationError::new(
                    "version",
                    "version must name a stored model version",
                ))
                .into(),
            );
        }
        let model = self.advisor.pin(&gpu, request.version).await?;
        let context = self.context(&gpu).await?;
        Ok(Response::new(convert::model_to_pb(&model, &context)))
    }

    async fn unpin_model(
        &self,
        request: Request<pb::UnpinModelRequest>,
    ) -> Result<Response<pb::Model>, Status> {
        let gpu = self.gpu(&request.into_inner().gpu)?;
        let model = self.advisor.unpin(&gpu).await?;
        let context = self.context(&gpu).await?;
        Ok(Response::new(convert::model_to_pb(&model, &context)))
    }
}

//! The operator CLI: `coloc workloads|rank|report|model|health` talk gRPC to a running
//! server (`--addr`, `COLOC_ADDR`; bearer token from `COLOC_TOKEN`; `--ca-cert` for TLS)
//! and print readable tables, or JSON with `--json`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tonic::{
    metadata::MetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use crate::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};

#[derive(Debug, Args, Clone)]
pub struct Connection {
    /// The server, e.g. http://127.0.0.1:50051 (https:// with TLS); an address without a
    /// scheme, like 127.0.0.1:50051, means http:// (https:// with --ca-cert).
    #[arg(
        long,
        env = "COLOC_ADDR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// A bearer token (reader or operator); read from the environment, never a flag.
    #[arg(skip = std::env::var("COLOC_TOKEN").ok())]
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the server's TLS certificate.
    #[arg(long, env = "COLOC_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadsCommand {
    /// Every workload (all pages).
    List {
        /// Only workloads in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
    },
    Get {
        name: String,
    },
    /// Register a workload (without a profile it waits for the profiling worker).
    Register {
        name: String,
        #[arg(long, value_enum)]
        mode: ModeArg,
        #[arg(long, default_value = "")]
        model: String,
        #[arg(long, default_value_t = 0)]
        batch_size: u32,
        /// KEY=VALUE, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Launch spec: the program the profiling worker runs (absolute path).
        #[arg(long)]
        program: Option<String>,
        /// Launch spec: an argument, repeatable.
        #[arg(long = "arg", allow_hyphen_values = true)]
        args: Vec<String>,
        #[arg(long)]
        working_dir: Option<String>,
    },
    Delete {
        name: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    PendingProfile,
    Profiled,
    Failed,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Training,
    Inference,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ObjectiveArg {
    Throughput,
    Normalized,
}

#[derive(Debug, Args)]
pub struct RankArgs {
    pub target: String,
    #[arg(long, default_value_t = 10)]
    pub top: i32,
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Only these candidates (comma-separated); default every profiled workload.
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    #[arg(long, value_enum, default_value = "throughput")]
    pub objective: ObjectiveArg,
    /// The lowest fraction of its exclusive throughput the target may keep (0-1).
    #[arg(long, default_value_t = 0.0)]
    pub max_target_slowdown: f64,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[arg(long)]
    pub gpu: String,
    /// WORKLOAD=THROUGHPUT for each member (2 or more).
    #[arg(required = true, num_args = 2..)]
    pub members: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// A stored version; default the one serving.
    #[arg(long, default_value_t = 0)]
    pub version: u64,
}

type Authorize =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
pub(crate) type Client = ColocationAdvisorClient<InterceptedService<Channel, Authorize>>;

impl Connection {
    /// The server's URL: `addr` as given, or with the scheme its TLS setting implies.
    pub fn url(&self) -> String {
        if self.addr.contains("://") {
            self.addr.clone()
        } else if self.ca_cert.is_some() {
            format!("https://{}", self.addr)
        } else {
            format!("http://{}", self.addr)
        }
    }

    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let mut endpoint = Endpoint::from_shared(self.url()).with_context(|| {
            format!(
                "--addr {:?} is not a URL like http://127.0.0.1:50051",
                self.addr
            )
        })?;
        if let Some(ca) = &self.ca_cert {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))?;
        }
        endpoint
            .connect()
            .await
            .with_context(|| format!("cannot reach coloc at {}", self.addr))
    }

    pub(crate) async fn client(&self) -> anyhow::Result<Client> {
        let token: Option<MetadataValue<_>> = match &self.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .context("COLOC_TOKEN is not a valid header value")?,
            ),
            None => None,
        };
        let authorize: Authorize = Box::new(move |mut request| {
            if let Some(token) = &token {
                request
                    .metadata_mut()
                    .insert("authorization", token.clone());
            }
            Ok(request)
        });
        Ok(ColocationAdvisorClient::with_interceptor(
            self.channel().await?,
            authorize,
        ))
    }
}

pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

fn mode_name(mode: i32) -> &'static str {
    match pb::WorkloadMode::try_from(mode) {
        Ok(pb::WorkloadMode::Training) => "training",
        Ok(pb::WorkloadMode::Inference) => "inference",
        _ => "unspecified",
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::WorkloadState::try_from(state) {
        Ok(pb::WorkloadState::PendingProfile) => "pending_profile",
        Ok(pb::WorkloadState::Profiled) => "profiled",
        Ok(pb::WorkloadState::Failed) => "failed",
        _ => "unspecified",
    }
}

fn workload_json(w: &pb::Workload) -> Value {
    json!({
        "name": w.name,
        "mode": mode_name(w.mode),
        "model": w.model,
        "batch_size": w.batch_size,
        "labels": w.labels,
        "state": state_name(w.state),
        "state_reason": w.state_reason,
        "profiled_on": w.profiles.iter().map(|p| p.gpu.clone()).collect::<Vec<_>>(),
    })
}

/// Prints rows as an aligned table under `headers`.
pub(crate) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Every workload on the server in `state` (0 = any), page after page.
pub async fn all_workloads<T>(
    client: &mut ColocationAdvisorClient<T>,
    state: i32,
) -> Result<Vec<pb::Workload>, tonic::Status>
where
    // The generated client's own bounds.
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 1000,
                page_token,
                state,
            })
            .await?
            .into_inner();
        all.extend(page.workloads);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

pub async fn workloads(connection: &Connection, command: WorkloadsCommand) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    match command {
        WorkloadsCommand::List { state } => {
            let state = state.map_or(0, |s| match s {
                StateArg::PendingProfile => pb::WorkloadState::PendingProfile,
                StateArg::Profiled => pb::WorkloadState::Profiled,
                StateArg::Failed => pb::WorkloadState::Failed,
            } as i32);
            let all = all_workloads(&mut client, state)
                .await
                .map_err(status_error)?;
            if connection.json {
                return print_json(&Value::Array(all.iter().map(workload_json).collect()));
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|w| {
                    vec![
                        w.name.clone(),
                        mode_name(w.mode).into(),
                        w.batch_size.to_string(),
                        state_name(w.state).into(),
                        w.profiles
                            .iter()
                            .map(|p| p.gpu.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                    ]
                })
                .collect();
            print_table(&["NAME", "MODE", "BATCH", "STATE", "PROFILED ON"], &rows);
        }
        WorkloadsCommand::Get { name } => {
            let w = client
                .get_workload(pb::GetWorkloadRequest { name })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_json(&workload_json(&w));
            }
            print_table(
                &["NAME", "MODE", "MODEL", "BATCH", "STATE", "REASON"],
                &[vec![
                    w.name.clone(),
                    mode_name(w.mode).into(),
                    w.model.clone(),
                    w.batch_size.to_string(),
                    state_name(w.state).into(),
                    w.state_reason.clone(),
                ]],
            );
        }
        WorkloadsCommand::Register {
            name,
            mode,
            model,
            batch_size,
            labels,
            program,
            args,
            working_dir,
        } => {
            let labels = labels
                .iter()
                .map(|l| {
                    l.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .with_context(|| format!("--label {l:?} is not KEY=VALUE"))
                })
                .collect::<anyhow::Result<_>>()?;
            let launch = program.map(|program| pb::LaunchSpec {
                program,
                args,
                working_dir: working_dir.unwrap_or_default(),
                ..Default::default()
            });
            let w = client
                .register_workload(pb::RegisterWorkloadRequest {
                    name,
                    mode: match mode {
                        ModeArg::Training => pb::WorkloadMode::Training,
                        ModeArg::Inference => pb::WorkloadMode::Inference,
                    } as i32,
                    model,
                    batch_size,
                    labels,
                    profile: None,
                    launch,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_json(&workload_json(&w));
            }
            println!("registered {} ({})", w.name, state_name(w.state));
        }
        WorkloadsCommand::Delete { name } => {
            client
                .delete_workload(pb::DeleteWorkloadRequest { name: name.clone() })
                .await
                .map_err(status_error)?;
            if connection.json {
                return print_json(&json!({ "deleted": name }));
            }
            println!("deleted {name}");
        }
    }
    Ok(())
}

pub async fn rank(connection: &Connection, args: RankArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let response = client
        .rank(pb::RankRequest {
            target: args.target,
            candidates: args.candidates,
            top_k: args.top,
            gpu: args.gpu,
            objective: match args.objective {
                ObjectiveArg::Throughput => pb::Objective::ThroughputSum,
                ObjectiveArg::Normalized => pb::Objective::NormalizedSum,
            } as i32,
            max_target_slowdown: args.max_target_slowdown,
            ..Default::default()
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_json(&json!({
            "gpu": response.gpu,
            "model_version": response.model_version,
            "ranked": response.ranked.iter().map(|c| json!({
                "workload": c.workload,
                "predicted_throughput_sum": c.predicted_throughput_sum,
                "predicted_normalized_sum": c.predicted_normalized_sum,
                "fits_memory": c.fits_memory,
                "memory_gb": c.memory_gb,
                "target_kept": c.members.first().and_then(|m| m.predicted_slowdown),
            })).collect::<Vec<_>>(),
            "skipped": response.skipped.iter().map(|s| json!({"workload": s.workload, "reason": s.reason})).collect::<Vec<_>>(),
        }));
    }
    let rows: Vec<Vec<String>> = response
        .ranked
        .iter()
        .enumerate()
        .map(|(i, c)| {
            vec![
                (i + 1).to_string(),
                c.workload.clone(),
                format!("{:.2}", c.predicted_throughput_sum),
                c.predicted_normalized_sum
                    .map_or("-".into(), |n| format!("{n:.3}")),
                c.members
                    .first()
                    .and_then(|m| m.predicted_slowdown)
                    .map_or("-".into(), |s| format!("{:.0} %", s * 100.0)),
                format!("{:.1}", c.memory_gb),
            ]
        })
        .collect();
    println!(
        "GPU {}, model version {}",
        response.gpu, response.model_version
    );
    print_table(
        &[
            "#",
            "CANDIDATE",
            "PREDICTED SUM",
            "NORMALIZED",
            "TARGET KEEPS",
            "MEMORY GB",
        ],
        &rows,
    );
    if !response.skipped.is_empty() {
        println!(
            "{} skipped, e.g. {}: {}",
            response.skipped.len(),
            response.skipped[0].workload,
            response.skipped[0].reason
        );
    }
    Ok(())
}

pub async fn report(connection: &Connection, args: ReportArgs) -> anyhow::Result<()> {
    let members = args
        .members
        .iter()
        .map(|m| {
            let (workload, throughput) = m
                .split_once('=')
                .with_context(|| format!("{m:?} is not WORKLOAD=THROUGHPUT"))?;
            Ok(pb::ColocatedMember {
                workload: workload.to_string(),
                throughput: throughput
                    .parse()
                    .with_context(|| format!("{throughput:?} is not a number"))?,
                job_id: String::new(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut client = connection.client().await?;
    let response = client
        .report_colocation(pb::ReportColocationRequest {
            gpu_id: String::new(),
            gpu: args.gpu,
            members,
            observed_at: None,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_json(
            &json!({"observation_id": response.observation_id, "created": response.created}),
        );
    }
    println!(
        "observation {} {}",
        response.observation_id,
        if response.created {
            "stored"
        } else {
            "was already stored"
        }
    );
    Ok(())
}

fn model_row(m: &pb::Model) -> Vec<String> {
    let status = match pb::ModelStatus::try_from(m.status) {
        Ok(pb::ModelStatus::Promoted) => "promoted",
        Ok(pb::ModelStatus::Rejected) => "rejected",
        _ => "-",
    };
    let mut flags = Vec::new();
    if m.serving {
        flags.push("serving");
    }
    if m.pinned {
        flags.push("pinned");
    }
    vec![
        m.version.to_string(),
        m.kind.clone(),
        status.into(),
        flags.join(","),
        m.observations.to_string(),
        m.cv_score.map_or("-".into(), |s| format!("{s:.4}")),
        format!("{:.3}", m.r2),
        m.reason.clone(),
    ]
}

pub async fn model(connection: &Connection, args: ModelArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let model = client
        .get_model(pb::GetModelRequest {
            gpu: args.gpu,
            version: args.version,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        let one = |m: &pb::Model| {
            json!({
                "gpu": m.gpu, "version": m.version, "kind": m.kind, "serving": m.serving,
                "pinned": m.pinned, "observations": m.observations, "r2": m.r2, "mse": m.mse,
                "cv_score": m.cv_score, "cv_mse": m.cv_mse, "reason": m.reason,
                "rolling_error": m.rolling_error, "excluded_outliers": m.excluded_outliers,
            })
        };
        let mut value = one(&model);
        value["history"] = Value::Array(model.history.iter().map(one).collect());
        return print_json(&value);
    }
    println!(
        "GPU {}: version {} ({}) serving",
        model.gpu, model.version, model.kind
    );
    if let Some(error) = model.rolling_error {
        println!(
            "rolling error {:.1} % over {} reported runs",
            error * 100.0,
            model.rolling_error_samples
        );
    }
    let rows: Vec<Vec<String>> = model.history.iter().map(model_row).collect();
    print_table(
        &[
            "VERSION", "KIND", "STATUS", "", "RUNS", "CV SCORE", "R2", "REASON",
        ],
        &rows,
    );
    Ok(())
}

/// Exits non-zero unless the server's health service says SERVING (container probes).
pub async fn health(connection: &Connection) -> anyhow::Result<()> {
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(connection.channel().await?);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(status_error)?
        .into_inner()
        .status();
    if status != tonic_health::pb::health_check_response::ServingStatus::Serving {
        bail!("coloc at {} is {:?}", connection.addr, status);
    }
    println!("SERVING");
    Ok(())
}

/// `coloc import kace DIR --addr URL`: the same import as the direct one, through a running
/// server's API, so that the server learns of everything at once. Workloads are registered
/// with their profiles (a taken name is compared and its profile replaced only when it
/// differs), pairs are reported as runs at time 0 (a repeated import, by either path, is
/// recognised run by run), and models are trained (the KACE baseline first, then the
/// server's default kind) only when something changed.
pub async fn import_kace(
    connection: &Connection,
    dir: &std::path::Path,
    gpu: &crate::domain::GpuName,
    gpu_memory_gb: f64,
) -> anyhow::Result<crate::import::ImportSummary> {
    use crate::import::{prepare, ImportSummary, ModelLine};

    let prepared = prepare(dir, gpu, gpu_memory_gb)?;
    let mut client = connection.client().await?;
    let (mut registered, mut updated, mut unchanged) = (0, 0, 0);
    let progress = crate::progress::bar(
        (prepared.workloads.len() + prepared.observations.len()) as u64,
        "import",
    );
    for workload in &prepared.workloads {
        progress.inc(1);
        let profile = workload
            .profile
            .as_ref()
            .expect("imported workloads carry a profile");
        let pb_profile = pb::Profile {
            gpu: gpu.to_string(),
            kernel: Some(pb::KernelMetrics {
                threads: profile.kernel.threads,
                compute_throughput_pct: profile.kernel.compute_throughput_pct,
                dram_throughput_pct: profile.kernel.dram_throughput_pct,
                memory_throughput_pct: profile.kernel.memory_throughput_pct,
                registers: profile.kernel.registers,
                static_shared_memory_bytes: profile.kernel.static_shared_memory_bytes,
            }),
            system: Some(pb::SystemMetrics {
                exclusive_throughput: profile.system.exclusive_throughput,
                throughput_unit: profile.system.throughput_unit.clone(),
                sm_busy_pct: profile.system.sm_busy_pct,
                mem_busy_pct: profile.system.mem_busy_pct,
                memory_gb: profile.system.memory_gb,
            }),
            source: pb::ProfileSource::Imported as i32,
            gpu_memory_gb,
            ..Default::default()
        };
        let request = pb::RegisterWorkloadRequest {
            name: workload.name.to_string(),
            mode: match workload.mode {
                crate::domain::WorkloadMode::Training => pb::WorkloadMode::Training,
                crate::domain::WorkloadMode::Inference => pb::WorkloadMode::Inference,
            } as i32,
            model: workload.model.clone(),
            batch_size: workload.batch_size,
            labels: workload.labels.clone().into_iter().collect(),
            profile: Some(pb_profile.clone()),
            ..Default::default()
        };
        match client.register_workload(request).await {
            Ok(_) => registered += 1,
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                let stored = client
                    .get_workload(pb::GetWorkloadRequest {
                        name: workload.name.to_string(),
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                let same = stored.profiles.iter().any(|p| {
                    p.gpu == pb_profile.gpu
                        && p.kernel == pb_profile.kernel
                        && p.system == pb_profile.system
                });
                if same {
                    unchanged += 1;
                } else {
                    client
                        .put_profile(pb::PutProfileRequest {
                            name: workload.name.to_string(),
                            profile: Some(pb_profile),
                        })
                        .await
                        .map_err(status_error)?;
                    updated += 1;
                }
            }
            Err(status) => return Err(status_error(status)),
        }
    }
    let mut observations_new = 0;
    for run in &prepared.observations {
        progress.inc(1);
        let answer = client
            .report_colocation(pb::ReportColocationRequest {
                gpu: gpu.to_string(),
                members: run
                    .members
                    .iter()
                    .map(|m| pb::ColocatedMember {
                        workload: m.workload.to_string(),
                        throughput: m.throughput,
                        job_id: m.job_id.clone(),
                    })
                    .collect(),
                observed_at: Some(prost_types::Timestamp {
                    seconds: run.observed_at_ms / 1000,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        observations_new += usize::from(answer.created);
    }
    let line = |m: &pb::Model| ModelLine {
        version: m.version,
        kind: m.kind.clone(),
        observations: m.observations,
        r2: m.r2,
        mse: m.mse,
        status: match pb::ModelStatus::try_from(m.status) {
            Ok(pb::ModelStatus::Promoted) => "promoted",
            Ok(pb::ModelStatus::Rejected) => "rejected",
            _ => "unspecified",
        }
        .to_string(),
        reason: m.reason.clone(),
    };
    progress.finish_and_clear();
    let nothing_changed = registered == 0 && updated == 0 && observations_new == 0;
    let current = client
        .get_model(pb::GetModelRequest {
            gpu: gpu.to_string(),
            version: 0,
        })
        .await;
    let models = match current {
        Ok(current) if nothing_changed => vec![Ok(line(current.get_ref()))],
        _ => {
            let training = crate::progress::spinner("training models");
            let mut models = Vec::new();
            for kind in ["kace-linear", ""] {
                let trained = client
                    .train(pb::TrainRequest {
                        gpu: gpu.to_string(),
                        kind: kind.into(),
                    })
                    .await;
                models.push(match trained {
                    Ok(answer) => Ok(line(
                        answer
                            .get_ref()
                            .model
                            .as_ref()
                            .unwrap_or(&pb::Model::default()),
                    )),
                    Err(status) => Err(status.message().to_string()),
                });
            }
            training.finish_and_clear();
            models
        }
    };
    Ok(ImportSummary {
        workloads_registered: registered,
        workloads_updated: updated,
        workloads_unchanged: unchanged,
        incomplete_workloads: prepared.incomplete_workloads,
        observations_new,
        observations_total: prepared.observations.len(),
        pairs_skipped: prepared.pairs_skipped,
        models,
    })
}

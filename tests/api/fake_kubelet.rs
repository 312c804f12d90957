//! A fake kubelet for the tests of where pods really run: it serves the real PodResources
//! v1 proto (coloc's vendored copy) on a real Unix socket and answers `List` with what the
//! test last set; `coloc agent`'s reader ([`PodDevicesReporter`]) is pointed at it.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use coloc::{
    agent::pod_resources::PodDevicesReporter,
    proto::{
        self as pb,
        podresources::{
            pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
            AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
            GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse,
        },
    },
};
use tonic::{Request, Response, Status};

use crate::helpers::TestApp;

/// The kubelet's PodResources server, answering List with what the test set last.
#[derive(Clone, Default)]
pub struct FakeKubelet {
    answer: Arc<Mutex<ListPodResourcesResponse>>,
}

impl FakeKubelet {
    pub fn answering(answer: ListPodResourcesResponse) -> Self {
        let kubelet = Self::default();
        kubelet.set_answer(answer);
        kubelet
    }

    /// What the next List answers.
    pub fn set_answer(&self, answer: ListPodResourcesResponse) {
        *self.answer.lock().unwrap() = answer;
    }

    /// Serves this kubelet on a new Unix socket at `socket`; returns `socket`.
    pub fn serve(&self, socket: PathBuf) -> PathBuf {
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(self.clone()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        socket
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.answer.lock().unwrap().clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by coloc"))
    }

    async fn get(
        &self,
        _request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by coloc"))
    }
}

/// `coloc agent`'s PodResources reader for `node`, as agent `agent`, reading `socket` and
/// reporting to `app`.
pub async fn reporter(app: &TestApp, socket: &Path, agent: &str, node: &str) -> PodDevicesReporter {
    let mut agents = app.settings.agents.clone();
    agents.pod_resources_socket = socket.display().to_string();
    PodDevicesReporter::new(
        app.channel().await,
        None,
        agent.into(),
        node.into(),
        &agents,
    )
    .unwrap()
}

/// A GPU's residents as ListGpus shows them: (job id, workload, source).
pub type Residents = Vec<(String, String, pb::ResidentSource)>;

/// Every GPU ListGpus shows (one page), each with its [`Residents`] in the answer's order.
pub async fn listed_gpus(app: &mut TestApp) -> Vec<(pb::ClusterGpu, Residents)> {
    let answer = app
        .client
        .list_gpus(pb::ListGpusRequest::default())
        .await
        .unwrap()
        .into_inner();
    answer
        .gpus
        .into_iter()
        .map(|g| {
            let jobs = g
                .jobs
                .iter()
                .map(|j| (j.job_id.clone(), j.workload.clone(), j.source()))
                .collect();
            (g, jobs)
        })
        .collect()
}

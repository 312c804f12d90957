//! Following one Kubernetes Job through the API server (kube-rs): create it (an existing
//! Job of the same claim is taken as created: a restarted service), read its status every
//! `profiler.kubernetes.poll_interval_ms` until it completes or fails, and say why it
//! failed from the Job's condition and its pod's container state (e.g. an image that
//! cannot be pulled, OOMKilled, the deadline). A stopped service deletes the Job.

use std::time::Duration;

use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use kube::{
    api::{DeleteParams, ListParams, PostParams, PropagationPolicy},
    Api, Client,
};
use tokio_util::sync::CancellationToken;

use super::{manifest, KubeJobError};
use crate::{settings::KubeJobSettings, store::ClaimedJob};

/// How a Job ended.
#[derive(Debug, Clone, PartialEq)]
pub enum JobEnd {
    /// Its pod exited 0 (it reported through the agents' API, or said why not there).
    Succeeded,
    /// It failed, with what Kubernetes said about it.
    Failed { reason: String },
}

/// The Jobs and pods of one namespace.
#[derive(Clone)]
pub struct KubeJobs {
    jobs: Api<Job>,
    pods: Api<Pod>,
    settings: KubeJobSettings,
    /// `profiler.max_attempts`, told to the Jobs' pods.
    max_attempts: u32,
}

impl KubeJobs {
    pub fn new(client: Client, settings: KubeJobSettings, max_attempts: u32) -> Self {
        Self {
            jobs: Api::namespaced(client.clone(), &settings.namespace),
            pods: Api::namespaced(client, &settings.namespace),
            settings,
            max_attempts,
        }
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.settings.poll_interval_ms.max(10))
    }

    /// Creates the Job of `job`'s claim; returns its name.
    pub async fn create(&self, job: &ClaimedJob) -> Result<String, KubeJobError> {
        let manifest = manifest::typed_job(job, &self.settings, self.max_attempts)?;
        let name = manifest::job_name(job);
        match self.jobs.create(&PostParams::default(), &manifest).await {
            Ok(_) => Ok(name),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(job = %name, "the Job exists already; following it");
                Ok(name)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The Job's end, or `None` while it runs.
    pub async fn end(&self, name: &str) -> Result<Option<JobEnd>, KubeJobError> {
        let Some(job) = self.jobs.get_opt(name).await? else {
            return Err(KubeJobError::JobGone(name.to_string()));
        };
        let conditions = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let holds = |kind: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == kind && c.status == "True")
        };
        if holds("Complete").is_some() {
            return Ok(Some(JobEnd::Succeeded));
        }
        let Some(failed) = holds("Failed") else {
            return Ok(None);
        };
        let mut reason = format!(
            "Kubernetes Job {name} failed ({}: {})",
            failed.reason.as_deref().unwrap_or("no reason"),
            failed.message.as_deref().unwrap_or("no message")
        );
        if let Some(pod) = self.pod_reason(name).await? {
            reason.push_str("; ");
            reason.push_str(&pod);
        }
        Ok(Some(JobEnd::Failed { reason }))
    }

    /// What the Job's pod says about its failure: a container's termination or wait.
    async fn pod_reason(&self, name: &str) -> Result<Option<String>, KubeJobError> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(&format!("job-name={name}")))
            .await?;
        for pod in pods {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let status = pod.status.unwrap_or_default();
            let containers = status
                .init_container_statuses
                .unwrap_or_default()
                .into_iter()
                .chain(status.container_statuses.unwrap_or_default());
            for container in containers {
                let state = container.state.unwrap_or_default();
                if let Some(done) = state.terminated.filter(|t| t.exit_code != 0) {
                    return Ok(Some(format!(
                        "pod {pod_name}: container {} ended: {} (exit {}){}",
                        container.name,
                        done.reason.as_deref().unwrap_or("terminated"),
                        done.exit_code,
                        done.message.map(|m| format!(": {m}")).unwrap_or_default()
                    )));
                }
                if let Some(waiting) = state.waiting {
                    return Ok(Some(format!(
                        "pod {pod_name}: container {} waiting: {}{}",
                        container.name,
                        waiting.reason.as_deref().unwrap_or("waiting"),
                        waiting
                            .message
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    )));
                }
            }
            if let Some(message) = status.message {
                return Ok(Some(format!("pod {pod_name}: {message}")));
            }
        }
        Ok(None)
    }

    /// Deletes the Job and its pod (a stopped service, a deleted workload).
    pub async fn delete(&self, name: &str) -> Result<(), KubeJobError> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match self.jobs.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Creates the Job and waits for its end, calling `tick` at each poll (the lease's
    /// renewal); `cancel` deletes the Job and returns [`KubeJobError::Cancelled`].
    pub async fn run<F, Fut>(
        &self,
        job: &ClaimedJob,
        cancel: &CancellationToken,
        mut tick: F,
    ) -> Result<JobEnd, KubeJobError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let name = self.create(job).await?;
        tracing::info!(job = %name, workload = %job.workload, "Kubernetes Job created");
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    if let Err(error) = self.delete(&name).await {
                        tracing::warn!(%error, job = %name, "deleting the stopped Job failed");
                    }
                    return Err(KubeJobError::Cancelled);
                }
                _ = tokio::time::sleep(self.poll_interval()) => {}
            }
            if let Some(end) = self.end(&name).await? {
                return Ok(end);
            }
            tick().await;
        }
    }
}

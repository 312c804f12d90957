//! The observer: learns from what the cluster ran, with nobody reporting by hand. From a
//! [`Timeline`] (which pods shared which GPU, from when to when) and throughput sources
//! (Prometheus, pushes), every `observer.interval_secs` it turns each window that closed
//! into:
//! - a colocated run, when a GPU's set of pods stayed the same for at least
//!   `observer.min_window_secs`: each member's mean throughput over the window (less
//!   `guard_secs` at each end), stored through the same path as ReportColocation (the members'
//!   job ids are the pod UIDs, the run's time the window's end);
//! - a solo window, when one pod was alone: its workload's exclusive throughput measured
//!   again, kept, and its drift from the profile's shown in metrics; where it differs from
//!   the profile's beyond measurement noise (`advisor::EXCLUSIVE_NOISE_MARGIN`), the profile's
//!   exclusive throughput is refreshed to it through PutProfile's path.
//!
//! Each window is keyed by GPU, pod UIDs and window (`observer_runs`): a restart, or a
//! second replica reading the same timeline, never stores one twice. A member whose series
//! is missing, stale or absurd skips the whole window with a counted reason. A window whose
//! source could not be read (Prometheus unreachable, an error answer) is deferred and tried
//! again at later turns, for at most [`RETRY_FOR_MS`] after it closed and with at most
//! [`MAX_DEFERRED_WINDOWS`] waiting; then it is skipped as `source_failed`. A service task
//! owned like the trainer; off unless `observer.sources` names a source.

pub mod prometheus;
pub mod push;
pub mod source;
pub mod stats;
pub mod timeline;

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    advisor::{Advisor, Error as AdvisorError, EXCLUSIVE_NOISE_MARGIN},
    domain::{now_ms, ColocatedMember, GpuName, Observation, ProfileSource, WorkloadName},
    extender::ClusterView,
    settings::{ObserverSettings, ThroughputSourceKind},
    store::{NewObservedWindow, ObservedWindow, Store},
};
pub use source::{SkipReason, Span, ThroughputSource};
pub use stats::{ObserverStats, WindowKind};
pub use timeline::{GpuKey, Pod, Recorder, Segment, Timeline};

/// How long after a window closed it is still tried again when its source could not be
/// read (an hour: a Prometheus restart or an outage of a few minutes loses nothing; its
/// retention is days).
pub const RETRY_FOR_MS: i64 = 3_600_000;
/// The most windows waiting to be tried again; beyond, a failed window is skipped at once
/// (memory stays bounded through a long outage).
pub const MAX_DEFERRED_WINDOWS: usize = 10_000;

/// What one window became.
#[derive(Debug, Clone, PartialEq)]
pub enum Formed {
    /// A colocated run: the stored run's id and each member's (pod UID, workload, mean
    /// throughput), in UID order.
    Run {
        observation_id: i64,
        members: Vec<(String, String, f64)>,
    },
    /// A pod alone: its workload's mean throughput, and whether it replaced the profile's
    /// exclusive throughput (it differed beyond measurement noise).
    Solo {
        workload: String,
        throughput: f64,
        refreshed: bool,
    },
    /// Formed before: nothing stored.
    Known,
    /// A source could not be read: tried again at a later turn (nothing stored yet).
    Deferred,
    /// Shorter than the minimum window.
    Short,
    Skipped(SkipReason),
}

/// One window and what it became.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowOutcome {
    pub gpu: GpuKey,
    pub start_ms: i64,
    pub end_ms: i64,
    pub formed: Formed,
}

#[derive(Clone)]
pub struct Observer {
    advisor: Arc<Advisor>,
    store: Store,
    timeline: Arc<dyn Timeline>,
    /// Fed from the cluster each turn (the service's own timeline); `None` when the
    /// timeline is fed elsewhere.
    feed: Option<(Arc<Recorder>, Arc<ClusterView>)>,
    sources: Vec<Arc<dyn ThroughputSource>>,
    settings: ObserverSettings,
    stats: Arc<ObserverStats>,
    /// Windows that closed at or before this were formed by this process.
    cursor_ms: i64,
    /// Windows whose source could not be read, to be tried again (oldest first).
    deferred: Vec<Segment>,
}

/// The window's key: GPU, pod UIDs and window.
pub fn window_key(segment: &Segment) -> String {
    let uids: Vec<&str> = segment.pods.iter().map(|p| p.uid.as_str()).collect();
    format!(
        "{}/{}|{}|{}-{}",
        segment.gpu.node,
        segment.gpu.gpu_id,
        uids.join(","),
        segment.start_ms,
        segment.end_ms
    )
}

impl Observer {
    pub fn new(
        advisor: Arc<Advisor>,
        store: Store,
        timeline: Arc<dyn Timeline>,
        sources: Vec<Arc<dyn ThroughputSource>>,
        settings: ObserverSettings,
    ) -> Self {
        Self {
            advisor,
            store,
            timeline,
            feed: None,
            sources,
            settings,
            stats: Arc::new(ObserverStats::new()),
            cursor_ms: i64::MIN,
            deferred: Vec::new(),
        }
    }

    /// The service's observer: its timeline recorded from the cluster view and the
    /// AssignJob occupancy, its sources as `observer.sources` lists them (`push` is the
    /// endpoint's buffer, served by the metrics endpoint).
    pub fn from_settings(
        advisor: Arc<Advisor>,
        store: Store,
        cluster: Arc<ClusterView>,
        settings: &ObserverSettings,
        push: Option<Arc<push::PushSource>>,
    ) -> Self {
        let recorder = Arc::new(Recorder::new());
        let sources = settings
            .sources
            .iter()
            .filter_map(|kind| -> Option<Arc<dyn ThroughputSource>> {
                match kind {
                    ThroughputSourceKind::Prometheus => Some(Arc::new(
                        prometheus::PrometheusSource::new(settings.prometheus.clone()),
                    )),
                    ThroughputSourceKind::Push => {
                        push.clone().map(|push| push as Arc<dyn ThroughputSource>)
                    }
                }
            })
            .collect();
        let mut observer = Self::new(advisor, store, recorder.clone(), sources, settings.clone());
        observer.feed = Some((recorder, cluster));
        observer
    }

    pub fn stats(&self) -> Arc<ObserverStats> {
        self.stats.clone()
    }

    /// One turn at `now_ms`: looks at the cluster (when fed from it), then tries again the
    /// windows deferred by a source that could not be read, then forms every window that
    /// closed at least `settle_secs` ago and was not formed yet.
    pub async fn run_once(&mut self, now_ms: i64) -> anyhow::Result<Vec<WindowOutcome>> {
        if let Some((recorder, cluster)) = &self.feed {
            recorder.look(now_ms, timeline::current_cluster(cluster));
        }
        let until = now_ms - (self.settings.settle_secs * 1000) as i64;
        let mut outcomes = Vec::new();
        let deferred = std::mem::take(&mut self.deferred);
        let fresh = self.timeline.closed_segments(self.cursor_ms, until);
        for segment in deferred.into_iter().chain(fresh) {
            let last_try = now_ms - segment.end_ms >= RETRY_FOR_MS
                || self.deferred.len() >= MAX_DEFERRED_WINDOWS;
            let formed = self.form(&segment, last_try).await?;
            self.cursor_ms = self.cursor_ms.max(segment.end_ms);
            if formed == Formed::Deferred {
                self.deferred.push(segment.clone());
            }
            outcomes.push(WindowOutcome {
                gpu: segment.gpu,
                start_ms: segment.start_ms,
                end_ms: segment.end_ms,
                formed,
            });
        }
        if self.feed.is_some() {
            // The service's own recorder: what is formed is not needed again.
            self.timeline.forget_through(self.cursor_ms);
        }
        Ok(outcomes)
    }

    fn count(&self, formed: Formed) -> Formed {
        match &formed {
            Formed::Run { .. } => self.stats.window(WindowKind::Colocated),
            Formed::Solo { .. } => self.stats.window(WindowKind::Solo),
            Formed::Known => self.stats.window(WindowKind::Known),
            Formed::Deferred => self.stats.window(WindowKind::Deferred),
            Formed::Short => self.stats.window(WindowKind::Short),
            Formed::Skipped(reason) => self.stats.skip(*reason),
        }
        formed
    }

    /// The mean throughput of one pod over `span`, from the first source that has values.
    async fn mean(&self, pod: &Pod, span: Span) -> Result<f64, SkipReason> {
        let stale_ms = (self.settings.stale_secs * 1000) as i64;
        let mut reason = SkipReason::Missing;
        for source in &self.sources {
            match source.series(pod, span).await {
                Ok(samples) => match source::window_mean(&samples, span, stale_ms) {
                    Ok(mean) => return Ok(mean),
                    Err(SkipReason::Missing) => {}
                    Err(other) => return Err(other),
                },
                Err(other) => reason = other,
            }
        }
        Err(reason)
    }

    /// What `segment` becomes; a source that could not be read defers it unless this is
    /// its `last_try`.
    async fn form(&self, segment: &Segment, last_try: bool) -> anyhow::Result<Formed> {
        if segment.end_ms - segment.start_ms < (self.settings.min_window_secs * 1000) as i64 {
            return Ok(self.count(Formed::Short));
        }
        let key = window_key(segment);
        if self.store.observed_window_known(&key).await? {
            return Ok(self.count(Formed::Known));
        }
        let requested = segment
            .gpu_model
            .as_deref()
            .and_then(|name| GpuName::parse("gpu", name).ok());
        let Ok(gpu) = self
            .advisor
            .gpu_of_run(requested, Some(&segment.gpu.gpu_id))
        else {
            return Ok(self.count(Formed::Skipped(SkipReason::Unknown)));
        };
        let guard_ms = (self.settings.guard_secs * 1000) as i64;
        let span = Span {
            start_ms: segment.start_ms + guard_ms,
            end_ms: segment.end_ms - guard_ms,
        };
        let mut means = Vec::with_capacity(segment.pods.len());
        for pod in &segment.pods {
            match self.mean(pod, span).await {
                Ok(mean) => means.push(mean),
                Err(SkipReason::SourceFailed) if !last_try => {
                    return Ok(self.count(Formed::Deferred))
                }
                Err(reason) => return Ok(self.count(Formed::Skipped(reason))),
            }
        }
        let mut window = NewObservedWindow {
            key,
            gpu: gpu.to_string(),
            gpu_id: segment.gpu.gpu_id.clone(),
            start_ms: segment.start_ms,
            end_ms: segment.end_ms,
            outcome: ObservedWindow::Colocated { observation_id: 0 },
        };
        let formed = if let [pod] = segment.pods.as_slice() {
            let workload = WorkloadName::parse("workload", &pod.workload).ok();
            let exclusive = workload
                .as_ref()
                .and_then(|w| self.advisor.exclusive_throughput(&gpu, w));
            let Some(exclusive) = exclusive else {
                return Ok(self.count(Formed::Skipped(SkipReason::Unknown)));
            };
            self.stats
                .set_drift(gpu.as_str(), &pod.workload, means[0] / exclusive);
            window.outcome = ObservedWindow::Solo {
                workload: pod.workload.clone(),
                throughput: means[0],
            };
            Formed::Solo {
                workload: pod.workload.clone(),
                throughput: means[0],
                refreshed: false,
            }
        } else {
            match self.report(segment, gpu.clone(), &means).await? {
                Some(observation_id) => {
                    window.outcome = ObservedWindow::Colocated { observation_id };
                    Formed::Run {
                        observation_id,
                        members: segment
                            .pods
                            .iter()
                            .zip(&means)
                            .map(|(p, m)| (p.uid.clone(), p.workload.clone(), *m))
                            .collect(),
                    }
                }
                None => return Ok(self.count(Formed::Skipped(SkipReason::Unknown))),
            }
        };
        if !self.store.record_observed_window(&window, now_ms()).await? {
            return Ok(self.count(Formed::Known));
        }
        let formed = match formed {
            Formed::Solo {
                workload,
                throughput,
                ..
            } => {
                let refreshed = self
                    .refresh_exclusive(&gpu, &workload, throughput, segment.end_ms)
                    .await?;
                Formed::Solo {
                    workload,
                    throughput,
                    refreshed,
                }
            }
            other => other,
        };
        Ok(self.count(formed))
    }

    /// A solo window's mean made the workload's exclusive throughput on `gpu`, through
    /// PutProfile's path (the store, then the catalog), when it differs from the profile's
    /// beyond measurement noise. Returns whether the profile changed.
    async fn refresh_exclusive(
        &self,
        gpu: &GpuName,
        workload: &str,
        mean: f64,
        at_ms: i64,
    ) -> anyhow::Result<bool> {
        let Ok(name) = WorkloadName::parse("workload", workload) else {
            return Ok(false);
        };
        let Some(record) = self.store.get_workload(workload).await? else {
            return Ok(false);
        };
        let Some(profile) = record.profiles.iter().find(|p| &p.gpu == gpu) else {
            return Ok(false);
        };
        let stored = profile.system.exclusive_throughput;
        if (mean - stored).abs() <= EXCLUSIVE_NOISE_MARGIN * stored {
            return Ok(false);
        }
        let mut refreshed = profile.clone();
        refreshed.system.exclusive_throughput = mean;
        refreshed.source = ProfileSource::Measured;
        refreshed.measured_at_ms = at_ms;
        if refreshed.validate().is_err() {
            return Ok(false);
        }
        match self.advisor.put_profile(&name, refreshed).await {
            Ok(_) => {
                tracing::info!(
                    workload,
                    gpu = gpu.as_str(),
                    from = stored,
                    to = mean,
                    "observer: exclusive throughput refreshed from a solo window"
                );
                Ok(true)
            }
            // Deleted since: nothing to refresh.
            Err(AdvisorError::UnknownWorkload(_)) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Stores the colocated run as ReportColocation does; `None` when coloc cannot take it
    /// (a member's workload is not registered, too many members).
    async fn report(
        &self,
        segment: &Segment,
        gpu: GpuName,
        means: &[f64],
    ) -> anyhow::Result<Option<i64>> {
        let mut members = Vec::with_capacity(means.len());
        for (pod, mean) in segment.pods.iter().zip(means) {
            let Ok(workload) = WorkloadName::parse("workload", &pod.workload) else {
                return Ok(None);
            };
            members.push(ColocatedMember {
                workload,
                throughput: *mean,
                job_id: pod.uid.clone(),
            });
        }
        let Ok(mut observation) = Observation::new(gpu, members, segment.end_ms) else {
            return Ok(None);
        };
        observation.gpu_id = segment.gpu.gpu_id.clone();
        // The cluster's mode as the operator set it (`model.default_sharing_mode`); the
        // pods' own KAI annotations are not read here.
        observation.sharing_mode = self.advisor.default_sharing_mode();
        match self.advisor.report(observation).await {
            Ok((id, _created)) => Ok(Some(id)),
            Err(AdvisorError::UnknownReportedWorkload(workload)) => {
                tracing::warn!(workload, "observer: a window's workload is not registered");
                Ok(None)
            }
            Err(error) => Err(error.into()),
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        let interval = Duration::from_secs(self.settings.interval_secs);
        tracing::info!(
            interval_secs = interval.as_secs(),
            sources = self.sources.len(),
            "observer started"
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
            match self.run_once(now_ms()).await {
                Ok(outcomes) => {
                    if !outcomes.is_empty() {
                        tracing::info!(windows = outcomes.len(), "observer: windows formed");
                    }
                }
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "observer error")
                }
            }
        }
        tracing::info!("observer stopped");
    }
}

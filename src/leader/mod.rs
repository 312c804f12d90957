//! Leadership among the servers (replicas) sharing one database: exactly one of them, the
//! leader, runs the tasks that must not run twice (the retraining task, profiling
//! dispatch, the lease sweeper); every replica serves reads from memory and accepts
//! reports. docs/replicas.md tells the whole story.
//!
//! - [`Elector`]: every `leader.renew_interval_ms` each replica tries to take or renew the
//!   lease row (`store::lease`: the database's clock, a fencing token that grows at every
//!   change of holder). The replica that holds it starts the leader's tasks, each inside
//!   `store::lease::fenced` with its token, so that every write they begin is checked
//!   against the lease in the same transaction; when the lease is lost (another replica
//!   took it, or a renewal could not be confirmed before it would run out), the tasks are
//!   stopped. On shutdown the lease is let go at once, so another replica takes over at
//!   its next try instead of after the lease's whole term.
//! - [`follow`]: every replica reads each GPU model's champion (its pin, else its newest
//!   promoted model) from the store every `leader.model_poll_ms` and serves it, so that a
//!   promotion or pin made on any replica reaches all of them.
//!
//! Metrics: `coloc_leader` (1 while this replica leads), `coloc_leader_token` (the
//! fencing token of its term, 0 while it follows) and `coloc_leader_terms_total`.
//!
//! On SQLite (one machine, one server) the lease is held by the one server from its first
//! try; the same SQL path runs.

pub mod follow;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    settings::LeaderSettings,
    store::{
        lease::{Fence, LeaseOutcome},
        Store,
    },
};

/// A running task (if it runs) and the token that stops it.
pub type Task = (CancellationToken, Option<JoinHandle<()>>);

/// Starts the leader's tasks for one term, each running inside the term's fence; when the
/// term ends they are stopped one after another, in the order given.
pub type LeaderTasks = Arc<dyn Fn(Fence) -> Vec<Task> + Send + Sync>;

/// How leadership is sought and kept.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease_ttl: Duration,
    pub renew_interval: Duration,
}

impl From<&LeaderSettings> for Timing {
    fn from(settings: &LeaderSettings) -> Self {
        Self {
            lease_ttl: Duration::from_millis(settings.lease_ttl_ms),
            renew_interval: Duration::from_millis(settings.renew_interval_ms),
        }
    }
}

/// A holder name unique to this process: the host, the process id and a random part (a
/// restarted server, or two on one host, never share one).
pub fn holder_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "coloc".to_string());
    format!(
        "{host}/{}/{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Seeks the lease and runs the leader's tasks while this replica holds it.
pub struct Elector {
    store: Store,
    holder: String,
    timing: Timing,
    tasks: LeaderTasks,
    /// The fence while this replica leads, `None` while it follows.
    leading: watch::Sender<Option<Fence>>,
    gauges: Gauges,
}

/// What the metrics endpoint shows of leadership.
#[derive(Clone)]
struct Gauges {
    leading: prometheus::IntGauge,
    token: prometheus::IntGauge,
    terms: prometheus::IntCounter,
}

impl Gauges {
    fn new() -> Self {
        let gauge = |name: &str, help: &str| {
            prometheus::IntGauge::new(name, help).expect("a valid metric name")
        };
        Self {
            leading: gauge(
                "coloc_leader",
                "1 while this replica holds the leader's lease",
            ),
            token: gauge(
                "coloc_leader_token",
                "The fencing token of this replica's term as leader; 0 while it follows",
            ),
            terms: prometheus::IntCounter::new(
                "coloc_leader_terms_total",
                "Terms as leader this replica began",
            )
            .expect("a valid metric name"),
        }
    }

    fn set(&self, fence: Option<&Fence>) {
        self.leading.set(i64::from(fence.is_some()));
        self.token.set(fence.map_or(0, |f| f.token));
        if fence.is_some() {
            self.terms.inc();
        }
    }
}

/// A term: the tasks and what stops them.
struct Term {
    fence: Fence,
    tasks: Vec<Task>,
    /// When the lease runs out at the latest, by this replica's clock: the start of the
    /// last confirmed try plus the lease's term.
    valid_until: Instant,
}

impl Elector {
    pub fn new(store: Store, holder: String, timing: Timing, tasks: LeaderTasks) -> Self {
        Self {
            store,
            holder,
            timing,
            tasks,
            leading: watch::channel(None).0,
            gauges: Gauges::new(),
        }
    }

    /// The leadership metrics, for the metrics endpoint's registry.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let gauges = self.gauges.clone();
        vec![
            Box::new(gauges.leading),
            Box::new(gauges.token),
            Box::new(gauges.terms),
        ]
    }

    /// Whether (and with which fence) this replica leads, as it changes.
    pub fn leading(&self) -> watch::Receiver<Option<Fence>> {
        self.leading.subscribe()
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Seeks and keeps the lease until `stop`; then stops the leader's tasks and lets the
    /// lease go.
    pub async fn run(self, stop: CancellationToken) {
        tracing::info!(
            holder = %self.holder,
            lease_ttl_ms = self.timing.lease_ttl.as_millis() as u64,
            renew_interval_ms = self.timing.renew_interval.as_millis() as u64,
            "seeking leadership"
        );
        let mut term: Option<Term> = None;
        let mut ticks = tokio::time::interval(self.timing.renew_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            term = self.try_once(term).await;
        }
        if let Some(term) = term {
            let fence = term.fence.clone();
            self.end_term(term, "shutting down").await;
            match self.store.release_lease(&fence).await {
                Ok(true) => tracing::info!(token = fence.token, "leadership let go"),
                Ok(false) => {}
                Err(error) => tracing::warn!(error = error.chain(), "cannot let the lease go"),
            }
        }
        tracing::info!("leadership task stopped");
    }

    /// One try to take or renew the lease; starts or ends a term as its outcome says.
    async fn try_once(&self, term: Option<Term>) -> Option<Term> {
        let started = Instant::now();
        let ttl_ms = self.timing.lease_ttl.as_millis() as i64;
        match self.store.take_or_renew_lease(&self.holder, ttl_ms).await {
            Ok(LeaseOutcome::Held { token, taken, .. }) => {
                let valid_until = started + self.timing.lease_ttl;
                match term {
                    Some(mut term) if term.fence.token == token => {
                        term.valid_until = valid_until;
                        Some(term)
                    }
                    other => {
                        if let Some(old) = other {
                            self.end_term(old, "the lease was taken anew").await;
                        }
                        let fence = Fence {
                            holder: self.holder.clone(),
                            token,
                        };
                        tracing::info!(token, taken, holder = %self.holder, "became leader");
                        let tasks = (self.tasks)(fence.clone());
                        self.leading.send_replace(Some(fence.clone()));
                        self.gauges.set(Some(&fence));
                        Some(Term {
                            fence,
                            tasks,
                            valid_until,
                        })
                    }
                }
            }
            Ok(LeaseOutcome::HeldBy {
                holder,
                token,
                expires_in_ms,
            }) => {
                if let Some(old) = term {
                    self.end_term(old, "another server took the lease").await;
                }
                tracing::debug!(%holder, token, expires_in_ms, "following");
                None
            }
            Err(error) => {
                tracing::warn!(error = error.chain(), "cannot take or renew the lease");
                match term {
                    // Not confirmed in time: stop before the lease may have run out.
                    Some(old) if Instant::now() + self.timing.renew_interval >= old.valid_until => {
                        self.end_term(old, "the lease could not be renewed in time")
                            .await;
                        None
                    }
                    other => other,
                }
            }
        }
    }

    async fn end_term(&self, term: Term, why: &str) {
        tracing::warn!(
            token = term.fence.token,
            why,
            "leadership ends: stopping the leader's tasks"
        );
        self.leading.send_replace(None);
        self.gauges.set(None);
        for (stop, task) in term.tasks {
            stop.cancel();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
    }
}

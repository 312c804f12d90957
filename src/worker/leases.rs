//! The service's sweep of expired leases: a task of `coloc serve` that, every
//! [`AgentPolicy::sweep_interval`](crate::advisor::AgentPolicy::sweep_interval), returns
//! the jobs whose agent stopped renewing to the queue (or fails them on their last
//! attempt), so that a job whose only agent died is visibly pending again without waiting
//! for another agent's claim. Claims sweep too, in their own transaction.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::advisor::Advisor;

#[derive(Clone)]
pub struct LeaseSweeper {
    advisor: Arc<Advisor>,
}

impl LeaseSweeper {
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self { advisor }
    }

    /// Sweeps until `stop`. A failed sweep (the store cannot write) is logged and tried
    /// again at the next tick.
    pub async fn run(self, stop: CancellationToken) {
        let every = self.advisor.agent_policy().sweep_interval();
        tracing::info!(
            interval_ms = every.as_millis() as u64,
            "lease sweeper started"
        );
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            if let Err(error) = self.advisor.expire_leases().await {
                tracing::warn!(error = %error, "sweeping expired leases failed; trying again");
            }
        }
        tracing::info!("lease sweeper stopped");
    }
}

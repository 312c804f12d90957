//! Every replica's copy of the champions: reads the store's champion of each GPU model
//! every `leader.model_poll_ms` and serves it (`Advisor::follow_store_champions`), so a
//! promotion or pin made on any replica is served by all of them within about one period.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::advisor::Advisor;

/// Follows the store's champions until `stop`; a failed read is logged and tried again.
pub async fn run(advisor: Arc<Advisor>, every: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        match advisor.follow_store_champions().await {
            Ok(_) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "cannot read the store's champions; trying again");
            }
            Err(_) => {}
        }
    }
    tracing::info!("champion follower stopped");
}

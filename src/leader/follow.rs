//! Every replica's copy of the champions: reads the store's champion of each GPU model
//! every `leader.model_poll_ms` and serves it (`Advisor::follow_store_champions`), so a
//! promotion or pin made on any replica is served by all of them within about one period;
//! the same for workloads and profiles (`Advisor::follow_store_catalog`) and for what the
//! stored runs say, read again after each training (`Advisor::follow_store_trainings`).
//! It also keeps the readiness the deploy files probe: the health status of
//! [`READY_SERVICE`] is SERVING once a champion model is loaded, NOT_SERVING before.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::advisor::Advisor;

/// The health service name a readiness probe asks for: SERVING while this replica serves
/// at least one champion model.
pub const READY_SERVICE: &str = "coloc.v1.Ready";

/// Follows the store's champions until `stop`; a failed read is logged and tried again.
pub async fn run(
    advisor: Arc<Advisor>,
    every: Duration,
    health: tonic_health::server::HealthReporter,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut ready = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let followed = async {
            advisor.follow_store_champions().await?;
            advisor.follow_store_trainings().await?;
            advisor.follow_store_catalog().await
        };
        match followed.await {
            Ok(_) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "cannot read the store's champions, trainings or catalog; trying again");
            }
            Err(_) => {}
        }
        let loaded = !advisor.champions().is_empty();
        if ready != Some(loaded) && !stop.is_cancelled() {
            ready = Some(loaded);
            let status = if loaded {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            health.set_service_status(READY_SERVICE, status).await;
        }
    }
    tracing::info!("champion follower stopped");
}

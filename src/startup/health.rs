//! The service's gRPC health as the store's writes and shutdown set it: NOT_SERVING for the
//! advisor and agents services while writes fail (readiness takes the replica out; the
//! server itself stays SERVING, so liveness does not restart a process that recovers by
//! itself), and NOT_SERVING for everything once the service stops.

use tokio_util::sync::CancellationToken;

use crate::api::{AdvisorService, AgentsService, ColocationAdvisorServer, ProfilingAgentsServer};

/// Health at shutdown: NOT_SERVING for both services and the server itself.
pub(super) async fn stop_serving(reporter: &tonic_health::server::HealthReporter) {
    reporter
        .set_not_serving::<ColocationAdvisorServer<AdvisorService>>()
        .await;
    reporter
        .set_not_serving::<ProfilingAgentsServer<AgentsService>>()
        .await;
    reporter
        .set_service_status(
            crate::leader::follow::READY_SERVICE,
            tonic_health::ServingStatus::NotServing,
        )
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
}

/// Mirrors the store's write health in the health status of the advisor and agents
/// services until
/// `shutdown` (which sets NOT_SERVING for good).
pub(super) async fn follow_write_health(
    mut failing: tokio::sync::watch::Receiver<bool>,
    reporter: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = failing.changed() => if changed.is_err() { return },
        }
        let failing = *failing.borrow_and_update();
        if shutdown.is_cancelled() {
            return;
        }
        // Both services write: the agents' claims and submissions fail as the advisor's
        // writes do.
        if failing {
            reporter
                .set_not_serving::<ColocationAdvisorServer<AdvisorService>>()
                .await;
            reporter
                .set_not_serving::<ProfilingAgentsServer<AgentsService>>()
                .await;
        } else {
            reporter
                .set_serving::<ColocationAdvisorServer<AdvisorService>>()
                .await;
            reporter
                .set_serving::<ProfilingAgentsServer<AgentsService>>()
                .await;
        }
    }
}

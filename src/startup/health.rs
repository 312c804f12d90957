//! The service's gRPC health as the store's writes and shutdown set it: NOT_SERVING for the
//! advisor and agents services while writes fail (readiness takes the replica out; the
//! server itself stays SERVING, so liveness does not restart a process that recovers by
//! itself), and NOT_SERVING for everything once the service stops.

use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::{server::HealthReporter, ServingStatus};

use crate::api::{AdvisorService, AgentsService, ColocationAdvisorServer, ProfilingAgentsServer};

/// Sets the status of the two services that write, the advisor's and the agents': the
/// agents' claims and submissions fail as the advisor's writes do.
pub(super) async fn set_writing_services(reporter: &HealthReporter, status: ServingStatus) {
    for service in [
        <ColocationAdvisorServer<AdvisorService> as NamedService>::NAME,
        <ProfilingAgentsServer<AgentsService> as NamedService>::NAME,
    ] {
        reporter.set_service_status(service, status).await;
    }
}

/// Health at shutdown: NOT_SERVING for both services and the server itself.
pub(super) async fn stop_serving(reporter: &HealthReporter) {
    set_writing_services(reporter, ServingStatus::NotServing).await;
    reporter
        .set_service_status(
            crate::leader::follow::READY_SERVICE,
            ServingStatus::NotServing,
        )
        .await;
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
}

/// Mirrors the store's write health in the health status of the advisor and agents
/// services until
/// `shutdown` (which sets NOT_SERVING for good).
pub(super) async fn follow_write_health(
    mut failing: tokio::sync::watch::Receiver<bool>,
    reporter: HealthReporter,
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
        let status = if failing {
            ServingStatus::NotServing
        } else {
            ServingStatus::Serving
        };
        set_writing_services(&reporter, status).await;
    }
}

//! Building and running the service: [`App::build`] opens the store, loads the advisor and
//! binds the listener (port 0 works, for tests); [`App::run_until_stopped`] serves gRPC
//! until the shutdown token is cancelled, then closes the store.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};

use crate::{
    advisor::Advisor,
    api::{AdvisorService, ColocationAdvisorServer},
    domain::now_ms,
    profiler::Backend,
    proto,
    settings::Settings,
    store::Store,
    trainer::Trainer,
    worker::Worker,
};

pub struct App {
    listener: TcpListener,
    local_addr: SocketAddr,
    advisor: Arc<Advisor>,
    /// The profiling worker; `None` when profiler.backend is "off".
    worker: Option<Worker>,
    /// The retraining task; `None` when trainer.interval_secs is 0.
    trainer: Option<Trainer>,
}

impl App {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let listen = settings.listen_address()?;
        let store = Store::open(&settings.database.url)
            .await
            .context("cannot open the database")?;
        let advisor = Arc::new(
            Advisor::load(store, settings.advisor_options()?)
                .await
                .context("cannot load profiles and models from the database")?,
        );
        let requeued = advisor.store().requeue_running_jobs(now_ms()).await?;
        if requeued > 0 {
            tracing::warn!(
                requeued,
                "profiling jobs cut off by the last stop are pending again"
            );
        }
        let backend =
            Backend::from_settings(&settings.profiler).context("cannot set up the profiler")?;
        let worker = match backend {
            Backend::Off => None,
            backend => Some(Worker::new(
                advisor.clone(),
                Arc::new(backend),
                settings.profiler.clone(),
            )),
        };
        let trainer = (settings.trainer.interval_secs > 0).then(|| {
            Trainer::new(
                advisor.clone(),
                Duration::from_secs(settings.trainer.interval_secs),
            )
        });
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let local_addr = listener.local_addr()?;
        Ok(Self {
            listener,
            local_addr,
            advisor,
            worker,
            trainer,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn advisor(&self) -> Arc<Advisor> {
        self.advisor.clone()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<ColocationAdvisorServer<AdvisorService>>()
            .await;
        // Both reflection versions (grpcurl 1.8.6 speaks only v1alpha), each describing every
        // service served, health and reflection included.
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(
                    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
                )
        };
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;

        let request_ids = Arc::new(AtomicU64::new(1));
        let server_shutdown = shutdown.child_token();
        // The worker is owned here and awaited below: on shutdown it stops its job and puts
        // it back to pending before the store closes.
        let worker = self
            .worker
            .map(|worker| tokio::spawn(worker.run(shutdown.child_token())));
        let trainer = self
            .trainer
            .map(|trainer| tokio::spawn(trainer.run(shutdown.child_token())));
        let stopping_reporter = health_reporter.clone();
        tracing::info!(address = %self.local_addr, "serving gRPC");
        let served = Server::builder()
            .trace_fn(move |request| {
                let request_id = request
                    .headers()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .unwrap_or_else(|| request_ids.fetch_add(1, Ordering::Relaxed).to_string());
                tracing::info_span!("rpc", method = %request.uri().path(), request_id = %request_id)
            })
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(ColocationAdvisorServer::new(AdvisorService::new(
                self.advisor.clone(),
            )))
            .serve_with_incoming_shutdown(
                TcpIncoming::from(self.listener).with_nodelay(Some(true)),
                async move {
                    server_shutdown.cancelled().await;
                    stopping_reporter
                        .set_not_serving::<ColocationAdvisorServer<AdvisorService>>()
                        .await;
                    stopping_reporter
                        .set_service_status("", tonic_health::ServingStatus::NotServing)
                        .await;
                    tracing::info!("shutting down: no new requests accepted");
                },
            )
            .await
            .context("gRPC server failed");
        // A failed server still stops the worker before the store closes.
        shutdown.cancel();
        for (task, name) in [(worker, "profiling worker"), (trainer, "retraining task")] {
            if let Some(task) = task {
                if let Err(error) = task.await {
                    tracing::error!(%error, task = name, "background task panicked");
                }
            }
        }
        self.advisor.store().close().await;
        served?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Cancels `token` on SIGINT or SIGTERM.
pub async fn cancel_on_signal(token: CancellationToken) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => tracing::info!("SIGINT received"),
        _ = terminate => tracing::info!("SIGTERM received"),
    }
    token.cancel();
}

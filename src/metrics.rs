//! Prometheus metrics (the prometheus crate) on their own small HTTP endpoint,
//! `GET /metrics` on `metrics.listen`. RPC counts and latencies are recorded as requests
//! pass; the state of the queue, the models and the store is read when scraped.

use std::{net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{advisor::Advisor, domain::now_ms, store::Store};

pub struct Metrics {
    registry: Registry,
    rpcs: IntCounterVec,
    latency: HistogramVec,
    jobs: IntGaugeVec,
    model_version: GaugeVec,
    model_age: GaugeVec,
    rolling_error: GaugeVec,
    store_bytes: IntGauge,
    /// Log lines stderr could not take (telemetry drops them rather than fail).
    log_lines_dropped: IntCounter,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("coloc".into()), None).expect("a valid prefix");
        let rpcs = IntCounterVec::new(
            Opts::new(
                "rpc_requests_total",
                "RPCs answered, by method and gRPC status code",
            ),
            &["method", "code"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "rpc_duration_seconds",
                "RPC latency, by method and gRPC status code",
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
                0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            &["method", "code"],
        )
        .expect("valid metric");
        let jobs = IntGaugeVec::new(
            Opts::new(
                "profiling_jobs",
                "Profiling jobs by state (pending = the queue)",
            ),
            &["state"],
        )
        .expect("valid metric");
        let model_version = GaugeVec::new(
            Opts::new(
                "model_version",
                "Version of the model serving each GPU model",
            ),
            &["gpu"],
        )
        .expect("valid metric");
        let model_age = GaugeVec::new(
            Opts::new(
                "model_age_seconds",
                "Age of the model serving each GPU model",
            ),
            &["gpu"],
        )
        .expect("valid metric");
        let rolling_error = GaugeVec::new(
            Opts::new(
                "model_rolling_error",
                "Mean relative error of the serving model on recently reported runs",
            ),
            &["gpu"],
        )
        .expect("valid metric");
        let store_bytes =
            IntGauge::new("store_bytes", "Size of the SQLite database").expect("valid metric");
        let log_lines_dropped = IntCounter::new(
            "log_lines_dropped_total",
            "Log lines dropped because stderr could not take them (e.g. a closed pipe)",
        )
        .expect("valid metric");
        for collector in [
            Box::new(rpcs.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(jobs.clone()),
            Box::new(model_version.clone()),
            Box::new(model_age.clone()),
            Box::new(rolling_error.clone()),
            Box::new(store_bytes.clone()),
            Box::new(log_lines_dropped.clone()),
        ] {
            registry
                .register(collector)
                .expect("each metric is registered once");
        }
        Self {
            registry,
            rpcs,
            latency,
            jobs,
            model_version,
            model_age,
            rolling_error,
            store_bytes,
            log_lines_dropped,
        }
    }

    pub fn observe_rpc(&self, method: &str, code: i32, seconds: f64) {
        let code = code.to_string();
        self.rpcs.with_label_values(&[method, &code]).inc();
        self.latency
            .with_label_values(&[method, &code])
            .observe(seconds);
    }

    /// Refreshes the state gauges and renders everything in the Prometheus text format.
    pub async fn render(&self, advisor: &Advisor, store: &Store) -> anyhow::Result<String> {
        let (pending, running, done, failed) = store.job_counts().await?;
        for (state, count) in [
            ("pending", pending),
            ("running", running),
            ("done", done),
            ("failed", failed),
        ] {
            self.jobs.with_label_values(&[state]).set(count);
        }
        self.model_version.reset();
        self.model_age.reset();
        self.rolling_error.reset();
        for model in advisor.champions() {
            let gpu = model.gpu.as_str();
            self.model_version
                .with_label_values(&[gpu])
                .set(model.version as f64);
            self.model_age
                .with_label_values(&[gpu])
                .set((now_ms() - model.created_at_ms) as f64 / 1000.0);
            if let Some((error, _)) = advisor.rolling_error(&model.gpu) {
                self.rolling_error.with_label_values(&[gpu]).set(error);
            }
        }
        self.store_bytes.set(store.size_bytes().await?);
        let dropped = crate::telemetry::dropped_log_lines();
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        let mut text = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut text)?;
        Ok(String::from_utf8(text)?)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves `GET /metrics` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    advisor: Arc<Advisor>,
    store: Store,
    shutdown: CancellationToken,
) {
    let address: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(address = ?address, "serving metrics");
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "metrics: accept failed");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let advisor = advisor.clone();
        let store = store.clone();
        connections.spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                let advisor = advisor.clone();
                let store = store.clone();
                async move {
                    let response = if request.uri().path() != "/metrics" {
                        Response::builder()
                            .status(404)
                            .body(Full::new(Bytes::from("not found\n")))
                    } else {
                        match metrics.render(&advisor, &store).await {
                            Ok(text) => Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(text))),
                            Err(error) => {
                                tracing::error!(
                                    error = format!("{error:#}"),
                                    "metrics: render failed"
                                );
                                Response::builder()
                                    .status(500)
                                    .body(Full::new(Bytes::from("internal error\n")))
                            }
                        }
                    };
                    response
                }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "metrics: connection ended");
            }
        });
    }
    connections.shutdown().await;
}

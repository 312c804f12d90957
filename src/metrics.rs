//! Prometheus metrics (the prometheus crate) on their own small HTTP endpoint,
//! `GET /metrics` on `metrics.listen`. RPC counts and latencies are recorded as requests
//! pass; the state of the queue, the models and the store is read when scraped; collectors
//! kept elsewhere (the observer's) are registered by `startup`. One more route may share the
//! listener ([`ExtraRoute`]: the observer's push endpoint), with no import of its owner. The
//! scheduler extender's HTTP endpoint (and the admission webhook served beside it) counts
//! its calls, latencies and neutral answers in the same registry ([`ExtenderMetrics`]).

use std::sync::Arc;

use http_body_util::Full;
use hyper::{body::Bytes, service::service_fn, Request, Response};
use prometheus::{
    core::Collector, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    advisor::{Advisor, JobOutcome, ReportOutcome, TrainingOutcome},
    domain::now_ms,
    store::Store,
};

pub struct Metrics {
    registry: Registry,
    /// grpc-ecosystem names (go-grpc-prometheus), so that stock gRPC dashboards work.
    handled: IntCounterVec,
    handling_seconds: HistogramVec,
    jobs: IntGaugeVec,
    /// Per profiling agent: when it was last heard from, whether it holds a job, and what
    /// it submitted.
    agent_last_seen: GaugeVec,
    agent_busy: IntGaugeVec,
    agent_jobs: IntCounterVec,
    model_version: GaugeVec,
    model_age: GaugeVec,
    model_trained: GaugeVec,
    rolling_error: GaugeVec,
    suspect_profiles: IntGaugeVec,
    store_bytes: IntGauge,
    store_writes_failing: IntGauge,
    store_write_failures: IntCounter,
    reports: IntCounterVec,
    /// Place's answers that offered a GPU, and those that explored.
    place: [IntCounter; 2],
    trainings: IntCounterVec,
    job_outcomes: IntCounterVec,
    /// Log lines stderr could not take (telemetry drops them rather than fail).
    log_lines_dropped: IntCounter,
    extender: Arc<ExtenderMetrics>,
}

/// The extender endpoint's metrics: calls per verb and HTTP status, their latency, and
/// the answers that were neutral (every node passes, every score 0) by reason.
pub struct ExtenderMetrics {
    calls: IntCounterVec,
    seconds: HistogramVec,
    neutral: IntCounterVec,
}

impl ExtenderMetrics {
    fn new(registry: &Registry) -> Self {
        let opts = HistogramOpts::new(
            "coloc_extender_request_duration_seconds",
            "Time the scheduler extender took to answer a call, by verb",
        )
        .buckets(vec![
            0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0,
        ]);
        Self {
            calls: counter(
                registry,
                "coloc_extender_requests_total",
                "Calls to the scheduler extender's endpoint, by verb and HTTP status code",
                &["verb", "code"],
            ),
            seconds: registered(
                registry,
                HistogramVec::new(opts, &["verb"]).expect("valid metric"),
            ),
            neutral: counter(
                registry,
                "coloc_extender_neutral_answers_total",
                "Calls answered neutrally (every node passes, every score 0), by verb and reason",
                &["verb", "reason"],
            ),
        }
    }

    /// One answered call: its verb (`filter`, `prioritize`, `healthz`, ...), HTTP status
    /// and duration.
    pub fn observe_call(&self, verb: &str, status: u16, seconds: f64) {
        self.calls
            .with_label_values(&[verb, &status.to_string()])
            .inc();
        self.seconds.with_label_values(&[verb]).observe(seconds);
    }

    /// One neutral answer of `verb` and why (`no_workload`, `unknown_workload`, ...).
    pub fn neutral(&self, verb: &str, reason: &str) {
        self.neutral.with_label_values(&[verb, reason]).inc();
    }
}

/// The gRPC code's name as grpc-go spells it (`grpc_code` label values).
pub fn grpc_code_name(code: i32) -> &'static str {
    match tonic::Code::from_i32(code) {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "Canceled",
        tonic::Code::Unknown => "Unknown",
        tonic::Code::InvalidArgument => "InvalidArgument",
        tonic::Code::DeadlineExceeded => "DeadlineExceeded",
        tonic::Code::NotFound => "NotFound",
        tonic::Code::AlreadyExists => "AlreadyExists",
        tonic::Code::PermissionDenied => "PermissionDenied",
        tonic::Code::ResourceExhausted => "ResourceExhausted",
        tonic::Code::FailedPrecondition => "FailedPrecondition",
        tonic::Code::Aborted => "Aborted",
        tonic::Code::OutOfRange => "OutOfRange",
        tonic::Code::Unimplemented => "Unimplemented",
        tonic::Code::Internal => "Internal",
        tonic::Code::Unavailable => "Unavailable",
        tonic::Code::DataLoss => "DataLoss",
        tonic::Code::Unauthenticated => "Unauthenticated",
    }
}

/// `/coloc.v1.ColocationAdvisor/Rank` -> (`coloc.v1.ColocationAdvisor`, `Rank`).
pub fn split_method(path: &str) -> (&str, &str) {
    path.trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("unknown", path))
}

/// `metric`, registered in `registry`.
fn registered<C: Collector + Clone + 'static>(registry: &Registry, metric: C) -> C {
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric is registered once");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn int_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    registered(registry, IntCounter::new(name, help).expect("valid metric"))
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    registered(
        registry,
        GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn int_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn single_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// grpc_server_handling_seconds, in buckets from 50 µs to 10 s.
fn handling_seconds(registry: &Registry) -> HistogramVec {
    let opts = HistogramOpts::new(
        "grpc_server_handling_seconds",
        "Time the server took to answer an RPC",
    )
    .buckets(vec![
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0, 2.5, 10.0,
    ]);
    registered(
        registry,
        HistogramVec::new(opts, &["grpc_type", "grpc_service", "grpc_method"])
            .expect("valid metric"),
    )
}

/// Place's answers that offered a GPU, and those that explored (`observer.explore_budget`).
fn place_counters(registry: &Registry) -> [IntCounter; 2] {
    [
        int_counter(
            registry,
            "coloc_place_placements_total",
            "Place answers that offered at least one GPU",
        ),
        int_counter(
            registry,
            "coloc_place_explored_total",
            "Place answers that offered first a set the model is unsure of (observer.explore_budget)",
        ),
    ]
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        gauge(
            &registry,
            "coloc_build_info",
            "Always 1; the labels say which build serves",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1.0);
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("each metric is registered once");
        Self {
            handled: counter(
                &registry,
                "grpc_server_handled_total",
                "RPCs completed on the server, regardless of success or failure",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            ),
            handling_seconds: handling_seconds(&registry),
            jobs: int_gauge(
                &registry,
                "coloc_profiling_jobs",
                "Profiling jobs by state (pending = the queue)",
                &["state"],
            ),
            agent_last_seen: gauge(
                &registry,
                "coloc_agent_last_seen_timestamp_seconds",
                "When each profiling agent was last heard from (Unix time)",
                &["agent", "node", "gpu"],
            ),
            agent_busy: int_gauge(
                &registry,
                "coloc_agent_busy",
                "1 while a profiling agent holds a job, else 0",
                &["agent"],
            ),
            agent_jobs: counter(
                &registry,
                "coloc_agent_jobs_total",
                "Outcomes profiling agents submitted, by agent and outcome",
                &["agent", "outcome"],
            ),
            model_version: gauge(
                &registry,
                "coloc_model_version",
                "Version of the model serving each GPU model",
                &["gpu"],
            ),
            model_age: gauge(
                &registry,
                "coloc_model_age_seconds",
                "Age of the model serving each GPU model",
                &["gpu"],
            ),
            model_trained: gauge(
                &registry,
                "coloc_model_trained_timestamp_seconds",
                "When the model serving each GPU model was trained (Unix time)",
                &["gpu"],
            ),
            rolling_error: gauge(
                &registry,
                "coloc_model_rolling_error",
                "Mean relative error of the serving model on recently reported runs",
                &["gpu"],
            ),
            suspect_profiles: int_gauge(
                &registry,
                "coloc_suspect_profiles",
                "Profiles whose exclusive throughput stored runs exceed beyond noise, per GPU model",
                &["gpu"],
            ),
            store_bytes: single_gauge(&registry, "coloc_store_bytes", "Size of the SQLite database"),
            store_writes_failing: single_gauge(
                &registry,
                "coloc_store_writes_failing",
                "1 while the store's writes fail on a storage fault (disk full, read-only volume), else 0",
            ),
            store_write_failures: int_counter(
                &registry,
                "coloc_store_write_failures_total",
                "Write transactions that failed on a storage fault",
            ),
            reports: counter(
                &registry,
                "coloc_reports_total",
                "ReportColocation calls by outcome (stored, duplicate, rejected)",
                &["outcome"],
            ),
            place: place_counters(&registry),
            trainings: counter(
                &registry,
                "coloc_trainings_total",
                "Training attempts by outcome (promoted, rejected, failed)",
                &["outcome"],
            ),
            job_outcomes: counter(
                &registry,
                "coloc_profiling_attempts_total",
                "Profiling attempts by outcome",
                &["outcome"],
            ),
            log_lines_dropped: int_counter(
                &registry,
                "coloc_log_lines_dropped_total",
                "Log lines dropped because stderr could not take them (e.g. a closed pipe)",
            ),
            extender: Arc::new(ExtenderMetrics::new(&registry)),
            registry,
        }
    }

    /// The extender endpoint's metrics, registered with the rest.
    pub fn extender(&self) -> Arc<ExtenderMetrics> {
        self.extender.clone()
    }

    /// One answered unary RPC: `path` is the HTTP/2 path, `code` the gRPC status code.
    pub fn observe_rpc(&self, path: &str, code: i32, seconds: f64) {
        let (service, method) = split_method(path);
        self.handled
            .with_label_values(&["unary", service, method, grpc_code_name(code)])
            .inc();
        self.handling_seconds
            .with_label_values(&["unary", service, method])
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
        self.model_trained.reset();
        self.rolling_error.reset();
        self.suspect_profiles.reset();
        for model in advisor.champions() {
            let gpu = model.gpu.as_str();
            self.suspect_profiles
                .with_label_values(&[gpu])
                .set(advisor.suspect_profiles(&model.gpu).len() as i64);
            self.model_version
                .with_label_values(&[gpu])
                .set(model.version as f64);
            self.model_age
                .with_label_values(&[gpu])
                .set((now_ms() - model.created_at_ms) as f64 / 1000.0);
            self.model_trained
                .with_label_values(&[gpu])
                .set(model.created_at_ms as f64 / 1000.0);
            if let Some((error, _)) = advisor.rolling_error(&model.gpu) {
                self.rolling_error.with_label_values(&[gpu]).set(error);
            }
        }
        // Counters catch up with the counts kept where the events happen.
        let catch_up = |counter: IntCounter, total: u64| {
            counter.inc_by(total.saturating_sub(counter.get()));
        };
        let writes = store.write_health();
        self.store_writes_failing.set(i64::from(writes.failing()));
        catch_up(self.store_write_failures.clone(), writes.failures());
        self.store_bytes.set(store.size_bytes().await?);
        let stats = advisor.stats();
        for outcome in ReportOutcome::ALL {
            catch_up(
                self.reports.with_label_values(&[outcome.as_str()]),
                stats.reports(outcome),
            );
        }
        let (placements, explored) = advisor.placements_explored();
        catch_up(self.place[0].clone(), placements);
        catch_up(self.place[1].clone(), explored);
        for outcome in TrainingOutcome::ALL {
            catch_up(
                self.trainings.with_label_values(&[outcome.as_str()]),
                stats.trainings(outcome),
            );
        }
        for outcome in JobOutcome::ALL {
            catch_up(
                self.job_outcomes.with_label_values(&[outcome.as_str()]),
                stats.jobs(outcome),
            );
        }
        self.agent_last_seen.reset();
        self.agent_busy.reset();
        for agent in advisor.agents().await? {
            let record = &agent.record;
            self.agent_last_seen
                .with_label_values(&[&record.id, &record.node, &record.gpu])
                .set(record.last_seen_ms as f64 / 1000.0);
            self.agent_busy
                .with_label_values(&[&record.id])
                .set(i64::from(record.job_id.is_some()));
        }
        for (agent, counts) in stats.agent_jobs() {
            for (outcome, count) in JobOutcome::ALL.iter().zip(counts) {
                catch_up(
                    self.agent_jobs
                        .with_label_values(&[&agent, outcome.as_str()]),
                    count,
                );
            }
        }
        catch_up(
            self.log_lines_dropped.clone(),
            crate::telemetry::dropped_log_lines(),
        );
        let mut text = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut text)?;
        Ok(String::from_utf8(text)?)
    }
}

impl Metrics {
    /// Adds collectors kept elsewhere (the observer's counts) to what is scraped.
    pub fn register(&self, collector: Box<dyn Collector>) -> prometheus::Result<()> {
        self.registry.register(collector)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// What an extra route does with a request body: (HTTP status, text).
pub type RouteHandler = dyn Fn(&[u8]) -> (u16, String) + Send + Sync;

/// A handler of one more path on the metrics endpoint: the request body in, (HTTP status,
/// text) out. The observer's push endpoint is one (`POST /observer/throughput`).
pub struct ExtraRoute {
    pub path: &'static str,
    /// Bodies larger than this are refused with 413 before the handler sees them.
    pub max_body_bytes: usize,
    pub handle: Box<RouteHandler>,
}

/// Serves `GET /metrics` (and `POST` to `extra`'s path, when given) until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    advisor: Arc<Advisor>,
    store: Store,
    extra: Option<Arc<ExtraRoute>>,
    shutdown: CancellationToken,
) {
    match listener.local_addr() {
        Ok(address) => tracing::info!(%address, "serving metrics"),
        Err(error) => tracing::info!(%error, "serving metrics on an address it cannot name"),
    }
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let metrics = metrics.clone();
        let advisor = advisor.clone();
        let store = store.clone();
        let extra = extra.clone();
        async move {
            match extra {
                Some(extra) if request.uri().path() == extra.path => {
                    answer_extra(request, &extra).await
                }
                _ => answer(&request, &metrics, &advisor, &store).await,
            }
        }
    });
    crate::http_server::serve("metrics", listener, None, service, shutdown).await;
}

/// A `POST` to the extra route: the body, read up to its limit, handed to its handler.
async fn answer_extra(
    request: Request<hyper::body::Incoming>,
    extra: &ExtraRoute,
) -> Result<Response<Full<Bytes>>, http::Error> {
    use http_body_util::BodyExt;
    let text = |status: u16, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
    };
    if request.method() != hyper::Method::POST {
        return text(405, format!("{} takes POST\n", extra.path));
    }
    let body = http_body_util::Limited::new(request.into_body(), extra.max_body_bytes);
    match body.collect().await {
        Ok(collected) => {
            let (status, body) = (extra.handle)(&collected.to_bytes());
            text(status, body)
        }
        Err(_) => text(
            413,
            format!("the body is larger than {} bytes\n", extra.max_body_bytes),
        ),
    }
}

/// `GET /metrics`'s answer; any other path is not found.
async fn answer(
    request: &Request<hyper::body::Incoming>,
    metrics: &Metrics,
    advisor: &Advisor,
    store: &Store,
) -> Result<Response<Full<Bytes>>, http::Error> {
    if request.uri().path() != "/metrics" {
        return Response::builder()
            .status(404)
            .body(Full::new(Bytes::from("not found\n")));
    }
    match metrics.render(advisor, store).await {
        Ok(text) => Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(text))),
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "metrics: render failed");
            Response::builder()
                .status(500)
                .body(Full::new(Bytes::from("internal error\n")))
        }
    }
}

//! Building and running the service: [`App::build`] opens the store, loads the advisor and
//! binds the listener (port 0 works, for tests); [`App::run_until_stopped`] serves gRPC
//! until the shutdown token is cancelled, then stops in order: the API first (health says
//! NOT_SERVING, no new calls, in-flight calls drain within the grace period), then the
//! scheduler extender and the cluster watcher that feeds it, the binding webhook's GPU
//! inventory and ResourceClaim watchers, then leadership with its term's tasks: the
//! profiling worker (its running job goes back to pending), the Kubernetes Job dispatcher
//! (its running Job deleted, the job re-queued), the lease sweeper, the observer, the
//! retraining task; then the champion follower, the metrics endpoint, the observation
//! writer, and the store last. Every background task is
//! owned here; its exit, error or panic is logged when it happens.

mod health;
mod options;

pub use options::{advisor_options, model_kind};

use health::{follow_write_health, set_writing_services, stop_serving};
use options::{extender_options, grpc_tls};

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server, ServerTlsConfig};

use crate::{
    advisor::Advisor,
    api::{
        AdvisorService, AgentsService, AuthLayer, ColocationAdvisorServer, HeavyLimitLayer,
        ProfilingAgentsServer, RpcLayer,
    },
    domain::{now_ms, GpuName},
    extender::{
        binding::{self, claims::ClaimWatcher, Inventory},
        http::ServeOptions,
        placer::AdvisorPlacer,
        ClusterView, ClusterWatcher, Extender, Prefer,
    },
    leader::{Elector, LeaderTasks},
    metrics::{ExtraRoute, Metrics},
    observer::{push::PushSource, Observer, ObserverStats},
    profiler::Backend,
    proto,
    settings::{LeaderSettings, ProfilerDispatch, Settings},
    store::{engine::Engine, lease::fenced, DatabaseLock, Store},
    tokens::Tokens,
    trainer::Trainer,
    worker::{
        kube_jobs::{KubeDispatcher, KubeJobs},
        LeaseSweeper, Worker,
    },
};

pub struct App {
    /// This server's claim on the database file, for as long as it runs: tools that would
    /// write the file behind its back, and a second server, are refused.
    database_lock: DatabaseLock,
    /// Closed last, after every task that writes to it has stopped.
    store: Store,
    listener: TcpListener,
    local_addr: SocketAddr,
    /// The metrics endpoint's listener; `None` when metrics.listen is empty.
    metrics_listener: Option<TcpListener>,
    /// The scheduler extender's listener and how it serves; `None` when extender.listen
    /// is empty.
    extender: Option<(TcpListener, ServeOptions)>,
    /// The one cluster view (the advisor's): the watcher, the agents' reports and
    /// AssignJob feed it; the extender, Place and ListGpus read it.
    cluster: Arc<ClusterView>,
    /// How the extender scores nodes (extender.prefer).
    prefer: Prefer,
    /// The pod and node watcher; `None` unless extender.watch_cluster.
    watcher: Option<ClusterWatcher>,
    /// Every GPU of the cluster, for the binding webhook (extender.binding hami or dra).
    inventory: Arc<Inventory>,
    /// How coloc's choice binds, its GPU count and hold time (extender.binding*).
    binding: binding::BindingOptions,
    /// The client that keeps `inventory` (and under DRA the claims' residencies in
    /// `cluster`); `None` unless binding is on and watch_cluster.
    inventory_client: Option<kube::Client>,
    tls: Option<ServerTlsConfig>,
    tokens: Option<Tokens>,
    max_request_bytes: usize,
    max_concurrent_heavy_rpcs: usize,
    heavy_body_timeout: Option<std::time::Duration>,
    shutdown_grace: Duration,
    advisor: Arc<Advisor>,
    /// The profiling worker; `None` when profiler.backend is "off".
    worker: Option<Worker>,
    /// The retraining task; `None` when trainer.interval_secs is 0.
    trainer: Option<Trainer>,
    /// The observer; `None` unless observer.sources names a source.
    observer: Option<Observer>,
    /// The push source's values, when observer.sources has "push" (served on the metrics
    /// endpoint).
    push: Option<Arc<PushSource>>,
    /// One Kubernetes Job per profiling job; `None` unless profiler.dispatch is
    /// "kubernetes-jobs".
    kube_dispatcher: Option<KubeDispatcher>,
    /// The lease's term and renewal, and how often the store's champions are read.
    leader: LeaderSettings,
}

impl App {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let listen = settings.server.listen;
        let options = advisor_options(settings)?;
        let database_lock = DatabaseLock::acquire(&settings.database.url)?;
        let store = Store::open(&settings.database.url)
            .await
            .map_err(anyhow::Error::new)
            .map_err(|e| explain_damage(e, &settings.database.url))
            .context("cannot open the database")?;
        let advisor = Arc::new(
            Advisor::load(store.clone(), options)
                .await
                .map_err(|e| explain_damage(e, &settings.database.url))
                .context("cannot load profiles and models from the database")?,
        );
        // One server on a SQLite file: the jobs its worker left running when it last stopped
        // are put back before it serves (with replicas on PostgreSQL, each new leader does
        // it before its worker starts: `leader_tasks`).
        if store.engine() == Engine::Sqlite {
            let requeued = store.requeue_running_jobs(now_ms()).await?;
            if requeued > 0 {
                tracing::warn!(
                    requeued,
                    "profiling jobs cut off by the last stop are pending again"
                );
            }
        }
        let backend =
            Backend::from_settings(&settings.profiler).context("cannot set up the profiler")?;
        let worker = match backend {
            Backend::Off => None,
            backend => Some(Worker::new(
                advisor.clone(),
                store.clone(),
                Arc::new(backend),
                settings.profiler.clone(),
            )),
        };
        let kube_dispatcher = kube_dispatcher(settings, &store).await?;
        let trainer = (settings.trainer.interval_secs > 0).then(|| {
            Trainer::new(
                advisor.clone(),
                store.clone(),
                Duration::from_secs(settings.trainer.interval_secs),
            )
        });
        let tokens = match &settings.auth.tokens_file {
            None => None,
            Some(path) => Some(
                Tokens::load(path)
                    .map_err(|e| anyhow::anyhow!("setting auth.tokens_file is invalid: {e}"))?,
            ),
        };
        let tls = grpc_tls(settings)?;
        let metrics_listener = bind_if_set(settings.metrics.listen, "metrics.listen").await?;
        let extender = match bind_if_set(settings.extender.listen, "extender.listen").await? {
            None => None,
            Some(listener) => Some((listener, extender_options(settings, tokens.as_ref())?)),
        };
        let cluster = advisor.cluster().clone();
        cluster.set_stale_after_ms(settings.agents.pod_devices_stale_secs as i64 * 1000);
        let watcher = cluster_watcher(settings, &cluster).await?;
        let binding = binding::BindingOptions::from_settings(&settings.extender);
        let inventory_client = match &watcher {
            Some(_) if binding.mode != crate::settings::BindingMode::NodeOnly => {
                Some(kube::Client::try_default().await.context(
                    "extender.binding needs Kubernetes credentials to watch the GPU inventory",
                )?)
            }
            _ => None,
        };
        let (observer, push) = observer(settings, &advisor, &store, &cluster);
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let local_addr = listener.local_addr()?;
        Ok(Self {
            database_lock,
            store,
            listener,
            local_addr,
            metrics_listener,
            extender,
            cluster,
            prefer: match settings.extender.prefer {
                crate::settings::ExtenderPrefer::Gain => Prefer::Gain,
                crate::settings::ExtenderPrefer::Pack => Prefer::Pack,
                crate::settings::ExtenderPrefer::Spread => Prefer::Spread,
            },
            watcher,
            inventory: Arc::new(Inventory::new()),
            binding,
            inventory_client,
            tls,
            tokens,
            max_request_bytes: settings.server.max_request_bytes,
            max_concurrent_heavy_rpcs: settings.server.max_concurrent_heavy_rpcs,
            heavy_body_timeout: (settings.server.heavy_body_timeout_secs > 0)
                .then(|| std::time::Duration::from_secs(settings.server.heavy_body_timeout_secs)),
            shutdown_grace: Duration::from_secs(settings.server.shutdown_grace_secs),
            advisor,
            worker,
            trainer,
            observer,
            push,
            kube_dispatcher,
            leader: settings.leader.clone(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the metrics endpoint listens, when it is on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Where the scheduler extender listens, when it is on.
    pub fn extender_addr(&self) -> Option<SocketAddr> {
        self.extender
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
    }

    /// What the extender knows of the cluster (embedders and tests may feed it).
    pub fn cluster(&self) -> Arc<ClusterView> {
        self.cluster.clone()
    }

    /// Every GPU the binding webhook decides over (embedders and tests may feed it).
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inventory.clone()
    }

    pub fn advisor(&self) -> Arc<Advisor> {
        self.advisor.clone()
    }

    /// The observer's counts, when it is on.
    pub fn observer_stats(&self) -> Option<Arc<ObserverStats>> {
        self.observer.as_ref().map(Observer::stats)
    }

    /// Replaces the profiling worker the settings asked for (embedders and tests bring
    /// their own backend); it is run and stopped like the built one.
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(worker);
        self
    }

    pub async fn run_until_stopped(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        // The agents' service is SERVING with or without agents: jobs for a GPU model no
        // agent serves wait, and their workloads say so.
        set_writing_services(&health_reporter, tonic_health::ServingStatus::Serving).await;
        let (reflection_v1, reflection_v1alpha) = reflection_services()?;
        let metrics = self
            .metrics_listener
            .as_ref()
            .map(|_| Arc::new(Metrics::new()));
        let background = self.spawn_background_tasks(metrics.clone(), health_reporter.clone());
        // While the store's writes fail, the advisor and agents services say NOT_SERVING (readiness
        // probes that name it take the replica out); the server itself ("") stays SERVING,
        // so liveness does not restart a process that recovers by itself.
        let write_health = spawn_owned(
            "write health",
            follow_write_health(
                self.store.write_health().subscribe(),
                health_reporter.clone(),
                shutdown.clone(),
            ),
        );
        let stopping_reporter = health_reporter.clone();
        tracing::info!(address = %self.local_addr, tls = self.tls.is_some(), auth = self.tokens.is_some(), "serving gRPC");
        // HTTP/2 windows that let heavy calls wait for their permit unread (api's
        // HeavyLimitLayer): a connection opens at most MAX_STREAMS calls at once, each may
        // send STREAM_WINDOW bytes before it is read, and the connection's window is twice
        // what they can hold together, so waiting calls never stall the running ones.
        const MAX_STREAMS: u32 = 256;
        const STREAM_WINDOW: u32 = 128 * 1024;
        let mut builder = Server::builder()
            .max_concurrent_streams(MAX_STREAMS)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(2 * MAX_STREAMS * STREAM_WINDOW)
            .http2_adaptive_window(Some(false));
        if let Some(tls) = self.tls {
            builder = builder
                .tls_config(tls)
                .context("invalid TLS certificate or key")?;
        }
        let advisor_service =
            ColocationAdvisorServer::new(AdvisorService::new(self.advisor.clone()))
                .max_decoding_message_size(self.max_request_bytes);
        let agents_service = ProfilingAgentsServer::new(AgentsService::new(self.advisor.clone()))
            .max_decoding_message_size(self.max_request_bytes);
        let api_shutdown = shutdown.clone();
        let server = builder
            .layer(RpcLayer::new(metrics))
            .layer(AuthLayer::new(self.tokens))
            .layer(HeavyLimitLayer::new(
                self.max_concurrent_heavy_rpcs,
                self.heavy_body_timeout,
            ))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(advisor_service)
            .add_service(agents_service)
            .serve_with_incoming_shutdown(
                TcpIncoming::from(self.listener).with_nodelay(Some(true)),
                async move {
                    api_shutdown.cancelled().await;
                    stop_serving(&stopping_reporter).await;
                    tracing::info!("shutting down: no new requests accepted");
                },
            );
        // In-flight RPCs finish, within the grace period.
        let grace = self.shutdown_grace;
        let served = tokio::select! {
            served = server => served.context("gRPC server failed"),
            _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!(grace_secs = grace.as_secs(), "in-flight RPCs outlived the grace period; closing");
                Ok(())
            }
        };
        match &served {
            Ok(()) => tracing::info!(task = "gRPC API", "task exited"),
            Err(error) => tracing::error!(
                task = "gRPC API",
                error = format!("{error:#}"),
                "task failed"
            ),
        }
        // A failed server still stops everything in order before the store closes.
        shutdown.cancel();
        let _ = write_health.await;
        for (stop, task) in background {
            stop.cancel();
            if let Some(task) = task {
                // The task logged its own exit; its supervisor never panics.
                let _ = task.await;
            }
        }
        self.store.close().await;
        drop(self.database_lock);
        tracing::info!("store closed");
        served?;
        tracing::info!("stopped");
        Ok(())
    }

    /// Starts the tasks beside the gRPC API (those the settings turned on), each with its
    /// own token. They are returned in the order they stop, once the API has stopped, so
    /// that nothing writes to the store after it closes and the running profiling job is
    /// re-queued while the API already refuses new calls.
    fn spawn_background_tasks(
        &mut self,
        metrics: Option<Arc<Metrics>>,
        health: tonic_health::server::HealthReporter,
    ) -> Vec<StoppableTask> {
        let extender = self.extender.take().map(|(listener, mut options)| {
            options.extra_routes = self.binding.routes(
                Arc::new(AdvisorPlacer::new(self.advisor.clone())),
                self.cluster.clone(),
                self.inventory.clone(),
                self.store.pool().clone(),
                &options,
            );
            let mut extender = Extender::new(
                Arc::new(AdvisorPlacer::new(self.advisor.clone())),
                self.cluster.clone(),
            )
            .with_prefer(self.prefer);
            if let Some(metrics) = &metrics {
                extender = extender.with_metrics(metrics.extender());
            }
            let extender = Arc::new(extender);
            move |stop| {
                spawn_owned(
                    "scheduler extender",
                    crate::extender::http::serve(listener, extender, options, stop),
                )
            }
        });
        let watcher = self
            .watcher
            .take()
            .map(|watcher| move |stop| spawn_owned("cluster watcher", watcher.run(stop)));
        let binding_watchers = self.binding_watchers();
        if let (Some(metrics), Some(observer)) = (&metrics, &self.observer) {
            for collector in observer.stats().collectors() {
                if let Err(error) = metrics.register(collector) {
                    tracing::error!(%error, "metrics: the observer's counts cannot be registered");
                }
            }
        }
        let push = self.push.take().map(|push| {
            Arc::new(ExtraRoute {
                path: crate::observer::push::PUSH_PATH,
                max_body_bytes: crate::observer::push::MAX_PUSH_BYTES,
                handle: Box::new(move |body| push.answer(body, now_ms())),
            })
        });
        let leader_tasks = self.leader_tasks();
        let elector = Elector::new(
            self.store.clone(),
            crate::leader::holder_name(),
            (&self.leader).into(),
            leader_tasks,
        );
        if let Some(metrics) = &metrics {
            for collector in elector.collectors() {
                if let Err(error) = metrics.register(collector) {
                    tracing::error!(%error, "metrics: the leadership gauges cannot be registered");
                }
            }
        }
        let follower = {
            let (advisor, every) = (
                self.advisor.clone(),
                Duration::from_millis(self.leader.model_poll_ms),
            );
            move |stop| {
                spawn_owned(
                    "champion follower",
                    crate::leader::follow::run(advisor, every, health, stop),
                )
            }
        };
        let metrics_server =
            self.metrics_listener
                .take()
                .zip(metrics)
                .map(|(listener, metrics)| {
                    let (advisor, store) = (self.advisor.clone(), self.store.clone());
                    move |stop| {
                        spawn_owned(
                            "metrics endpoint",
                            crate::metrics::serve(listener, metrics, advisor, store, push, stop),
                        )
                    }
                });
        let mut tasks = vec![stoppable(extender), stoppable(watcher)];
        tasks.extend(binding_watchers);
        tasks.extend([
            stoppable(Some(move |stop| {
                spawn_owned("leadership", elector.run(stop))
            })),
            stoppable(Some(follower)),
            stoppable(metrics_server),
        ]);
        tasks
    }

    /// The binding webhook's watchers, when binding is on and the cluster is watched: the
    /// GPU inventory (HAMi's node annotation or the DRA driver's ResourceSlices) and under
    /// DRA the ResourceClaims (where DRA pods run), on one client.
    fn binding_watchers(&mut self) -> Vec<StoppableTask> {
        let Some(client) = self.inventory_client.take() else {
            return Vec::new();
        };
        let dra = self.binding.mode == crate::settings::BindingMode::Dra;
        let claims = dra.then(|| {
            let claims =
                ClaimWatcher::new(client.clone(), self.inventory.clone(), self.cluster.clone());
            move |stop| spawn_owned("resource claim watcher", claims.run(stop))
        });
        let inventory = self.inventory.clone();
        vec![
            stoppable(Some(move |stop| {
                spawn_owned("gpu inventory watcher", inventory.run(client, dra, stop))
            })),
            stoppable(claims),
        ]
    }

    /// What the leader runs, started anew at each term (each task inside the term's fence,
    /// so that its writes are refused once the lease is lost), in the order they stop: the
    /// profiling worker (after it puts back the jobs a former leader's worker left
    /// running), the Kubernetes Job dispatcher, the lease sweeper, the observer, the
    /// retraining task.
    fn leader_tasks(&mut self) -> LeaderTasks {
        let worker = self.worker.take();
        let kube_dispatcher = self.kube_dispatcher.take();
        let trainer = self.trainer.take();
        let observer = self.observer.take();
        let sweeper = LeaseSweeper::new(self.advisor.clone());
        let store = self.store.clone();
        // On SQLite the one server put them back before it served (`App::build`); a later
        // term there must not take back a job claimed in process meanwhile.
        let shared = store.engine() == Engine::Postgres;
        Arc::new(move |fence| {
            let worker = worker.as_ref().map(|worker| {
                let (worker, store, fence) = (worker.fresh(), store.clone(), fence.clone());
                move |stop| {
                    spawn_owned(
                        "profiling worker",
                        fenced(fence, async move {
                            if shared {
                                requeue_cut_off_jobs(&store).await;
                            }
                            worker.run(stop).await
                        }),
                    )
                }
            });
            let kube_dispatcher = kube_dispatcher.clone().map(|dispatcher| {
                let fence = fence.clone();
                move |stop| {
                    spawn_owned(
                        "kubernetes job dispatcher",
                        fenced(fence, dispatcher.run(stop)),
                    )
                }
            });
            // Jobs whose agent stopped renewing go back to the queue without waiting for
            // a claim.
            // Without a worker here, the sweeper puts the cut-off jobs back.
            let requeue_here = shared && worker.is_none();
            let sweeper = {
                let (sweeper, fence, store) = (sweeper.clone(), fence.clone(), store.clone());
                move |stop| {
                    spawn_owned(
                        "lease sweeper",
                        fenced(fence, async move {
                            if requeue_here {
                                requeue_cut_off_jobs(&store).await;
                            }
                            sweeper.run(stop).await
                        }),
                    )
                }
            };
            let trainer = trainer.clone().map(|trainer| {
                let fence = fence.clone();
                move |stop| spawn_owned("retraining task", fenced(fence, trainer.run(stop)))
            });
            // The observer forms runs from what the cluster ran: one replica only, so
            // that a window is read once (its key also makes a second reading a no-op).
            let observer = observer.clone().map(|observer| {
                let fence = fence.clone();
                move |stop| spawn_owned("observer", fenced(fence, observer.run(stop)))
            });
            vec![
                stoppable(worker),
                stoppable(kube_dispatcher),
                stoppable(Some(sweeper)),
                stoppable(observer),
                stoppable(trainer),
            ]
        })
    }
}

/// A listener on `address` when the setting `key` names one.
async fn bind_if_set(
    address: Option<SocketAddr>,
    key: &str,
) -> anyhow::Result<Option<TcpListener>> {
    let Some(address) = address else {
        return Ok(None);
    };
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address} ({key})"))?;
    Ok(Some(listener))
}

/// The pod and node watcher that keeps `cluster`, when extender.watch_cluster is on.
/// The Kubernetes Job dispatcher, when profiler.dispatch is "kubernetes-jobs": its GPU
/// models are profiler.kubernetes.gpus, else model.default_gpu.
async fn kube_dispatcher(
    settings: &Settings,
    store: &Store,
) -> anyhow::Result<Option<KubeDispatcher>> {
    if settings.profiler.dispatch != ProfilerDispatch::KubernetesJobs {
        return Ok(None);
    }
    let jobs = &settings.profiler.kubernetes;
    let names: Vec<&String> = if jobs.gpus.is_empty() {
        settings.model.default_gpu.iter().collect()
    } else {
        jobs.gpus.iter().collect()
    };
    let gpus = names
        .into_iter()
        .map(|name| GpuName::parse("profiler.kubernetes.gpus", name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!(e.message))?;
    if gpus.is_empty() {
        anyhow::bail!(
            "profiler.dispatch = \"kubernetes-jobs\" needs the GPU models the cluster has: \
             set profiler.kubernetes.gpus (or model.default_gpu)"
        );
    }
    let client = kube::Client::try_default().await.context(
        "profiler.dispatch = \"kubernetes-jobs\" but no Kubernetes credentials were found \
         (in-cluster service account or kubeconfig)",
    )?;
    Ok(Some(KubeDispatcher::new(
        KubeJobs::new(client, jobs.clone(), settings.profiler.max_attempts),
        store.clone(),
        gpus,
        (settings.agents.lease_secs * 1000) as i64,
        settings.profiler.max_attempts,
        Duration::from_secs(settings.profiler.retry_backoff_secs),
    )))
}

async fn cluster_watcher(
    settings: &Settings,
    cluster: &Arc<ClusterView>,
) -> anyhow::Result<Option<ClusterWatcher>> {
    if !settings.extender.watch_cluster {
        return Ok(None);
    }
    let client = kube::Client::try_default().await.context(
        "extender.watch_cluster is on but no Kubernetes credentials were found \
         (in-cluster service account or kubeconfig)",
    )?;
    let namespace = Some(settings.extender.watch_namespace.clone()).filter(|n| !n.is_empty());
    Ok(Some(ClusterWatcher::new(
        client,
        namespace,
        cluster.clone(),
    )))
}

/// The observer and its push buffer, as observer.sources asks.
fn observer(
    settings: &Settings,
    advisor: &Arc<Advisor>,
    store: &Store,
    cluster: &Arc<ClusterView>,
) -> (Option<Observer>, Option<Arc<PushSource>>) {
    let observer = &settings.observer;
    if observer.sources.is_empty() {
        return (None, None);
    }
    let push = observer
        .sources
        .contains(&crate::settings::ThroughputSourceKind::Push)
        .then(|| Arc::new(PushSource::new(observer.push.clone())));
    let built = Observer::from_settings(
        advisor.clone(),
        store.clone(),
        cluster.clone(),
        observer,
        push.clone(),
    );
    (Some(built), push)
}

/// Profiling jobs the in-process worker of a former leader (this server's last run, or a
/// replica that lost the lease) left running go back to the queue, before this leader's
/// worker claims any.
async fn requeue_cut_off_jobs(store: &Store) {
    match store.requeue_running_jobs(now_ms()).await {
        Ok(0) => {}
        Ok(requeued) => tracing::warn!(
            requeued,
            "profiling jobs cut off by the last stop are pending again"
        ),
        Err(error) => tracing::warn!(
            error = error.chain(),
            "cannot put back the profiling jobs cut off by the last stop"
        ),
    }
}

/// A background task (if it runs) and the token that stops it.
pub type StoppableTask = (CancellationToken, Option<tokio::task::JoinHandle<()>>);

/// Starts `start` (when given) with a fresh stop token.
fn stoppable(
    start: Option<impl FnOnce(CancellationToken) -> tokio::task::JoinHandle<()>>,
) -> StoppableTask {
    let stop = CancellationToken::new();
    let task = start.map(|start| start(stop.clone()));
    (stop, task)
}

/// Both reflection versions (grpcurl 1.8.6 speaks only v1alpha), each describing every
/// service served, health and reflection included.
fn reflection_services() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
    };
    Ok((reflection().build_v1()?, reflection().build_v1alpha()?))
}

/// SQLite maps the database's `-shm` file (the WAL index) into memory. When a write to
/// that mapping cannot be backed (the file was made immutable: ext4 refuses the page
/// write; or its tmpfs is full), the kernel stops the process with SIGBUS, which by
/// default leaves no trace. This handler writes one line to stderr first, then the
/// default action (the process ends) follows: nothing can be stored safely anymore, and a
/// supervisor restarts the service once the file is writable again.
pub fn note_fatal_storage_signals() {
    extern "C" fn on_sigbus(_: nix::libc::c_int) {
        const NOTE: &[u8] = b"coloc: fatal: SIGBUS: a memory-mapped database file (the -shm \
WAL index) could not be written (made immutable, or its file system is full); stopping\n";
        // SAFETY: write(2) is async-signal-safe; the buffer is static.
        unsafe {
            nix::libc::write(2, NOTE.as_ptr().cast(), NOTE.len());
        }
    }
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    // SA_RESETHAND: the handler runs once; the faulting write runs again and the default
    // action ends the process.
    let action = SigAction::new(
        SigHandler::Handler(on_sigbus),
        SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    // SAFETY: the handler only calls write(2).
    if let Err(error) = unsafe { sigaction(Signal::SIGBUS, &action) } {
        tracing::warn!(%error, "cannot install the SIGBUS note");
    }
}

/// Says what to do when the database file is damaged, instead of only a decoder's text
/// (e.g. "invalid utf-8 ... column parameters").
fn explain_damage(error: anyhow::Error, url: &str) -> anyhow::Error {
    if !crate::store::is_corruption(&error) {
        return error;
    }
    error.context(format!(
        "the database file ({url}) is damaged: check it with `sqlite3 FILE 'PRAGMA \
         integrity_check'` and restore the last backup (`coloc backup`; deploy/README.md, \"Backups\") if \
         it reports errors"
    ))
}

/// Spawns a background task owned by the caller (who awaits the handle) and logs its exit
/// when it happens: a normal exit, or a panic with its message.
fn spawn_owned<F>(name: &'static str, task: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let inner = tokio::spawn(task);
    tokio::spawn(async move {
        match inner.await {
            Ok(()) => tracing::info!(task = name, "task exited"),
            Err(error) if error.is_panic() => {
                tracing::error!(task = name, %error, "task panicked")
            }
            Err(error) => tracing::warn!(task = name, %error, "task cancelled"),
        }
    })
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

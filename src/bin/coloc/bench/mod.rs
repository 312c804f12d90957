//! `coloc bench`: the load generator. It starts the server in-process on a loopback port
//! (or, on PostgreSQL, `--replicas` servers sharing the database, as child `coloc serve`
//! processes with `--replica-processes`, the clients' connections
//! spread over them round-robin, each serving the trained model before anything is
//! measured) with a synthetic store (W workloads with profiles drawn from the KACE V100 metric
//! ranges, runs of random pairs, and of three and four with `--crowded-share`, a model
//! trained through the Train RPC), or drives a
//! running server (`--addr`), and measures each scenario with C concurrent clients for T
//! seconds: Health/Check (the floor any RPC pays on this machine, in the same run), Rank
//! over N named candidates, Rank over every workload, ReportColocation, and Rank on the
//! Python comparison peer (benches/peer/) trained on the same data, Place over a cluster of
//! N GPUs sent with the request (`place_N`) or kept by the server (`place_stored_N`), and
//! AssignJob/ReleaseJob (`occupancy`), and Rank's transport floor (`echo_rank_N`: a
//! bench-only echo service answering a real rank_N answer's bytes). It reports RPC/s,
//! latency percentiles (hdrhistogram), CPU used and the ratios to Health/Check and, for
//! rank_N, to echo_rank_N.
//!
//! A tool beside the service, not part of it: a module of the `coloc` binary that the
//! service's library never compiles. Its parts: `synthetic` (the store), `cluster` (the
//! GPUs and jobs of the Place scenarios), `echo` (the echo floor), `scenario` (the
//! clients and their calls), `peer` (the Python comparison), `process` (CPU and memory of
//! a process), `report` (tables, JSON, ratios).

mod cluster;
mod echo;
mod peer;
mod process;
mod report;
mod scenario;
mod synthetic;

use std::{
    path::Path,
    sync::{atomic::AtomicI64, Arc},
    time::Instant,
};

use anyhow::{bail, Context};

use crate::args::BenchArgs;
use coloc::{
    proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient},
    settings::{Settings, SettingsSources},
    startup::App,
    store::Store,
};

use echo::EchoFloors;
use peer::start_peer;
use process::{peak_rss_mb, rss_mb};
use report::{print_report, Report};
use scenario::{
    connect, connect_spread, connect_when_ready, rank_pool, rank_pool_with, run_scenario,
    server_names, wait_until_serving, Call,
};
use synthetic::{seed_store, synthetic, Synthetic};

const GPU: &str = "bench-gpu-80GB";
const GPU_MEMORY_GB: f64 = 80.0;
/// Pre-built requests per Rank scenario, cycled through by the clients.
const REQUEST_POOL: usize = 64;

/// A server the bench started: in its own process (`--replica-processes`), or in the
/// bench's, with its task and the token that stops it.
enum Server {
    InProcess(
        tokio::task::JoinHandle<anyhow::Result<()>>,
        tokio_util::sync::CancellationToken,
    ),
    Process(tokio::process::Child),
}

impl Server {
    async fn stop(self) -> anyhow::Result<()> {
        match self {
            Server::InProcess(task, stop) => {
                stop.cancel();
                task.await?
            }
            Server::Process(mut child) => {
                if let Some(pid) = child.id() {
                    let pid = nix::unistd::Pid::from_raw(pid as i32);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                }
                let waited = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait());
                match waited.await {
                    Ok(status) => {
                        let status = status?;
                        if !status.success() {
                            bail!("a replica process ended with {status}");
                        }
                    }
                    Err(_) => child.kill().await?,
                }
                Ok(())
            }
        }
    }
}

/// `coloc serve` as a child process on a free loopback port, with the bench's overrides as
/// environment variables; returns once it accepts connections (60 s at most).
async fn spawn_replica(overrides: &[(&str, String)]) -> anyhow::Result<(String, Server)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    for (key, value) in overrides {
        if *key != "server.listen" {
            let variable = format!("COLOC__{}", key.to_uppercase().replace('.', "__"));
            command.env(variable, value);
        }
    }
    let mut child = command.spawn().context("starting a replica process")?;
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if let Some(status) = child.try_wait()? {
            bail!("a replica process exited at start ({status})");
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            bail!("a replica process did not listen within 60 s");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok((format!("http://127.0.0.1:{port}"), Server::Process(child)))
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.replicas > 1 && args.postgres.is_none() {
        bail!("--replicas above 1 needs --postgres: a SQLite file serves one server");
    }
    let mut report = Report::default();
    let setup = &mut report.setup;
    let mut setup = |key: &str, value: serde_json::Value| {
        setup.insert(key.into(), value);
    };
    setup("cpus", std::thread::available_parallelism()?.get().into());
    setup("concurrency", args.concurrency.into());
    setup("seconds_per_scenario", args.duration.into());
    setup("rank_top_k", args.top_k.into());

    let scratch = tempfile::tempdir()?;
    let mut servers = Vec::new();
    let mut data = None;
    let (addrs, names) = match &args.addr {
        Some(addr) => {
            let channel = connect(addr, 1).await?.remove(0);
            (vec![addr.clone()], server_names(channel).await?)
        }
        None => {
            let (addrs, names, started, synthetic) =
                start_in_process(&args, scratch.path(), &mut setup).await?;
            servers = started;
            data = Some(synthetic);
            (addrs, names)
        }
    };
    if names.is_empty() {
        bail!("the server has no workloads to rank");
    }
    let channels = connect_spread(&addrs, args.connections).await?;
    setup("connections", channels.len().into());
    if !servers.is_empty() {
        train_and_wait(&channels, addrs.len(), &names, &args, &mut setup).await?;
    }

    let names = Arc::new(names);
    let peer = match (&args.peer_python, &data) {
        (Some(python), Some(data)) => Some(start_peer(&args, python, data)?),
        (Some(_), None) => bail!("the peer runs only with the in-process server (no --addr)"),
        _ => None,
    };
    let peer_channels = match &peer {
        Some(peer) => Some(connect_when_ready(&peer.addr, args.connections).await?),
        None => None,
    };
    let clock = Arc::new(AtomicI64::new(1_700_000_000_000));
    if args.json {
        coloc::progress::hide();
    }
    let mut echoes = EchoFloors::default();
    let progress = coloc::progress::bar(args.scenarios.len() as u64, "scenarios");
    for scenario in &args.scenarios {
        progress.inc(1);
        let (on_peer, name) = match scenario.strip_prefix("peer_") {
            Some(rest) => (true, rest),
            None => (false, scenario.as_str()),
        };
        let call = scenario_call(scenario, name, &names, &clock, &args, &channels).await?;
        let (target, pid) = match (&call, on_peer, &peer_channels, &peer) {
            (Call::EchoRank(pool), false, _, _) => {
                let n = pool_size(name);
                let echo = echoes.channels(n, pool, &channels[0], args.connections, &mut setup);
                (echo.await?, None)
            }
            (_, false, _, _) => (channels.clone(), None),
            (_, true, Some(channels), Some(peer)) => (channels.clone(), Some(peer.child.id())),
            _ => bail!("scenario {scenario:?} needs --peer-python"),
        };
        if !progress.is_hidden() {
            progress.set_message(scenario.clone());
        } else if !args.json {
            eprintln!(
                "running {scenario} for {:.0} s ...",
                args.warmup + args.duration
            );
        }
        let result = run_scenario(&target, call, &args, pid).await?;
        report.scenarios.insert(scenario.clone(), result);
    }
    progress.finish_and_clear();
    drop(peer);
    echoes.stop().await?;
    drop(channels);
    for server in servers {
        server.stop().await?;
    }
    print_report(&report, &args)
}

/// N of a scenario named `..._N` (0 when it names none).
fn pool_size(name: &str) -> usize {
    name.rsplit('_')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Trains the in-process servers' model through the Train RPC (on the first replica) and
/// waits until every replica serves it: `channels` holds at least one connection to each
/// of the `replicas` servers, the first to the first, and so on.
async fn train_and_wait(
    channels: &[tonic::transport::Channel],
    replicas: usize,
    names: &[String],
    args: &BenchArgs,
    setup: &mut impl FnMut(&str, serde_json::Value),
) -> anyhow::Result<()> {
    let mut client = ColocationAdvisorClient::new(channels[0].clone());
    let started = Instant::now();
    let trained = client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .context("training the synthetic store's model")?
        .into_inner();
    setup("train_s", started.elapsed().as_secs_f64().into());
    setup("model_version", trained.champion_version.into());
    if let Some(model) = &trained.model {
        setup("train_observations", model.observations.into());
    }
    setup("rss_after_training_mb", rss_mb().into());
    setup("peak_rss_mb", peak_rss_mb().into());
    let probe = rank_pool(names, Some(10), args.top_k, args.seed).remove(0);
    let started = Instant::now();
    for channel in &channels[..replicas] {
        wait_until_serving(channel, trained.champion_version, &probe).await?;
    }
    setup("replicas_serving_s", started.elapsed().as_secs_f64().into());
    Ok(())
}

/// The in-process servers of `coloc bench` without `--addr`: the synthetic store seeded
/// (unless `--database` names one that exists) and `--replicas` servers started on it,
/// each on a loopback port of its own. Returns their addresses, the workloads' names, the
/// servers' tasks and stop tokens, and the synthetic data (the peer is trained on it).
async fn start_in_process(
    args: &BenchArgs,
    scratch: &Path,
    setup: &mut impl FnMut(&str, serde_json::Value),
) -> anyhow::Result<(Vec<String>, Vec<String>, Vec<Server>, Synthetic)> {
    let path = match &args.database {
        Some(path) => path.clone(),
        None => scratch.join("bench.db"),
    };
    let synthetic = synthetic(
        args.workloads,
        args.observations,
        args.crowded_share,
        args.seed,
    )?;
    let (url, seeded) = match &args.postgres {
        Some(url) => {
            let store = Store::open(url).await?;
            let seeded = !store.gpus().await?.is_empty();
            store.close().await;
            (url.clone(), seeded)
        }
        None => (format!("sqlite://{}", path.display()), path.exists()),
    };
    let engine = if args.postgres.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    setup("store", engine.into());
    if !seeded {
        let started = Instant::now();
        let store = Store::open(&url).await?;
        let how = seed_store(&store, &url, &synthetic).await?;
        store.close().await;
        setup("seed_s", started.elapsed().as_secs_f64().into());
        setup("seed_runs_by", how.into());
    }
    setup("workloads", args.workloads.into());
    setup("observations", args.observations.into());
    setup("crowded_share", args.crowded_share.into());
    setup("replicas", args.replicas.into());
    let overrides: Vec<(&str, String)> = vec![
        ("server.listen", "127.0.0.1:0".into()),
        ("metrics.listen", String::new()),
        ("database.url", url),
        ("profiler.backend", "off".into()),
        ("trainer.interval_secs", "0".into()),
        ("server.max_request_bytes", (64u64 << 20).to_string()),
    ]
    .into_iter()
    .chain(
        args.max_training_runs
            .map(|runs| ("trainer.max_training_runs", runs.to_string())),
    )
    .collect();
    let settings = Settings::load(SettingsSources {
        file: None,
        environment: Some(Default::default()),
        overrides: overrides.clone(),
    })?;
    setup(
        "max_training_runs",
        settings.trainer.max_training_runs.into(),
    );
    let (mut addrs, mut servers) = (Vec::new(), Vec::new());
    let started = Instant::now();
    setup("replica_processes", args.replica_processes.into());
    for _ in 0..args.replicas {
        if args.replica_processes {
            let (addr, server) = spawn_replica(&overrides).await?;
            addrs.push(addr);
            servers.push(server);
            continue;
        }
        let app = App::build(&settings).await?;
        addrs.push(format!("http://{}", app.local_addr()));
        let stop = tokio_util::sync::CancellationToken::new();
        servers.push(Server::InProcess(
            tokio::spawn(app.run_until_stopped(stop.clone())),
            stop,
        ));
    }
    setup("startup_s", started.elapsed().as_secs_f64().into());
    setup("rss_after_startup_mb", rss_mb().into());
    let names = synthetic.names.iter().map(|n| n.to_string()).collect();
    Ok((addrs, names, servers, synthetic))
}

/// The calls scenario `scenario` (`name` without its `peer_` prefix) makes; a
/// `place_stored_N` scenario first puts its cluster into the server's occupancy.
async fn scenario_call(
    scenario: &str,
    name: &str,
    names: &Arc<Vec<String>>,
    clock: &Arc<AtomicI64>,
    args: &BenchArgs,
    channels: &[tonic::transport::Channel],
) -> anyhow::Result<Call> {
    Ok(match name {
        "health" => Call::Health,
        "report" => Call::Report {
            names: names.clone(),
            clock: clock.clone(),
        },
        "rank_all" => Call::Rank(Arc::new(rank_pool(names, None, 10, args.seed))),
        "occupancy" => Call::Occupancy {
            names: names.clone(),
            jobs: Arc::new(AtomicI64::new(0)),
        },
        _ => {
            let size = |prefix: &str| name.strip_prefix(prefix).and_then(|n| n.parse().ok());
            if let Some(n) = size("echo_rank_") {
                Call::EchoRank(Arc::new(rank_pool(names, Some(n), args.top_k, args.seed)))
            } else if let Some(n) = size("rank_cautious_") {
                Call::Rank(Arc::new(rank_pool_with(
                    names,
                    Some(n),
                    args.top_k,
                    args.seed,
                    true,
                )))
            } else if let Some(n) = size("rank_") {
                Call::Rank(Arc::new(rank_pool(names, Some(n), args.top_k, args.seed)))
            } else if let Some(n) = size("place_stored_") {
                let gpus = cluster::cluster(names, n, args.seed);
                store_cluster(channels, &gpus).await?;
                Call::Place(Arc::new(cluster::place_pool(names, &[], args.seed)))
            } else if let Some(n) = size("place_") {
                let gpus = cluster::cluster(names, n, args.seed);
                Call::Place(Arc::new(cluster::place_pool(names, &gpus, args.seed)))
            } else {
                bail!("unknown scenario {scenario:?}")
            }
        }
    })
}

/// Puts the cluster's jobs into the server's occupancy (AssignJob, 64 at a time), before a
/// `place_stored_N` scenario is measured.
async fn store_cluster(
    channels: &[tonic::transport::Channel],
    gpus: &[pb::GpuState],
) -> anyhow::Result<()> {
    let assignments = cluster::assignments(gpus);
    for chunk in assignments.chunks(64) {
        let mut calls = tokio::task::JoinSet::new();
        for (i, request) in chunk.iter().cloned().enumerate() {
            let mut client = ColocationAdvisorClient::new(channels[i % channels.len()].clone());
            calls.spawn(async move { client.assign_job(request).await });
        }
        while let Some(answer) = calls.join_next().await {
            answer?.context("assigning the cluster's jobs")?;
        }
    }
    Ok(())
}

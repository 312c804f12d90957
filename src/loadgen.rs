//! `coloc bench`: the load generator. It starts the server in-process on a loopback port
//! with a synthetic store (W workloads with profiles drawn from the KACE V100 metric
//! ranges, runs of random pairs, a model trained through the Train RPC), or drives a
//! running server (`--addr`), and measures each scenario with C concurrent clients for T
//! seconds: Health/Check (the floor any RPC pays on this machine, in the same run), Rank
//! over N named candidates, Rank over every workload, ReportColocation, and Rank on the
//! Python comparison peer (benches/peer/) trained on the same data. It reports RPC/s,
//! latency percentiles (hdrhistogram), CPU used and the ratios to Health/Check.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    marker::PhantomData,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use bytes::{BufMut, Bytes};
use clap::Args;
use hdrhistogram::Histogram;
use prost::Message;
use rand::{rngs::StdRng, seq::index::sample, Rng, SeedableRng};
use serde::Serialize;
use tonic::{
    codec::{Codec, EncodeBuf, Encoder},
    transport::{Channel, Endpoint},
    Status,
};
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use tonic_prost::ProstCodec;

use crate::{
    domain::{
        ColocatedMember, GpuName, KernelMetrics, NewWorkload, Observation, Profile, ProfileSource,
        SystemMetrics, WorkloadMode, WorkloadName,
    },
    proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient},
    settings::{Settings, SettingsSources},
    startup::App,
    store::{ObservationSource, Store},
};

const GPU: &str = "bench-gpu-80GB";
const GPU_MEMORY_GB: f64 = 80.0;
/// Pre-built requests per Rank scenario, cycled through by the clients.
const REQUEST_POOL: usize = 64;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Drive this running server instead of an in-process one (its profiled workloads are
    /// listed and used; no peer, no scale figures).
    #[arg(long)]
    addr: Option<String>,
    /// Synthetic store: workloads (all profiled on one GPU model).
    #[arg(long, default_value_t = 1_000)]
    workloads: usize,
    /// Synthetic store: colocated runs of random pairs (the training data).
    #[arg(long, default_value_t = 2_000)]
    observations: usize,
    /// Keep the synthetic store in this SQLite file; an existing file is used as it is.
    #[arg(long)]
    database: Option<PathBuf>,
    /// Concurrent clients.
    #[arg(long, short = 'c', default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the clients share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Seconds measured per scenario.
    #[arg(long, short = 't', default_value_t = 5.0)]
    duration: f64,
    /// Seconds of load before measuring, per scenario.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Scenarios, in order: health, rank_N (N named candidates), rank_all (every
    /// workload, top 10), report, peer_rank_N (needs --peer-python).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "health,rank_100,rank_1000,report"
    )]
    scenarios: Vec<String>,
    /// top_k of the rank_N scenarios (0 = every candidate in the answer).
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Python with benches/peer/requirements.txt installed: also run the peer's Rank.
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// The peer's server script and the proto directory it compiles.
    #[arg(long, default_value = "benches/peer/server.py")]
    peer_script: PathBuf,
    #[arg(long, default_value = "proto")]
    proto_dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// CPU time per wall second of the server's process (client included in-process).
    pub cpu_cores: f64,
    pub errors: u64,
}

/// What `coloc bench` prints: setup figures, then one entry per scenario.
#[derive(Debug, Default, Serialize)]
struct Report {
    setup: BTreeMap<String, serde_json::Value>,
    #[serde(flatten)]
    scenarios: BTreeMap<String, ScenarioResult>,
}

/// The synthetic store's content, kept to train the peer on the same data.
struct Synthetic {
    names: Vec<WorkloadName>,
    profiles: Vec<Profile>,
    runs: Vec<Observation>,
}

/// Per metric: (min, max, log scale) over the KACE V100 workloads.
const METRIC_RANGES: [(f64, f64, bool); 10] = [
    (3.6e4, 1.16e7, true), // threads
    (15.6, 80.6, false),   // compute_throughput_pct
    (9.0, 84.6, false),    // dram_throughput_pct
    (40.2, 85.0, false),   // memory_throughput_pct
    (3.1e6, 1.98e8, true), // registers
    (180.0, 7.4e4, true),  // static_shared_memory_bytes
    (1.7, 126.2, true),    // exclusive_throughput
    (17.5, 97.5, false),   // sm_busy_pct
    (3.4, 47.9, false),    // mem_busy_pct
    (1.2, 21.5, false),    // memory_gb
];

fn draw(rng: &mut StdRng, (lo, hi, log): (f64, f64, bool)) -> f64 {
    if log {
        (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
    } else {
        lo + rng.random::<f64>() * (hi - lo)
    }
}

fn synthetic(workloads: usize, runs: usize, seed: u64) -> anyhow::Result<Synthetic> {
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = GpuName::parse("gpu", GPU)?;
    let names: Vec<WorkloadName> = (0..workloads)
        .map(|i| WorkloadName::parse("name", &format!("w{i:06}")))
        .collect::<Result<_, _>>()?;
    let profiles: Vec<Profile> = (0..workloads)
        .map(|_| {
            let m: Vec<f64> = METRIC_RANGES.iter().map(|&r| draw(&mut rng, r)).collect();
            Profile {
                gpu: gpu.clone(),
                kernel: KernelMetrics {
                    threads: m[0],
                    compute_throughput_pct: m[1],
                    dram_throughput_pct: m[2],
                    memory_throughput_pct: m[3],
                    registers: m[4],
                    static_shared_memory_bytes: m[5],
                },
                system: SystemMetrics {
                    exclusive_throughput: m[6],
                    throughput_unit: "samples/s".into(),
                    sm_busy_pct: m[7],
                    mem_busy_pct: m[8],
                    memory_gb: m[9],
                },
                source: ProfileSource::ClientSupplied,
                gpu_memory_gb: Some(GPU_MEMORY_GB),
                measured_at_ms: 0,
                kernel_missing: false,
            }
        })
        .collect();
    // Each member keeps less of its throughput the busier the pair keeps the SMs and the
    // memory system, with 3 % noise.
    let kept = |own: &Profile, other: &Profile, rng: &mut StdRng| {
        let sm = (own.system.sm_busy_pct + other.system.sm_busy_pct) / 100.0;
        let mem = (own.system.mem_busy_pct + other.system.mem_busy_pct) / 100.0;
        (1.15 - 0.35 * sm - 0.3 * mem + 0.03 * (rng.random::<f64>() - 0.5)).clamp(0.15, 1.0)
    };
    let runs = (0..runs)
        .map(|i| {
            let (a, b) = (
                rng.random_range(0..workloads),
                rng.random_range(0..workloads),
            );
            let (pa, pb) = (&profiles[a], &profiles[b]);
            let members = vec![
                ColocatedMember {
                    workload: names[a].clone(),
                    throughput: pa.system.exclusive_throughput * kept(pa, pb, &mut rng),
                    job_id: String::new(),
                },
                ColocatedMember {
                    workload: names[b].clone(),
                    throughput: pb.system.exclusive_throughput * kept(pb, pa, &mut rng),
                    job_id: String::new(),
                },
            ];
            Ok(Observation::new(gpu.clone(), members, 1 + i as i64)?)
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Synthetic {
        names,
        profiles,
        runs,
    })
}

async fn seed_store(store: &Store, data: &Synthetic) -> anyhow::Result<()> {
    let workloads: Vec<NewWorkload> = data
        .names
        .iter()
        .zip(&data.profiles)
        .map(|(name, profile)| NewWorkload {
            name: name.clone(),
            mode: WorkloadMode::Training,
            model: String::new(),
            batch_size: 0,
            labels: Default::default(),
            profile: Some(profile.clone()),
            launch: None,
        })
        .collect();
    store.register_workloads(&workloads, 0).await?;
    for chunk in data.runs.chunks(20_000) {
        store
            .insert_observations(chunk, ObservationSource::Reported, 0)
            .await?;
    }
    Ok(())
}

fn rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds (user + system) used so far by a process (`None` = this one).
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".into(),
    };
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    std::fs::read_to_string(path)
        .ok()
        .and_then(|stat| {
            // Fields after the command name (which may hold spaces) start at field 3.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .unwrap_or(0.0)
}

/// The Python comparison peer, stopped when dropped.
struct Peer {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn start_peer(args: &BenchArgs, python: &Path, data: &Synthetic) -> anyhow::Result<Peer> {
    let dir = tempfile::tempdir()?;
    let profiles = dir.path().join("profiles.csv");
    let mut out = csv::Writer::from_path(&profiles)?;
    let mut header = vec!["workload"];
    header.extend(crate::model::FEATURE_NAMES);
    out.write_record(&header)?;
    for (name, p) in data.names.iter().zip(&data.profiles) {
        let f = crate::model::Features::of(p);
        let mut row = vec![name.to_string()];
        row.extend(f.0.iter().map(|v| format!("{v:?}")));
        out.write_record(&row)?;
    }
    out.flush()?;
    let observations = dir.path().join("observations.csv");
    let mut out = csv::Writer::from_path(&observations)?;
    out.write_record(["workload_a", "workload_b", "throughput_sum"])?;
    for run in &data.runs {
        out.write_record([
            run.members[0].workload.to_string(),
            run.members[1].workload.to_string(),
            format!("{:?}", run.throughput_sum()),
        ])?;
    }
    out.flush()?;
    let mut child = Command::new(python)
        .arg(&args.peer_script)
        .arg("--proto-dir")
        .arg(&args.proto_dir)
        .arg("--profiles")
        .arg(&profiles)
        .arg("--observations")
        .arg(&observations)
        .args(["--port", "0", "--gpu-memory-gb", &GPU_MEMORY_GB.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start the peer with {}", python.display()))?;
    let stdout = child.stdout.take().context("the peer's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening on ") else {
        let _ = child.kill();
        bail!("the peer did not start (its first line: {line:?})");
    };
    Ok(Peer {
        addr: format!("http://{addr}"),
        child,
        _dir: dir,
    })
}

/// Requests encoded once, sent through tonic's client as they are; answers decoded in full
/// as a scheduler would. Building and encoding 1 000 names per call would cost the load
/// generator more CPU than the server spends on the request, on the same cores, and the
/// Health/Check floor pays no such cost.
struct PreEncoded<U>(PhantomData<U>);

impl<U> Default for PreEncoded<U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl<U: Message + Default + Send + 'static> Codec for PreEncoded<U> {
    type Encode = Bytes;
    type Decode = U;
    type Encoder = BytesEncoder;
    type Decoder = <ProstCodec<U, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<U, U>::default().decoder()
    }
}

const RANK_PATH: &str = "/coloc.v1.ColocationAdvisor/Rank";

/// What one scenario sends.
#[derive(Clone)]
enum Call {
    Health,
    /// Encoded `RankRequest`s.
    Rank(Arc<Vec<Bytes>>),
    Report {
        names: Arc<Vec<String>>,
        clock: Arc<AtomicI64>,
    },
}

async fn run_scenario(
    channels: &[Channel],
    call: Call,
    args: &BenchArgs,
    peer_pid: Option<u32>,
) -> anyhow::Result<ScenarioResult> {
    let warmup = Duration::from_secs_f64(args.warmup);
    let measure = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = Vec::with_capacity(args.concurrency);
    for task in 0..args.concurrency {
        let channel = channels[task % channels.len()].clone();
        let call = call.clone();
        let seed = args.seed ^ (task as u64) << 32;
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut errors = 0u64;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut health = HealthClient::new(channel.clone());
            let mut raw = tonic::client::Grpc::new(channel.clone())
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20);
            let mut advisor = ColocationAdvisorClient::new(channel)
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20);
            let mut i = task;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let ok = match &call {
                    Call::Health => health
                        .check(HealthCheckRequest {
                            service: String::new(),
                        })
                        .await
                        .is_ok(),
                    Call::Rank(pool) => {
                        let request = tonic::Request::new(pool[i % pool.len()].clone());
                        let path = http::uri::PathAndQuery::from_static(RANK_PATH);
                        let codec = PreEncoded::<pb::RankResponse>::default();
                        match raw.ready().await {
                            Ok(()) => raw.unary(request, path, codec).await.is_ok(),
                            Err(_) => false,
                        }
                    }
                    Call::Report { names, clock } => {
                        let member = |rng: &mut StdRng| pb::ColocatedMember {
                            workload: names[rng.random_range(0..names.len())].clone(),
                            throughput: 1.0 + 100.0 * rng.random::<f64>(),
                            job_id: String::new(),
                        };
                        let at = clock.fetch_add(1, Ordering::Relaxed);
                        let request = pb::ReportColocationRequest {
                            gpu: GPU.into(),
                            members: vec![member(&mut rng), member(&mut rng)],
                            observed_at: Some(prost_types::Timestamp {
                                seconds: at / 1000,
                                nanos: (at % 1000) as i32 * 1_000_000,
                            }),
                        };
                        advisor
                            .report_colocation(request)
                            .await
                            .is_ok_and(|r| r.into_inner().created)
                    }
                };
                i += 1;
                if sent >= from {
                    if ok {
                        histogram.record(sent.elapsed().as_micros().max(1) as u64)?;
                    } else {
                        errors += 1;
                    }
                }
            }
            anyhow::Ok((histogram, errors))
        }));
    }
    tokio::time::sleep_until(from.into()).await;
    let (cpu_from, peer_from) = (cpu_seconds(None), peer_pid.map(|p| cpu_seconds(Some(p))));
    tokio::time::sleep_until(until.into()).await;
    let cpu = cpu_seconds(None) - cpu_from + peer_pid.map_or(0.0, |p| cpu_seconds(Some(p)));
    let cpu = cpu - peer_from.unwrap_or(0.0);
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0;
    for task in tasks {
        let (h, e) = task.await??;
        histogram.add(h)?;
        errors += e;
    }
    Ok(ScenarioResult {
        rps: histogram.len() as f64 / measure.as_secs_f64(),
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        cpu_cores: cpu / measure.as_secs_f64(),
        errors,
    })
}

fn rank_pool(names: &[String], n: Option<usize>, top_k: i32, seed: u64) -> Vec<Bytes> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..REQUEST_POOL)
        .map(|_| pb::RankRequest {
            target: names[rng.random_range(0..names.len())].clone(),
            candidates: match n {
                Some(n) => sample(&mut rng, names.len(), n.min(names.len()))
                    .into_iter()
                    .map(|i| names[i].clone())
                    .collect(),
                None => Vec::new(),
            },
            top_k: if n.is_some() { top_k } else { 10 },
            gpu: GPU.into(),
            ..Default::default()
        })
        .map(|request| Bytes::from(request.encode_to_vec()))
        .collect()
}

async fn connect(addr: &str, connections: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        channels.push(Endpoint::from_shared(addr.to_string())?.connect().await?);
    }
    Ok(channels)
}

/// Workload names of a running server, for `--addr`.
async fn server_names(channel: Channel) -> anyhow::Result<Vec<String>> {
    let mut client = ColocationAdvisorClient::new(channel);
    let workloads = crate::client::all_workloads(&mut client, 0).await?;
    Ok(workloads.into_iter().map(|w| w.name).collect())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
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
    let mut server = None;
    let mut data = None;
    let (addr, names) = match &args.addr {
        Some(addr) => {
            let channel = connect(addr, 1).await?.remove(0);
            (addr.clone(), server_names(channel).await?)
        }
        None => {
            let path = match &args.database {
                Some(path) => path.clone(),
                None => scratch.path().join("bench.db"),
            };
            let synthetic = synthetic(args.workloads, args.observations, args.seed)?;
            let url = format!("sqlite://{}", path.display());
            if !path.exists() {
                let started = Instant::now();
                let store = Store::open(&url).await?;
                seed_store(&store, &synthetic).await?;
                store.close().await;
                setup("seed_s", started.elapsed().as_secs_f64().into());
            }
            setup("workloads", args.workloads.into());
            setup("observations", args.observations.into());
            let settings = Settings::load(SettingsSources {
                file: None,
                environment: Some(Default::default()),
                overrides: vec![
                    ("server.listen", "127.0.0.1:0".into()),
                    ("metrics.listen", String::new()),
                    ("database.url", url),
                    ("profiler.backend", "off".into()),
                    ("trainer.interval_secs", "0".into()),
                    ("server.max_request_bytes", (64u64 << 20).to_string()),
                ],
            })?;
            let started = Instant::now();
            let app = App::build(&settings).await?;
            setup("startup_s", started.elapsed().as_secs_f64().into());
            setup("rss_after_startup_mb", rss_mb().into());
            let addr = format!("http://{}", app.local_addr());
            let stop = tokio_util::sync::CancellationToken::new();
            server = Some((tokio::spawn(app.run_until_stopped(stop.clone())), stop));
            let names = synthetic.names.iter().map(|n| n.to_string()).collect();
            data = Some(synthetic);
            (addr, names)
        }
    };
    if names.is_empty() {
        bail!("the server has no workloads to rank");
    }
    let channels = connect(&addr, args.connections).await?;
    let mut client = ColocationAdvisorClient::new(channels[0].clone());
    if server.is_some() {
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
        setup("rss_after_training_mb", rss_mb().into());
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
    for scenario in &args.scenarios {
        let (on_peer, name) = match scenario.strip_prefix("peer_") {
            Some(rest) => (true, rest),
            None => (false, scenario.as_str()),
        };
        let call = match name {
            "health" => Call::Health,
            "report" => Call::Report {
                names: names.clone(),
                clock: clock.clone(),
            },
            "rank_all" => Call::Rank(Arc::new(rank_pool(&names, None, 10, args.seed))),
            _ => match name.strip_prefix("rank_").and_then(|n| n.parse().ok()) {
                Some(n) => Call::Rank(Arc::new(rank_pool(&names, Some(n), args.top_k, args.seed))),
                None => bail!("unknown scenario {scenario:?}"),
            },
        };
        let (target, pid) = match (on_peer, &peer_channels, &peer) {
            (false, _, _) => (&channels, None),
            (true, Some(channels), Some(peer)) => (channels, Some(peer.child.id())),
            _ => bail!("scenario {scenario:?} needs --peer-python"),
        };
        if !args.json {
            eprintln!(
                "running {scenario} for {:.0} s ...",
                args.warmup + args.duration
            );
        }
        let result = run_scenario(target, call, &args, pid).await?;
        report.scenarios.insert(scenario.clone(), result);
    }
    drop(peer);
    if let Some((task, stop)) = server {
        stop.cancel();
        task.await??;
    }
    print_report(&report, &args)
}

async fn connect_when_ready(addr: &str, connections: usize) -> anyhow::Result<Vec<Channel>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(channels) = connect(addr, connections).await {
            let mut health = HealthClient::new(channels[0].clone());
            let request = HealthCheckRequest {
                service: String::new(),
            };
            if health.check(request).await.is_ok() {
                return Ok(channels);
            }
        }
        if Instant::now() > deadline {
            bail!("the peer at {addr} did not become healthy within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn print_report(report: &Report, args: &BenchArgs) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for (key, value) in &report.setup {
        writeln!(out, "{key:<24} {value}")?;
    }
    let health = report.scenarios.get("health");
    writeln!(
        out,
        "\n{:<16} {:>10} {:>9} {:>9} {:>10} {:>6} {:>7} {:>12} {:>12}",
        "scenario",
        "rpc/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "cpu",
        "errors",
        "rps/health",
        "p99/health"
    )?;
    for (name, r) in &report.scenarios {
        let (rps_ratio, p99_ratio) = match health {
            Some(h) => (
                format!("{:.2}", r.rps / h.rps),
                format!("{:.2}", r.p99_us as f64 / h.p99_us as f64),
            ),
            None => ("-".into(), "-".into()),
        };
        writeln!(
            out,
            "{name:<16} {:>10.0} {:>9} {:>9} {:>10} {:>6.2} {:>7} {rps_ratio:>12} {p99_ratio:>12}",
            r.rps, r.p50_us, r.p99_us, r.p999_us, r.cpu_cores, r.errors
        )?;
    }
    for (name, r) in &report.scenarios {
        let Some(peer) = name
            .strip_prefix("peer_")
            .and_then(|own| report.scenarios.get(own).map(|own| (own, r)))
        else {
            continue;
        };
        let (own, peer) = peer;
        writeln!(
            out,
            "coloc vs peer, {}: {:.1}x RPC/s, p99 {:.1}x lower",
            &name[5..],
            own.rps / peer.rps,
            peer.p99_us as f64 / own.p99_us as f64
        )?;
    }
    Ok(())
}

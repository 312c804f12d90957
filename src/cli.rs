//! The command line: `coloc serve` runs the service; `coloc import` loads datasets and
//! `coloc export` writes them.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::{
    advisor::Advisor,
    client, cluster_client,
    domain::GpuName,
    import,
    settings::{Settings, SettingsSources},
    startup::{cancel_on_signal, App},
    store::Store,
    telemetry,
};

#[derive(Debug, Parser)]
#[command(
    name = "coloc",
    version,
    about = "GPU colocation advisor: which workloads to share a GPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC service.
    Serve(ServeArgs),
    /// Load a dataset measured elsewhere into the store, then train.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Write what the store holds for one GPU model as a dataset that `coloc import` reads
    /// back. Reads the database read-only: safe while a server runs on it.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Measure how well each model kind picks partners, on a published dataset.
    #[command(subcommand)]
    Eval(EvalCommand),
    /// Run pairs of workloads profiled on this node's GPU model together on its GPU and
    /// submit what they achieved to the service at --addr as training data of that GPU
    /// model (README, "Calibration"). Needs an NVIDIA GPU (or profiler.nvml_recording) and
    /// launch specs; the token, an agent's or an operator's, comes from COLOC_TOKEN.
    Calibrate(CalibrateArgs),
    /// Run a profiling agent on this GPU node: announce it to the service at --addr, then
    /// claim the profiling jobs of this GPU model, measure them (profiler.* settings) and
    /// submit the profiles (README, "Profiling agents"). The token, an agent's or an
    /// operator's, comes from COLOC_TOKEN.
    Agent(AgentArgs),
    /// Profiling agents known to a running server.
    Agents {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        command: client::AgentsCommand,
    },
    /// Print the effective settings (defaults, file, environment) as TOML.
    Config(ConfigArgs),
    /// Copy the database, consistently, while the service runs (SQLite's VACUUM INTO), and
    /// check the copy. Restore: stop the service, put the copy in place of the database
    /// file (removing its -wal and -shm files), start it.
    Backup(BackupArgs),
    /// Load generator: drive a server (in-process with a synthetic store, or --addr) with
    /// concurrent clients and report RPC/s and latency per scenario.
    Bench(BenchArgs),
    /// Cluster simulation: replay the Alibaba GPU trace on a simulated V100 cluster under
    /// each placement policy, with the measured KACE colocations as the only truth.
    Simulate(SimulateArgs),
    /// Workloads on a running server.
    Workloads {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        command: client::WorkloadsCommand,
    },
    /// Rank partners for a target on a running server.
    Rank {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: client::RankArgs,
    },
    /// Which GPU should a new job go to? GPUs from --gpu-state FILE.json, or the occupancy
    /// the server keeps; best first, with why each GPU ranked where it did.
    Place {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: cluster_client::PlaceArgs,
    },
    /// The GPUs of the occupancy the server keeps.
    Gpus {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        command: cluster_client::GpusCommand,
    },
    /// Jobs in the occupancy the server keeps: assign one to a GPU, release it.
    Jobs {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        command: cluster_client::JobsCommand,
    },
    /// Report a colocated run to a running server.
    Report {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: client::ReportArgs,
    },
    /// The serving model of a GPU model (or a stored --version) and its history; `pin` and
    /// `unpin` choose the serving version by hand.
    Model {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: client::ModelArgs,
        #[command(subcommand)]
        command: Option<client::ModelCommand>,
    },
    /// Stored model versions on a running server.
    Models {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        command: client::ModelsCommand,
    },
    /// Predict an explicit set of 2 or more workloads on a running server.
    Predict {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: client::PredictArgs,
    },
    /// Fit, judge and maybe promote a model from the stored runs now, on a running server.
    Train {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: client::TrainArgs,
    },
    /// Exit 0 when the server's health service says SERVING (for container health checks).
    Health {
        #[command(flatten)]
        connection: client::Connection,
    },
    /// Check an Nsight Compute CSV (`ncu --csv` output) before registering workloads: what
    /// it holds of the eight kernel metrics, and the profile's kernel metrics. Exits 0 only
    /// when a complete kernel profile can be built from it.
    Ncu(NcuArgs),
}

#[derive(Debug, Args)]
pub struct NcuArgs {
    /// The ncu output: `ncu --csv` (details page, ncu's default) or `--page raw`, as a file
    /// (other lines before the table are allowed).
    pub file: PathBuf,
    /// Print the check as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What `coloc agent` and `coloc calibrate` on a GPU node share: the service to talk to,
/// the settings, and who they announce themselves as.
#[derive(Debug, Args)]
pub struct AgentNodeArgs {
    #[command(flatten)]
    pub connection: client::Connection,
    /// TOML settings file (its profiler.* section; COLOC__PROFILER__* variables apply).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The agent's id, unique in the cluster; default NODE-gpuINDEX.
    #[arg(long, env = "COLOC_AGENT_ID")]
    pub id: Option<String>,
    /// The node's name; default the host name (Kubernetes: the downward API's
    /// spec.nodeName in NODE_NAME).
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub node: AgentNodeArgs,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub node: AgentNodeArgs,
    /// NVML index of the GPU to run on (overrides profiler.gpu_index).
    #[arg(long)]
    pub gpu_index: Option<u32>,
    /// At most this many pairs.
    #[arg(long, default_value_t = 10)]
    pub pairs: usize,
    /// Only pairs with this workload in them (repeatable), e.g. a newly profiled one.
    #[arg(long = "with", value_name = "WORKLOAD")]
    pub with: Vec<String>,
    /// How the pairs share the GPU: MPS, plain time-sliced sharing, or MPS when
    /// nvidia-cuda-mps-control is installed.
    #[arg(long, value_enum, default_value_t = SharingArg::Auto)]
    pub sharing: SharingArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SharingArg {
    Auto,
    Mps,
    Shared,
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// The KACE paper's protocol on a KACE-format dataset with splits.csv: every split
    /// (train on its pairs, rank the rest) and every held-out workload.
    Kace(EvalKaceArgs),
    /// Which Rank objective picks partners that pay off: each KACE workload held out of
    /// training, picked for by THROUGHPUT_SUM and NORMALIZED_SUM, with and without the
    /// break-even rule, judged on the measured pairs (README, "Trustworthy defaults").
    Objectives(EvalObjectivesArgs),
    /// The KACE artifact's unseen-workload protocol on runs of three or more jobs per GPU
    /// (run-set files such as kace-3way/runs.csv and kace-4way/runs.csv).
    Nway(EvalNwayArgs),
}

#[derive(Debug, Args)]
pub struct EvalObjectivesArgs {
    /// The dataset folder (kernel_metrics.csv, system_metrics.csv, pairs.csv, splits.csv).
    pub dir: PathBuf,
    /// The model kind to fit; default the server's default kind.
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// Print the figures as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EvalNwayArgs {
    /// Run-set files (run_id, workload1..N, w1throughput..wNthroughput, optionally
    /// in_recorded_eval_subset).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The KACE-format dataset with every member's profile, and the pairs that the
    /// "pairs+runs" training adds.
    #[arg(long, value_name = "DIR")]
    pub profiles: PathBuf,
    /// Only these model kinds (default: every kind); baselines are always scored.
    #[arg(long = "model", value_name = "KIND")]
    pub models: Vec<String>,
    /// Also score every candidate option set of member-ridge-gbt (README, "N-way").
    #[arg(long)]
    pub candidates: bool,
    /// Also measure how often the default model's 80 % intervals hold held-out runs (the
    /// pairs' unseen-workload protocol and these runs').
    #[arg(long)]
    pub coverage: bool,
    /// With --coverage, measure every candidate way of calibrating the intervals, not only
    /// the chosen one (README, "N-way", "Intervals").
    #[arg(long, requires = "coverage")]
    pub calibrations: bool,
    /// Print the numbers as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write every prediction of the default model kind (or --predictions-model) to this CSV.
    #[arg(long, value_name = "FILE.csv")]
    pub predictions_out: Option<PathBuf>,
    /// The model kind whose predictions --predictions-out writes, or with --candidates a
    /// candidate as `cand:NAME` (as the table names it).
    #[arg(long, value_name = "KIND")]
    pub predictions_model: Option<String>,
    /// Judge the model kinds through the public API: per case a fresh server (loopback
    /// port 0, fresh SQLite file), the profiles registered, the training runs reported,
    /// Train, PinModel, then Predict for every candidate run (README, "N-way").
    #[arg(long, conflicts_with_all = ["candidates", "coverage"])]
    pub through_api: bool,
    /// With --through-api: the servers' settings file (as `coloc serve --config`).
    #[arg(long, value_name = "FILE", requires = "through_api")]
    pub server_config: Option<PathBuf>,
    /// Only these targets (default: every workload of the runs).
    #[arg(long = "target", value_name = "WORKLOAD")]
    pub targets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct EvalKaceArgs {
    /// The dataset folder (kernel_metrics.csv, system_metrics.csv, pairs.csv, splits.csv).
    pub dir: PathBuf,
    /// Print the numbers as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw per-target scores and predicted-vs-actual sums into this PNG.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Write every prediction of the default model kind (or --predictions-model) to this CSV.
    #[arg(long, value_name = "FILE.csv")]
    pub predictions_out: Option<PathBuf>,
    /// The model kind whose predictions --predictions-out writes.
    #[arg(long, value_name = "KIND")]
    pub predictions_model: Option<String>,
    /// Also score every candidate option set of member-ridge-gbt (README, "N-way").
    #[arg(long)]
    pub candidates: bool,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// TOML settings file (optional; defaults and COLOC__SECTION__KEY variables apply).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Database URL, e.g. sqlite://./coloc.db (overrides database.url).
    #[arg(long, value_name = "URL")]
    pub database: Option<String>,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The new file to write (an existing file is never overwritten).
    pub file: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Address to listen on, e.g. 127.0.0.1:50051 (overrides server.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Log format: "text" (for people) or "json" (for collectors); overrides log.format.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// A KACE-format dataset: a folder with kernel_metrics.csv, system_metrics.csv and
    /// pairs.csv, or a clone of the KACE-artifact repository.
    Kace(ImportKaceArgs),
}

#[derive(Debug, Args)]
pub struct ImportKaceArgs {
    /// The dataset folder.
    pub dir: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
    /// GPU model the data was measured on.
    #[arg(long, default_value = import::KACE_GPU)]
    pub gpu: String,
    /// Total memory of that GPU model, GB.
    #[arg(long, default_value_t = import::KACE_GPU_MEMORY_GB)]
    pub gpu_memory_gb: f64,
    /// Import through this running server's API (e.g. http://127.0.0.1:50051; token from
    /// COLOC_TOKEN, an operator's) instead of writing a database file that no server holds.
    #[arg(long)]
    pub addr: Option<String>,
    /// CA certificate (PEM) of the server's TLS certificate, with --addr.
    #[arg(long, requires = "addr")]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// A KACE-format folder (kernel_metrics.csv, system_metrics.csv, pairs.csv): every
    /// workload with a complete profile on --gpu, and every stored run of two of them as a
    /// pair (runs of 3 or more members are counted, not exported).
    Kace(ExportKaceArgs),
}

#[derive(Debug, Args)]
pub struct ExportKaceArgs {
    /// The folder to write (created if missing; existing dataset files are refused).
    pub dir: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
    /// GPU model whose profiles and runs to export.
    #[arg(long)]
    pub gpu: String,
    /// Replace kernel_metrics.csv, system_metrics.csv and pairs.csv if the folder has them.
    #[arg(long)]
    pub force: bool,
}

fn load_settings(common: &CommonArgs, listen: Option<&String>) -> anyhow::Result<Settings> {
    let mut overrides = Vec::new();
    if let Some(url) = &common.database {
        overrides.push(("database.url", url.clone()));
    }
    if let Some(listen) = listen {
        overrides.push(("server.listen", listen.clone()));
    }
    Ok(Settings::load(SettingsSources {
        file: common.config.as_deref(),
        environment: None,
        overrides,
    })?)
}

/// `coloc simulate`: what the cluster simulation (a module of the binary, `src/sim/`) is
/// told. The defaults are the setup README reports.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The pod list of the Alibaba GPU trace v2023 (one-GPU pods are simulated).
    #[arg(
        long,
        default_value = "../shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv"
    )]
    pub trace: PathBuf,
    /// The KACE V100 folder: profiles, exclusive throughputs and the measured pairs.
    #[arg(long, default_value = "../shared/data/kace-v100")]
    pub kace_v100: PathBuf,
    /// The measured 3-way runs.
    #[arg(long, default_value = "../shared/data/kace-3way/runs.csv")]
    pub kace_3way: PathBuf,
    /// The measured 4-way runs.
    #[arg(long, default_value = "../shared/data/kace-4way/runs.csv")]
    pub kace_4way: PathBuf,
    /// GPUs in the cluster; by default the number that puts the offered load at --load.
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Offered load with one job per GPU: total exclusive work / (GPUs x arrival span).
    #[arg(long, default_value_t = 1.2)]
    pub load: f64,
    /// Seeds of the workload assignment, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    pub seeds: Vec<u64>,
    /// Policies, comma-separated (default: all but coloc-online): one-per-gpu,
    /// fraction-pack, smallest-memory, kace-linear, coloc, coloc-online (the service in
    /// process, learning from the runs its placements report), oracle.
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// min_job_fraction of latency-sensitive (LS) jobs: the least share of its exclusive
    /// speed such a job may be placed to run at (0 = no cap).
    #[arg(long, default_value_t = 0.5)]
    pub ls_cap: f64,
    /// How the model policies check the LS caps: cautious (on the low end of each
    /// member's 80 % interval, Place's `cautious`; a model without intervals on its point)
    /// or point (on the point prediction). The default was chosen with --rule on seeds 6-10
    /// (README, "Cluster simulation").
    #[arg(long, default_value = "cautious", value_parser = ["cautious", "point"])]
    pub caps: String,
    /// What the oracle and the model policies ask of a shared GPU before a queued job
    /// starts there: fair-share (every member of k keeps at least 1/k of its speed; chosen
    /// with --caps under the k8s queue on seeds 6-10, README), break-even (the new set's Σ
    /// colocated / exclusive at least 1), gain (Σ grows with the job). Caps and memory are
    /// kept under every rule.
    #[arg(long, default_value = "fair-share", value_parser = ["fair-share", "break-even", "gain"])]
    pub rule: String,
    /// How waiting jobs are offered: k8s (kube-scheduler's order: every waiting job in
    /// arrival order, a job that fits nowhere stays while the ones behind it are placed) or
    /// fifo (strict FIFO: when the head waits, everyone waits).
    #[arg(long, default_value = "k8s", value_parser = ["k8s", "fifo"])]
    pub queue: String,
    /// Seconds before a job that ran out of memory is submitted again.
    #[arg(long, default_value_t = 60.0)]
    pub retry_delay: f64,
    /// Split the measured 3- and 4-job sets in two fixed halves (a hash of each set): the
    /// truth keeps the pairs and the judged half only, and the training half is what
    /// `--train-on pairs+runs` adds to the model policies' training (README, "Cluster
    /// simulation").
    #[arg(long)]
    pub split_runs: bool,
    /// What the model policies (kace-linear, coloc) are trained on: pairs (the 181 measured
    /// pairs) or pairs+runs (with the training half of --split-runs, which it needs).
    #[arg(long, default_value = "pairs", value_parser = ["pairs", "pairs+runs"])]
    pub train_on: String,
    /// How coloc's model is banded: profiles (its 80 % intervals as `Train` calibrates
    /// them, on held-out profiles, and its seen bands, `--seen-bands`), held-out-runs (an experiment: recalibrated on runs held
    /// out at random, whose workloads the model saw) or held-out-runs-95 (the same, 95 %
    /// intervals); README, "Cluster simulation".
    #[arg(long, default_value = "profiles", value_parser = ["profiles", "held-out-runs", "held-out-runs-95"])]
    pub bands: String,
    /// Where coloc's model blends crowded members with the time-sharing law: always (the
    /// default's way since 2026-11-27: a model fitted on pairs alone too) or crowded-fits
    /// (only a model that learned crowded sets, the way before); README, "Cluster
    /// simulation".
    #[arg(long, default_value = "always", value_parser = ["always", "crowded-fits"])]
    pub law_blend: String,
    /// Which of `Train`'s seen bands coloc's model keeps (narrower bands for sets of
    /// workloads it was trained on): on (every one, the default), crowded (those of three
    /// and more members only) or off (the model's bands alone, as before 2026-11-27);
    /// README, "N-way", "Seen bands".
    #[arg(long, default_value = "on", value_parser = ["on", "crowded", "off"])]
    pub seen_bands: String,
    /// Simulate only the first N one-GPU pods (by arrival), for quick runs.
    #[arg(long)]
    pub max_pods: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the plots (JCT CDF, busy GPUs over time) as PNG files into this folder.
    #[arg(long)]
    pub plots: Option<PathBuf>,
}

/// `coloc bench`: what the load generator (a module of the binary, `src/loadgen/`) is
/// told.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Drive this running server instead of an in-process one (its profiled workloads are
    /// listed and used; no peer, no scale figures).
    #[arg(long)]
    pub addr: Option<String>,
    /// Synthetic store: workloads (all profiled on one GPU model).
    #[arg(long, default_value_t = 1_000)]
    pub workloads: usize,
    /// Synthetic store: colocated runs of random pairs (the training data).
    #[arg(long, default_value_t = 2_000)]
    pub observations: usize,
    /// Synthetic store: the share (0 to 1) of its runs that are sets of three or four
    /// members (half each, in expectation) instead of pairs; 0 gives the pairs-only store
    /// of earlier releases, run for run.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub crowded_share: f64,
    /// Keep the synthetic store in this SQLite file; an existing file is used as it is.
    #[arg(long)]
    pub database: Option<PathBuf>,
    /// Concurrent clients.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub concurrency: usize,
    /// HTTP/2 connections the clients share.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Seconds measured per scenario.
    #[arg(long, short = 't', default_value_t = 5.0)]
    pub duration: f64,
    /// Seconds of load before measuring, per scenario.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Scenarios, in order: health, rank_N (N named candidates), rank_cautious_N (the same
    /// asking the target to keep half its speed at the low end of its interval), rank_all
    /// (every workload, top 10), report, peer_rank_N (needs --peer-python), place_N (Place over N
    /// GPUs sent with the request, top 10), place_stored_N (the same N GPUs put into the
    /// server's occupancy first; the occupancy keeps them, so run sizes in increasing order),
    /// occupancy (AssignJob then ReleaseJob of new jobs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "health,rank_100,rank_1000,report"
    )]
    pub scenarios: Vec<String>,
    /// top_k of the rank_N scenarios (0 = every candidate in the answer).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Python with benches/peer/requirements.txt installed: also run the peer's Rank.
    #[arg(long)]
    pub peer_python: Option<PathBuf>,
    /// The peer's server script and the proto directory it compiles.
    #[arg(long, default_value = "benches/peer/server.py")]
    pub peer_script: PathBuf,
    #[arg(long, default_value = "proto")]
    pub proto_dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The in-process server's `trainer.max_training_runs` for the training it is measured
    /// on (0 = every stored run; the default is the service's).
    #[arg(long)]
    pub max_training_runs: Option<usize>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let mut settings = load_settings(&args.common, args.listen.as_ref())?;
            if let Some(format) = args.log_format {
                settings.log.format =
                    format
                        .parse()
                        .map_err(|message| crate::settings::SettingsError::Invalid {
                            key: "log.format",
                            message,
                        })?;
            }
            telemetry::init(&settings.log.level, settings.log.format);
            let app = App::build(&settings).await?;
            let shutdown = CancellationToken::new();
            let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
            let served = app.run_until_stopped(shutdown).await;
            signals.abort();
            served
        }
        Command::Eval(EvalCommand::Kace(args)) => run_eval(args).await,
        Command::Eval(EvalCommand::Objectives(args)) => run_eval_objectives(args).await,
        Command::Eval(EvalCommand::Nway(args)) => run_eval_nway(args).await,
        Command::Backup(args) => {
            let settings = load_settings(&args.common, None)?;
            let started = std::time::Instant::now();
            let summary = crate::store::backup::backup(&settings.database.url, &args.file)
                .await
                .with_context(|| format!("cannot back up {}", settings.database.url))?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "file": args.file,
                        "bytes": summary.bytes,
                        "workloads": summary.workloads,
                        "observations": summary.observations,
                        "models": summary.models,
                        "seconds": started.elapsed().as_secs_f64(),
                    })
                );
            } else {
                println!(
                    "backed up {} to {} in {:.2} s: {} bytes, {} workloads, {} runs, {} model \
                     versions; integrity check ok",
                    settings.database.url,
                    args.file.display(),
                    started.elapsed().as_secs_f64(),
                    summary.bytes,
                    summary.workloads,
                    summary.observations,
                    summary.models
                );
            }
            Ok(())
        }
        Command::Config(args) => {
            let settings = load_settings(&args.common, None)?;
            // Settings hold no secret values: auth.tokens_file is a path, never its tokens.
            print!("{}", toml::to_string(&settings)?);
            Ok(())
        }
        Command::Workloads {
            connection,
            command,
        } => client::workloads(&connection, command).await,
        Command::Rank { connection, args } => client::rank(&connection, args).await,
        Command::Report { connection, args } => client::report(&connection, args).await,
        Command::Place { connection, args } => cluster_client::place(&connection, args).await,
        Command::Gpus {
            connection,
            command,
        } => cluster_client::gpus(&connection, command).await,
        Command::Jobs {
            connection,
            command,
        } => cluster_client::jobs(&connection, command).await,
        Command::Model {
            connection,
            args,
            command,
        } => match command {
            None => client::model(&connection, args).await,
            Some(command) => client::model_command(&connection, command).await,
        },
        Command::Models {
            connection,
            command,
        } => client::models(&connection, command).await,
        Command::Predict { connection, args } => client::predict(&connection, args).await,
        Command::Train { connection, args } => client::train(&connection, args).await,
        Command::Health { connection } => client::health(&connection).await,
        Command::Agents {
            connection,
            command,
        } => client::agents(&connection, command).await,
        Command::Agent(args) => {
            let (settings, identity, channel) = agent_node(&args.node, None)?;
            let cancel = CancellationToken::new();
            let signals = tokio::spawn(cancel_on_signal(cancel.clone()));
            let ran = crate::agent::run(
                channel,
                args.node.connection.token.clone(),
                identity,
                settings.profiler,
                cancel,
            )
            .await;
            signals.abort();
            tracing::info!("agent stopped");
            ran
        }
        Command::Ncu(args) => crate::profiler::ncu::run_check(&args.file, args.json),
        Command::Calibrate(args) => {
            let (settings, identity, channel) = agent_node(&args.node, args.gpu_index)?;
            let cancel = CancellationToken::new();
            let signals = tokio::spawn(cancel_on_signal(cancel.clone()));
            let summary = crate::agent::calibrate::run(
                channel,
                args.node.connection.token.clone(),
                identity,
                settings.profiler,
                &crate::profiler::calibrate::Plan {
                    max_pairs: args.pairs,
                    with: args
                        .with
                        .iter()
                        .map(|w| crate::domain::WorkloadName::parse("--with", w))
                        .collect::<Result<_, _>>()?,
                    sharing: match args.sharing {
                        SharingArg::Auto => None,
                        SharingArg::Mps => Some(crate::profiler::calibrate::Sharing::Mps),
                        SharingArg::Shared => Some(crate::profiler::calibrate::Sharing::Shared),
                    },
                },
                &cancel,
            )
            .await;
            signals.abort();
            let summary = summary?;
            println!("GPU {} ({} sharing)", summary.gpu, summary.sharing.as_str());
            for (a, b, ta, tb) in &summary.measured {
                println!("  {a} {ta:.3} + {b} {tb:.3} = {:.3}", ta + tb);
            }
            for (a, b, why) in &summary.failed {
                println!("  {a} + {b}: failed: {why}");
            }
            println!(
                "{} pairs stored as calibrated runs of {}, {} failed; call Train to use them",
                summary.measured.len(),
                summary.gpu,
                summary.failed.len()
            );
            Ok(())
        }
        // The load generator is a tool of the binary, not of the service's library.
        Command::Bench(_) => anyhow::bail!("coloc bench is run by the coloc binary"),
        Command::Simulate(_) => anyhow::bail!("coloc simulate is run by the coloc binary"),
        Command::Export(ExportCommand::Kace(args)) => {
            let settings = load_settings(&args.common, None)?;
            telemetry::init(&settings.log.level, settings.log.format);
            let gpu = GpuName::parse("--gpu", &args.gpu).map_err(|e| anyhow::anyhow!(e.message))?;
            let overwrite = if args.force {
                crate::dataset::Overwrite::Replace
            } else {
                crate::dataset::Overwrite::Refuse
            };
            let summary =
                crate::export::export_kace(&settings.database.url, &gpu, &args.dir, overwrite)
                    .await
                    .with_context(|| {
                        format!("cannot export {gpu} from {}", settings.database.url)
                    })?;
            print_export_summary(&summary);
            Ok(())
        }
        Command::Import(ImportCommand::Kace(args)) => {
            let settings = load_settings(&args.common, None)?;
            telemetry::init(&settings.log.level, settings.log.format);
            let gpu = GpuName::parse("--gpu", &args.gpu).map_err(|e| anyhow::anyhow!(e.message))?;
            crate::domain::check_memory_gb("--gpu-memory-gb", args.gpu_memory_gb)
                .map_err(|e| anyhow::anyhow!(e.message))?;
            if let Some(addr) = &args.addr {
                let connection = client::Connection {
                    addr: addr.clone(),
                    token: std::env::var("COLOC_TOKEN").ok(),
                    ca_cert: args.ca_cert.clone(),
                    json: false,
                };
                let summary =
                    client::import_kace(&connection, &args.dir, &gpu, args.gpu_memory_gb).await?;
                print_import_summary(&gpu, &summary);
                return Ok(());
            }
            // A failed import leaves no new database file behind.
            let created = new_database_file(&settings.database.url);
            // Writes the file directly: never behind a running server's back.
            let _database_lock = crate::store::DatabaseLock::acquire(&settings.database.url)?;
            let imported = async {
                let store = Store::open(&settings.database.url)
                    .await
                    .context("cannot open the database")?;
                let advisor =
                    Advisor::load(store, crate::startup::advisor_options(&settings)?).await?;
                let summary =
                    import::import_kace(&advisor, &args.dir, &gpu, args.gpu_memory_gb).await;
                advisor.store().close().await;
                summary
            }
            .await;
            let summary = match imported {
                Ok(summary) => summary,
                Err(error) => {
                    if let Some(path) = created {
                        for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
                            let mut file = path.clone().into_os_string();
                            file.push(suffix);
                            let _ = std::fs::remove_file(file);
                        }
                    }
                    return Err(error);
                }
            };
            print_import_summary(&gpu, &summary);
            Ok(())
        }
    }
}

/// What a profiling agent (or `coloc calibrate`) on this node starts from: its settings
/// (`gpu_index` overriding profiler.gpu_index), with logging set up from them; who it is
/// (`--id`, default NODE-gpuINDEX; `--node`, default the host name); and a channel to the
/// service.
fn agent_node(
    args: &AgentNodeArgs,
    gpu_index: Option<u32>,
) -> anyhow::Result<(
    Settings,
    crate::agent::AgentIdentity,
    tonic::transport::Channel,
)> {
    let mut settings = load_settings(
        &CommonArgs {
            config: args.config.clone(),
            database: None,
        },
        None,
    )?;
    if let Some(index) = gpu_index {
        settings.profiler.gpu_index = index;
    }
    telemetry::init(&settings.log.level, settings.log.format);
    let node = args.node.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "node".into())
    });
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("{node}-gpu{}", settings.profiler.gpu_index));
    let channel = args.connection.lazy_channel()?;
    Ok((settings, crate::agent::AgentIdentity { id, node }, channel))
}

/// The database file `url` names, when it does not exist yet (a command that fails may
/// remove what it created).
fn new_database_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    if path.is_empty() || path.contains(":memory:") {
        return None;
    }
    let path = PathBuf::from(path);
    (!path.exists()).then_some(path)
}

fn parse_share(raw: &str) -> Result<f64, String> {
    let share: f64 = raw.parse().map_err(|e| format!("{raw:?}: {e}"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("a share is between 0 and 1, got {raw}"))
    }
}

fn parse_model_kind(flag: &str, raw: &str) -> anyhow::Result<crate::model::ModelKind> {
    use crate::model::ModelKind;
    ModelKind::parse(raw).with_context(|| {
        let known: Vec<&str> = ModelKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("{flag} {raw:?} is not one of {known:?}")
    })
}

async fn run_eval_nway(args: EvalNwayArgs) -> anyhow::Result<()> {
    if args.json {
        crate::progress::hide();
    }
    use crate::{
        eval,
        model::{self, ModelKind},
    };
    // A model kind, or with --candidates one of them as `cand:NAME` (the name --candidates
    // prints), for tracing what a candidate predicts.
    let predictions_policy = match &args.predictions_model {
        None => eval::Policy::Model(ModelKind::DEFAULT),
        Some(raw) => match raw.strip_prefix("cand:") {
            Some(name) => {
                let i = eval::candidates::MEMBER_CANDIDATES
                    .iter()
                    .position(|(n, _)| *n == name)
                    .ok_or_else(|| {
                        anyhow::anyhow!("--predictions-model {raw:?} names no candidate")
                    })?;
                if !args.candidates {
                    anyhow::bail!("--predictions-model {raw:?} needs --candidates");
                }
                eval::Policy::Candidate(i)
            }
            None => eval::Policy::Model(parse_model_kind("--predictions-model", raw)?),
        },
    };
    let kinds: Vec<ModelKind> = if args.models.is_empty() {
        ModelKind::ALL.to_vec()
    } else {
        args.models
            .iter()
            .map(|raw| parse_model_kind("--model", raw))
            .collect::<anyhow::Result<_>>()?
    };
    if let eval::Policy::Model(kind) = predictions_policy {
        if args.predictions_out.is_some() && !kinds.contains(&kind) {
            anyhow::bail!(
                "--predictions-out writes {}, which --model leaves out",
                kind.as_str()
            );
        }
    }
    let mut policies: Vec<eval::Policy> = kinds.into_iter().map(eval::Policy::Model).collect();
    if args.candidates {
        policies.extend(eval::Policy::candidates());
    }
    policies.extend([
        eval::Policy::Random,
        eval::Policy::SmallestMemory,
        eval::Policy::LargestExclusive,
    ]);
    let mut writer = match &args.predictions_out {
        Some(path) => Some(eval::nway_predictions_writer(path)?),
        None => None,
    };
    let mut rows = Vec::new();
    let mut coverage_rows = Vec::new();
    let mut seen_rows = Vec::new();
    let mut api_trainings = Vec::new();
    let mut api_servers = 0;
    let mut targets_found = std::collections::BTreeSet::new();
    for (k, path) in args.runs.iter().enumerate() {
        let (path, profiles, run_policies) =
            (path.clone(), args.profiles.clone(), policies.clone());
        let (with_coverage, with_calibrations) = (args.coverage, args.calibrations);
        let through_api = args.through_api;
        let targets = args.targets.clone();
        let (data, cases, mut results, run_coverage, seen_coverage) =
            tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                let runs = eval::nway::read_runs(&path)?;
                let size = runs.first().map_or(0, |r| r.members.len());
                let data = eval::nway::NwayData::read(&format!("{size}-way"), &path, &profiles)?;
                let mut cases = data.cases();
                if !targets.is_empty() {
                    cases.retain(|c| targets.contains(&c.target));
                }
                // Through the API only the baselines are scored here; the model kinds are
                // judged by the servers below.
                let local_policies: Vec<eval::Policy> = run_policies
                    .iter()
                    .copied()
                    .filter(|p| !(through_api && matches!(p, eval::Policy::Model(_))))
                    .collect();
                let results = eval::nway::evaluate(&data, &cases, &local_policies)?;
                let mut run_coverage = Vec::new();
                let mut seen_coverage = Vec::new();
                if with_coverage {
                    // The chosen calibration, or with --calibrations every one compared.
                    let calibrations: &[(&str, model::intervals::Calibration)] =
                        if with_calibrations {
                            &eval::candidates::CALIBRATION_CANDIDATES
                        } else {
                            &[("chosen", model::intervals::Calibration::CHOSEN)]
                        };
                    // The pairs are the same for every file: measured once.
                    if k == 0 {
                        run_coverage.extend(eval::nway::pair_coverage(&data, calibrations)?);
                    }
                    run_coverage.extend(eval::nway::coverage(&data, &cases, calibrations)?);
                    seen_coverage.extend(eval::nway::seen_coverage(&data, k == 0)?);
                }
                Ok((data, cases, results, run_coverage, seen_coverage))
            })
            .await??;
        if args.through_api {
            let api = eval::nway_api::evaluate(
                &data,
                &cases,
                &policies
                    .iter()
                    .filter_map(|p| match p {
                        eval::Policy::Model(kind) => Some(*kind),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                args.server_config.as_deref(),
            )
            .await?;
            results.extend(api.results);
            api_trainings.extend(api.trainings);
            api_servers += api.servers;
        }
        targets_found.extend(cases.iter().map(|c| c.target.clone()));
        coverage_rows.extend(run_coverage);
        seen_rows.extend(seen_coverage);
        if let Some(writer) = writer.as_mut() {
            eval::write_nway_predictions(writer, &data, &cases, &results, predictions_policy)?;
        }
        rows.extend(eval::nway::summarize(&data, &cases, &policies, &results));
    }
    if let Some(mut writer) = writer {
        writer.flush()?;
    }
    if let Some(missing) = args.targets.iter().find(|t| !targets_found.contains(*t)) {
        anyhow::bail!("--target {missing:?} is in no run of the files");
    }
    if args.json {
        let mut summary = serde_json::json!({
            "rows": rows,
            "coverage": coverage_rows,
            "seen_coverage": seen_rows,
        });
        if args.through_api {
            summary["api"] =
                serde_json::json!({ "servers": api_servers, "trainings": api_trainings });
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eval::print_nway_table(&rows, &policies, &mut std::io::stdout().lock())?;
        if args.through_api {
            print_api_trainings(api_servers, &api_trainings);
        }
        for c in &coverage_rows {
            println!("80 % interval coverage, {c}");
        }
        for row in &seen_rows {
            println!(
                "80 % interval coverage, {}; {} of the sets by seen bands",
                row.coverage, row.by_seen_bands
            );
        }
    }
    Ok(())
}

/// What the servers of `eval nway --through-api` decided, per model kind: how many
/// challengers the champion comparison rejected (pinned to answer anyway) and how many runs
/// were left out as outliers.
fn print_api_trainings(servers: usize, trainings: &[crate::eval::nway_api::ApiTraining]) {
    println!(
        "through the API: {servers} servers, one per case; each kind's version pinned to answer"
    );
    let kinds: std::collections::BTreeSet<&str> = trainings.iter().map(|t| t.kind).collect();
    for kind in kinds {
        let of_kind: Vec<_> = trainings.iter().filter(|t| t.kind == kind).collect();
        let rejected = of_kind.iter().filter(|t| !t.promoted).count();
        let with_outliers = of_kind.iter().filter(|t| t.excluded_outliers > 0).count();
        let outliers: u64 = of_kind.iter().map(|t| t.excluded_outliers).sum();
        let reported: usize = of_kind.iter().map(|t| t.reported).sum();
        let fitted: u64 = of_kind.iter().map(|t| t.observations).sum();
        println!(
            "  {kind}: {} trainings, {rejected} rejected by the champion comparison; \
             {reported} runs reported, {fitted} fitted, {outliers} left out as outliers \
             (in {with_outliers} trainings)",
            of_kind.len()
        );
    }
}

async fn run_eval(args: EvalKaceArgs) -> anyhow::Result<()> {
    if args.json {
        crate::progress::hide();
    }
    use crate::{eval, model::ModelKind};
    let predictions_kind = match &args.predictions_model {
        None => ModelKind::DEFAULT,
        Some(raw) => parse_model_kind("--predictions-model", raw)?,
    };
    let mut policies: Vec<eval::Policy> = vec![eval::Policy::Model(ModelKind::DEFAULT)];
    policies.extend(
        ModelKind::ALL
            .into_iter()
            .filter(|k| *k != ModelKind::DEFAULT)
            .map(eval::Policy::Model),
    );
    if args.candidates {
        policies.extend(eval::Policy::candidates());
    }
    policies.extend([
        eval::Policy::Random,
        eval::Policy::SmallestMemory,
        eval::Policy::LargestExclusive,
    ]);
    let dir = args.dir.clone();
    let (data, results, summary) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let data = eval::EvalData::read(&dir)?;
        let results = eval::evaluate(&data, &policies)?;
        let summary = eval::summarize(&data, &policies, &results);
        Ok((data, results, summary))
    })
    .await??;
    if let Some(path) = &args.predictions_out {
        eval::write_predictions(path, &data, &results, eval::Policy::Model(predictions_kind))?;
    }
    if let Some(path) = &args.plot {
        let models: Vec<eval::Policy> = ModelKind::ALL
            .into_iter()
            .map(eval::Policy::Model)
            .collect();
        eval::draw(path, &data, &summary, &results, &models)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eval::print_table(&summary, &mut std::io::stdout().lock())?;
    }
    Ok(())
}

async fn run_eval_objectives(args: EvalObjectivesArgs) -> anyhow::Result<()> {
    if args.json {
        crate::progress::hide();
    }
    use crate::{eval, model::ModelKind};
    let kind = match &args.kind {
        None => ModelKind::DEFAULT,
        Some(raw) => ModelKind::parse(raw).with_context(|| {
            let known: Vec<&str> = ModelKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("--kind {raw:?} is not one of {known:?}")
        })?,
    };
    let dir = args.dir.clone();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let data = eval::EvalData::read(&dir)?;
        eval::evaluate_objectives(&data, kind)
    })
    .await??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eval::print_objectives(&report, &mut std::io::stdout().lock())?;
    }
    Ok(())
}

fn print_import_summary(gpu: &GpuName, summary: &import::ImportSummary) {
    println!(
        "workloads: {} registered, {} updated, {} unchanged; {} skipped without both kernel and system metrics",
        summary.workloads_registered,
        summary.workloads_updated,
        summary.workloads_unchanged,
        summary.incomplete_workloads.len()
    );
    println!(
        "observations on {gpu}: {} new of {} pairs ({} already stored); {} pairs skipped",
        summary.observations_new,
        summary.observations_total,
        summary.observations_total - summary.observations_new,
        summary.pairs_skipped
    );
    for model in &summary.models {
        match model {
            Ok(model) => println!(
                "model: version {} ({}), {} observations, in-sample R^2 {:.3}, MSE {:.2}: {} ({})",
                model.version,
                model.kind,
                model.observations,
                model.r2,
                model.mse,
                model.status,
                model.reason
            ),
            Err(reason) => println!("model: not trained: {reason}"),
        }
    }
}

fn print_export_summary(summary: &crate::export::ExportSummary) {
    let gpu = &summary.gpu;
    println!(
        "exported {} workloads and {} pairs of {gpu} to {}",
        summary.workloads,
        summary.pairs,
        summary.dir.display()
    );
    if summary.incomplete_workloads > 0 {
        println!(
            "{} workloads profiled on {gpu} without kernel metrics not exported",
            summary.incomplete_workloads
        );
    }
    if summary.crowded_runs > 0 {
        println!(
            "{} runs of 3 or more members not exported",
            summary.crowded_runs
        );
    }
    if summary.pairs_without_profiles > 0 {
        println!(
            "{} pairs not exported: a member has no complete profile on {gpu}",
            summary.pairs_without_profiles
        );
    }
}

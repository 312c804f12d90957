//! The command line as clap reads it: every command, its flags and their help. What the
//! commands do lives beside this file, one file (or folder) per family of commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod eval;
mod tools;
mod undo;
mod upload;
pub use eval::{
    EvalCommand, EvalKaceArgs, EvalNwayArgs, EvalObjectivesArgs, NestedCandidates, NestedTrain,
};
pub use tools::{BenchArgs, SimulateArgs};
pub use undo::{AuditCommand, DeleteRunsArgs, RunsCommand, UndoArgs};
pub use upload::ProfileFiles;

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
    /// model (docs/profiling.md, "Calibration"). Needs an NVIDIA GPU (or profiler.nvml_recording) and
    /// launch specs; the token, an agent's or an operator's, comes from COLOC_TOKEN.
    Calibrate(CalibrateArgs),
    /// Run a profiling agent on this GPU node: announce it to the service at --addr, then
    /// claim the profiling jobs of this GPU model, measure them (profiler.* settings) and
    /// submit the profiles (docs/profiling.md, "Profiling agents"). The token, an agent's or an
    /// operator's, comes from COLOC_TOKEN.
    Agent(AgentArgs),
    /// The measuring step of a profiling Kubernetes Job (profiler.dispatch =
    /// "kubernetes-jobs"; the service writes this command line into the Job): measure the
    /// command after `--` for the job the service claimed, and report the profile or the
    /// failure through the agents' API (docs/profiling.md, "Profiling with Kubernetes Jobs").
    ProfileJob(ProfileJobArgs),
    /// Profiling agents known to a running server.
    Agents {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: AgentsCommand,
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
        connection: Connection,
        #[command(subcommand)]
        command: WorkloadsCommand,
    },
    /// Rank partners for a target on a running server.
    Rank {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: RankArgs,
    },
    /// Which GPU should a new job go to? GPUs from --gpu-state FILE.json, or the occupancy
    /// the server keeps; best first, with why each GPU ranked where it did.
    Place {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: PlaceArgs,
    },
    /// The GPUs of the occupancy the server keeps.
    Gpus {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: GpusCommand,
    },
    /// Jobs in the occupancy the server keeps: assign one to a GPU, release it.
    Jobs {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// Stored runs (training data): delete the wrong ones.
    Runs {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// The audit trail of undo commands.
    Audit {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Report a colocated run to a running server.
    Report {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: ReportArgs,
    },
    /// The serving model of a GPU model (or a stored --version) and its history; `pin` and
    /// `unpin` choose the serving version by hand.
    Model {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: ModelArgs,
        #[command(subcommand)]
        command: Option<ModelCommand>,
    },
    /// Stored model versions on a running server.
    Models {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Predict an explicit set of 2 or more workloads on a running server.
    Predict {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: PredictArgs,
    },
    /// Fit, judge and maybe promote a model from the stored runs now, on a running server.
    Train {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: TrainArgs,
    },
    /// Exit 0 when the server's health service says SERVING (for container health checks).
    Health {
        #[command(flatten)]
        connection: Connection,
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
    pub connection: Connection,
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
pub struct ProfileJobArgs {
    #[command(flatten)]
    pub node: AgentNodeArgs,
    /// The profiling job's id, as the service claimed it.
    #[arg(long, env = "COLOC_JOB_ID")]
    pub job_id: i64,
    /// The service's claim token for it.
    #[arg(long, env = "COLOC_CLAIM")]
    pub claim: i64,
    /// Which attempt this is (1 for the first).
    #[arg(long, env = "COLOC_ATTEMPT", default_value_t = 1)]
    pub attempt: u32,
    /// The workload being profiled.
    #[arg(long, env = "COLOC_WORKLOAD")]
    pub workload: String,
    /// The workload's program and its arguments, run as they are (no shell).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
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
    /// Address of the Prometheus metrics endpoint, e.g. 127.0.0.1:50062; "" switches it off
    /// (overrides metrics.listen, default 127.0.0.1:50052).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Address of the kube-scheduler extender's endpoint; "" switches it off (overrides
    /// extender.listen, off by default).
    #[arg(long, value_name = "ADDR")]
    pub extender_listen: Option<String>,
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
    /// GPU model the data was measured on; required unless the folder's gpu.json says it
    /// (the published KACE V100 data: "Tesla V100-SXM2-32GB").
    #[arg(long)]
    pub gpu: Option<String>,
    /// Total memory of that GPU model, GB; required with --gpu unless gpu.json says it
    /// (the published KACE V100 data: 32).
    #[arg(long)]
    pub gpu_memory_gb: Option<f64>,
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

#[derive(Debug, Args, Clone)]
pub struct Connection {
    /// The server, e.g. http://127.0.0.1:50051 (https:// with TLS); an address without a
    /// scheme, like 127.0.0.1:50051, means http:// (https:// with --ca-cert).
    #[arg(
        long,
        env = "COLOC_ADDR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// A bearer token (reader or operator); read from the environment, never a flag.
    #[arg(skip = std::env::var("COLOC_TOKEN").ok())]
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the server's TLS certificate.
    #[arg(long, env = "COLOC_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadsCommand {
    /// Every workload (all pages).
    List {
        /// Only workloads in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
    },
    /// One workload: its registration, state and profile on every GPU model.
    Get {
        /// The workload's name.
        name: String,
    },
    /// Register a workload (without a profile it waits for the profiling worker).
    Register {
        /// The workload's name (letters, digits, `-`, `_`, `.`), e.g. bert-base-cased_batch8-inf.
        name: String,
        /// Whether the workload trains or serves.
        #[arg(long, value_enum)]
        mode: ModeArg,
        /// The model it runs, e.g. bert-base-cased (free text, for people).
        #[arg(long, default_value = "")]
        model: String,
        /// Its batch size (0 = not said).
        #[arg(long, default_value_t = 0)]
        batch_size: u32,
        /// KEY=VALUE, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Launch spec: the program the profiling worker runs (absolute path).
        #[arg(long)]
        program: Option<String>,
        /// Launch spec: an argument, repeatable.
        #[arg(long = "arg", allow_hyphen_values = true)]
        args: Vec<String>,
        /// Launch spec: the folder the program starts in.
        #[arg(long)]
        working_dir: Option<String>,
        /// Launch spec: an environment variable KEY=VALUE for the program, repeatable.
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Launch spec: the NVTX range that marks one step for Nsight Compute (default
        /// coloc_step); "" selects kernels by launch count (profiler.ncu_launch_skip and
        /// ncu_launch_count) instead.
        #[arg(long)]
        nvtx_range: Option<String>,
        /// A GPU model to profile it on (one job each, run by an agent of that model),
        /// repeatable; none = every GPU model with a live agent, else model.default_gpu.
        #[arg(long = "profile-on")]
        profile_on: Vec<String>,
        /// A profile measured elsewhere, stored with the registration.
        #[command(flatten)]
        files: ProfileFiles,
    },
    /// Store a profile measured elsewhere for a registered workload (its profile on that
    /// GPU model is replaced).
    SubmitProfile {
        /// The workload's name.
        name: String,
        #[command(flatten)]
        files: ProfileFiles,
    },
    /// Forget a workload: its registration, profiles and pending profiling jobs.
    Delete {
        /// The workload's name.
        name: String,
    },
    /// Remove a workload's profile on one GPU model (its other profiles stay), then
    /// retrain that GPU model.
    DeleteProfile {
        /// The workload's name.
        name: String,
        /// The GPU model whose profile goes (default: the server's).
        #[arg(long, default_value = "")]
        gpu: String,
        #[command(flatten)]
        undo: UndoArgs,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    PendingProfile,
    Profiled,
    Failed,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Training,
    Inference,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ObjectiveArg {
    Throughput,
    Normalized,
}

/// How the GPU is (or was) shared.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SharingModeArg {
    Mps,
    TimeSlicing,
}

impl SharingModeArg {
    /// The request's `sharing_mode`.
    pub fn to_pb(self) -> i32 {
        match self {
            Self::Mps => coloc::proto::SharingMode::Mps as i32,
            Self::TimeSlicing => coloc::proto::SharingMode::TimeSlicing as i32,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RuleArg {
    FairShare,
    BreakEven,
    Gain,
    None,
}

/// The policy flags Rank and Place share; each one given replaces the server's default
/// (settings [policy]: normalized, fair share, cautious; docs/placement.md, "The policy").
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// What a shared GPU must promise: each job keeps 1/k of its speed (fair-share), the
    /// set does one job's work (break-even), the value grows (gain), or none.
    #[arg(long, value_enum)]
    pub rule: Option<RuleArg>,
    /// Read floors and order on the point predictions instead of the low ends of the 80 %
    /// intervals (the default policy is cautious).
    #[arg(long, conflicts_with = "cautious")]
    pub point: bool,
    /// The lowest fraction of its exclusive throughput every partner (Rank's candidate,
    /// Place's residents) may keep (0-1; 0 = the server's default).
    #[arg(long, default_value_t = 0.0)]
    pub min_partner_fraction: f64,
    /// Also list sets predicted to do less work than their members apart.
    #[arg(long)]
    pub include_losses: bool,
}

#[derive(Debug, Args)]
pub struct RankArgs {
    /// The workload to find partners for.
    pub target: String,
    /// How many partners to show (0 = every one that qualifies).
    #[arg(long, default_value_t = 10)]
    pub top: i32,
    /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Only these candidates (comma-separated); default every profiled workload.
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// What to order by; default the server's (normalized).
    #[arg(long, value_enum)]
    pub objective: Option<ObjectiveArg>,
    /// The lowest fraction of its exclusive throughput the target may keep (0-1; 0 = no
    /// limit). `--max-target-slowdown` is its deprecated name.
    #[arg(long, alias = "max-target-slowdown", default_value_t = 0.0)]
    pub min_target_speed_fraction: f64,
    /// The least predicted gain over running the pair apart (normalized sum - 1), e.g. 0.2.
    #[arg(long, default_value_t = 0.0)]
    pub min_benefit: f64,
    /// Also rank candidates predicted to do less work together than apart.
    #[arg(long)]
    pub include_below_break_even: bool,
    /// Check --min-target-speed-fraction on the low end of the target's 80 % interval
    /// instead of its point prediction (a model without intervals: the point prediction).
    #[arg(long)]
    pub cautious: bool,
    /// Also rank candidates whose summed memory exceeds the GPU's (fits_memory = false).
    #[arg(long)]
    pub include_oversubscribed: bool,
    /// Memory available for the pair, GB; 0 = the GPU model's total memory.
    #[arg(long, default_value_t = 0.0)]
    pub gpu_memory_gb: f64,
    /// The sharing mode to rank for; default the server's (model.default_sharing_mode).
    #[arg(long, value_enum)]
    pub sharing_mode: Option<SharingModeArg>,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The GPU model the run was measured on; empty = the server's default (model.default_gpu,
    /// else the only one it knows).
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// WORKLOAD=THROUGHPUT for each member (2 or more).
    #[arg(required = true, num_args = 2..)]
    pub members: Vec<String>,
    /// The scheduler's job id of each member, in the members' order (repeat the flag).
    #[arg(long = "job-id", value_name = "ID")]
    pub job_ids: Vec<String>,
    /// When the run was measured (RFC 3339, e.g. 2026-11-23T18:00:00Z); default now. The
    /// same GPU, time, members, values and job ids are the same run: reporting it again
    /// stores nothing (created = false). Without --at each call is a new run.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// How the GPU was shared during the run; default mps.
    #[arg(long, value_enum)]
    pub sharing_mode: Option<SharingModeArg>,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// 2 or more workloads; a name may repeat (copies of one workload).
    #[arg(required = true, num_args = 2..)]
    pub workloads: Vec<String>,
    /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Memory available, GB; 0 = the GPU model's total memory.
    #[arg(long, default_value_t = 0.0)]
    pub gpu_memory_gb: f64,
    /// The sharing mode to predict for; default the server's (model.default_sharing_mode).
    #[arg(long, value_enum)]
    pub sharing_mode: Option<SharingModeArg>,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Model kind: member-ridge-gbt or kace-linear; default the server's model.kind.
    #[arg(long, default_value = "")]
    pub kind: String,
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every stored version of a GPU model, newest first, rejected challengers included.
    List {
        /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
        #[arg(long, default_value = "")]
        gpu: String,
        /// At most this many; 0 = 100.
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Serve this stored version whatever training decides, until unpinned.
    Pin {
        version: u64,
        /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
        #[arg(long, default_value = "")]
        gpu: String,
    },
    /// Return to the newest promoted version.
    Unpin {
        /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
        #[arg(long, default_value = "")]
        gpu: String,
    },
    /// Draw predicted vs observed throughput of the reported runs, the rolling error over
    /// time and each promotion into a PNG (GetModelReport).
    Report {
        /// The PNG to write.
        #[arg(long)]
        plot: PathBuf,
        /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
        #[arg(long, default_value = "")]
        gpu: String,
        /// The newest this many reported runs; 0 = the server's default (10000).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Runs in the rolling error's window (the server's trainer.drift_window is 50).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        window: u32,
    },
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// GPU model; empty = the server's default (model.default_gpu, else the only one it knows).
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// A stored version; default the one serving.
    #[arg(long, default_value_t = 0)]
    pub version: u64,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Every agent that announced itself: id, node, GPU model, last seen, job in hand.
    List,
}

#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// The new job's workload.
    pub workload: String,
    /// A JSON array of the candidate GPUs: `[{"id": "gpu-0", "node": "n1", "gpu": "Tesla
    /// V100-SXM2-32GB", "memory_gb": 32, "residents": ["bert-base-cased_batch8-inf"]}]`
    /// (node, gpu, memory_gb and residents optional). Without it, the occupancy the server
    /// keeps (AssignJob) is used.
    #[arg(long)]
    pub gpu_state: Option<PathBuf>,
    /// How many GPUs to show (0 = all that qualify).
    #[arg(long, default_value_t = 5)]
    pub top: i32,
    /// What a GPU's value is: the members' throughput sum, or the sum of each member's
    /// fraction of its exclusive throughput (normalized); default the server's (normalized).
    #[arg(long, value_enum)]
    pub objective: Option<ObjectiveArg>,
    /// The lowest fraction of its exclusive throughput the new job may keep (0-1; 0 = no cap).
    #[arg(long, default_value_t = 0.0)]
    pub min_job_fraction: f64,
    /// The lowest fraction every resident may keep (0-1; 0 = the server's default); the
    /// same as --min-partner-fraction.
    #[arg(long, default_value_t = 0.0)]
    pub min_resident_fraction: f64,
    /// Jobs a GPU may hold with the new one (0 = the server's default, 4).
    #[arg(long, default_value_t = 0)]
    pub max_jobs_per_gpu: u32,
    /// Also rank GPUs whose memory would overflow.
    #[arg(long)]
    pub include_oversubscribed: bool,
    /// Check --min-job-fraction and --min-resident-fraction on the low end of each member's
    /// 80 % interval instead of its point prediction (the gain is scored on the points).
    #[arg(long)]
    pub cautious: bool,
    /// Without --gpu-state: only GPUs on these nodes (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Without --gpu-state: only GPUs of this GPU model.
    #[arg(long, default_value = "")]
    pub gpu: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[derive(Debug, Subcommand)]
pub enum GpusCommand {
    /// Every GPU of the occupancy the server keeps, with its running jobs (all pages).
    List {
        /// Only GPUs on these nodes (comma-separated).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Only GPUs of this GPU model.
        #[arg(long, default_value = "")]
        gpu: String,
    },
    /// Forget a GPU (or every GPU of --node) with its jobs, so its id can be assigned anew
    /// on another node or GPU model.
    Forget {
        /// The GPU's id.
        #[arg(required_unless_present = "node", conflicts_with = "node")]
        gpu_id: Option<String>,
        /// Forget every GPU of this node instead.
        #[arg(long)]
        node: Option<String>,
        #[command(flatten)]
        undo: UndoArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Record that a job runs on a GPU (again: renew its lease).
    Assign {
        /// The scheduler's id of the job.
        job_id: String,
        /// The GPU it runs on (the id the scheduler uses, e.g. a UUID or node-gpu0).
        gpu_id: String,
        /// The job's workload (registered and profiled).
        #[arg(long)]
        workload: String,
        /// The node the GPU is on.
        #[arg(long, default_value = "")]
        node: String,
        /// GPU model; empty = the server's default.
        #[arg(long, default_value = "")]
        gpu: String,
        /// Seconds until the job expires unless assigned again or released (0 = never).
        #[arg(long, default_value_t = 0)]
        lease: u32,
    },
    /// Forget a job.
    Release {
        /// The scheduler's id of the job.
        job_id: String,
    },
    /// Every running job of the occupancy the server keeps: its workload, GPU, node and
    /// when its lease ends.
    List {
        /// Only jobs on these nodes (comma-separated).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Only jobs on GPUs of this GPU model.
        #[arg(long, default_value = "")]
        gpu: String,
    },
}

//! Typed settings, layered: built-in defaults, then an optional TOML file, then the
//! environment (`COLOC__SECTION__KEY`, e.g. `COLOC__SERVER__LISTEN`), then command-line
//! flags. Everything is validated before any port is bound; an error names the bad key.
//!
//! A leaf of the house: it depends on nothing else of coloc. Values arrive typed (enums for
//! choices, `SocketAddr` for addresses, `Option<PathBuf>` for optional files, where the
//! empty string still means "off"); `startup` turns them into what each part needs (the
//! advisor's policy, the profiler's backend, domain names).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
};

use config::{Config, Environment, File, FileFormat, Map};
use serde::{Deserialize, Serialize};

mod forms;
mod observer;
#[cfg(test)]
mod tests;
mod validate;

use crate::domain::AllowedPrograms;
use forms::{address, empty_path_is_none, empty_string_is_none, optional_address};
pub use observer::{ObserverSettings, PrometheusSettings, PushSettings, ThroughputSourceKind};

/// Fewer runs than this cannot fit a model (ten coefficients, an intercept and one degree
/// of freedom): `trainer.max_training_runs` may not cap training below it. The model layer
/// has the same number (`model::MIN_TRAINING_ROWS`; a test keeps the two equal).
pub const MIN_TRAINING_RUNS: usize = 12;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub metrics: MetricsSettings,
    pub extender: ExtenderSettings,
    pub policy: PolicySettings,
    pub auth: AuthSettings,
    pub database: DatabaseSettings,
    pub model: ModelSettings,
    pub profiler: ProfilerSettings,
    pub agents: AgentsSettings,
    pub trainer: TrainerSettings,
    pub leader: LeaderSettings,
    pub log: LogSettings,
    /// `[observer]` (its own file; absent = every default, the observer off).
    #[serde(default)]
    pub observer: ObserverSettings,
}

/// Leadership among servers sharing one database (docs/replicas.md): one of them, the
/// leader, runs the retraining task, profiling dispatch and the lease sweeper.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LeaderSettings {
    /// How long a taken or renewed lease lasts (database clock): a leader that stops
    /// renewing (killed, cut off) is replaced within about this long.
    pub lease_ttl_ms: u64,
    /// How often every server tries to take or renew the lease.
    pub renew_interval_ms: u64,
    /// How often every server reads each GPU model's champion and pin from the store, so
    /// that a promotion or pin made by another server is served here too.
    pub model_poll_ms: u64,
}

/// Profiling agents, as the service sees them (docs/profiling.md, "Profiling agents").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentsSettings {
    /// A claimed job's lease: an agent that does not renew it within this long loses the
    /// job, which goes back to the queue. Agents renew every third of it.
    pub lease_secs: u64,
    /// An agent seen within this long is live: new workloads are routed to its GPU model.
    pub live_secs: u64,
    /// `coloc agent`: the kubelet's PodResources socket, read to report which pod holds
    /// which GPU on the node (ReportPodDevices); "" = no reports.
    pub pod_resources_socket: String,
    /// `coloc agent`: how often it reports its node's pods and GPUs.
    pub pod_devices_interval_secs: u64,
    /// The service: a node's report counts this long after it came (then the node's pods
    /// fall back to their annotations).
    pub pod_devices_stale_secs: u64,
    /// `coloc agent`: the extended resources whose devices are whole GPUs (NVIDIA's device
    /// plugin, also under time-slicing and MPS, which name replicas `UUID::N`; HAMi's).
    pub gpu_resources: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainerSettings {
    /// How often the retraining task looks at each GPU model; 0 = never (Train only).
    pub interval_secs: u64,
    /// New runs since the last training that make a retrain due.
    pub min_new_observations: u64,
    /// Folds of the cross-validation that judges a challenger against the champion.
    pub cv_folds: usize,
    /// Training uses the newest this many runs of a GPU model (bounds retrain time and
    /// memory on large stores); 0 = every run.
    pub max_training_runs: usize,
    /// Threads one training run uses: the final fit and every fold of the cross-validation
    /// run side by side; 0 = one per core. Fewer leave cores to Rank while a retrain runs.
    pub training_threads: usize,
    /// A challenger is "not worse" when its cross-validated rank score is at least the
    /// champion's minus score_tolerance and its MSE at most the champion's x (1 + mse_tolerance).
    pub score_tolerance: f64,
    pub mse_tolerance: f64,
    /// Runs with a member further than this many robust deviations from the median
    /// colocated/exclusive ratio are flagged as outliers and not trained on.
    pub outlier_threshold: f64,
    /// Relative error of the champion's predictions on newly reported runs (mean over the
    /// last drift_window of them) above which a retrain is due at once.
    pub drift_threshold: f64,
    pub drift_window: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfilerSettings {
    /// "nvml" (measure on this machine's GPU), "replay" (serve profiles from a KACE-format
    /// dataset) or "off" (jobs wait).
    pub backend: ProfilerBackend,
    /// The dataset of the replay backend; "" = none.
    #[serde(with = "empty_path_is_none")]
    pub replay_dir: Option<PathBuf>,
    /// GPU model and memory the replay backend records its profiles under.
    pub replay_gpu: String,
    pub replay_gpu_memory_gb: f64,
    /// NVML index of the dedicated profiling GPU (also its CUDA_VISIBLE_DEVICES).
    pub gpu_index: u32,
    /// A recording of NVML readings (tests/fixtures/nvml/README.md's format) that the nvml
    /// backend replays instead of asking the driver: demos and tests without a GPU. ""
    /// = the real NVML.
    #[serde(with = "empty_path_is_none")]
    pub nvml_recording: Option<PathBuf>,
    /// Keep each profile's raw measurements here (one folder per profile: the NVML
    /// readings as a recording in `nvml_recording`'s format, Nsight Compute's CSV exactly
    /// as it wrote it, and the command lines): for checking a profile afterwards and for
    /// test fixtures. "" = keep nothing.
    #[serde(with = "empty_path_is_none")]
    pub keep_raw_dir: Option<PathBuf>,
    /// Nsight Compute: a path, or a name looked up in PATH.
    pub ncu_path: PathBuf,
    /// Glob patterns of programs a launch spec may name; empty = launch specs are refused.
    pub allowed_programs: Vec<String>,
    /// Variables of the worker's own environment that the workload inherits.
    pub env_allowlist: Vec<String>,
    /// NVML sampling period.
    pub sample_interval_ms: u64,
    /// Time limits of the system phase (NVML) and kernel phase (ncu) of one attempt.
    pub system_timeout_secs: u64,
    pub kernel_timeout_secs: u64,
    /// Attempts before a job is FAILED; retries wait retry_backoff_secs x 2^(attempt-1).
    pub max_attempts: u32,
    pub retry_backoff_secs: u64,
    /// Each of stdout and stderr is kept up to this many bytes.
    pub output_limit_bytes: usize,
    /// How often an idle worker looks for a job.
    pub poll_interval_ms: u64,
    /// Kernel selection when a launch spec asks for no NVTX range.
    pub ncu_launch_skip: u64,
    pub ncu_launch_count: u64,
    /// Who measures the service's profiling jobs: "agents" (the in-process worker and
    /// `coloc agent`s claim them) or "kubernetes-jobs" (one Kubernetes Job per job).
    pub dispatch: ProfilerDispatch,
    /// The one-shot Kubernetes Jobs of `dispatch = "kubernetes-jobs"`.
    pub kubernetes: KubeJobSettings,
}

/// `profiler.kubernetes`: how a profiling job becomes a Kubernetes Job (docs/profiling.md,
/// "Profiling with Kubernetes Jobs").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubeJobSettings {
    /// Namespace the Jobs are created in.
    pub namespace: String,
    /// coloc's own image: its init container copies the `coloc` binary into the Job's pod.
    pub coloc_image: String,
    /// Where the Job's pod reaches the service's gRPC API (the agents' API).
    pub service_addr: String,
    /// A Secret holding an agent-role bearer token under the key `token`; "" = no token.
    pub token_secret: String,
    /// The node label naming the GPU product (GPU feature discovery's).
    pub gpu_label: String,
    /// The Job's pod is stopped after this long (activeDeadlineSeconds).
    pub active_deadline_secs: u64,
    /// A finished Job is deleted this long after it ends (ttlSecondsAfterFinished).
    pub ttl_secs_after_finished: u64,
    /// How often the service reads a running Job's status.
    pub poll_interval_ms: u64,
    /// GPU models (as NVML names them) the cluster's nodes have: their profiling jobs
    /// become Jobs; empty = `model.default_gpu`.
    pub gpus: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the gRPC server binds, e.g. 127.0.0.1:50051.
    #[serde(with = "address")]
    pub listen: SocketAddr,
    /// Without auth the server binds only loopback addresses, unless this is true.
    pub allow_unauthenticated_non_loopback: bool,
    /// PEM certificate chain and private key: both set = TLS on the gRPC port; "" = none.
    #[serde(with = "empty_path_is_none")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(with = "empty_path_is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// Larger request messages are refused (OUT_OF_RANGE).
    pub max_request_bytes: usize,
    /// Rank, Predict and Place calls computed at once; more wait their turn, so memory
    /// stays bounded under a flood. 0 = twice the CPU cores (at least 4).
    pub max_concurrent_heavy_rpcs: usize,
    /// A heavy call's request body must have arrived this long after the call got its
    /// turn, else it fails with DEADLINE_EXCEEDED and gives its turn up (a client that
    /// trickles its body cannot hold a turn). 0 = no limit.
    pub heavy_body_timeout_secs: u64,
    /// On SIGTERM/SIGINT, in-flight RPCs get this long to finish.
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address of the Prometheus endpoint (`/metrics`); empty = off.
    #[serde(with = "optional_address")]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExtenderSettings {
    /// Address of the kube-scheduler extender (HTTP, `POST <url_prefix>/filter` and
    /// `/prioritize`); empty = off.
    #[serde(with = "optional_address")]
    pub listen: Option<SocketAddr>,
    /// Path the verbs live under, e.g. "/coloc"; "" = at the root.
    pub url_prefix: String,
    /// PEM certificate chain and private key: both set = HTTPS; "" = plain HTTP.
    #[serde(with = "empty_path_is_none")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(with = "empty_path_is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA: callers must present a client certificate it signed (kube-scheduler's
    /// extender tlsConfig certFile/keyFile); "" = none asked.
    #[serde(with = "empty_path_is_none")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Requests need a bearer token from auth.tokens_file (kube-scheduler sends none; for
    /// a proxy that adds one).
    pub require_token: bool,
    /// Larger request bodies are refused (a full NodeList of 5,000 nodes is ~25 MB).
    pub max_request_bytes: usize,
    /// Watch pods and nodes (in-cluster credentials or kubeconfig) to know each GPU's
    /// residents and each node's GPUs.
    pub watch_cluster: bool,
    /// The namespace whose pods are watched; "" = all namespaces.
    pub watch_namespace: String,
    /// Which acceptable GPU a node's score favours: "gain" (the largest predicted gain, so
    /// an empty GPU usually first), "pack" (an occupied GPU before an empty one) or
    /// "spread" (an empty GPU before an occupied one).
    pub prefer: ExtenderPrefer,
    /// How coloc's choice reaches the GPU (`extender::binding`): "node-only" (scores
    /// nodes; the device plugin picks the GPU), "hami" (the admission webhook writes
    /// `nvidia.com/use-gpuuuid`) or "dra" (it pins a marked ResourceClaim to the GPUs).
    pub binding: BindingMode,
    /// How many acceptable GPUs the webhook names, best first (the first is reserved).
    pub binding_gpus: usize,
    /// How long a GPU slot chosen by the webhook stays held for its pod, in seconds.
    pub reservation_ttl_secs: u64,
}

/// `extender.binding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum BindingMode {
    NodeOnly,
    Hami,
    Dra,
}

impl BindingMode {
    pub const ALL: [Self; 3] = [Self::NodeOnly, Self::Hami, Self::Dra];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeOnly => "node-only",
            Self::Hami => "hami",
            Self::Dra => "dra",
        }
    }
}

impl TryFrom<String> for BindingMode {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == raw)
            .ok_or_else(|| format!("{raw:?} is not one of {:?}", Self::ALL.map(Self::as_str)))
    }
}

/// `extender.prefer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ExtenderPrefer {
    Gain,
    Pack,
    Spread,
}

impl ExtenderPrefer {
    pub const ALL: [Self; 3] = [Self::Gain, Self::Pack, Self::Spread];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gain => "gain",
            Self::Pack => "pack",
            Self::Spread => "spread",
        }
    }
}

impl TryFrom<String> for ExtenderPrefer {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|prefer| prefer.as_str() == raw)
            .ok_or_else(|| format!("{raw:?} is not one of {:?}", Self::ALL.map(Self::as_str)))
    }
}

/// The placement policy Rank, Place and the scheduler extender apply unless a request
/// says otherwise (`advisor::Policy`; docs/placement.md, "The policy").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// How a set is valued: "normalized-sum" (Σ colocated / exclusive) or "throughput-sum".
    pub objective: ExtenderObjective,
    /// What a shared GPU must promise, on the members' predicted shares of their exclusive
    /// throughput: "fair-share" (each of the k jobs keeps at least 1/k; the rule the
    /// cluster simulation chose), "break-even" (together at least one job's work), "gain"
    /// (the set's value grows) or "none".
    pub rule: ExtenderRule,
    /// Read the floors, and order answers, on the low ends of the members' 80 % intervals.
    pub cautious: bool,
    /// The lowest fraction of its exclusive throughput the asking job keeps; 0 = none.
    pub min_job_fraction: f64,
    /// The lowest fraction every partner (Rank's candidate, Place's residents) keeps; 0 =
    /// none.
    pub min_partner_fraction: f64,
    /// List sets predicted to do less work than their members apart.
    pub include_losses: bool,
}

/// `policy.rule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ExtenderRule {
    None,
    Gain,
    FairShare,
    BreakEven,
}

impl ExtenderRule {
    pub const ALL: [Self; 4] = [Self::FairShare, Self::BreakEven, Self::Gain, Self::None];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gain => "gain",
            Self::FairShare => "fair-share",
            Self::BreakEven => "break-even",
        }
    }
}

impl TryFrom<String> for ExtenderRule {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|rule| rule.as_str() == raw)
            .ok_or_else(|| format!("{raw:?} is not one of {:?}", Self::ALL.map(Self::as_str)))
    }
}

/// `policy.objective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ExtenderObjective {
    NormalizedSum,
    ThroughputSum,
}

impl ExtenderObjective {
    pub const ALL: [Self; 2] = [Self::NormalizedSum, Self::ThroughputSum];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NormalizedSum => "normalized-sum",
            Self::ThroughputSum => "throughput-sum",
        }
    }
}

impl TryFrom<String> for ExtenderObjective {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|objective| objective.as_str() == raw)
            .ok_or_else(|| format!("{raw:?} is not one of {:?}", Self::ALL.map(Self::as_str)))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// A file of `ROLE TOKEN` lines (roles: reader, operator); empty = auth off.
    #[serde(with = "empty_path_is_none")]
    pub tokens_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// sqlx SQLite URL; the file is created if missing.
    pub url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// GPU model used when a request names none; empty = the only one known. Always a
    /// string, even when it looks like a number ("1080").
    #[serde(with = "empty_string_is_none")]
    pub default_gpu: Option<String>,
    /// Model kind Train fits when the request names none.
    pub kind: ModelKindSetting,
    /// The sharing mode ("mps" or "time-slicing") Rank, Predict, Place and the extender
    /// answer for when the request or pod names none.
    pub default_sharing_mode: crate::domain::SharingMode,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter, e.g. "info" or "coloc=debug,info". RUST_LOG overrides it.
    pub level: String,
    /// "text" or "json".
    pub format: LogFormat,
}

/// `profiler.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ProfilerBackend {
    /// Jobs wait.
    Off,
    /// Measure on this machine's GPU (NVML and Nsight Compute).
    Nvml,
    /// Serve profiles recorded in a KACE-format dataset.
    Replay,
}

/// `profiler.dispatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ProfilerDispatch {
    /// The in-process worker and `coloc agent`s claim the jobs.
    Agents,
    /// The service creates a one-shot Kubernetes Job per profiling job.
    KubernetesJobs,
}

impl TryFrom<String> for ProfilerDispatch {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        match raw.as_str() {
            "agents" => Ok(Self::Agents),
            "kubernetes-jobs" => Ok(Self::KubernetesJobs),
            other => Err(format!(
                "{other:?} is not one of \"agents\", \"kubernetes-jobs\""
            )),
        }
    }
}

/// `model.kind`: the model kinds by their settings names (the model layer maps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum ModelKindSetting {
    MemberRidgeGbt,
    KaceLinear,
}

impl ModelKindSetting {
    pub const ALL: [Self; 2] = [Self::MemberRidgeGbt, Self::KaceLinear];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemberRidgeGbt => "member-ridge-gbt",
            Self::KaceLinear => "kace-linear",
        }
    }
}

impl TryFrom<String> for ModelKindSetting {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == raw)
            .ok_or_else(|| format!("{raw:?} is not one of {:?}", Self::ALL.map(Self::as_str)))
    }
}

impl TryFrom<String> for ProfilerBackend {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        match raw.as_str() {
            "off" => Ok(Self::Off),
            "nvml" => Ok(Self::Nvml),
            "replay" => Ok(Self::Replay),
            other => Err(format!(
                "{other:?} is not one of \"nvml\", \"replay\", \"off\""
            )),
        }
    }
}

impl TryFrom<String> for LogFormat {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        raw.parse()
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object a line, for collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is neither \"text\" nor \"json\"")),
        }
    }
}

const DEFAULTS: &str = r#"
[server]
listen = "127.0.0.1:50051"
allow_unauthenticated_non_loopback = false
tls_cert_file = ""
tls_key_file = ""
max_request_bytes = 4194304
max_concurrent_heavy_rpcs = 0
heavy_body_timeout_secs = 10
shutdown_grace_secs = 20

[metrics]
listen = "127.0.0.1:50052"

[extender]
listen = ""
url_prefix = ""
tls_cert_file = ""
tls_key_file = ""
tls_client_ca_file = ""
require_token = false
max_request_bytes = 67108864
watch_cluster = false
watch_namespace = ""
prefer = "gain"
binding = "node-only"
binding_gpus = 1
reservation_ttl_secs = 60

[policy]
objective = "normalized-sum"
rule = "fair-share"
cautious = true
min_job_fraction = 0.0
min_partner_fraction = 0.0
include_losses = false

[auth]
tokens_file = ""

[database]
url = "sqlite://./coloc.db"

[model]
default_gpu = ""
kind = "member-ridge-gbt"
default_sharing_mode = "mps"

[profiler]
backend = "off"
replay_dir = ""
replay_gpu = "Tesla V100-SXM2-32GB"
replay_gpu_memory_gb = 32.0
gpu_index = 0
nvml_recording = ""
keep_raw_dir = ""
ncu_path = "ncu"
allowed_programs = []
env_allowlist = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME", "PYTHONPATH", "VIRTUAL_ENV"]
sample_interval_ms = 100
system_timeout_secs = 900
kernel_timeout_secs = 1800
max_attempts = 3
retry_backoff_secs = 30
output_limit_bytes = 4194304
poll_interval_ms = 1000
ncu_launch_skip = 50
ncu_launch_count = 200
dispatch = "agents"

[profiler.kubernetes]
namespace = "coloc"
coloc_image = "coloc"
service_addr = "http://coloc.coloc.svc:50051"
token_secret = ""
gpu_label = "nvidia.com/gpu.product"
active_deadline_secs = 3600
ttl_secs_after_finished = 600
poll_interval_ms = 2000
gpus = []

[agents]
lease_secs = 30
live_secs = 90
pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
pod_devices_interval_secs = 30
pod_devices_stale_secs = 120
gpu_resources = ["nvidia.com/gpu", "nvidia.com/gpu.shared"]

[trainer]
interval_secs = 600
min_new_observations = 20
cv_folds = 5
max_training_runs = 20000
training_threads = 0
score_tolerance = 0.005
mse_tolerance = 0.05
outlier_threshold = 6.0
drift_threshold = 0.25
drift_window = 50

[leader]
lease_ttl_ms = 10000
renew_interval_ms = 2000
model_poll_ms = 500
[observer]
sources = []
interval_secs = 15
min_window_secs = 300
guard_secs = 60
settle_secs = 30
stale_secs = 120
explore_budget = 0.0

[observer.prometheus]
url = "http://127.0.0.1:9090"
step_secs = 15
timeout_secs = 10
default_query = ""

[observer.push]
max_points_per_pod = 4096
max_pods = 10000

[log]
level = "info"
format = "text"
"#;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The config crate's message already names the key.
    #[error("cannot read settings: {0}")]
    Load(config::ConfigError),
    #[error("setting {key} is invalid: {message}")]
    Invalid { key: &'static str, message: String },
}

impl From<config::ConfigError> for SettingsError {
    fn from(error: config::ConfigError) -> Self {
        Self::Load(error)
    }
}

/// Where settings come from, besides the defaults.
#[derive(Debug, Default)]
pub struct SettingsSources<'a> {
    pub file: Option<&'a Path>,
    /// The environment to read `COLOC__...` variables from; `None` = the process's own.
    pub environment: Option<Map<String, String>>,
    /// Command-line overrides as (key, value), e.g. ("server.listen", "0.0.0.0:50051").
    pub overrides: Vec<(&'static str, String)>,
}

/// Settings that hold lists, given in the environment as comma-separated values.
const LIST_KEYS: [&str; 5] = [
    "observer.sources",
    "profiler.allowed_programs",
    "profiler.env_allowlist",
    "profiler.kubernetes.gpus",
    "agents.gpu_resources",
];

impl Settings {
    pub fn load(sources: SettingsSources<'_>) -> Result<Self, SettingsError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
        if let Some(path) = sources.file {
            builder = builder.add_source(File::from(path).format(FileFormat::Toml).required(true));
        }
        // Values from the environment stay strings until the typed field reads them, so a
        // GPU model named "1080" or "0800" is never turned into a number on the way (the
        // config crate's `try_parsing` would). Lists are split here, on commas.
        let environment: Map<String, String> = sources
            .environment
            .unwrap_or_else(|| std::env::vars().collect());
        let mut lists = Vec::new();
        let mut scalars = Map::new();
        for (name, value) in environment {
            let key = name
                .strip_prefix("COLOC__")
                .map(|k| k.replace("__", ".").to_lowercase());
            match key {
                Some(key) if LIST_KEYS.contains(&key.as_str()) => {
                    let items: Vec<String> = value
                        .split(',')
                        .filter(|item| !item.is_empty())
                        .map(str::to_string)
                        .collect();
                    lists.push((key, items));
                }
                _ => {
                    scalars.insert(name, value);
                }
            }
        }
        builder = builder.add_source(
            Environment::with_prefix("COLOC")
                .prefix_separator("__")
                .separator("__")
                .source(Some(scalars)),
        );
        for (key, items) in lists {
            builder = builder.set_override(key, items)?;
        }
        for (key, value) in sources.overrides {
            builder = builder.set_override(key, value)?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// The compiled allow-list of launch-spec programs.
    pub fn allowed_programs(&self) -> Result<AllowedPrograms, SettingsError> {
        AllowedPrograms::new(&self.profiler.allowed_programs).map_err(|message| {
            SettingsError::Invalid {
                key: "profiler.allowed_programs",
                message,
            }
        })
    }
}

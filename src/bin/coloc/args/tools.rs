//! The flags of the tools beside the service: `coloc simulate` (docs/simulation.md) and
//! `coloc bench` (docs/performance.md).

use super::*;

/// `coloc simulate`: what the cluster simulation (a module of the binary, `src/bin/coloc/sim/`) is
/// told. The defaults are the setup docs/simulation.md reports.
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
    /// (docs/simulation.md).
    #[arg(long, default_value = "cautious", value_parser = ["cautious", "point"])]
    pub caps: String,
    /// What the oracle and the model policies ask of a shared GPU before a queued job
    /// starts there: fair-share (every member of k keeps at least 1/k of its speed; chosen
    /// with --caps under the k8s queue on seeds 6-10, README), break-even (the new set's Σ
    /// colocated / exclusive at least 1), gain (Σ grows with the job). Caps and memory are
    /// kept under every rule.
    #[arg(long, default_value = "fair-share", value_parser = ["fair-share", "break-even", "gain"])]
    pub rule: String,
    /// Which GPU the model policies take among those Place admits, as the extender's
    /// `extender.prefer`: gain (the largest predicted gain, so an empty GPU usually first),
    /// pack (the best occupied GPU before any empty one) or spread (an empty GPU before
    /// any occupied one).
    #[arg(long, default_value = "gain", value_parser = ["gain", "pack", "spread"])]
    pub prefer: String,
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
    /// `--train-on pairs+runs` adds to the model policies' training
    /// (docs/simulation.md).
    #[arg(long)]
    pub split_runs: bool,
    /// Each workload's speed alone in the truth: corrected (the default: where the runs
    /// contradict the profile's exclusive throughput beyond noise, the figure the
    /// service's answers use instead) or recorded (the profile's figure, which two
    /// workloads' runs exceed by up to 2.5x; the truth before 2026-11-28);
    /// docs/decisions/036-corrected-truth.md.
    #[arg(long, default_value = "corrected", value_parser = ["recorded", "corrected"])]
    pub truth_exclusive: String,
    /// What the model policies (kace-linear, coloc) are trained on: pairs (the 181 measured
    /// pairs) or pairs+runs (with the training half of --split-runs, which it needs).
    #[arg(long, default_value = "pairs", value_parser = ["pairs", "pairs+runs"])]
    pub train_on: String,
    /// How coloc's model is banded: profiles (its 80 % intervals as `Train` calibrates
    /// them, on held-out profiles, and its seen bands, `--seen-bands`), held-out-runs (an experiment: recalibrated on runs held
    /// out at random, whose workloads the model saw) or held-out-runs-95 (the same, 95 %
    /// intervals); docs/simulation.md.
    #[arg(long, default_value = "profiles", value_parser = ["profiles", "held-out-runs", "held-out-runs-95"])]
    pub bands: String,
    /// Where coloc's model blends crowded members with the time-sharing law: always (the
    /// default's way since 2026-11-27: a model fitted on pairs alone too) or crowded-fits
    /// (only a model that learned crowded sets, the way before); docs/simulation.md
    /// .
    #[arg(long, default_value = "always", value_parser = ["always", "crowded-fits"])]
    pub law_blend: String,
    /// Which of `Train`'s seen bands coloc's model keeps (narrower bands for sets of
    /// workloads it was trained on): on (every one, the default), crowded (those of three
    /// and more members only) or off (the model's bands alone, as before 2026-11-27);
    /// docs/nway.md, "Seen bands".
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
    /// Write coloc-online's retraining trace to this file, one JSON object a line: at the
    /// start and after every retraining turn that trained, the serving model (version,
    /// runs, seen bands) and its answers on every measured set through Predict (error,
    /// low ends, widths, coverage; docs/simulation.md).
    #[arg(long)]
    pub trace_retraining: Option<PathBuf>,
}

/// `coloc bench`: what the load generator (a module of the binary, `src/bin/coloc/bench/`) is
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
    /// Run the in-process server on this PostgreSQL database instead (`postgres://...`, the
    /// database created beforehand); seeded when it holds no GPU model yet.
    #[arg(long, conflicts_with = "database")]
    pub postgres: Option<String>,
    /// In-process servers on the --postgres database (each its own loopback port; one
    /// leads); the clients' connections are spread over them round-robin. More than 1 needs
    /// --postgres.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "addr")]
    pub replicas: u32,
    /// Start each server as a child `coloc serve` process (this binary) on its own loopback
    /// port, instead of inside the bench's process: the bench process is then only the
    /// load, and replicas are processes as in a deployment.
    #[arg(long, conflicts_with = "addr")]
    pub replica_processes: bool,
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
    /// occupancy (AssignJob then ReleaseJob of new jobs), echo_rank_N (the transport's
    /// floor for rank_N: a bench-only echo service in the bench's process answering a
    /// real rank_N answer's bytes to the rank_N requests).
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
    /// The peer's server script.
    #[arg(long, default_value = "benches/peer/server.py")]
    pub peer_script: PathBuf,
    /// The proto directory the peer's server compiles.
    #[arg(long, default_value = "proto")]
    pub proto_dir: PathBuf,
    /// Seed of the synthetic store and of the requests' random choices.
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

fn parse_share(raw: &str) -> Result<f64, String> {
    let share: f64 = raw.parse().map_err(|e| format!("{raw:?}: {e}"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("a share is between 0 and 1, got {raw}"))
    }
}

//! The flags of `coloc eval` (kace, nway, objectives): the evaluation protocols of
//! docs/model.md and docs/nway.md.

use super::*;

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// The KACE paper's protocol on a KACE-format dataset with splits.csv: every split
    /// (train on its pairs, rank the rest) and every held-out workload.
    Kace(EvalKaceArgs),
    /// What following Rank's top pick blindly gets, per policy: each workload held out of
    /// training, its top partner over every profiled workload judged on the measured pairs,
    /// beside the oracle (docs/api.md, "Trustworthy defaults"). KACE-format folder;
    /// splits.csv is not needed.
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
    /// Also score every candidate option set of member-ridge-gbt (docs/nway.md).
    #[arg(long)]
    pub candidates: bool,
    /// Also measure how often the default model's 80 % intervals hold held-out runs (the
    /// pairs' unseen-workload protocol and these runs').
    #[arg(long)]
    pub coverage: bool,
    /// With --coverage, measure every candidate way of calibrating the intervals, not only
    /// the chosen one (docs/nway.md, "Intervals").
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
    /// Train, PinModel, then Predict for every candidate run (docs/nway.md).
    #[arg(long, conflicts_with_all = ["candidates", "coverage"])]
    pub through_api: bool,
    /// With --through-api: the servers' settings file (as `coloc serve --config`).
    #[arg(long, value_name = "FILE", requires = "through_api")]
    pub server_config: Option<PathBuf>,
    /// Only these targets (default: every workload of the runs).
    #[arg(long = "target", value_name = "WORKLOAD")]
    pub targets: Vec<String>,
    /// Withhold the six Nsight Compute kernel metrics from every profile (training and
    /// answers): the quality of profiles from NVML alone.
    #[arg(long, conflicts_with = "through_api")]
    pub nvml_only: bool,
    /// Instead of the table: the crowded-set choices made by nested leave-family-out
    /// cross-validation inside each training set, outer folds reporting (decision 020).
    #[arg(long, conflicts_with_all = ["through_api", "coverage", "candidates"])]
    pub nested: bool,
    /// With --nested: which candidates the inner folds choose among (`law`: decision
    /// 020's; `weighted`, `stacked`: the served options with and without that flag,
    /// decision 037; `composition`: crowded members composed from pair answers at 0, 50
    /// and 100 %, decision 041).
    #[arg(long, value_enum, default_value = "law", requires = "nested")]
    pub nested_candidates: NestedCandidates,
    /// With --nested: what the models are fitted on (`runs`: each file's runs, decision
    /// 020; `pairs`: the profile dataset's pairs alone, judged on the file's runs, as a
    /// service that imported them answers crowded sets, decision 041).
    #[arg(long, value_enum, default_value = "runs", requires = "nested")]
    pub nested_train: NestedTrain,
    /// Instead of the table: the crowded intervals' calibration chosen by nested
    /// leave-family-out cross-validation inside each training set, outer folds reporting
    /// (decision 038).
    #[arg(long, conflicts_with_all = ["through_api", "coverage", "candidates", "nested"])]
    pub nested_calibration: bool,
}

/// The candidate lists of `coloc eval nway --nested` (`eval::candidates::NestedSet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NestedCandidates {
    Law,
    Weighted,
    Stacked,
    Composition,
}

/// What `coloc eval nway --nested` fits its models on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NestedTrain {
    Runs,
    Pairs,
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
    /// Also score every candidate option set of member-ridge-gbt (docs/nway.md).
    #[arg(long)]
    pub candidates: bool,
    /// Also measure the default model's 80 % intervals on each pair protocol (n_occur=2
    /// splits, unseen workload, unseen family), calibrated on each case's training alone.
    #[arg(long)]
    pub coverage: bool,
    /// Withhold the six Nsight Compute kernel metrics from every profile (training and
    /// answers): the quality of profiles from NVML alone.
    #[arg(long)]
    pub nvml_only: bool,
    /// Instead of the table: the pair options chosen by nested leave-workload-out
    /// cross-validation inside each training set, outer folds reporting (decision 020).
    #[arg(long, conflicts_with_all = ["coverage", "candidates", "plot", "predictions_out"])]
    pub nested: bool,
}

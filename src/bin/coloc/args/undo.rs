//! The flags of the undo commands (`coloc runs delete`, `coloc gpus forget`, `coloc
//! workloads delete-profile`, `coloc audit list`; docs/operations.md, "Undoing mistakes").

use clap::{Args, Subcommand};

/// What every undo command takes: a dry run, and who asks.
#[derive(Debug, Args, Clone)]
pub struct UndoArgs {
    /// Show what would go; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Who asks, for the audit trail (default: $COLOC_ACTOR, else $USER).
    #[arg(long, env = "COLOC_ACTOR")]
    pub actor: Option<String>,
}

impl UndoArgs {
    /// The actor sent: the flag, else the login name.
    pub fn actor(&self) -> String {
        self.actor
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_default()
    }
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Delete stored runs (training data): by id, by source, by when they were stored, or
    /// one import's; then retrain each GPU model that lost runs. Exactly one selector.
    Delete(DeleteRunsArgs),
}

#[derive(Debug, Args)]
pub struct DeleteRunsArgs {
    /// A run id (ReportColocation's observation_id), repeatable.
    #[arg(long = "id", conflicts_with_all = ["source", "since", "until", "import_batch"])]
    pub ids: Vec<u64>,
    /// Every run of this source: reported, imported or calibrated.
    #[arg(long, conflicts_with_all = ["since", "until", "import_batch"])]
    pub source: Option<String>,
    /// Runs stored at this time (RFC 3339, e.g. 2026-11-27T10:00:00Z) or later.
    #[arg(long, conflicts_with = "import_batch")]
    pub since: Option<String>,
    /// Runs stored before this time (RFC 3339).
    #[arg(long, conflicts_with = "import_batch")]
    pub until: Option<String>,
    /// The runs of one import: the batch id `coloc import` printed.
    #[arg(long)]
    pub import_batch: Option<i64>,
    /// Only runs on this GPU model (default: every GPU model).
    #[arg(long, default_value = "")]
    pub gpu: String,
    #[command(flatten)]
    pub undo: UndoArgs,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// The newest entries of the audit trail: who undid what, when, how many rows.
    List {
        /// How many entries (at most 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

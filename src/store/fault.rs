//! Fault injection for chaos tests: a switch that makes every commit of the store fail,
//! the way a full disk or an I/O error fails it. While it is on, the store's one commit
//! (`engine::Db::commit`) rolls the transaction back and answers with
//! [`injected_commit_failure`], SQLite's "constraint failed: commit hook" code: the state a
//! failed write to storage leaves behind, on either engine. Off (the default), it costs one
//! atomic load per commit. Nothing in the service turns it on.

use std::{
    borrow::Cow,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use sqlx::error::{DatabaseError, ErrorKind};

/// SQLite's SQLITE_CONSTRAINT_COMMITHOOK: a COMMIT a commit hook turned into a rollback.
pub(super) const COMMIT_HOOK_CODE: i32 = 19 | (2 << 8);

#[derive(Clone, Debug, Default)]
pub struct FaultSwitch {
    fail_commits: Arc<AtomicBool>,
}

impl FaultSwitch {
    /// Makes every commit fail (`true`) or succeed again (`false`).
    pub fn fail_commits(&self, on: bool) {
        self.fail_commits.store(on, Ordering::SeqCst);
    }

    /// Whether commits fail now.
    pub(super) fn failing_commits(&self) -> bool {
        self.fail_commits.load(Ordering::SeqCst)
    }
}

/// The error a commit refused by the switch answers.
pub(super) fn injected_commit_failure() -> sqlx::Error {
    sqlx::Error::Database(Box::new(InjectedCommitFailure))
}

#[derive(Debug)]
struct InjectedCommitFailure;

impl std::fmt::Display for InjectedCommitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("commit failed (the fault switch is on); the transaction was rolled back")
    }
}

impl std::error::Error for InjectedCommitFailure {}

impl DatabaseError for InjectedCommitFailure {
    fn message(&self) -> &str {
        "commit failed (the fault switch is on); the transaction was rolled back"
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(COMMIT_HOOK_CODE.to_string()))
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        ErrorKind::Other
    }
}

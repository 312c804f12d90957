//! Fault injection for chaos tests: a switch that makes every commit of the store fail,
//! the way a full disk or an I/O error fails it. Each pool connection gets a SQLite commit
//! hook when it opens; while the switch is on the hook turns each COMMIT into a ROLLBACK, so
//! SQLite answers the COMMIT with an error and has rolled the transaction back by itself:
//! the state a failed write to storage leaves behind. Off (the default), the hook costs one
//! atomic load per commit. Nothing in the service turns it on.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use sqlx::SqliteConnection;

#[derive(Clone, Debug, Default)]
pub struct FaultSwitch {
    fail_commits: Arc<AtomicBool>,
}

impl FaultSwitch {
    /// Makes every commit fail (`true`) or succeed again (`false`).
    pub fn fail_commits(&self, on: bool) {
        self.fail_commits.store(on, Ordering::SeqCst);
    }

    /// Installs the commit hook on a new connection.
    pub(super) async fn install(&self, connection: &mut SqliteConnection) -> sqlx::Result<()> {
        let fail_commits = self.fail_commits.clone();
        connection
            .lock_handle()
            .await?
            .set_commit_hook(move || !fail_commits.load(Ordering::SeqCst));
        Ok(())
    }
}

//! Online backups of the store: a consistent copy of the SQLite file taken while the
//! service runs and writes, through SQLite's own `VACUUM INTO` (one read transaction: the
//! copy is the database as of one commit, never a half-written one; writers are not
//! blocked under WAL). The copy is then opened and checked.

use std::{path::Path, str::FromStr};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode},
    ConnectOptions, Connection, Row,
};

/// What a finished backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    pub bytes: u64,
    pub workloads: i64,
    pub observations: i64,
    pub models: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0} exists; a backup never overwrites a file")]
    Exists(String),
    #[error("the database {0} does not exist")]
    NoDatabase(String),
    #[error("invalid database url: {0}")]
    InvalidUrl(#[source] sqlx::Error),
    #[error("the backup failed")]
    Database(#[from] sqlx::Error),
    #[error("the copy failed its integrity check: {0}")]
    Damaged(String),
    #[error("cannot read the copy's size")]
    Io(#[from] std::io::Error),
}

/// Copies the database at `database_url` into the new file `destination`, consistently, and
/// checks the copy (`PRAGMA integrity_check`). Never creates or migrates the source.
pub async fn backup(database_url: &str, destination: &Path) -> Result<BackupSummary, BackupError> {
    if destination.exists() {
        return Err(BackupError::Exists(destination.display().to_string()));
    }
    let source = SqliteConnectOptions::from_str(database_url)
        .map_err(BackupError::InvalidUrl)?
        .create_if_missing(false)
        .read_only(true);
    if !source.get_filename().exists() {
        return Err(BackupError::NoDatabase(
            source.get_filename().display().to_string(),
        ));
    }
    let mut connection = source.connect().await.map_err(|e| match e {
        sqlx::Error::Database(_) => BackupError::NoDatabase(database_url.to_string()),
        other => BackupError::Database(other),
    })?;
    sqlx::query("VACUUM INTO ?1")
        .bind(destination.to_string_lossy().as_ref())
        .execute(&mut connection)
        .await?;
    connection.close().await?;

    // The copy is a rollback-journal database; the service turns WAL on when it opens it.
    let mut copy = SqliteConnectOptions::new()
        .filename(destination)
        .journal_mode(SqliteJournalMode::Delete)
        .connect()
        .await?;
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut copy)
        .await?;
    if integrity != "ok" {
        return Err(BackupError::Damaged(integrity));
    }
    let counts = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM workloads), (SELECT COUNT(*) FROM observations), \
         (SELECT COUNT(*) FROM models)",
    )
    .fetch_one(&mut copy)
    .await?;
    copy.close().await?;
    Ok(BackupSummary {
        bytes: std::fs::metadata(destination)?.len(),
        workloads: counts.get(0),
        observations: counts.get(1),
        models: counts.get(2),
    })
}

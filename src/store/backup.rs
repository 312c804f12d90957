//! Online backups of the store: a consistent copy of the SQLite file taken while the
//! service runs and writes, through SQLite's own `VACUUM INTO` (one read transaction: the
//! copy is the database as of one commit, never a half-written one; writers are not
//! blocked under WAL). The copy is then opened and checked. A PostgreSQL store is backed
//! up with PostgreSQL's own `pg_dump`, which this refuses plainly to stand in for.

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
    /// `coloc backup` copies SQLite files only.
    #[error(
        "coloc backup copies a SQLite store; this store is PostgreSQL: back it up with \
         PostgreSQL's own tools, e.g. `pg_dump --format=custom --file {file} '{url}'` \
         (restore with pg_restore into an empty database)"
    )]
    UsePgDump { url: String, file: String },
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
    if super::engine::Engine::of_url(database_url) == super::engine::Engine::Postgres {
        return Err(BackupError::UsePgDump {
            url: without_password(database_url),
            file: destination.display().to_string(),
        });
    }
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

/// `url` with its password (if any) left out, for a message.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}{}", &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_postgresql_store_is_sent_to_pg_dump_without_its_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("copy.dump");
        let error = backup("postgres://coloc:secret@db.example:5432/coloc", &file)
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("pg_dump --format=custom"), "{text}");
        assert!(text.contains("postgres://coloc@db.example:5432/coloc"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(!file.exists(), "nothing written");
    }
}

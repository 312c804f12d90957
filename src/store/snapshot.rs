//! A read-only, consistent view of one GPU model's data in a store file, for tools that
//! read a database beside a running service (`coloc export`).
//!
//! Unlike [`Store::open`](super::Store::open), it never creates, migrates or writes the file,
//! and it takes no [`DatabaseLock`](super::DatabaseLock): that lock keeps writers from
//! writing behind a running service's back, and a reader does no such harm. One connection,
//! opened read-only, reads everything in one read transaction: under WAL that is the
//! database as of one commit (a run reported meanwhile is either wholly in or wholly out),
//! and the service's writers are not blocked while it reads (as `coloc backup`).

use std::str::FromStr;

use sqlx::{sqlite::SqliteConnectOptions, AnyConnection, ConnectOptions, Connection};

use super::{engine::Engine, observations, workloads, StoreError, StoredObservation};
use crate::domain::{GpuName, Profile, WorkloadName};

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the database {0} does not exist")]
    NoDatabase(String),
    #[error("{0} is no coloc store (it has no profiles table)")]
    NotAStore(String),
    #[error("invalid database url: {0}")]
    InvalidUrl(#[source] sqlx::Error),
    #[error("cannot open the database {0} read-only")]
    Open(String, #[source] sqlx::Error),
    #[error("cannot read the database")]
    Read(#[from] StoreError),
}

impl From<sqlx::Error> for SnapshotError {
    fn from(error: sqlx::Error) -> Self {
        Self::Read(StoreError::Database(error))
    }
}

/// What a store holds for one GPU model, as of one commit.
#[derive(Debug, Clone)]
pub struct GpuSnapshot {
    /// Every profile on the GPU model (complete or not), by workload name.
    pub profiles: Vec<(WorkloadName, Profile)>,
    /// Every stored run on the GPU model, whatever its source and size, oldest first (in the
    /// order they were stored).
    pub runs: Vec<StoredObservation>,
    /// Every GPU model that has a profile in the store.
    pub profiled_gpus: Vec<GpuName>,
}

/// Reads `gpu`'s profiles and runs from the database at `database_url`, read-only.
/// On PostgreSQL, the read is one REPEATABLE READ, READ ONLY transaction.
pub async fn read_gpu(database_url: &str, gpu: &GpuName) -> Result<GpuSnapshot, SnapshotError> {
    sqlx::any::install_default_drivers();
    let engine = Engine::of_url(database_url);
    let (url, file) = match engine {
        Engine::Postgres => (database_url.to_string(), database_url.to_string()),
        Engine::Sqlite => {
            let options = SqliteConnectOptions::from_str(database_url)
                .map_err(SnapshotError::InvalidUrl)?
                .create_if_missing(false)
                .read_only(true);
            let file = options.get_filename().display().to_string();
            let in_memory =
                database_url.contains(":memory:") || database_url.contains("mode=memory");
            if !in_memory && !options.get_filename().exists() {
                return Err(SnapshotError::NoDatabase(file));
            }
            (options.to_url_lossy().to_string(), file)
        }
    };
    let mut connection = AnyConnection::connect(&url)
        .await
        .map_err(|e| SnapshotError::Open(file.clone(), e))?;
    let (begin, tables) = match engine {
        Engine::Sqlite => (
            "BEGIN",
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'profiles'",
        ),
        Engine::Postgres => (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name = 'profiles'",
        ),
    };
    let mut tx = connection.begin_with(begin).await?;
    let tables: i64 = sqlx::query_scalar(tables).fetch_one(&mut *tx).await?;
    if tables == 0 {
        return Err(SnapshotError::NotAStore(file));
    }
    let (profiles, profiled_gpus) = workloads::profiles_on_gpu(&mut tx, gpu).await?;
    let runs = observations::runs_on_gpu(&mut tx, gpu, 0).await?;
    // Nothing was written: ending the read transaction either way only lets go of the
    // snapshot.
    tx.rollback().await?;
    connection.close().await?;
    Ok(GpuSnapshot {
        profiles,
        runs,
        profiled_gpus,
    })
}

//! Which database engine a store runs on (SQLite or PostgreSQL, chosen by the URL), how its
//! pool is opened, and the one place where the store's transactions begin and commit.
//!
//! The store's SQL is portable (`$N` placeholders, `ON CONFLICT`, `RETURNING`, BIGINT and
//! DOUBLE PRECISION columns) and runs through sqlx's `Any` driver, so every query is
//! written once. What differs between the engines lives here:
//!
//! - **Write transactions.** SQLite's `BEGIN IMMEDIATE` takes the database's one write
//!   lock up front. PostgreSQL gets the same rule from a transaction-scoped advisory lock
//!   ([`WRITE_LOCK_KEY`]) taken first thing in every write transaction, waited for at most
//!   [`LOCK_WAIT`] (SQLite's busy timeout): write transactions of every process on the
//!   database run one after another, and what one reads (READ COMMITTED: each statement
//!   sees everything committed before it) cannot change under it before it commits. The
//!   occupancy's version check and the job queue's claims rely on that, across servers.
//!   [`Db::begin_fenced_write`] adds the leader's fencing token: inside a leader's task
//!   (`lease::fenced`) the lease is checked in the same transaction, under the write lock
//!   (`lease.rs`).
//! - **Commits.** [`Db::commit`] is where the fault switch (`fault.rs`) fails a commit.
//! - **Connections.** SQLite: WAL, synchronous FULL, foreign keys, a 5 s busy timeout, the
//!   file created when missing (by one connection of SQLite's own before the pool opens). PostgreSQL: a short acquire timeout, so that a lost server
//!   fails writes within seconds instead of holding callers for the pool's default 30 s.

use std::time::Duration;

use sqlx::{
    any::AnyPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
    Any, AnyPool, Encode, Transaction,
};

use super::fault::FaultSwitch;

/// The key of PostgreSQL's store-wide write lock (`pg_advisory_xact_lock`): "coloc" in
/// ASCII. Every process writing one database takes the same key.
pub const WRITE_LOCK_KEY: i64 = 0x63_6f_6c_6f_63;

/// How long a write transaction waits for another one's write lock before it fails as a
/// storage fault (SQLite's busy timeout is the same).
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long a caller waits for a PostgreSQL connection (a lost server fails writes after
/// this long).
pub const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// The database engine behind a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// The engine a database URL names: `postgres://` or `postgresql://` is PostgreSQL,
    /// anything else SQLite (`sqlite://FILE`, `sqlite::memory:`).
    pub fn of_url(url: &str) -> Self {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::Postgres
        } else {
            Self::Sqlite
        }
    }
}

/// The pool and what the store needs to know to use it.
#[derive(Clone, Debug)]
pub(super) struct Db {
    pub(super) pool: AnyPool,
    pub(super) engine: Engine,
    pub(super) faults: FaultSwitch,
}

impl Db {
    /// A write transaction: the database's write lock is held from its first statement.
    pub(super) async fn begin_write(&self) -> sqlx::Result<Transaction<'static, Any>> {
        match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Engine::Postgres => {
                let mut tx = self.pool.begin().await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SET LOCAL lock_timeout = {}",
                    LOCK_WAIT.as_millis()
                )))
                .execute(&mut *tx)
                .await?;
                // A writer that stops between statements while it holds the write lock (a
                // process paused, a hung client) would hold every other server's writes,
                // the leader's lease included: the server ends its session after
                // LOCK_WAIT idle inside the transaction, which rolls it back.
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SET LOCAL idle_in_transaction_session_timeout = {}",
                    LOCK_WAIT.as_millis()
                )))
                .execute(&mut *tx)
                .await?;
                sqlx::query("SELECT 1 FROM pg_advisory_xact_lock($1)")
                    .bind(WRITE_LOCK_KEY)
                    .execute(&mut *tx)
                    .await?;
                Ok(tx)
            }
        }
    }

    /// [`Self::begin_write`], then, inside a leader's task, the check that its lease still
    /// holds (`lease::check_fence`): a deposed leader's write fails with
    /// `StoreError::NotLeader` before it writes anything.
    pub(super) async fn begin_fenced_write(
        &self,
    ) -> Result<Transaction<'static, Any>, super::StoreError> {
        let mut tx = self.begin_write().await?;
        if let Err(refused) = super::lease::check_fence(&mut tx, self.engine).await {
            if let Err(error) = tx.rollback().await {
                tracing::warn!(%error, "rollback failed");
            }
            return Err(refused);
        }
        Ok(tx)
    }

    /// A read transaction: one consistent view (SQLite: a deferred transaction; PostgreSQL:
    /// REPEATABLE READ, one snapshot for all its statements).
    pub(super) async fn begin_read(&self) -> sqlx::Result<Transaction<'static, Any>> {
        match self.engine {
            Engine::Sqlite => self.pool.begin().await,
            Engine::Postgres => {
                self.pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
            }
        }
    }

    /// Commits `tx`, unless the fault switch is on: then it is rolled back and the commit
    /// fails as a failed disk write would.
    pub(super) async fn commit(&self, tx: Transaction<'static, Any>) -> sqlx::Result<()> {
        if self.faults.failing_commits() {
            if let Err(error) = tx.rollback().await {
                tracing::warn!(%error, "rollback failed");
            }
            return Err(super::fault::injected_commit_failure());
        }
        tx.commit().await
    }
}

/// An optional `f64` to bind. sqlx 0.9's Any driver turns a bound `Option<f64>::None` into a
/// PostgreSQL `float4` NULL (its NULL kinds for REAL and DOUBLE are swapped on the way to
/// PostgreSQL's arguments), and a statement prepared with that parameter type then refuses
/// the same statement's later non-NULL `f64` ("incorrect binary data format"). This binds
/// its NULL as the kind that reaches PostgreSQL as `float8`; SQLite sees a plain NULL.
#[derive(Clone, Copy, Debug)]
pub(super) struct OptF64(pub Option<f64>);

impl sqlx::Type<Any> for OptF64 {
    fn type_info() -> sqlx::any::AnyTypeInfo {
        <f64 as sqlx::Type<Any>>::type_info()
    }
}

impl sqlx::Encode<'_, Any> for OptF64 {
    fn encode_by_ref(
        &self,
        buf: &mut <Any as sqlx::Database>::ArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        match self.0 {
            Some(value) => <f64 as Encode<'_, Any>>::encode_by_ref(&value, buf),
            // An f32 NULL: the kind sqlx hands PostgreSQL as a float8 NULL (see above).
            None => <Option<f32> as Encode<'_, Any>>::encode_by_ref(&None, buf),
        }
    }
}

/// Opens the pool for `url`, with the engine's connection settings; `keep` decides
/// whether a connection of age `age` may be lent or taken back (store/health.rs).
pub(super) async fn connect(
    url: &str,
    engine: Engine,
    keep: impl Fn(Duration) -> bool + Clone + Send + Sync + 'static,
) -> sqlx::Result<AnyPool> {
    sqlx::any::install_default_drivers();
    let (acquire_keep, release_keep) = (keep.clone(), keep);
    let options = AnyPoolOptions::new()
        .before_acquire(move |_, meta| {
            let kept = acquire_keep(meta.age);
            Box::pin(async move { Ok(kept) })
        })
        .after_release(move |connection, meta| {
            let kept = release_keep(meta.age);
            Box::pin(async move { Ok(kept && release_check(connection).await?) })
        });
    match engine {
        Engine::Postgres => {
            options
                .max_connections(8)
                .acquire_timeout(PG_ACQUIRE_TIMEOUT)
                .connect(url)
                .await
        }
        Engine::Sqlite => {
            let in_memory = url.contains(":memory:") || url.contains("mode=memory");
            if !in_memory {
                // One connection of SQLite's own first: it creates the file when missing and
                // turns WAL on (a setting of the file, kept), and a file that is no database
                // fails here, at once, rather than in the pool's retries.
                use sqlx::ConnectOptions;
                let first = <SqliteConnectOptions as std::str::FromStr>::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .connect()
                    .await?;
                sqlx::Connection::close(first).await?;
            }
            // An in-memory database lives in one connection; more would each see an empty one.
            let max_connections = if in_memory { 1 } else { 4 };
            options
                .max_connections(max_connections)
                .after_connect(|connection, _| {
                    Box::pin(async move {
                        // FULL: an acknowledged write survives a power cut, not only a
                        // process crash (a setting of each connection). Foreign keys and
                        // the 5 s busy timeout are sqlx's defaults for SQLite.
                        sqlx::query("PRAGMA synchronous = FULL")
                            .execute(&mut *connection)
                            .await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
        }
    }
}

/// Run when a connection goes back to the pool. A transaction whose COMMIT or ROLLBACK
/// failed (a full disk, an I/O error, a lost server) can leave the connection inside a
/// transaction, or sqlx believing it is (SQLite rolled back by itself, so the ROLLBACK found
/// none): every later `BEGIN` on it would fail. Such a connection is closed, which rolls back
/// whatever is left, and the pool opens a fresh one.
async fn release_check(connection: &mut sqlx::AnyConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    if !connection.is_in_transaction() {
        return Ok(true);
    }
    // A dropped transaction's rollback may still be queued: it runs before the ping answers.
    connection.ping().await?;
    if connection.is_in_transaction() {
        tracing::warn!("a connection was left inside a transaction; closing it");
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_engine() {
        assert_eq!(Engine::of_url("postgres://h/db"), Engine::Postgres);
        assert_eq!(Engine::of_url("postgresql://h/db"), Engine::Postgres);
        assert_eq!(Engine::of_url("sqlite://./coloc.db"), Engine::Sqlite);
        assert_eq!(Engine::of_url("sqlite::memory:"), Engine::Sqlite);
    }
}

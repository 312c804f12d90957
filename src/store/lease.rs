//! The leader's lease among the servers sharing one database (table `leader_lease`, one
//! row) and the fencing token every leader-only write is checked against.
//!
//! - **Time is the database's.** Expiry is compared with the database's clock
//!   (PostgreSQL `clock_timestamp()`, SQLite `julianday('now')`), never a server's, so
//!   servers whose clocks disagree still agree on who holds the lease.
//! - **Taking and renewing** run in a write transaction (`engine::Db::begin_write`: the
//!   database's write lock), so two servers never both take an expired lease.
//! - **The fencing token** grows by one each time the lease is taken anew (another holder,
//!   or the same one after it ran out). A leader's tasks run inside [`fenced`]: every write
//!   transaction they begin checks, in that same transaction and under the write lock,
//!   that the row still names their holder and token and has not run out; otherwise the
//!   write is refused with [`StoreError::NotLeader`] and nothing is written. A takeover
//!   needs the same write lock, so it cannot slip between the check and the commit.
//!
//! Writes every replica makes (reports through the observation writer, the occupancy,
//! the health probe) are not fenced: they begin with `Db::begin_write` directly.

use std::future::Future;

use super::{engine::Engine, Store, StoreError};

/// Who leads, as the database says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub holder: String,
    pub token: i64,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
}

/// What taking or renewing the lease gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The caller holds the lease until `expires_at_ms` (database clock) with `token`;
    /// `taken` when this call took it anew (a new token), false when it renewed it.
    Held {
        token: i64,
        taken: bool,
        expires_at_ms: i64,
    },
    /// Another holder's lease has not run out.
    HeldBy {
        holder: String,
        token: i64,
        expires_in_ms: i64,
    },
}

/// The holder and token a leader's writes are checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub token: i64,
}

tokio::task_local! {
    /// The fence of the leader task running now, if any.
    static FENCE: Fence;
}

/// Runs `work` as a leader's task holding `fence`: every store write transaction it
/// begins (in this task, not in tasks it spawns) is refused unless the lease still names
/// `fence`.
pub async fn fenced<F: Future>(fence: Fence, work: F) -> F::Output {
    FENCE.scope(fence, work).await
}

/// The fence of the running task, if it runs inside [`fenced`].
pub fn current_fence() -> Option<Fence> {
    FENCE.try_with(Fence::clone).ok()
}

/// The database's clock in milliseconds since the epoch, as an SQL expression.
fn database_now(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        Engine::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// The lease row and the database's clock, read inside `tx`.
async fn read_lease(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    engine: Engine,
) -> Result<(Option<LeaseRow>, i64), sqlx::Error> {
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {}",
        database_now(engine)
    )))
    .fetch_one(&mut **tx)
    .await?;
    let row: Option<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT holder, token, acquired_at_ms, expires_at_ms FROM leader_lease WHERE id = 1",
    )
    .fetch_optional(&mut **tx)
    .await?;
    let row = row.map(|(holder, token, acquired_at_ms, expires_at_ms)| LeaseRow {
        holder,
        token,
        acquired_at_ms,
        expires_at_ms,
    });
    Ok((row, now))
}

/// Checks, inside a write transaction, that the running task's fence (if it has one)
/// still holds the lease. Called by `engine` right after the write lock is taken.
pub(super) async fn check_fence(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    engine: Engine,
) -> Result<(), StoreError> {
    let Some(fence) = current_fence() else {
        return Ok(());
    };
    let (row, now) = read_lease(tx, engine).await?;
    match row {
        Some(row)
            if row.holder == fence.holder
                && row.token == fence.token
                && row.expires_at_ms > now =>
        {
            Ok(())
        }
        row => {
            let now = match row {
                None => "no server holds the lease".to_string(),
                Some(row) if row.token != fence.token || row.holder != fence.holder => {
                    format!("{} leads with token {}", row.holder, row.token)
                }
                Some(row) => format!("the lease ran out {} ms ago", now - row.expires_at_ms),
            };
            Err(StoreError::NotLeader {
                holder: fence.holder,
                token: fence.token,
                now,
            })
        }
    }
}

impl Store {
    /// Takes the lease for `holder` when nobody holds it or its lease ran out, renews it
    /// when `holder` holds it, for `ttl_ms` from now on the database's clock.
    pub async fn take_or_renew_lease(
        &self,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        let mut tx = self.db.begin_write().await.map_err(StoreError::from)?;
        let outcome = take_or_renew_in(&mut tx, self.db.engine, holder, ttl_ms).await;
        self.finish_write(tx, outcome).await
    }

    /// Lets the lease go (it runs out now) when `fence` still holds it, so that another
    /// server takes over at its next try instead of after the lease's whole term. False
    /// when the lease was no longer `fence`'s.
    pub async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError> {
        let mut tx = self.db.begin_write().await.map_err(StoreError::from)?;
        let sql = format!(
            "UPDATE leader_lease SET expires_at_ms = {} WHERE id = 1 AND holder = $1 AND token = $2",
            database_now(self.db.engine)
        );
        let outcome = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.token)
            .execute(&mut *tx)
            .await
            .map(|done| done.rows_affected() == 1)
            .map_err(StoreError::from);
        self.finish_write(tx, outcome).await
    }

    /// The lease as stored, and the database's clock now (for operators and tests).
    pub async fn lease(&self) -> Result<(Option<LeaseRow>, i64), StoreError> {
        let mut tx = self.db.begin_read().await?;
        let read = read_lease(&mut tx, self.db.engine).await?;
        tx.rollback().await?;
        Ok(read)
    }
}

async fn take_or_renew_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    engine: Engine,
    holder: &str,
    ttl_ms: i64,
) -> Result<LeaseOutcome, StoreError> {
    let (row, now) = read_lease(tx, engine).await?;
    let expires_at_ms = now + ttl_ms;
    match row {
        None => {
            sqlx::query(
                "INSERT INTO leader_lease (id, holder, token, acquired_at_ms, expires_at_ms) \
                 VALUES (1, $1, 1, $2, $3)",
            )
            .bind(holder)
            .bind(now)
            .bind(expires_at_ms)
            .execute(&mut **tx)
            .await?;
            Ok(LeaseOutcome::Held {
                token: 1,
                taken: true,
                expires_at_ms,
            })
        }
        Some(row) if row.holder == holder && row.expires_at_ms > now => {
            sqlx::query("UPDATE leader_lease SET expires_at_ms = $1 WHERE id = 1")
                .bind(expires_at_ms)
                .execute(&mut **tx)
                .await?;
            Ok(LeaseOutcome::Held {
                token: row.token,
                taken: false,
                expires_at_ms,
            })
        }
        Some(row) if row.expires_at_ms <= now => {
            let token = row.token + 1;
            sqlx::query(
                "UPDATE leader_lease SET holder = $1, token = $2, acquired_at_ms = $3, \
                 expires_at_ms = $4 WHERE id = 1",
            )
            .bind(holder)
            .bind(token)
            .bind(now)
            .bind(expires_at_ms)
            .execute(&mut **tx)
            .await?;
            Ok(LeaseOutcome::Held {
                token,
                taken: true,
                expires_at_ms,
            })
        }
        Some(row) => Ok(LeaseOutcome::HeldBy {
            holder: row.holder,
            token: row.token,
            expires_in_ms: row.expires_at_ms - now,
        }),
    }
}

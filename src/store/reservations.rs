//! GPU reservations: a slot the scheduler extender's webhook chose is held for its pod
//! between the decision and the bind, so that two pods decided back to back (on one
//! replica or two) never both take the last acceptable slot of a GPU.
//!
//! A hold is keyed by the GPU (node and id), the version of the GPU's resident set the
//! decision saw, and its ordinal: how many live holds the decider saw on that GPU under that
//! version. Two deciders that saw the same state ask for the same key; the store grants it
//! to one (an insert that conflicts changes nothing unless the row there has expired or is
//! the same holder's), and the other decides again with the new hold in view. A hold counts
//! while it has not expired and its version is still the GPU's current one: once the
//! resident set changes (the pod landed, or anything else moved), the cluster view is the
//! truth again. A hold is done once its pod is seen bound: the next claim deletes it in
//! its own transaction, and until then the decider ignores it.
//!
//! The SQL is portable (`$N` placeholders, `ON CONFLICT ... DO UPDATE ... WHERE`, no
//! SQLite-only function) and runs unchanged on PostgreSQL
//! (migrations/postgres/20261128050001_gpu_reservations.sql), where several replicas share
//! one database; [`Reservations`] takes either pool. One exception: on SQLite the live
//! holds are read as one row, a JSON array built by SQLite's `json_group_array`, since the
//! SQLite driver hands rows to the caller one at a time across threads (a wake-up each),
//! and a webhook decision reads every live hold.

use sqlx::{AnyPool, PgPool};

/// The table's pool: the service's store (SQLite or PostgreSQL), or a PostgreSQL database
/// of its own.
#[derive(Debug, Clone)]
pub enum Reservations {
    Store(AnyPool),
    Postgres(PgPool),
}

/// One hold on a GPU slot.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Reservation {
    pub node: String,
    pub gpu_id: String,
    pub resident_version: String,
    pub ordinal: i64,
    pub holder: String,
    pub workload: String,
    pub reserved_at_ms: i64,
    pub expires_at_ms: i64,
    /// What the holder will take on the GPU as HAMi accounts it (memory in MiB, cores in
    /// percent); 0 without a HAMi request.
    pub mem_mib: i64,
    pub cores: i64,
}

impl From<LiveRow> for Reservation {
    fn from(row: LiveRow) -> Self {
        let (node, gpu_id, resident_version, ordinal, holder, workload) =
            (row.0, row.1, row.2, row.3, row.4, row.5);
        Self {
            node,
            gpu_id,
            resident_version,
            ordinal,
            holder,
            workload,
            reserved_at_ms: row.6,
            expires_at_ms: row.7,
            mem_mib: row.8,
            cores: row.9,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    #[error("the reservations table cannot be read or written: {0}")]
    Database(#[from] sqlx::Error),
}

const LIVE: &str = "SELECT node, gpu_id, resident_version, ordinal, holder, workload, \
     reserved_at_ms, expires_at_ms, mem_mib, cores FROM gpu_reservations WHERE expires_at_ms > $1 \
     ORDER BY node, gpu_id, ordinal";

/// Granted when the key is free, expired, or already this holder's (a retried decision).
const CLAIM: &str = "INSERT INTO gpu_reservations (node, gpu_id, resident_version, ordinal, \
     holder, workload, reserved_at_ms, expires_at_ms, mem_mib, cores) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
     ON CONFLICT (node, gpu_id, resident_version, ordinal) DO UPDATE SET \
     holder = excluded.holder, workload = excluded.workload, \
     reserved_at_ms = excluded.reserved_at_ms, expires_at_ms = excluded.expires_at_ms, \
     mem_mib = excluded.mem_mib, cores = excluded.cores \
     WHERE gpu_reservations.expires_at_ms <= $7 OR gpu_reservations.holder = excluded.holder";

/// [`LIVE`] as one JSON array of arrays (SQLite).
const LIVE_AS_JSON: &str = "SELECT json_group_array(json_array(node, gpu_id, \
     resident_version, ordinal, holder, workload, reserved_at_ms, expires_at_ms, mem_mib, \
     cores)) FROM gpu_reservations WHERE expires_at_ms > $1";

/// One element of [`LIVE_AS_JSON`]'s array, in [`Reservation`]'s field order.
type LiveRow = (
    String,
    String,
    String,
    i64,
    String,
    String,
    i64,
    i64,
    i64,
    i64,
);

const SWEEP: &str = "DELETE FROM gpu_reservations WHERE expires_at_ms <= $1";

const RELEASE: &str = "DELETE FROM gpu_reservations WHERE holder = $1";

impl Reservations {
    /// The holds that have not expired at `now_ms`.
    pub async fn live(&self, now_ms: i64) -> Result<Vec<Reservation>, ReservationError> {
        Ok(match self {
            Self::Store(pool) if pool.connect_options().database_url.scheme() == "sqlite" => {
                let (json,): (String,) = sqlx::query_as(LIVE_AS_JSON)
                    .bind(now_ms)
                    .fetch_one(pool)
                    .await?;
                let rows: Vec<LiveRow> = serde_json::from_str(&json)
                    .map_err(|error| sqlx::Error::Decode(Box::new(error)))?;
                let mut live: Vec<Reservation> = rows.into_iter().map(Reservation::from).collect();
                live.sort_unstable_by(|a, b| {
                    (&a.node, &a.gpu_id, a.ordinal).cmp(&(&b.node, &b.gpu_id, b.ordinal))
                });
                live
            }
            Self::Store(pool) => sqlx::query_as(LIVE).bind(now_ms).fetch_all(pool).await?,
            Self::Postgres(pool) => sqlx::query_as(LIVE).bind(now_ms).fetch_all(pool).await?,
        })
    }

    /// Asks for the hold `wanted` (its `reserved_at_ms` is now); `true` = granted.
    pub async fn claim(&self, wanted: &Reservation) -> Result<bool, ReservationError> {
        self.claim_releasing(wanted, &[]).await
    }

    /// [`Self::claim`], deleting first, in the same transaction, every hold of `landed`
    /// (holders whose pods are bound: their holds are done). One commit either way.
    pub async fn claim_releasing(
        &self,
        wanted: &Reservation,
        landed: &[&str],
    ) -> Result<bool, ReservationError> {
        macro_rules! bound {
            ($query:expr) => {
                $query
                    .bind(&wanted.node)
                    .bind(&wanted.gpu_id)
                    .bind(&wanted.resident_version)
                    .bind(wanted.ordinal)
                    .bind(&wanted.holder)
                    .bind(&wanted.workload)
                    .bind(wanted.reserved_at_ms)
                    .bind(wanted.expires_at_ms)
                    .bind(wanted.mem_mib)
                    .bind(wanted.cores)
            };
        }
        macro_rules! claimed {
            ($pool:expr) => {
                if landed.is_empty() {
                    bound!(sqlx::query(CLAIM))
                        .execute($pool)
                        .await?
                        .rows_affected()
                } else {
                    let mut tx = $pool.begin().await?;
                    for holder in landed {
                        sqlx::query(RELEASE).bind(*holder).execute(&mut *tx).await?;
                    }
                    let changed = bound!(sqlx::query(CLAIM))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    changed
                }
            };
        }
        let changed = match self {
            Self::Store(pool) => claimed!(pool),
            Self::Postgres(pool) => claimed!(pool),
        };
        Ok(changed == 1)
    }

    /// Deletes the holds expired at `now_ms`; how many went.
    pub async fn sweep(&self, now_ms: i64) -> Result<u64, ReservationError> {
        Ok(match self {
            Self::Store(pool) => sqlx::query(SWEEP)
                .bind(now_ms)
                .execute(pool)
                .await?
                .rows_affected(),
            Self::Postgres(pool) => sqlx::query(SWEEP)
                .bind(now_ms)
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }

    /// Deletes every hold of `holder`; how many went.
    pub async fn release(&self, holder: &str) -> Result<u64, ReservationError> {
        Ok(match self {
            Self::Store(pool) => sqlx::query(RELEASE)
                .bind(holder)
                .execute(pool)
                .await?
                .rows_affected(),
            Self::Postgres(pool) => sqlx::query(RELEASE)
                .bind(holder)
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(holder: &str, ordinal: i64, at: i64) -> Reservation {
        Reservation {
            node: "n1".into(),
            gpu_id: "GPU-a".into(),
            resident_version: "v1".into(),
            ordinal,
            holder: holder.into(),
            workload: "resnet".into(),
            reserved_at_ms: at,
            expires_at_ms: at + 1_000,
            mem_mib: 1024,
            cores: 30,
        }
    }

    async fn sqlite() -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::TempDir::new().unwrap();
        let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
        let store = crate::store::Store::open(&url).await.unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn the_live_holds_read_as_one_json_row_equal_the_rows_read_one_by_one() {
        let (_dir, store) = sqlite().await;
        let table = Reservations::Store(store.pool().clone());
        let mut odd = hold("ns/pod \"quoted\" ünïcode\\", 0, 10);
        odd.node = "n0".into();
        odd.mem_mib = i64::MAX;
        for wanted in [
            hold("pod-b", 1, 12),
            odd,
            hold("pod-a", 0, 11),
            hold("gone", 2, -5_000),
        ] {
            assert!(table.claim(&wanted).await.unwrap());
        }
        let live = table.live(20).await.unwrap();
        let rows: Vec<Reservation> = sqlx::query_as(LIVE)
            .bind(20i64)
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(live.len(), 3, "{live:?}");
        assert_eq!(live, rows);
        assert_eq!(live[0].holder, "ns/pod \"quoted\" ünïcode\\");
        assert!(table.live(i64::MAX).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_key_goes_to_one_holder_until_it_expires() {
        let (_dir, store) = sqlite().await;
        let table = Reservations::Store(store.pool().clone());
        assert!(table.claim(&hold("pod-a", 0, 10)).await.unwrap());
        assert!(!table.claim(&hold("pod-b", 0, 20)).await.unwrap());
        // The same holder asking again (a retried admission) keeps it.
        assert!(table.claim(&hold("pod-a", 0, 30)).await.unwrap());
        // pod-x's hold goes with pod-b's claim, in one transaction.
        assert!(table.claim(&hold("pod-x", 5, 30)).await.unwrap());
        assert!(table
            .claim_releasing(&hold("pod-b", 1, 30), &["pod-x"])
            .await
            .unwrap());
        let live = table.live(40).await.unwrap();
        assert_eq!(
            live.iter()
                .map(|r| (r.holder.as_str(), r.ordinal))
                .collect::<Vec<_>>(),
            [("pod-a", 0), ("pod-b", 1)]
        );
        // pod-a's hold (renewed at 30) expires at 1,030: then the key is free again.
        assert!(!table.claim(&hold("pod-c", 0, 1_029)).await.unwrap());
        assert!(table.claim(&hold("pod-c", 0, 1_030)).await.unwrap());
        assert_eq!(table.release("pod-c").await.unwrap(), 1);
        assert_eq!(table.sweep(1_031).await.unwrap(), 1, "pod-b's hold expired");
        assert!(table.live(0).await.unwrap().is_empty());
        store.close().await;
    }
}

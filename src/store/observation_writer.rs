//! Group commit for reported runs (the writer loop is `group_commit`'s).
//! `Store::insert_observation` hands its run to one writer task over a bounded queue and
//! waits for the answer. The writer takes the first queued run, opens one write
//! transaction (`engine::Db::begin_write`), adds every run queued by then (at most [`MAX_BATCH`]), writes
//! them and commits once: concurrent reports share one fsync instead of paying one each.
//! Nothing waits on a timer, so a lone report is written at once.
//!
//! A run that fails (a constraint the database enforces) fails alone: the batch is rolled
//! back and written again with a savepoint per run, and only the failing run's caller gets
//! its error. A failure of the transaction itself (begin, a savepoint statement, commit) or
//! of the storage under any run (a read-only file, a full disk) fails every run of the
//! batch: none is acknowledged, and the store is marked failing, never healthy, until a
//! batch or the probe stores a row again (`health`).
//!
//! The writer cannot deadlock with the pool or with other writers: it borrows a pool
//! connection only for the length of a batch, waits on nothing but that connection while it
//! holds the write lock, and no caller of `insert_observation` holds a connection while it
//! waits for its answer. Other `BEGIN IMMEDIATE` writers wait for a batch within the busy
//! timeout, as they would for any transaction; [`MAX_BATCH`] keeps a batch short.

use std::sync::Arc;

use sqlx::{Any, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::{
    engine::Db,
    group_commit::{take_queued, Committer, GroupCommit},
    health::WriteHealth,
    observations::{insert_one, ObservationSource, Prediction},
    StoreError,
};
use crate::domain::Observation;

/// The most runs one transaction writes. It bounds how long the write lock is held (other
/// writers wait for it within the 5 s busy timeout) and how long the first run of a batch
/// waits for the last: tens of milliseconds at this size, far inside the timeout.
pub(super) const MAX_BATCH: usize = 256;
/// Runs that may wait for the writer before reporters wait to enqueue (backpressure).
const QUEUE_CAPACITY: usize = 4 * MAX_BATCH;

/// What a run's caller is told: its id and whether it is new.
type Reply = Result<(i64, bool), StoreError>;

#[derive(Debug)]
pub(super) struct WriteRequest {
    observation: Observation,
    source: ObservationSource,
    prediction: Option<Prediction>,
    now_ms: i64,
    reply_tx: oneshot::Sender<Reply>,
}

/// The handle the store keeps on the writer task.
#[derive(Debug)]
pub(super) struct ObservationWriter {
    writer: GroupCommit<WriteRequest>,
}

impl ObservationWriter {
    /// Starts the writer task on `pool`. It borrows a pool connection per batch and holds
    /// none between batches, so it shares the pool's connections (and an in-memory
    /// database's only one) with every other reader and writer.
    pub(super) fn spawn(db: Db, health: Arc<WriteHealth>) -> Self {
        let committer = BatchWriter { db, health };
        Self {
            writer: GroupCommit::spawn("observation writer", committer, QUEUE_CAPACITY),
        }
    }

    /// Queues a run and waits until its batch is committed (or failed).
    pub(super) async fn write(
        &self,
        observation: Observation,
        source: ObservationSource,
        prediction: Option<Prediction>,
        now_ms: i64,
    ) -> Reply {
        self.writer
            .send(|reply_tx| WriteRequest {
                observation,
                source,
                prediction,
                now_ms,
                reply_tx,
            })
            .await
    }

    /// Refuses new runs, lets the writer finish every run already queued, and waits for it.
    pub(super) async fn stop(&self) {
        self.writer.stop().await;
    }
}

/// What the writer task commits: batches of runs, through [`run_once`].
struct BatchWriter {
    db: Db,
    health: Arc<WriteHealth>,
}

impl Committer for BatchWriter {
    type Request = WriteRequest;

    async fn commit(&mut self, first: WriteRequest, queue: &mut mpsc::Receiver<WriteRequest>) {
        run_once(&self.db, first, queue, &self.health).await;
    }
}

/// What one batch came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BatchOutcome {
    /// Committed in one pass: every run written (new or found).
    Committed { runs: usize },
    /// A run failed, so the batch was written again with a savepoint per run and
    /// committed; `failed` runs were refused.
    CommittedIsolated { runs: usize, failed: usize },
    /// The transaction failed: every run of the batch was refused.
    Failed { runs: usize },
}

/// Writes `first` and whatever else is queued once the write lock is held (up to
/// [`MAX_BATCH`]) in one transaction, and answers every caller.
///
/// The first pass writes the runs one after another with no savepoints (two extra
/// statements per run cost a third of the throughput or more). If any run fails, that
/// transaction is rolled back and the batch is written again in a new one with a savepoint
/// per run, so the failure stays with its own run.
pub(super) async fn run_once(
    db: &Db,
    first: WriteRequest,
    request_rx: &mut mpsc::Receiver<WriteRequest>,
    health: &WriteHealth,
) -> BatchOutcome {
    let mut tx = match db.begin_write().await {
        Ok(tx) => tx,
        Err(error) => {
            return fail_batch(vec![first], Vec::new(), StoreError::Database(error), health)
        }
    };
    // Runs that arrived while the lock was awaited join this commit too.
    let mut batch = vec![first];
    take_queued(&mut batch, request_rx, MAX_BATCH);
    match write_all(&mut tx, &batch).await {
        Ok(written) => {
            if let Err(error) = db.commit(tx).await {
                return fail_batch(batch, Vec::new(), StoreError::Database(error), health);
            }
            if written.iter().any(|(_, created)| *created) {
                health.succeeded();
            }
            let runs = batch.len();
            answer(batch, written.into_iter().map(Ok));
            tracing::debug!(runs, "observation batch committed");
            BatchOutcome::Committed { runs }
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(error = %rollback, "rollback failed");
            }
            // The storage failed, not the run: every run of the batch would fail the same.
            if error.is_storage_fault() {
                return fail_batch(batch, Vec::new(), error, health);
            }
            tracing::debug!(error = %error, "a run failed; writing the batch again run by run");
            run_isolated(db, batch, health).await
        }
    }
}

/// Writes every run of the batch, stopping at the first failure.
async fn write_all(
    tx: &mut Transaction<'static, Any>,
    batch: &[WriteRequest],
) -> Result<Vec<(i64, bool)>, StoreError> {
    let mut written = Vec::with_capacity(batch.len());
    for request in batch {
        written.push(
            insert_one(
                tx,
                &request.observation,
                request.source,
                request.prediction,
                request.now_ms,
            )
            .await?,
        );
    }
    Ok(written)
}

/// The second pass: one transaction, a savepoint per run.
async fn run_isolated(db: &Db, batch: Vec<WriteRequest>, health: &WriteHealth) -> BatchOutcome {
    let mut tx = match db.begin_write().await {
        Ok(tx) => tx,
        Err(error) => return fail_batch(batch, Vec::new(), StoreError::Database(error), health),
    };
    let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
    for request in &batch {
        match write_isolated(&mut tx, request).await {
            Ok(reply) => replies.push(reply),
            Err(broken) => {
                if let Err(rollback) = tx.rollback().await {
                    tracing::warn!(error = %rollback, "rollback failed");
                }
                return fail_batch(batch, replies, broken, health);
            }
        }
    }
    if let Err(error) = db.commit(tx).await {
        return fail_batch(batch, replies, StoreError::Database(error), health);
    }
    if replies.iter().any(|reply| matches!(reply, Ok((_, true)))) {
        health.succeeded();
    }
    let runs = batch.len();
    let failed = replies.iter().filter(|r| r.is_err()).count();
    answer(batch, replies);
    tracing::debug!(runs, failed, "observation batch committed run by run");
    BatchOutcome::CommittedIsolated { runs, failed }
}

/// Sends every caller its reply.
fn answer(batch: Vec<WriteRequest>, replies: impl IntoIterator<Item = Reply>) {
    for (request, reply) in batch.into_iter().zip(replies) {
        // A caller that went away (its RPC was cancelled) finds its run stored if it asks
        // again: the fingerprint makes the retry a no-op.
        let _ = request.reply_tx.send(reply);
    }
}

/// Writes one run under its own savepoint. The outer error means the transaction itself
/// is in doubt (a savepoint statement failed, or the storage did: a read-only file, a full
/// disk) and the batch must be abandoned; the inner one is this run's own failure, already
/// rolled back.
async fn write_isolated(
    tx: &mut Transaction<'static, Any>,
    request: &WriteRequest,
) -> Result<Reply, StoreError> {
    sqlx::query("SAVEPOINT observation")
        .execute(&mut **tx)
        .await?;
    let outcome = insert_one(
        tx,
        &request.observation,
        request.source,
        request.prediction,
        request.now_ms,
    )
    .await;
    match outcome {
        Ok(written) => {
            sqlx::query("RELEASE observation")
                .execute(&mut **tx)
                .await?;
            Ok(Ok(written))
        }
        Err(error) if error.is_storage_fault() => Err(error),
        Err(error) => {
            sqlx::query("ROLLBACK TO observation")
                .execute(&mut **tx)
                .await?;
            sqlx::query("RELEASE observation")
                .execute(&mut **tx)
                .await?;
            tracing::debug!(error = %error, "run rolled back to its savepoint");
            Ok(Err(error))
        }
    }
}

/// Answers every run of a failed batch: a run that had already failed on its own keeps its
/// own error, every other one gets the batch's.
fn fail_batch(
    batch: Vec<WriteRequest>,
    replies: Vec<Reply>,
    error: StoreError,
    health: &WriteHealth,
) -> BatchOutcome {
    tracing::warn!(error = %error.chain(), runs = batch.len(), "observation batch failed; none stored");
    if error.is_storage_fault() {
        health.failed(&error);
    }
    let error = Arc::new(error);
    let runs = batch.len();
    let mut replies = replies.into_iter();
    for request in batch {
        let reply = match replies.next() {
            Some(Err(own)) => Err(own),
            _ => Err(StoreError::Batch(error.clone())),
        };
        let _ = request.reply_tx.send(reply);
    }
    BatchOutcome::Failed { runs }
}

#[cfg(test)]
mod tests {
    use sqlx::error::ErrorKind;
    use tempfile::TempDir;

    use super::*;
    use crate::{
        domain::{ColocatedMember, GpuName, WorkloadName},
        store::Store,
    };

    async fn open_store() -> (TempDir, Store) {
        let dir = TempDir::new().unwrap();
        let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
        let store = Store::open(&url).await.unwrap();
        (dir, store)
    }

    fn member(workload: &str, throughput: f64) -> ColocatedMember {
        ColocatedMember {
            workload: WorkloadName::parse("workload", workload).unwrap(),
            throughput,
            job_id: String::new(),
        }
    }

    fn gpu() -> GpuName {
        GpuName::parse("gpu", "Test GPU 16GB").unwrap()
    }

    /// A valid run of a and b; `a` is a's throughput, which tells runs apart.
    fn run_of(a: f64) -> Observation {
        Observation::new(
            gpu(),
            vec![member("a", a), member("b", 1.0)],
            1_750_000_000_000,
        )
        .unwrap()
    }

    /// A run the domain would refuse, built around its validation: the database's CHECK
    /// (throughput >= 0) refuses its second member after its observations row went in.
    fn run_the_database_refuses() -> Observation {
        Observation {
            gpu: gpu(),
            members: vec![member("a", 1.0), member("b", -1.0)],
            observed_at_ms: 1_750_000_000_000,
            gpu_id: String::new(),
            sharing_mode: crate::domain::SharingMode::Mps,
        }
    }

    /// Puts the runs on a queue, in order, as reporters would.
    fn queue(
        runs: Vec<Observation>,
    ) -> (mpsc::Receiver<WriteRequest>, Vec<oneshot::Receiver<Reply>>) {
        let (request_tx, request_rx) = mpsc::channel(QUEUE_CAPACITY);
        let replies = runs
            .into_iter()
            .map(|observation| {
                let (reply_tx, reply_rx) = oneshot::channel();
                request_tx
                    .try_send(WriteRequest {
                        observation,
                        source: ObservationSource::Reported,
                        prediction: None,
                        now_ms: 1,
                        reply_tx,
                    })
                    .unwrap();
                reply_rx
            })
            .collect();
        (request_rx, replies)
    }

    /// One writer pass over what is queued.
    async fn write_queued(
        store: &Store,
        request_rx: &mut mpsc::Receiver<WriteRequest>,
    ) -> BatchOutcome {
        let first = request_rx.try_recv().unwrap();
        run_once(&store.db, first, request_rx, store.write_health()).await
    }

    async fn replies(replies: Vec<oneshot::Receiver<Reply>>) -> Vec<Reply> {
        let mut answered = Vec::new();
        for reply_rx in replies {
            answered.push(reply_rx.await.expect("every run is answered"));
        }
        answered
    }

    async fn count(store: &Store, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_batch_takes_what_is_queued_up_to_the_cap() {
        let (_dir, store) = open_store().await;
        let (mut request_rx, reply_rxs) =
            queue((0..MAX_BATCH + 3).map(|i| run_of(i as f64)).collect());
        assert_eq!(
            write_queued(&store, &mut request_rx).await,
            BatchOutcome::Committed { runs: MAX_BATCH }
        );
        assert_eq!(request_rx.len(), 3, "the rest waits for the next batch");
        assert_eq!(
            write_queued(&store, &mut request_rx).await,
            BatchOutcome::Committed { runs: 3 }
        );
        let mut ids: Vec<i64> = replies(reply_rxs)
            .await
            .into_iter()
            .map(|reply| {
                let (id, created) = reply.unwrap();
                assert!(created);
                id
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), MAX_BATCH + 3);
        assert_eq!(count(&store, "observations").await, (MAX_BATCH + 3) as i64);
    }

    #[tokio::test]
    async fn a_runs_sharing_mode_is_stored_and_read_back() {
        use crate::domain::SharingMode;
        let (_dir, store) = open_store().await;
        let sliced = Observation {
            sharing_mode: SharingMode::TimeSlicing,
            ..run_of(1.0)
        };
        for run in [sliced, run_of(2.0)] {
            store
                .insert_observation(&run, ObservationSource::Reported, None, 1)
                .await
                .unwrap();
        }
        let modes: Vec<SharingMode> = store
            .observations(&gpu(), 0)
            .await
            .unwrap()
            .iter()
            .map(|run| run.sharing_mode)
            .collect();
        assert_eq!(modes, [SharingMode::TimeSlicing, SharingMode::Mps]);
    }

    #[tokio::test]
    async fn duplicates_in_one_batch_get_the_first_copy_s_id_and_are_not_created() {
        let (_dir, store) = open_store().await;
        let reordered = Observation {
            members: run_of(5.0).members.into_iter().rev().collect(),
            ..run_of(5.0)
        };
        let (mut request_rx, reply_rxs) =
            queue(vec![run_of(5.0), run_of(6.0), run_of(5.0), reordered]);
        assert_eq!(
            write_queued(&store, &mut request_rx).await,
            BatchOutcome::Committed { runs: 4 }
        );
        let answered: Vec<(i64, bool)> = replies(reply_rxs)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let (first_id, other_id) = (answered[0].0, answered[1].0);
        assert_ne!(first_id, other_id);
        assert_eq!(
            answered,
            vec![
                (first_id, true),
                (other_id, true),
                (first_id, false),
                (first_id, false)
            ]
        );
        assert_eq!(count(&store, "observations").await, 2);
        assert_eq!(count(&store, "observation_members").await, 4);
    }

    /// A batch whose runs were all stored before commits and writes nothing: it says
    /// nothing about whether the store writes again.
    #[tokio::test]
    async fn only_a_batch_that_stores_a_run_marks_a_failing_store_healthy() {
        let (_dir, store) = open_store().await;
        let (mut request_rx, _replies) = queue(vec![run_of(1.0)]);
        write_queued(&store, &mut request_rx).await;
        // No probe: only the batches below may clear the state.
        store.probe_stop.cancel();
        store.write_health().failed(&StoreError::WriterStopped);
        let (mut request_rx, _replies) = queue(vec![run_of(1.0)]);
        assert_eq!(
            write_queued(&store, &mut request_rx).await,
            BatchOutcome::Committed { runs: 1 }
        );
        assert!(store.write_health().failing());
        let (mut request_rx, _replies) = queue(vec![run_of(2.0)]);
        write_queued(&store, &mut request_rx).await;
        assert!(!store.write_health().failing());
    }

    #[tokio::test]
    async fn a_run_the_database_refuses_fails_alone_and_leaves_no_row_behind() {
        let (_dir, store) = open_store().await;
        let (mut request_rx, reply_rxs) = queue(vec![
            run_of(1.0),
            run_the_database_refuses(),
            run_of(2.0),
            run_of(1.0),
        ]);
        assert_eq!(
            write_queued(&store, &mut request_rx).await,
            BatchOutcome::CommittedIsolated { runs: 4, failed: 1 }
        );
        let answered = replies(reply_rxs).await;
        match &answered[1] {
            Err(StoreError::Database(error)) => assert_eq!(
                error.as_database_error().map(|e| e.kind()),
                Some(ErrorKind::CheckViolation),
                "{error}"
            ),
            other => panic!("the refused run was answered {other:?}"),
        }
        let (first_id, created) = *answered[0].as_ref().unwrap();
        assert!(created);
        assert!(answered[2].as_ref().unwrap().1);
        assert_eq!(*answered[3].as_ref().unwrap(), (first_id, false));
        // Its observations row had gone in before the member failed: rolled back too.
        assert_eq!(count(&store, "observations").await, 2);
        assert_eq!(count(&store, "observation_members").await, 4);
    }

    #[tokio::test]
    async fn closing_writes_the_queued_runs_and_refuses_later_ones() {
        let (dir, store) = open_store().await;
        let runs = [run_of(1.0), run_of(2.0), run_of(3.0)];
        let write = |run| store.insert_observation(run, ObservationSource::Reported, None, 1);
        // Biased: the three writes are queued before close is first polled.
        let (first, second, third, ()) = tokio::join!(
            biased;
            write(&runs[0]),
            write(&runs[1]),
            write(&runs[2]),
            store.close(),
        );
        for reply in [first, second, third] {
            assert!(reply.unwrap().1);
        }
        let late = write(&run_of(4.0)).await;
        assert!(matches!(late, Err(StoreError::Closed)), "{late:?}");

        let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
        let reopened = Store::open(&url).await.unwrap();
        assert_eq!(count(&reopened, "observations").await, 3);
        reopened.close().await;
    }

    #[tokio::test]
    async fn the_writer_shares_an_in_memory_store_s_only_connection() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        let runs: Vec<Observation> = (0..20).map(|i| run_of(i as f64)).collect();
        let mut writes = tokio::task::JoinSet::new();
        for run in runs {
            let store = store.clone();
            writes.spawn(async move {
                store
                    .insert_observation(&run, ObservationSource::Reported, None, 1)
                    .await
            });
        }
        while let Some(written) = writes.join_next().await {
            assert!(written.unwrap().unwrap().1);
        }
        assert_eq!(count(&store, "observations").await, 20);
        store.close().await;
    }
}

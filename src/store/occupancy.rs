//! The cluster's occupancy as schedulers tell coloc (AssignJob / ReleaseJob): which job
//! runs on which GPU, so that Place can answer without the whole cluster in each request.
//!
//! Durable and fast: one writer task (`group_commit`'s loop, as for reported runs) takes
//! every assignment and release, opens one write transaction for the queued
//! ones, checks each against its own copy of the occupancy, writes them (one fsync for all)
//! and answers each caller only once that transaction committed. Readers are served from a
//! second copy, which the writer brings up to date after each commit; they never query the
//! database.
//!
//! Several servers on one database: the copy carries the `occupancy_version` it was read
//! at, and every batch reads the stored version inside its write transaction (under the
//! database's write lock) before it decides anything. When another server wrote since, the
//! copy is read again first; each batch that writes bumps the version. So the rules hold
//! across servers: a job is never booked on two GPUs, nor a GPU past its
//! [`MAX_MEMBERS`]. The readers' copy follows other servers' writes too: a task reads the
//! stored version every [`REFRESH_INTERVAL`] and the occupancy again when it moved.
//!
//! Rules (docs/placement.md): assigning a job id again to the same GPU and workload
//! renews its lease; to another GPU or workload it is refused until released. Releasing an
//! unknown (or already released, or expired) job is not an error: `released` is false. A GPU
//! becomes known with its first job and stays known (empty) after its last is released; its
//! node and GPU model never change. A job with a lease expires by itself: readers ignore it
//! from that moment, and the writer deletes it with its next batch.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use sqlx::{Any, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::{
    engine::Db,
    group_commit::{take_queued, Committer, GroupCommit},
    StoreError,
};
use crate::{
    domain::{GpuName, WorkloadName, MAX_MEMBERS},
    sync::Unpoisoned,
};

/// How often the readers' copy looks for other servers' writes.
pub const REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// The most operations one transaction writes.
const MAX_BATCH: usize = 512;
const QUEUE_CAPACITY: usize = 4 * MAX_BATCH;

/// One job on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterJob {
    pub job_id: Arc<str>,
    pub workload: WorkloadName,
    pub assigned_at_ms: i64,
    /// `None` = no lease: the job stays until released.
    pub expires_at_ms: Option<i64>,
}

impl ClusterJob {
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|at| at > now_ms)
    }
}

/// One GPU of the cluster and its jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterGpu {
    pub id: Arc<str>,
    pub node: Arc<str>,
    pub gpu: GpuName,
    pub jobs: Vec<ClusterJob>,
}

/// The occupancy: GPUs by id (ordered, for paging) and where each job runs.
#[derive(Debug, Default, Clone)]
pub struct Occupancy {
    gpus: BTreeMap<Arc<str>, ClusterGpu>,
    jobs: HashMap<Arc<str>, Arc<str>>,
    /// The stored `occupancy_version` this copy is at.
    version: i64,
}

impl Occupancy {
    pub fn gpus(&self) -> impl Iterator<Item = &ClusterGpu> {
        self.gpus.values()
    }

    /// GPUs whose id comes after `after`, in id order.
    pub fn gpus_after<'a>(&'a self, after: Option<&str>) -> impl Iterator<Item = &'a ClusterGpu> {
        use std::ops::Bound;
        let start = match after {
            Some(after) => Bound::Excluded(after),
            None => Bound::Unbounded,
        };
        self.gpus
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(_, gpu)| gpu)
    }

    pub fn gpu(&self, id: &str) -> Option<&ClusterGpu> {
        self.gpus.get(id)
    }

    /// The job and its GPU, live or not.
    fn job(&self, job_id: &str) -> Option<(&ClusterGpu, &ClusterJob)> {
        let gpu = self.gpus.get(self.jobs.get(job_id)?)?;
        let job = gpu.jobs.iter().find(|j| &*j.job_id == job_id)?;
        Some((gpu, job))
    }

    fn apply(&mut self, effect: Effect) -> Effect {
        match effect {
            Effect::AddGpu(gpu) => {
                let id = gpu.id.clone();
                self.gpus.insert(id.clone(), gpu);
                Effect::RemoveGpu(id)
            }
            Effect::RemoveGpu(id) => {
                let gpu = self.gpus.remove(&id).expect("undo of an added GPU");
                Effect::AddGpu(gpu)
            }
            Effect::PutJob { gpu_id, job } => {
                let undo = self.remove_job(&job.job_id);
                let gpu = self.gpus.get_mut(&gpu_id).expect("GPU added first");
                self.jobs.insert(job.job_id.clone(), gpu_id.clone());
                let job_id = job.job_id.clone();
                gpu.jobs.push(job);
                undo.unwrap_or(Effect::RemoveJob(job_id))
            }
            Effect::RemoveJob(job_id) => self
                .remove_job(&job_id)
                .expect("only known jobs are removed"),
        }
    }

    /// Removes a job; the effect that puts it back.
    fn remove_job(&mut self, job_id: &str) -> Option<Effect> {
        let gpu_id = self.jobs.remove(job_id)?;
        let gpu = self.gpus.get_mut(&gpu_id)?;
        let at = gpu.jobs.iter().position(|j| &*j.job_id == job_id)?;
        let job = gpu.jobs.remove(at);
        Some(Effect::PutJob { gpu_id, job })
    }

    /// The jobs expired at `now_ms`.
    fn expired(&self, now_ms: i64) -> Vec<Arc<str>> {
        self.gpus
            .values()
            .flat_map(|g| &g.jobs)
            .filter(|j| !j.is_live(now_ms))
            .map(|j| j.job_id.clone())
            .collect()
    }

    fn next_expiry(&self) -> Option<i64> {
        self.gpus
            .values()
            .flat_map(|g| &g.jobs)
            .filter_map(|j| j.expires_at_ms)
            .min()
    }
}

/// A change to the occupancy, as applied to both copies (and undone on a failed commit).
#[derive(Debug, Clone)]
enum Effect {
    AddGpu(ClusterGpu),
    RemoveGpu(Arc<str>),
    PutJob { gpu_id: Arc<str>, job: ClusterJob },
    RemoveJob(Arc<str>),
}

/// AssignJob in store terms; the workload was checked to be registered.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub job_id: String,
    pub gpu_id: String,
    pub node: String,
    pub gpu: GpuName,
    pub workload: WorkloadName,
    /// `None` = no lease.
    pub lease_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignOutcome {
    /// A new job on the GPU.
    Assigned,
    /// The same job on the same GPU again: its lease was renewed.
    Renewed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Assigned {
    pub outcome: AssignOutcome,
    pub gpu: GpuName,
    pub expires_at_ms: Option<i64>,
}

/// Why an assignment was refused (nothing was written).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OccupancyConflict {
    #[error("job {job_id:?} already runs {workload} on GPU {gpu_id:?}; release it first")]
    JobAssignedElsewhere {
        job_id: String,
        gpu_id: String,
        workload: String,
    },
    #[error("GPU {gpu_id:?} is known as a {known_gpu:?} on node {known_node:?}, not a {gpu:?} on node {node:?}")]
    GpuMismatch {
        gpu_id: String,
        known_gpu: String,
        known_node: String,
        gpu: String,
        node: String,
    },
    #[error("GPU {gpu_id:?} already runs {MAX_MEMBERS} jobs, the most one GPU may hold")]
    GpuFull { gpu_id: String },
}

#[derive(Debug)]
enum Op {
    Assign(Assignment),
    Release(String),
    /// Forget these GPUs (known ones) with every job on them (ForgetGpus).
    Forget(Vec<String>),
}

type Reply = Result<Outcome, StoreError>;

#[derive(Debug)]
enum Outcome {
    Assigned(Assigned),
    Released(bool),
    /// GPUs and jobs forgotten.
    Forgot {
        gpus: u64,
        jobs: u64,
    },
}

#[derive(Debug)]
struct Request {
    op: Op,
    now_ms: i64,
    reply_tx: oneshot::Sender<Reply>,
}

/// The handle the store keeps: the writer's queue and the readers' copy.
#[derive(Debug)]
pub(super) struct OccupancyWriter {
    writer: GroupCommit<Request>,
    view: Arc<RwLock<Occupancy>>,
    /// Stops the refresh of the readers' copy.
    refresh_stop: tokio_util::sync::CancellationToken,
}

impl OccupancyWriter {
    /// Loads the stored occupancy and starts the writer on `pool`.
    pub(super) async fn spawn(db: Db) -> Result<Self, StoreError> {
        let mut connection = db.pool.acquire().await?;
        let state = load(&mut connection).await?;
        drop(connection);
        let view = Arc::new(RwLock::new(state.clone()));
        let refresh_stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(refresh(db.clone(), view.clone(), refresh_stop.clone()));
        let committer = OccupancyCommitter {
            db,
            next_expiry: state.next_expiry(),
            state,
            view: view.clone(),
        };
        Ok(Self {
            writer: GroupCommit::spawn("occupancy writer", committer, QUEUE_CAPACITY),
            view,
            refresh_stop,
        })
    }

    pub(super) fn view(&self) -> std::sync::RwLockReadGuard<'_, Occupancy> {
        // Every change is applied whole under the lock, so a poisoned one is still usable.
        self.view.read().unpoisoned()
    }

    async fn send(&self, op: Op, now_ms: i64) -> Reply {
        self.writer
            .send(|reply_tx| Request {
                op,
                now_ms,
                reply_tx,
            })
            .await
    }

    pub(super) async fn assign(
        &self,
        assignment: Assignment,
        now_ms: i64,
    ) -> Result<Assigned, StoreError> {
        match self.send(Op::Assign(assignment), now_ms).await? {
            Outcome::Assigned(assigned) => Ok(assigned),
            _ => unreachable!("an assignment is answered as one"),
        }
    }

    pub(super) async fn release(&self, job_id: String, now_ms: i64) -> Result<bool, StoreError> {
        match self.send(Op::Release(job_id), now_ms).await? {
            Outcome::Released(released) => Ok(released),
            _ => unreachable!("a release is answered as one"),
        }
    }

    /// Forgets the GPUs with these ids that are known, with their jobs (live or expired):
    /// (GPUs, jobs) forgotten. The ids can then be assigned anew, on any node and model.
    pub(super) async fn forget(
        &self,
        gpu_ids: Vec<String>,
        now_ms: i64,
    ) -> Result<(u64, u64), StoreError> {
        match self.send(Op::Forget(gpu_ids), now_ms).await? {
            Outcome::Forgot { gpus, jobs } => Ok((gpus, jobs)),
            _ => unreachable!("a forget is answered as one"),
        }
    }

    /// Refuses new operations, writes the queued ones, and waits for the writer.
    pub(super) async fn stop(&self) {
        self.refresh_stop.cancel();
        self.writer.stop().await;
    }
}

#[derive(sqlx::FromRow)]
struct GpuRow {
    id: String,
    node: String,
    gpu: String,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    job_id: String,
    gpu_id: String,
    workload: String,
    assigned_at_ms: i64,
    expires_at_ms: Option<i64>,
}

async fn load(connection: &mut sqlx::AnyConnection) -> Result<Occupancy, StoreError> {
    let mut occupancy = Occupancy {
        version: stored_version(connection).await?,
        ..Occupancy::default()
    };
    let gpus: Vec<GpuRow> = sqlx::query_as("SELECT id, node, gpu FROM cluster_gpus")
        .fetch_all(&mut *connection)
        .await?;
    for row in gpus {
        let gpu = GpuName::parse("gpu", &row.gpu).map_err(|e| StoreError::Corrupt(e.message))?;
        let id: Arc<str> = row.id.into();
        occupancy.gpus.insert(
            id.clone(),
            ClusterGpu {
                id,
                node: row.node.into(),
                gpu,
                jobs: Vec::new(),
            },
        );
    }
    let jobs: Vec<JobRow> = sqlx::query_as(
        "SELECT job_id, gpu_id, workload, assigned_at_ms, expires_at_ms FROM cluster_jobs ORDER BY assigned_at_ms, job_id",
    )
    .fetch_all(&mut *connection)
    .await?;
    for row in jobs {
        let workload = WorkloadName::parse("workload", &row.workload)
            .map_err(|e| StoreError::Corrupt(e.message))?;
        let gpu_id: Arc<str> = row.gpu_id.into();
        if !occupancy.gpus.contains_key(&gpu_id) {
            return Err(StoreError::Corrupt(format!(
                "job {} names unknown GPU {gpu_id}",
                row.job_id
            )));
        }
        occupancy.apply(Effect::PutJob {
            gpu_id,
            job: ClusterJob {
                job_id: row.job_id.into(),
                workload,
                assigned_at_ms: row.assigned_at_ms,
                expires_at_ms: row.expires_at_ms,
            },
        });
    }
    Ok(occupancy)
}

/// Brings the readers' copy up to other servers' writes, every [`REFRESH_INTERVAL`] until
/// `stop`. A copy the writer has already brought further is left alone.
async fn refresh(db: Db, view: Arc<RwLock<Occupancy>>, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
        let known = view.read().unpoisoned().version;
        let read = async {
            // One read transaction: the version and the rows agree.
            let mut tx = db.begin_read().await?;
            if stored_version(&mut tx).await? <= known {
                return Ok(None);
            }
            Ok::<_, StoreError>(Some(load(&mut tx).await?))
        }
        .await;
        match read {
            Ok(Some(fresh)) => {
                let mut published = view.write().unpoisoned();
                if fresh.version > published.version {
                    tracing::debug!(
                        version = fresh.version,
                        "occupancy written by another server"
                    );
                    *published = fresh;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(error = %error.chain(), "occupancy refresh failed"),
        }
    }
}

async fn stored_version(connection: &mut sqlx::AnyConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT version FROM occupancy_version WHERE id = 1")
        .fetch_one(connection)
        .await
}

/// What the writer task commits: batches of operations, each checked against the
/// writer's own copy of the occupancy, which it keeps with the next lease expiry.
struct OccupancyCommitter {
    db: Db,
    state: Occupancy,
    view: Arc<RwLock<Occupancy>>,
    next_expiry: Option<i64>,
}

impl Committer for OccupancyCommitter {
    type Request = Request;

    async fn commit(&mut self, first: Request, queue: &mut mpsc::Receiver<Request>) {
        let mut tx = match self.db.begin_write().await {
            Ok(tx) => tx,
            Err(error) => return fail_all(vec![first], StoreError::Database(error)),
        };
        let mut batch = vec![first];
        take_queued(&mut batch, queue, MAX_BATCH);
        if let Err(error) = self.catch_up(&mut tx).await {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(error = %rollback, "rollback failed");
            }
            return fail_all(batch, error);
        }
        write_batch(self, tx, batch).await;
    }
}

impl OccupancyCommitter {
    /// Reads the occupancy again when another server changed it since this copy was read.
    async fn catch_up(&mut self, tx: &mut Transaction<'static, Any>) -> Result<(), StoreError> {
        if stored_version(tx).await? == self.state.version {
            return Ok(());
        }
        let state = load(tx).await?;
        tracing::debug!(
            version = state.version,
            "occupancy changed by another server; read again"
        );
        *self.view.write().unpoisoned() = state.clone();
        self.next_expiry = state.next_expiry();
        self.state = state;
        Ok(())
    }
}

/// Answers every operation of a batch that could not start with the error.
fn fail_all(batch: Vec<Request>, error: StoreError) {
    tracing::error!(error = %error.chain(), operations = batch.len(), "occupancy batch failed");
    let error = Arc::new(error);
    for request in batch {
        let _ = request.reply_tx.send(Err(StoreError::Batch(error.clone())));
    }
}

/// What one operation does, decided against the writer's copy.
fn plan(state: &Occupancy, op: &Op, now_ms: i64) -> Result<(Vec<Effect>, Outcome), StoreError> {
    match op {
        Op::Forget(gpu_ids) => {
            let mut effects = Vec::new();
            let (mut gpus, mut jobs) = (0, 0);
            for gpu in gpu_ids.iter().filter_map(|id| state.gpu(id)) {
                for job in &gpu.jobs {
                    effects.push(Effect::RemoveJob(job.job_id.clone()));
                    jobs += 1;
                }
                effects.push(Effect::RemoveGpu(gpu.id.clone()));
                gpus += 1;
            }
            Ok((effects, Outcome::Forgot { gpus, jobs }))
        }
        Op::Release(job_id) => Ok(match state.job(job_id) {
            Some((_, job)) if job.is_live(now_ms) => (
                vec![Effect::RemoveJob(job.job_id.clone())],
                Outcome::Released(true),
            ),
            // Expired: gone already for every reader; the sweep deletes it.
            _ => (Vec::new(), Outcome::Released(false)),
        }),
        Op::Assign(a) => {
            let expires_at_ms = a.lease_ms.map(|lease| now_ms.saturating_add(lease));
            let mut effects = Vec::new();
            let mut outcome = AssignOutcome::Assigned;
            if let Some((gpu, job)) = state.job(&a.job_id) {
                if job.is_live(now_ms) {
                    if *gpu.id != *a.gpu_id || job.workload != a.workload {
                        return Err(StoreError::Occupancy(
                            OccupancyConflict::JobAssignedElsewhere {
                                job_id: a.job_id.clone(),
                                gpu_id: gpu.id.to_string(),
                                workload: job.workload.to_string(),
                            },
                        ));
                    }
                    outcome = AssignOutcome::Renewed;
                }
            }
            match state.gpu(&a.gpu_id) {
                Some(gpu) => {
                    if gpu.gpu != a.gpu || *gpu.node != *a.node {
                        return Err(StoreError::Occupancy(OccupancyConflict::GpuMismatch {
                            gpu_id: a.gpu_id.clone(),
                            known_gpu: gpu.gpu.to_string(),
                            known_node: gpu.node.to_string(),
                            gpu: a.gpu.to_string(),
                            node: a.node.clone(),
                        }));
                    }
                    let live = gpu.jobs.iter().filter(|j| j.is_live(now_ms)).count();
                    if outcome == AssignOutcome::Assigned && live >= MAX_MEMBERS {
                        return Err(StoreError::Occupancy(OccupancyConflict::GpuFull {
                            gpu_id: a.gpu_id.clone(),
                        }));
                    }
                }
                None => effects.push(Effect::AddGpu(ClusterGpu {
                    id: a.gpu_id.as_str().into(),
                    node: a.node.as_str().into(),
                    gpu: a.gpu.clone(),
                    jobs: Vec::new(),
                })),
            }
            let assigned_at_ms = match (outcome, state.job(&a.job_id)) {
                (AssignOutcome::Renewed, Some((_, job))) => job.assigned_at_ms,
                _ => now_ms,
            };
            effects.push(Effect::PutJob {
                gpu_id: a.gpu_id.as_str().into(),
                job: ClusterJob {
                    job_id: a.job_id.as_str().into(),
                    workload: a.workload.clone(),
                    assigned_at_ms,
                    expires_at_ms,
                },
            });
            Ok((
                effects,
                Outcome::Assigned(Assigned {
                    outcome,
                    gpu: a.gpu.clone(),
                    expires_at_ms,
                }),
            ))
        }
    }
}

async fn write_effect(tx: &mut Transaction<'static, Any>, effect: &Effect) -> sqlx::Result<()> {
    match effect {
        Effect::AddGpu(gpu) => {
            sqlx::query("INSERT INTO cluster_gpus (id, node, gpu) VALUES ($1, $2, $3)")
                .bind(&*gpu.id)
                .bind(&*gpu.node)
                .bind(gpu.gpu.as_str())
                .execute(&mut **tx)
                .await?;
        }
        Effect::RemoveGpu(id) => {
            sqlx::query("DELETE FROM cluster_gpus WHERE id = $1")
                .bind(&**id)
                .execute(&mut **tx)
                .await?;
        }
        Effect::PutJob { gpu_id, job } => {
            sqlx::query(
                "INSERT INTO cluster_jobs (job_id, gpu_id, workload, assigned_at_ms, expires_at_ms) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (job_id) DO UPDATE SET gpu_id = excluded.gpu_id, \
                 workload = excluded.workload, assigned_at_ms = excluded.assigned_at_ms, \
                 expires_at_ms = excluded.expires_at_ms",
            )
            .bind(&*job.job_id)
            .bind(&**gpu_id)
            .bind(job.workload.as_str())
            .bind(job.assigned_at_ms)
            .bind(job.expires_at_ms)
            .execute(&mut **tx)
            .await?;
        }
        Effect::RemoveJob(job_id) => {
            sqlx::query("DELETE FROM cluster_jobs WHERE job_id = $1")
                .bind(&**job_id)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// Plans every operation of the batch against the writer's copy (applying each as it
/// goes, so later ones see earlier ones), writes the effects in one transaction, and
/// answers every caller after the commit; a failed transaction undoes the copy and fails
/// every operation that would have written.
async fn write_batch(
    committer: &mut OccupancyCommitter,
    mut tx: Transaction<'static, Any>,
    batch: Vec<Request>,
) {
    let OccupancyCommitter {
        db,
        state,
        view,
        next_expiry,
        ..
    } = committer;
    let now_ms = batch.iter().map(|r| r.now_ms).max().unwrap_or_default();
    let mut effects: Vec<Effect> = Vec::new();
    let mut undo: Vec<Effect> = Vec::new();
    // Expired jobs go with this batch. The next expiry is then found again (a scan of
    // every job); between sweeps it only moves earlier, with new leases.
    if next_expiry.is_some_and(|at| at <= now_ms) {
        for job_id in state.expired(now_ms) {
            let effect = Effect::RemoveJob(job_id);
            undo.push(state.apply(effect.clone()));
            effects.push(effect);
        }
        *next_expiry = state.next_expiry();
    }
    let mut replies: Vec<(oneshot::Sender<Reply>, Result<Outcome, StoreError>, bool)> =
        Vec::with_capacity(batch.len());
    for request in batch {
        match plan(state, &request.op, request.now_ms) {
            Ok((planned, outcome)) => {
                let writes = !planned.is_empty();
                for effect in planned {
                    undo.push(state.apply(effect.clone()));
                    effects.push(effect);
                }
                replies.push((request.reply_tx, Ok(outcome), writes));
            }
            Err(error) => replies.push((request.reply_tx, Err(error), false)),
        }
    }
    if effects.is_empty() {
        // Nothing to write: the read ends, and with it the write lock.
        if let Err(error) = tx.rollback().await {
            tracing::warn!(error = %error, "rollback failed");
        }
    } else {
        let written = async {
            for effect in &effects {
                write_effect(&mut tx, effect).await?;
            }
            let bumped: i64 = sqlx::query_scalar(
                "UPDATE occupancy_version SET version = version + 1 WHERE id = 1 RETURNING version",
            )
            .fetch_one(&mut *tx)
            .await?;
            db.commit(tx).await?;
            Ok::<_, sqlx::Error>(bumped)
        }
        .await;
        match written {
            Ok(bumped) => state.version = bumped,
            Err(error) => {
                tracing::error!(error = %error, operations = replies.len(), "occupancy batch failed");
                for effect in undo.into_iter().rev() {
                    state.apply(effect);
                }
                *next_expiry = state.next_expiry();
                let error = Arc::new(StoreError::Database(error));
                for (reply_tx, outcome, writes) in replies {
                    let outcome = if writes {
                        Err(StoreError::Batch(error.clone()))
                    } else {
                        outcome
                    };
                    let _ = reply_tx.send(outcome);
                }
                return;
            }
        }
        let mut published = view.write().unpoisoned();
        for effect in effects {
            if let Effect::PutJob { job, .. } = &effect {
                if let Some(at) = job.expires_at_ms {
                    *next_expiry = Some(next_expiry.map_or(at, |next| next.min(at)));
                }
            }
            published.apply(effect);
        }
        published.version = state.version;
    }
    for (reply_tx, outcome, _) in replies {
        // A caller that gave up waiting is told nothing; its operation stands.
        let _ = reply_tx.send(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn assignment(job: &str, gpu_id: &str, lease_ms: Option<i64>) -> Assignment {
        Assignment {
            job_id: job.into(),
            gpu_id: gpu_id.into(),
            node: "n1".into(),
            gpu: GpuName::parse("gpu", "Test GPU 16GB").unwrap(),
            workload: WorkloadName::parse("workload", "w01").unwrap(),
            lease_ms,
        }
    }

    fn live_jobs(store: &Store, gpu_id: &str, now_ms: i64) -> Vec<String> {
        store
            .occupancy()
            .gpu(gpu_id)
            .unwrap()
            .jobs
            .iter()
            .filter(|j| j.is_live(now_ms))
            .map(|j| j.job_id.to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_job_whose_lease_ran_out_is_gone_for_readers_and_deleted_with_the_next_write() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        let assigned = store
            .assign_cluster_job(assignment("j1", "g1", Some(1_000)), 10_000)
            .await
            .unwrap();
        assert_eq!(assigned.expires_at_ms, Some(11_000));
        store
            .assign_cluster_job(assignment("j2", "g1", None), 10_000)
            .await
            .unwrap();
        // A renewal before it runs out moves the expiry.
        let renewed = store
            .assign_cluster_job(assignment("j1", "g1", Some(1_000)), 10_500)
            .await
            .unwrap();
        assert_eq!(renewed.outcome, AssignOutcome::Renewed);
        assert_eq!(live_jobs(&store, "g1", 11_400), ["j2", "j1"]);
        assert_eq!(live_jobs(&store, "g1", 11_500), ["j2"]);
        // Released after it expired: it was not running.
        assert!(!store
            .release_cluster_job("j1".into(), 11_500)
            .await
            .unwrap());
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cluster_jobs")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, 1, "the release's batch swept the expired job");
        // The id may now go anywhere.
        let moved = store
            .assign_cluster_job(assignment("j1", "g2", None), 11_600)
            .await
            .unwrap();
        assert_eq!(moved.outcome, AssignOutcome::Assigned);
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT job_id, gpu_id FROM cluster_jobs ORDER BY job_id")
                .fetch_all(store.pool())
                .await
                .unwrap();
        assert_eq!(
            rows,
            [("j1".into(), "g2".into()), ("j2".into(), "g1".into())]
        );
        assert_eq!(live_jobs(&store, "g1", 11_600), ["j2"]);
        store.close().await;
    }

    #[tokio::test]
    async fn a_gpu_holds_at_most_sixteen_jobs_and_a_refused_one_writes_nothing() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        for i in 0..MAX_MEMBERS {
            store
                .assign_cluster_job(assignment(&format!("j{i}"), "g1", None), 1)
                .await
                .unwrap();
        }
        let error = store
            .assign_cluster_job(assignment("one-more", "g1", None), 1)
            .await
            .unwrap_err();
        assert!(matches!(
            error,
            StoreError::Occupancy(OccupancyConflict::GpuFull { .. })
        ));
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cluster_jobs")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, MAX_MEMBERS as i64);
        store.close().await;
    }
}

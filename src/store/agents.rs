//! The agents table: profiling agents that announced themselves (docs/profiling.md
//! "Profiling agents"), when each was last seen and the job it holds. Announcing again updates the
//! row; every claim, renewal and submission counts as being seen.

use sqlx::FromRow;

use super::{Store, StoreError};
use crate::domain::{GpuName, WorkloadName};

/// What an agent says of itself when it announces.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAgent {
    pub id: String,
    pub node: String,
    pub gpu: GpuName,
    pub gpu_memory_gb: f64,
    pub ncu_version: String,
    /// The agent's profiler backend (`nvml`, `replay`).
    pub backend: String,
}

/// An agent as stored, with the job in hand.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct AgentRecord {
    pub id: String,
    pub node: String,
    pub gpu: String,
    pub gpu_memory_gb: f64,
    pub ncu_version: String,
    pub backend: String,
    pub announced_at_ms: i64,
    pub last_seen_ms: i64,
    pub job_id: Option<i64>,
    /// The workload of the job in hand.
    pub job_workload: Option<String>,
}

impl Store {
    /// Records an agent (or its new announcement: a restarted agent keeps its id). A job
    /// the agent held before is left to its lease: the restarted process cannot renew it.
    pub async fn announce_agent(
        &self,
        agent: &NewAgent,
        now_ms: i64,
    ) -> Result<AgentRecord, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            sqlx::query(
                "INSERT INTO agents (id, node, gpu, gpu_memory_gb, ncu_version, backend, \
                 announced_at_ms, last_seen_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
                 ON CONFLICT (id) DO UPDATE SET node = $2, gpu = $3, gpu_memory_gb = $4, \
                 ncu_version = $5, backend = $6, announced_at_ms = $7, last_seen_ms = $7",
            )
            .bind(&agent.id)
            .bind(&agent.node)
            .bind(agent.gpu.as_str())
            .bind(agent.gpu_memory_gb)
            .bind(&agent.ncu_version)
            .bind(&agent.backend)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            fetch_agent(&mut tx, &agent.id)
                .await?
                .ok_or_else(|| StoreError::Corrupt("an announced agent vanished".into()))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// One agent, if it announced itself.
    pub async fn agent(&self, id: &str) -> Result<Option<AgentRecord>, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = fetch_agent(&mut tx, id).await;
        super::finish(tx, outcome).await
    }

    /// Every agent, by id.
    pub async fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        Ok(
            sqlx::query_as::<_, AgentRecord>(sqlx::AssertSqlSafe(format!(
                "{AGENT_SELECT} ORDER BY a.id"
            )))
            .fetch_all(&self.db.pool)
            .await?,
        )
    }

    /// The workload of a profiling job; `None` when the job does not exist.
    pub async fn job_workload(&self, job_id: i64) -> Result<Option<WorkloadName>, StoreError> {
        let name: Option<String> = sqlx::query_scalar(
            "SELECT w.name FROM profiling_jobs j JOIN workloads w ON w.id = j.workload_id \
             WHERE j.id = $1",
        )
        .bind(job_id)
        .fetch_optional(&self.db.pool)
        .await?;
        name.map(|n| WorkloadName::parse("name", &n).map_err(|e| StoreError::Corrupt(e.message)))
            .transpose()
    }

    /// GPU models with an agent seen at or after `since_ms`, by name.
    pub async fn live_agent_gpus(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT gpu FROM agents WHERE last_seen_ms >= $1 ORDER BY gpu",
        )
        .bind(since_ms)
        .fetch_all(&self.db.pool)
        .await?)
    }
}

const AGENT_SELECT: &str = "SELECT a.id, a.node, a.gpu, a.gpu_memory_gb, a.ncu_version, \
     a.backend, a.announced_at_ms, a.last_seen_ms, a.job_id, \
     (SELECT w.name FROM profiling_jobs j JOIN workloads w ON w.id = j.workload_id \
      WHERE j.id = a.job_id) AS job_workload FROM agents a";

async fn fetch_agent(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
) -> Result<Option<AgentRecord>, StoreError> {
    Ok(
        sqlx::query_as::<_, AgentRecord>(sqlx::AssertSqlSafe(format!(
            "{AGENT_SELECT} WHERE a.id = $1"
        )))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?,
    )
}

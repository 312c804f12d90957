//! Workloads, GPU models and profiles.

use std::collections::HashMap;

use sqlx::{Any, FromRow, Transaction};

use super::engine::OptF64;

use super::{finish, is_unique_violation, Store, StoreError};
use crate::domain::{
    GpuName, KernelMetrics, Labels, LaunchSpec, NewWorkload, Profile, ProfileSource, SystemMetrics,
    WorkloadMode, WorkloadName, WorkloadState,
};

/// A stored workload with its profiles, one per GPU model.
#[derive(Debug, Clone)]
pub struct WorkloadRecord {
    pub name: WorkloadName,
    pub mode: WorkloadMode,
    pub model: String,
    pub batch_size: u32,
    pub labels: Labels,
    pub state: WorkloadState,
    pub state_reason: String,
    pub launch: Option<LaunchSpec>,
    pub profiles: Vec<Profile>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

#[derive(FromRow)]
struct WorkloadRow {
    id: i64,
    name: String,
    mode: String,
    model: String,
    batch_size: i64,
    labels: String,
    state: String,
    state_reason: String,
    launch: Option<String>,
    created_at_ms: i64,
    updated_at_ms: i64,
}

#[derive(FromRow)]
struct ProfileRow {
    workload_id: i64,
    gpu: String,
    gpu_memory_gb: Option<f64>,
    threads: f64,
    compute_throughput_pct: f64,
    dram_throughput_pct: f64,
    memory_throughput_pct: f64,
    registers: f64,
    static_shared_memory_bytes: f64,
    exclusive_throughput: f64,
    throughput_unit: String,
    sm_busy_pct: f64,
    mem_busy_pct: f64,
    memory_gb: f64,
    source: String,
    measured_at_ms: i64,
    /// 0 or 1 (an integer column on both engines).
    kernel_missing: i64,
}

/// `SELECT` of every profile column joined with its GPU's memory, followed by `$tail`.
macro_rules! select_profiles {
    ($tail:literal) => {
        concat!(
            "SELECT p.workload_id, p.gpu, g.memory_gb AS gpu_memory_gb, p.threads, ",
            "p.compute_throughput_pct, p.dram_throughput_pct, p.memory_throughput_pct, p.registers, ",
            "p.static_shared_memory_bytes, p.exclusive_throughput, p.throughput_unit, p.sm_busy_pct, ",
            "p.mem_busy_pct, p.memory_gb, p.source, p.measured_at_ms, p.kernel_missing ",
            "FROM profiles p JOIN gpus g ON g.name = p.gpu ",
            $tail
        )
    };
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

impl ProfileRow {
    fn into_profile(self) -> Result<Profile, StoreError> {
        Ok(Profile {
            gpu: GpuName::parse("gpu", &self.gpu).map_err(|e| corrupt(e.message))?,
            kernel: KernelMetrics {
                threads: self.threads,
                compute_throughput_pct: self.compute_throughput_pct,
                dram_throughput_pct: self.dram_throughput_pct,
                memory_throughput_pct: self.memory_throughput_pct,
                registers: self.registers,
                static_shared_memory_bytes: self.static_shared_memory_bytes,
            },
            system: SystemMetrics {
                exclusive_throughput: self.exclusive_throughput,
                throughput_unit: self.throughput_unit,
                sm_busy_pct: self.sm_busy_pct,
                mem_busy_pct: self.mem_busy_pct,
                memory_gb: self.memory_gb,
            },
            source: ProfileSource::from_db(&self.source)
                .ok_or_else(|| corrupt(format!("profile source {:?}", self.source)))?,
            gpu_memory_gb: self.gpu_memory_gb,
            measured_at_ms: self.measured_at_ms,
            kernel_missing: self.kernel_missing != 0,
        })
    }
}

impl WorkloadRow {
    fn into_record(self, profiles: Vec<Profile>) -> Result<WorkloadRecord, StoreError> {
        Ok(WorkloadRecord {
            name: WorkloadName::parse("name", &self.name).map_err(|e| corrupt(e.message))?,
            mode: WorkloadMode::from_db(&self.mode)
                .ok_or_else(|| corrupt(format!("workload mode {:?}", self.mode)))?,
            model: self.model,
            batch_size: u32::try_from(self.batch_size)
                .map_err(|_| corrupt(format!("batch size {}", self.batch_size)))?,
            labels: serde_json::from_str(&self.labels)
                .map_err(|e| corrupt(format!("labels of {}: {e}", self.name)))?,
            state: WorkloadState::from_db(&self.state)
                .ok_or_else(|| corrupt(format!("workload state {:?}", self.state)))?,
            state_reason: self.state_reason,
            launch: self
                .launch
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|e| corrupt(format!("launch spec of {}: {e}", self.name)))?,
            profiles,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        })
    }
}

/// Records or updates a GPU model; a known memory size is never erased by an unknown one.
async fn upsert_gpu(
    tx: &mut Transaction<'_, Any>,
    gpu: &GpuName,
    memory_gb: Option<f64>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO gpus (name, memory_gb) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET memory_gb = COALESCE(excluded.memory_gb, gpus.memory_gb)",
    )
    .bind(gpu.as_str())
    .bind(OptF64(memory_gb))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn upsert_profile(
    tx: &mut Transaction<'_, Any>,
    workload_id: i64,
    profile: &Profile,
) -> Result<(), StoreError> {
    upsert_gpu(tx, &profile.gpu, profile.gpu_memory_gb).await?;
    let k = &profile.kernel;
    let s = &profile.system;
    sqlx::query(
        "INSERT INTO profiles (workload_id, gpu, threads, compute_throughput_pct, \
         dram_throughput_pct, memory_throughput_pct, registers, static_shared_memory_bytes, \
         exclusive_throughput, throughput_unit, sm_busy_pct, mem_busy_pct, memory_gb, source, \
         measured_at_ms, kernel_missing) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
         ON CONFLICT (workload_id, gpu) DO UPDATE SET threads = excluded.threads, \
         compute_throughput_pct = excluded.compute_throughput_pct, \
         dram_throughput_pct = excluded.dram_throughput_pct, \
         memory_throughput_pct = excluded.memory_throughput_pct, registers = excluded.registers, \
         static_shared_memory_bytes = excluded.static_shared_memory_bytes, \
         exclusive_throughput = excluded.exclusive_throughput, \
         throughput_unit = excluded.throughput_unit, sm_busy_pct = excluded.sm_busy_pct, \
         mem_busy_pct = excluded.mem_busy_pct, memory_gb = excluded.memory_gb, \
         source = excluded.source, measured_at_ms = excluded.measured_at_ms, \
         kernel_missing = excluded.kernel_missing",
    )
    .bind(workload_id)
    .bind(profile.gpu.as_str())
    .bind(k.threads)
    .bind(k.compute_throughput_pct)
    .bind(k.dram_throughput_pct)
    .bind(k.memory_throughput_pct)
    .bind(k.registers)
    .bind(k.static_shared_memory_bytes)
    .bind(s.exclusive_throughput)
    .bind(&s.throughput_unit)
    .bind(s.sm_busy_pct)
    .bind(s.mem_busy_pct)
    .bind(s.memory_gb)
    .bind(profile.source.as_str())
    .bind(profile.measured_at_ms)
    .bind(i64::from(profile.kernel_missing))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Registers a workload. With a profile it is PROFILED at once; without one a
    /// profiling job is queued for the worker. One transaction.
    pub async fn register_workload(
        &self,
        workload: &NewWorkload,
        now_ms: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = register_in(&mut tx, workload, now_ms).await;
        self.finish_write(tx, outcome).await
    }

    /// Registers many workloads (each with its profile, or queued for profiling) in
    /// transactions of up to 5 000: bulk loading, e.g. `coloc bench`'s synthetic stores.
    pub async fn register_workloads(
        &self,
        workloads: &[NewWorkload],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for chunk in workloads.chunks(5_000) {
            let mut tx = self.begin_write().await?;
            let outcome = async {
                for workload in chunk {
                    register_in(&mut tx, workload, now_ms).await?;
                }
                Ok(())
            }
            .await;
            self.finish_write(tx, outcome).await?;
        }
        Ok(())
    }

    pub async fn get_workload(&self, name: &str) -> Result<Option<WorkloadRecord>, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = fetch_workload(&mut tx, name).await;
        finish(tx, outcome).await
    }

    /// Workloads ordered by name, after `after_name` (keyset paging), at most `limit`.
    pub async fn list_workloads(
        &self,
        after_name: Option<&str>,
        limit: u32,
        state: Option<WorkloadState>,
    ) -> Result<Vec<WorkloadRecord>, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = async {
            let rows = sqlx::query_as::<_, WorkloadRow>(
                "SELECT * FROM workloads WHERE ($1 IS NULL OR name > $1) \
                 AND ($2 IS NULL OR state = $2) ORDER BY name LIMIT $3",
            )
            .bind(after_name)
            .bind(state.map(WorkloadState::as_str))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            let profiles = fetch_profiles(&mut tx, rows.iter().map(|r| r.id).collect()).await?;
            Ok((rows, profiles))
        }
        .await;
        let (rows, mut profiles) = finish(tx, outcome).await?;
        rows.into_iter()
            .map(|row| {
                let own = profiles.remove(&row.id).unwrap_or_default();
                row.into_record(own)
            })
            .collect()
    }

    /// Deletes a workload with its profiles and job. Returns false when it did not exist.
    pub async fn delete_workload(&self, name: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM workloads WHERE name = $1")
            .bind(name)
            .execute(&self.db.pool)
            .await?;
        Ok(result.rows_affected() > 0)
    }

    /// Stores or replaces the workload's profile for the profile's GPU model and marks the
    /// workload PROFILED (its profiling job, if any, is done). One transaction.
    pub async fn put_profile(
        &self,
        name: &str,
        profile: &Profile,
        now_ms: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = put_profile_in(&mut tx, name, profile, now_ms).await;
        self.finish_write(tx, outcome).await
    }

    /// Every workload's name with its profiles: what the in-memory catalog is built from.
    pub async fn all_profiles(&self) -> Result<Vec<(WorkloadName, Vec<Profile>)>, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = async {
            let rows = sqlx::query_as::<_, (i64, String)>("SELECT id, name FROM workloads")
                .fetch_all(&mut *tx)
                .await?;
            let profile_rows = sqlx::query_as::<_, ProfileRow>(select_profiles!(""))
                .fetch_all(&mut *tx)
                .await?;
            Ok((rows, profile_rows))
        }
        .await;
        let (rows, profile_rows) = finish(tx, outcome).await?;
        let mut profiles = group_profiles(profile_rows)?;
        rows.into_iter()
            .map(|(id, name)| {
                let name = WorkloadName::parse("name", &name).map_err(|e| corrupt(e.message))?;
                Ok((name, profiles.remove(&id).unwrap_or_default()))
            })
            .collect()
    }

    /// The catalog's version: it moves with every change of workloads, profiles or GPU
    /// models, by any server or tool sharing the database (triggers in the migrations).
    pub async fn catalog_version(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT version FROM catalog_version WHERE id = 1")
                .fetch_one(&self.db.pool)
                .await?,
        )
    }

    /// Every GPU model with its memory, when known.
    pub async fn gpus(&self) -> Result<Vec<(GpuName, Option<f64>)>, StoreError> {
        let rows = sqlx::query_as::<_, (String, Option<f64>)>("SELECT name, memory_gb FROM gpus")
            .fetch_all(&self.db.pool)
            .await?;
        rows.into_iter()
            .map(|(name, memory)| {
                Ok((
                    GpuName::parse("gpu", &name).map_err(|e| corrupt(e.message))?,
                    memory,
                ))
            })
            .collect()
    }

    /// Records a GPU model's memory (used by imports, which know it from their dataset).
    pub async fn upsert_gpu(
        &self,
        gpu: &GpuName,
        memory_gb: Option<f64>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = upsert_gpu(&mut tx, gpu, memory_gb).await;
        self.finish_write(tx, outcome).await
    }
}

/// Every profile on `gpu` with its workload's name, by name; and every GPU model that has
/// a profile at all. Read through the caller's connection (a read-only snapshot's
/// transaction, `snapshot.rs`).
pub(super) async fn profiles_on_gpu(
    connection: &mut sqlx::AnyConnection,
    gpu: &GpuName,
) -> Result<(Vec<(WorkloadName, Profile)>, Vec<GpuName>), StoreError> {
    let rows = sqlx::query_as::<_, ProfileRow>(select_profiles!("WHERE p.gpu = $1"))
        .bind(gpu.as_str())
        .fetch_all(&mut *connection)
        .await?;
    let names: HashMap<i64, String> = sqlx::query_as::<_, (i64, String)>(
        "SELECT w.id, w.name FROM workloads w JOIN profiles p ON p.workload_id = w.id \
         WHERE p.gpu = $1",
    )
    .bind(gpu.as_str())
    .fetch_all(&mut *connection)
    .await?
    .into_iter()
    .collect();
    let gpus = sqlx::query_scalar::<_, String>("SELECT DISTINCT gpu FROM profiles ORDER BY gpu")
        .fetch_all(&mut *connection)
        .await?;
    let mut profiles = rows
        .into_iter()
        .map(|row| {
            let name = names
                .get(&row.workload_id)
                .ok_or_else(|| corrupt("a profile of no workload"))?;
            let name = WorkloadName::parse("name", name).map_err(|e| corrupt(e.message))?;
            Ok((name, row.into_profile()?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    profiles.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let gpus = gpus
        .iter()
        .map(|g| GpuName::parse("gpu", g).map_err(|e| corrupt(e.message)))
        .collect::<Result<_, StoreError>>()?;
    Ok((profiles, gpus))
}

async fn register_in(
    tx: &mut Transaction<'_, Any>,
    workload: &NewWorkload,
    now_ms: i64,
) -> Result<WorkloadRecord, StoreError> {
    let state = if workload.profile.is_some() {
        WorkloadState::Profiled
    } else {
        WorkloadState::PendingProfile
    };
    let labels = serde_json::to_string(&workload.labels).expect("string map serializes");
    let inserted = sqlx::query_scalar::<_, i64>(
        "INSERT INTO workloads (name, mode, model, batch_size, labels, state, launch, \
         created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $8, $7, $7) RETURNING id",
    )
    .bind(workload.name.as_str())
    .bind(workload.mode.as_str())
    .bind(&workload.model)
    .bind(i64::from(workload.batch_size))
    .bind(labels)
    .bind(state.as_str())
    .bind(now_ms)
    .bind(
        workload
            .launch
            .as_ref()
            .map(|l| serde_json::to_string(l).expect("launch spec serializes")),
    )
    .fetch_one(&mut **tx)
    .await;
    let id = match inserted {
        Ok(id) => id,
        Err(e) if is_unique_violation(&e) => {
            return Err(StoreError::WorkloadExists(workload.name.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    match &workload.profile {
        Some(profile) => upsert_profile(tx, id, profile).await?,
        None => {
            // One job per GPU model asked for; '' = any GPU model.
            let gpus: Vec<&str> = if workload.profile_on.is_empty() {
                vec![""]
            } else {
                workload.profile_on.iter().map(|g| g.as_str()).collect()
            };
            for gpu in gpus {
                sqlx::query(
                    "INSERT INTO profiling_jobs (workload_id, gpu, state, created_at_ms, \
                     updated_at_ms) VALUES ($1, $3, 'pending', $2, $2) \
                     ON CONFLICT (workload_id, gpu) DO NOTHING",
                )
                .bind(id)
                .bind(now_ms)
                .bind(gpu)
                .execute(&mut **tx)
                .await?;
            }
        }
    }
    fetch_workload(tx, workload.name.as_str())
        .await?
        .ok_or_else(|| corrupt("a registered workload vanished"))
}

pub(super) async fn put_profile_in(
    tx: &mut Transaction<'_, Any>,
    name: &str,
    profile: &Profile,
    now_ms: i64,
) -> Result<WorkloadRecord, StoreError> {
    let id = sqlx::query_scalar::<_, i64>("SELECT id FROM workloads WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| StoreError::WorkloadNotFound(name.to_string()))?;
    upsert_profile(tx, id, profile).await?;
    sqlx::query(
        "UPDATE workloads SET state = 'profiled', state_reason = '', updated_at_ms = $2 \
         WHERE id = $1",
    )
    .bind(id)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE profiling_jobs SET state = 'done', updated_at_ms = $2 \
         WHERE workload_id = $1 AND state IN ('pending', 'failed') AND gpu IN ('', $3)",
    )
    .bind(id)
    .bind(now_ms)
    .bind(profile.gpu.as_str())
    .execute(&mut **tx)
    .await?;
    fetch_workload(tx, name)
        .await?
        .ok_or_else(|| corrupt("a profiled workload vanished"))
}

pub(super) async fn fetch_workload(
    tx: &mut Transaction<'_, Any>,
    name: &str,
) -> Result<Option<WorkloadRecord>, StoreError> {
    let Some(row) = sqlx::query_as::<_, WorkloadRow>("SELECT * FROM workloads WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(None);
    };
    let mut profiles = fetch_profiles(tx, vec![row.id]).await?;
    let own = profiles.remove(&row.id).unwrap_or_default();
    row.into_record(own).map(Some)
}

/// Workload ids bound in one query by [`fetch_profiles`].
const IDS_PER_QUERY: usize = 500;

async fn fetch_profiles(
    tx: &mut Transaction<'_, Any>,
    workload_ids: Vec<i64>,
) -> Result<HashMap<i64, Vec<Profile>>, StoreError> {
    if workload_ids.is_empty() {
        return Ok(HashMap::new());
    }
    // A placeholder per id (portable SQL), in chunks well under either engine's limit on
    // bound parameters; the chunks' rows are put back in the one query's order.
    let mut rows = Vec::with_capacity(workload_ids.len());
    for chunk in workload_ids.chunks(IDS_PER_QUERY) {
        let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
        let sql = format!(
            "{} WHERE p.workload_id IN ({})",
            select_profiles!(""),
            marks.join(", ")
        );
        let mut query = sqlx::query_as::<_, ProfileRow>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        rows.extend(query.fetch_all(&mut **tx).await?);
    }
    rows.sort_by(|a, b| a.gpu.cmp(&b.gpu));
    group_profiles(rows)
}

fn group_profiles(rows: Vec<ProfileRow>) -> Result<HashMap<i64, Vec<Profile>>, StoreError> {
    let mut grouped: HashMap<i64, Vec<Profile>> = HashMap::new();
    for row in rows {
        let id = row.workload_id;
        grouped.entry(id).or_default().push(row.into_profile()?);
    }
    Ok(grouped)
}

//! The advisor: what every RPC does, in domain terms. It owns the store, the in-memory
//! catalog of profiles and the current model of each GPU model, and keeps the three in
//! step: writes go to the store first and reach memory only once committed.

mod agents;
mod catalog;
mod error;
mod observed;
mod follow;
mod occupancy;
mod place;
mod policy;
mod predict;
mod rank;
mod runs;
mod stats;
mod training;
mod undo;

use crate::sync::Unpoisoned;
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use arc_swap::ArcSwap;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::{
    domain::{
        now_ms, AllowedPrograms, GpuName, NewWorkload, Observation, Profile, SharingMode,
        WorkloadName, WorkloadState,
    },
    model::ModelKind,
    store::{ClaimedJob, ObservationSource, Store, StoredModel, Submitted, WorkloadRecord},
};

pub use agents::{AgentFailure, AgentPolicy, AgentView};
pub use catalog::{Catalog, GpuProfiles, ProfileEntry};
pub use error::{Error, Result};
pub use occupancy::{
    same_gpu_model, GpuFilter, JobAssignment, MAX_GPUS_PER_POD, MAX_LEASE_SECS, MAX_REPORTED_PODS,
};
pub use place::{
    explore_candidate, place_in, place_in_keeping, Exploration, GpuState, ModelUsed, PlaceAnswer,
    PlaceQuery, PlaceRule, PlaceSkipCode, PlacedSets, Placement, SkippedGpu,
    DEFAULT_MAX_JOBS_PER_GPU, MAX_JOBS_PER_GPU, MAX_PLACE_GPUS, PLACED_SETS,
};
pub use policy::{is_loss, Policy, PolicyChanges};
pub use predict::EXCLUSIVE_NOISE_MARGIN;
pub use rank::{
    predict_in, rank_in, rank_order, MemberPrediction, Objective, PredictQuery, PredictResult,
    RankQuery, RankResult, RankedCandidate, SkipCode, Skipped, BREAK_EVEN_NORMALIZED_SUM,
    MAX_CANDIDATES,
};
pub use runs::{Evidence, ModeEvidence, RunSummary, SuspectProfile, MIN_SUSPECT_RUNS};
pub use stats::{JobOutcome, ReportOutcome, Stats, TrainingOutcome};
pub use training::{trimmed_mean, TrainOutcome, Trigger};
pub use undo::{ForgetTarget, UndoOutcome};

/// Page size when the client asks for none, and the largest page served.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
pub const MAX_PAGE_SIZE: u32 = 1000;

type ModelMap = HashMap<GpuName, Arc<StoredModel>>;

/// What the advisor is told at startup (`startup` builds it from the settings).
#[derive(Debug, Clone)]
pub struct AdvisorOptions {
    pub default_gpu: Option<GpuName>,
    pub default_kind: ModelKind,
    /// Programs a launch spec may name; empty = launch specs are refused.
    pub allowed_programs: AllowedPrograms,
    pub lifecycle: LifecyclePolicy,
    /// Why a workload waiting for a profile waits, when no profiling worker runs on this
    /// server (`profiler.backend = "off"`); `None` when one does.
    pub no_profiler_reason: Option<String>,
    /// Leases of agents' claims, and when an agent counts as live.
    pub agents: AgentPolicy,
    /// The placement policy Rank, Place and the extender apply unless a request says
    /// otherwise (the `[policy]` settings).
    pub policy: Policy,
    /// The sharing mode a request that names none is for (`model.default_sharing_mode`).
    pub default_sharing_mode: SharingMode,
    /// The share of Place's placements that may explore (`observer.explore_budget`; 0 =
    /// never).
    pub explore_budget: f64,
}

/// How models are trained, judged and watched (docs/model.md, "Model lifecycle"): the
/// `trainer.*` settings, as the advisor uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecyclePolicy {
    /// New runs since the last training that make a retrain due.
    pub min_new_observations: u64,
    /// Folds of the cross-validation that judges a challenger against the champion.
    pub cv_folds: usize,
    /// Training uses the newest this many runs of a GPU model; 0 = every run.
    pub max_training_runs: usize,
    /// Threads one training run uses; 0 = one per core.
    pub training_threads: usize,
    /// A challenger is "not worse" when its cross-validated rank score is at least the
    /// champion's minus score_tolerance and its MSE at most the champion's x (1 + mse_tolerance).
    pub score_tolerance: f64,
    pub mse_tolerance: f64,
    /// Runs with a member further than this many robust deviations are not trained on.
    pub outlier_threshold: f64,
    /// Mean relative error over the last drift_window reported runs above which a retrain
    /// is due at once.
    pub drift_threshold: f64,
    pub drift_window: usize,
}

pub struct Advisor {
    store: Store,
    allowed_programs: AllowedPrograms,
    lifecycle: LifecyclePolicy,
    /// The champion's recent prediction errors per GPU model (drift).
    rolling_errors: std::sync::Mutex<HashMap<GpuName, training::RollingError>>,
    /// Woken when a champion's rolling error passes the drift threshold.
    drift: tokio::sync::Notify,
    catalog: RwLock<Catalog>,
    models: ArcSwap<ModelMap>,
    /// Bumped after every change of what Place answers from: each catalog write (when its
    /// guard drops, the write lock still held), each model published, the kept set
    /// predictions forgotten ([`Self::answers_generation`]).
    answers: std::sync::atomic::AtomicU64,
    /// How many times a model was published here (`publish`), held while publishing: the
    /// follower of the store's champions (`follow.rs`) publishes only when nothing else
    /// did since it read the store, so a stale read never replaces a newer pin.
    publications: std::sync::Mutex<u64>,
    default_gpu: Option<GpuName>,
    default_kind: ModelKind,
    /// Serialises catalog writers so that memory changes in the order the store committed.
    catalog_writer: Mutex<()>,
    /// The store's catalog version the catalog was last brought up to (`follow`); -1 before.
    followed_catalog: std::sync::atomic::AtomicI64,
    /// The newest training run of each GPU model whose runs the catalog's summary was
    /// read at (`follow`).
    followed_trainings: std::sync::Mutex<HashMap<GpuName, i64>>,
    /// Serialises training so that versions are published in order.
    trainer: Mutex<()>,
    /// What the advisor did since start-up, for the metrics endpoint.
    stats: Stats,
    /// Shown on workloads waiting for a profile when no worker runs here.
    no_profiler_reason: Option<String>,
    /// The profiling job running now, by workload: DeleteWorkload cancels it.
    running_jobs: std::sync::Mutex<HashMap<WorkloadName, CancellationToken>>,
    /// Leases and liveness of profiling agents.
    agent_policy: AgentPolicy,
    /// Place's set predictions, kept across requests.
    placed_sets: Arc<place::PlacedSets>,
    /// The default placement policy.
    policy: Policy,
    /// The sharing mode a request that names none is for.
    default_sharing_mode: SharingMode,
    /// Place's exploration budget and what it spent.
    exploration: Arc<place::Exploration>,
    /// The one cluster view (AssignJob's occupancy, the watcher's pods, the agents'
    /// PodResources reports): what ListGpus lists and Place's stored view holds.
    cluster: Arc<crate::cluster::ClusterView>,
}

impl Advisor {
    /// Builds the advisor from what the store holds: profiles into the catalog, the newest
    /// model of each GPU model into memory.
    pub async fn load(store: Store, options: AdvisorOptions) -> anyhow::Result<Self> {
        let AdvisorOptions {
            default_gpu,
            default_kind,
            allowed_programs,
            lifecycle,
            no_profiler_reason,
            agents: agent_policy,
            policy,
            default_sharing_mode,
            explore_budget,
        } = options;
        if let Some(reason) = &no_profiler_reason {
            // Only jobs no live agent can run: the others keep their reasons.
            let now = now_ms();
            store
                .explain_waiting_jobs(None, reason, now - agent_policy.live_ms, now)
                .await?;
        }
        let mut catalog = Catalog::default();
        for (gpu, memory) in store.gpus().await? {
            catalog.set_gpu_memory(&gpu, memory);
        }
        for (name, profiles) in store.all_profiles().await? {
            catalog.put_workload(&name, &profiles);
        }
        let models: ModelMap = store
            .champions()
            .await?
            .into_iter()
            .map(|m| (m.gpu.clone(), Arc::new(m)))
            .collect();
        for model in models.values() {
            catalog.set_scoring_model(model.clone());
        }
        tracing::info!(models = models.len(), "advisor loaded");
        let cluster = Arc::new(crate::cluster::ClusterView::with_assignments(store.clone()));
        let advisor = Self {
            cluster,
            store,
            allowed_programs,
            lifecycle,
            rolling_errors: std::sync::Mutex::new(HashMap::new()),
            drift: tokio::sync::Notify::new(),
            catalog: RwLock::new(catalog),
            models: ArcSwap::from_pointee(models),
            answers: std::sync::atomic::AtomicU64::new(0),
            publications: std::sync::Mutex::new(0),
            default_gpu,
            default_kind,
            catalog_writer: Mutex::new(()),
            followed_catalog: std::sync::atomic::AtomicI64::new(-1),
            followed_trainings: std::sync::Mutex::new(HashMap::new()),
            trainer: Mutex::new(()),
            stats: Stats::default(),
            no_profiler_reason,
            running_jobs: std::sync::Mutex::new(HashMap::new()),
            agent_policy,
            placed_sets: Arc::new(place::PlacedSets::new(place::PLACED_SETS)),
            policy,
            default_sharing_mode,
            exploration: Arc::new(place::Exploration::new(explore_budget)),
        };
        advisor.load_rolling_errors().await?;
        // Read before the runs below: a training recorded meanwhile is read again later.
        let trainings = advisor.store.latest_training_runs().await?;
        *advisor.followed_trainings.lock().unpoisoned() = trainings.into_iter().collect();
        let gpus: Vec<GpuName> = advisor.models.load().keys().cloned().collect();
        for gpu in gpus {
            let runs = advisor
                .store
                .observations(&gpu, advisor.lifecycle.max_training_runs)
                .await?;
            advisor.refresh_runs(&gpu, &runs);
        }
        Ok(advisor)
    }

    /// The profiles of `gpu` whose exclusive throughput the stored runs contradict.
    pub fn suspect_profiles(&self, gpu: &GpuName) -> Vec<SuspectProfile> {
        self.read_catalog()
            .gpu(gpu)
            .map(|t| t.runs().suspects.clone())
            .unwrap_or_default()
    }

    /// The GPU models on which `workload`'s profile is suspect, with the suspicion.
    pub fn suspect_profiles_of(&self, workload: &WorkloadName) -> Vec<(GpuName, SuspectProfile)> {
        let catalog = self.read_catalog();
        let gpus: Vec<GpuName> = catalog.gpu_names().cloned().collect();
        gpus.into_iter()
            .filter_map(|gpu| {
                let suspect = catalog
                    .gpu(&gpu)?
                    .runs()
                    .suspect(workload.as_str())?
                    .clone();
                Some((gpu, suspect))
            })
            .collect()
    }

    /// Summarizes the stored runs of `gpu` (evidence, suspect profiles) into the catalog.
    fn refresh_runs(&self, gpu: &GpuName, runs: &[crate::store::StoredObservation]) {
        let table = self.read_catalog().gpu(gpu).unwrap_or_default();
        let summary = RunSummary::of(runs.iter().map(|r| r.members.as_slice()), |name| {
            table
                .position(name)
                .map(|i| table.entries()[i].features.exclusive_throughput())
        })
        .with_modes(runs.iter().map(|r| r.sharing_mode));
        self.write_catalog().set_runs(gpu, summary);
    }

    /// The server's default placement policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The sharing mode a request that names none is for.
    pub fn default_sharing_mode(&self) -> SharingMode {
        self.default_sharing_mode
    }

    /// What the runs of `gpu` say of `mode` (unset: the default): whether an answer for it
    /// rests on runs of that mode, and the sentence that says so when it does not.
    pub fn mode_evidence(&self, gpu: &GpuName, mode: Option<SharingMode>) -> ModeEvidence {
        let mode = mode.unwrap_or(self.default_sharing_mode);
        let table = self.read_catalog().gpu(gpu).unwrap_or_default();
        ModeEvidence::of(table.runs(), gpu, mode)
    }

    /// The one cluster view, which the extender, the watcher and the agents' reports
    /// share with ListGpus and Place.
    pub fn cluster(&self) -> &Arc<crate::cluster::ClusterView> {
        &self.cluster
    }

    pub fn default_kind(&self) -> ModelKind {
        self.default_kind
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    fn read_catalog(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        // A panic while holding the lock cannot leave the catalog half-written (every
        // mutation is a single call), so a poisoned lock is still usable.
        self.catalog.read().unpoisoned()
    }

    /// The catalog to change; the answers generation moves on when the guard drops.
    fn write_catalog(&self) -> CatalogWrite<'_> {
        CatalogWrite {
            guard: self.catalog.write().unpoisoned(),
            answers: &self.answers,
        }
    }

    /// A number that moves on after every change of what Place's answer to the same query
    /// could depend on (the catalog's workloads, profiles, runs and GPU memories, a
    /// serving model). A caller that keeps answers reads it **before** it asks Place, and
    /// keeps what Place answered under the number read: a change that Place already saw
    /// moves the number after it, so the kept answer is never reused under a number that
    /// was current before the change.
    pub fn answers_generation(&self) -> u64 {
        self.answers.load(std::sync::atomic::Ordering::Acquire)
    }

    fn answers_changed(&self) {
        self.answers
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    pub async fn register(&self, workload: NewWorkload) -> Result<WorkloadRecord> {
        let mut workload = workload;
        if let Some(launch) = &workload.launch {
            self.check_program(&launch.program)?;
        }
        let _writer = self.catalog_writer.lock().await;
        if let Some(profile) = &workload.profile {
            self.check_gpu_memory_known(profile)?;
        } else if workload.profile_on.is_empty() {
            workload.profile_on = self.default_profile_gpus().await?;
        }
        let mut record = self.store.register_workload(&workload, now_ms()).await?;
        if record.state == WorkloadState::PendingProfile {
            if let Some(reason) = self.unserved_reason(&workload.profile_on).await? {
                let now = now_ms();
                self.store
                    .explain_waiting_jobs(
                        Some(record.name.as_str()),
                        &reason,
                        now - self.agent_policy.live_ms,
                        now,
                    )
                    .await?;
                record.state_reason = reason;
            }
        }
        self.write_catalog()
            .put_workload(&record.name, &record.profiles);
        Ok(record)
    }

    /// The first profile of a GPU model must say the model's memory: without it, Rank
    /// could not tell which pairs fit. Later profiles may leave it out.
    fn check_gpu_memory_known(&self, profile: &Profile) -> Result<()> {
        if profile.gpu_memory_gb.is_some() {
            return Ok(());
        }
        let known = self
            .read_catalog()
            .gpu(&profile.gpu)
            .is_some_and(|table| table.memory_gb.is_some());
        if known {
            return Ok(());
        }
        Err(Error::InvalidRequest(crate::domain::ValidationError::new(
            "profile.gpu_memory_gb",
            format!(
                "profile.gpu_memory_gb is required for the first profile of GPU model {:?}: no \
                 stored profile says its memory",
                profile.gpu.as_str()
            ),
        )))
    }

    /// A launch spec may name only a program the operator allowed.
    fn check_program(&self, program: &str) -> Result<()> {
        if self.allowed_programs.is_empty() {
            return Err(Error::LaunchSpecsDisabled);
        }
        self.allowed_programs
            .resolve(program)
            .map_err(|reason| Error::ProgramNotAllowed {
                program: program.to_string(),
                reason,
            })?;
        Ok(())
    }

    pub async fn get(&self, name: &WorkloadName) -> Result<WorkloadRecord> {
        self.store
            .get_workload(name.as_str())
            .await?
            .ok_or_else(|| Error::UnknownWorkload(name.as_str().to_string()))
    }

    /// One page of workloads by name; the token is opaque to clients.
    pub async fn list(
        &self,
        page_size: u32,
        page_token: &str,
        state: Option<WorkloadState>,
    ) -> Result<(Vec<WorkloadRecord>, String)> {
        let limit = match page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = decode_page_token(page_token)?;
        let page = self
            .store
            .list_workloads(after.as_deref(), limit, state)
            .await?;
        let next = if page.len() == limit as usize {
            page.last()
                .map(|w| encode_page_token(w.name.as_str()))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((page, next))
    }

    pub async fn delete(&self, name: &WorkloadName) -> Result<()> {
        let _writer = self.catalog_writer.lock().await;
        if !self.store.delete_workload(name.as_str()).await? {
            return Err(Error::UnknownWorkload(name.as_str().to_string()));
        }
        self.write_catalog().remove_workload(name);
        // Its job row went with it; stop the run if the worker is profiling it now.
        if let Some(running) = self.running_jobs.lock().unpoisoned().get(name) {
            running.cancel();
        }
        Ok(())
    }

    pub async fn put_profile(
        &self,
        name: &WorkloadName,
        profile: Profile,
    ) -> Result<WorkloadRecord> {
        let _writer = self.catalog_writer.lock().await;
        self.check_gpu_memory_known(&profile)?;
        let record = self
            .store
            .put_profile(name.as_str(), &profile, now_ms())
            .await?;
        self.write_catalog()
            .put_workload(&record.name, &record.profiles);
        Ok(record)
    }

    /// Marks a profiling job as running for `workload`: the returned token is cancelled when
    /// the workload is deleted (or `parent` is).
    pub fn start_job(
        &self,
        workload: &WorkloadName,
        parent: &CancellationToken,
    ) -> CancellationToken {
        let token = parent.child_token();
        self.running_jobs
            .lock()
            .unpoisoned()
            .insert(workload.clone(), token.clone());
        token
    }

    pub fn end_job(&self, workload: &WorkloadName) {
        self.running_jobs.lock().unpoisoned().remove(workload);
    }

    /// Stores a profiling job's result and makes the workload rankable at once, once per
    /// claim (a repeat is `Duplicate` and changes nothing).
    pub async fn complete_job(
        &self,
        job: &ClaimedJob,
        profile: &Profile,
        note: &str,
    ) -> Result<Submitted<WorkloadRecord>> {
        let _writer = self.catalog_writer.lock().await;
        self.check_gpu_memory_known(profile)?;
        let submitted = self
            .store
            .complete_job(job, profile, note, now_ms())
            .await?;
        if let Submitted::Applied(record) = &submitted {
            self.write_catalog()
                .put_workload(&record.name, &record.profiles);
        }
        Ok(submitted)
    }

    /// Stores a colocated run; every member must be a registered workload. When the
    /// champion can predict the set, its prediction is stored with the run and its error
    /// feeds the rolling error (drift).
    pub async fn report(&self, observation: Observation) -> Result<(i64, bool)> {
        self.record_run(observation, ObservationSource::Reported)
            .await
    }

    /// Stores a run from `source` once, with what the champion predicted for it (the
    /// rolling error and drift follow it). Returns the run's id and whether it is new.
    async fn record_run(
        &self,
        observation: Observation,
        source: ObservationSource,
    ) -> Result<(i64, bool)> {
        let table = {
            let catalog = self.read_catalog();
            if let Some(unknown) = observation
                .members
                .iter()
                .find(|m| !catalog.contains(&m.workload))
            {
                self.stats.report(ReportOutcome::Rejected);
                return Err(Error::UnknownReportedWorkload(
                    unknown.workload.as_str().to_string(),
                ));
            }
            catalog.gpu(&observation.gpu)
        };
        let champion = self.models.load().get(&observation.gpu).cloned();
        let prediction = champion.zip(table).and_then(|(champion, table)| {
            // Runs with an NVML-only member are neither trained on nor judged (as before
            // twins existed): drift speaks of the full model.
            let entries: Option<Vec<&ProfileEntry>> = observation
                .members
                .iter()
                .map(|m| table.get(&m.workload).filter(|e| !e.nvml_only))
                .collect();
            let sum = predict::predict_entries(&champion, &table, &entries?).0.sum;
            Some((sum, champion.version))
        });
        let (id, created) = self
            .store
            .insert_observation(&observation, source, prediction, now_ms())
            .await?;
        self.stats.report(if created {
            ReportOutcome::Stored
        } else {
            ReportOutcome::Duplicate
        });
        let actual = observation.throughput_sum();
        if let (true, Some((predicted, version))) = (created, prediction) {
            if actual > 0.0 {
                self.record_prediction_error(
                    &observation.gpu,
                    version,
                    (predicted - actual).abs() / actual,
                );
            }
        }
        Ok((id, created))
    }

    /// The GPU model a request is about: the one it names, else the configured default,
    /// else the only one known.
    pub fn resolve_gpu(&self, requested: Option<GpuName>) -> Result<GpuName> {
        if let Some(gpu) = requested {
            return Ok(gpu);
        }
        if let Some(gpu) = &self.default_gpu {
            return Ok(gpu.clone());
        }
        let catalog = self.read_catalog();
        let mut known = catalog.gpu_names();
        match (known.next(), known.next()) {
            (Some(only), None) => Ok(only.clone()),
            (None, _) => Err(Error::NoGpuModelKnown),
            (Some(_), Some(_)) => {
                // A profile of a new GPU model must not break clients that name none: the
                // one GPU model with a trained model keeps serving them.
                let models = self.models.load();
                let mut trained = models.keys();
                match (trained.next(), trained.next()) {
                    (Some(only), None) => Ok(only.clone()),
                    _ => Err(Error::AmbiguousGpuModel),
                }
            }
        }
    }

    /// The model serving each GPU model.
    pub fn champions(&self) -> Vec<Arc<StoredModel>> {
        self.models.load().values().cloned().collect()
    }

    pub fn current_model(&self, gpu: &GpuName) -> Result<Arc<StoredModel>> {
        self.models
            .load()
            .get(gpu)
            .cloned()
            .ok_or_else(|| Error::NoModelForGpu(gpu.clone()))
    }

    /// Rank: candidates for a target, best first.
    pub async fn rank(&self, query: RankQuery) -> Result<RankResult> {
        let gpu = self.resolve_gpu(query.gpu.clone())?;
        let model = self.current_model(&gpu)?;
        let (table, found) = {
            let catalog = self.read_catalog();
            if !catalog.contains(&query.target) {
                return Err(Error::UnknownTarget(query.target.as_str().to_string()));
            }
            let table = catalog.gpu(&gpu).unwrap_or_default();
            // One index lookup per named candidate; the catalog only for the misses.
            let found: Vec<rank::Found> = query
                .candidates
                .iter()
                .map(|c| match table.position(c.as_str()) {
                    Some(i) => rank::Found::Entry(i),
                    None if catalog.contains(c.as_str()) => rank::Found::NotRankable,
                    None => rank::Found::Unknown,
                })
                .collect();
            (table, found)
        };
        let work = rank::RankWork {
            query,
            gpu,
            model,
            table,
            found,
        };
        if work.is_large() {
            // The RPC's span follows the work onto the blocking thread.
            let span = tracing::Span::current();
            tokio::task::spawn_blocking(move || span.in_scope(|| work.run()))
                .await
                .map_err(|e| Error::Internal(anyhow::Error::new(e).context("rank panicked")))?
        } else {
            work.run()
        }
    }

    /// Place: the GPUs a new job may go to, best first (see `place.rs`), exploring within
    /// the service's budget (`observer.explore_budget`). In-process callers (the simulator)
    /// call this directly with a [`PlaceQuery`].
    pub async fn place(&self, query: PlaceQuery) -> Result<PlaceAnswer> {
        self.place_with(query, true).await
    }

    /// Place without exploring: Place's own order, no answer marked `explored`, and the
    /// call not counted in the exploration budget's placements. For callers that score
    /// GPUs rather than take the first (the scheduler extender and the binding webhook):
    /// an explored offer they would not follow must not spend the budget.
    pub async fn place_without_exploring(&self, query: PlaceQuery) -> Result<PlaceAnswer> {
        self.place_with(query, false).await
    }

    async fn place_with(&self, query: PlaceQuery, explore: bool) -> Result<PlaceAnswer> {
        let mut query = query;
        query.validate()?;
        if query.gpus.is_empty() {
            query.gpus = self.stored_gpus(&GpuFilter {
                nodes: std::mem::take(&mut query.nodes),
                gpu: query.gpu_filter.take(),
            });
        }
        let mut work = self.place_work(query)?;
        if !explore {
            work.explore = None;
        }
        if work.is_large() {
            let span = tracing::Span::current();
            tokio::task::spawn_blocking(move || span.in_scope(|| work.run()))
                .await
                .map_err(|e| Error::Internal(anyhow::Error::new(e).context("place panicked")))?
        } else {
            work.run()
        }
    }

    /// Place's answers that offered a GPU since start, and those that explored.
    pub fn placements_explored(&self) -> (u64, u64) {
        self.exploration.counts()
    }

    /// Forgets the set predictions Place keeps across requests (benchmarks measure a cold
    /// request with it; answers never depend on it).
    pub fn forget_placed_sets(&self) {
        self.placed_sets.clear();
        // What callers keep of Place's answers goes too.
        self.answers_changed();
    }

    /// Resolves the GPU models, models, profile tables and residents of a Place request
    /// under one short catalog read.
    fn place_work(&self, query: PlaceQuery) -> Result<place::PlaceWork> {
        let default_gpu = if query.gpus.iter().any(|g| g.gpu.is_none()) {
            Some(self.resolve_gpu(None)?)
        } else {
            None
        };
        let models = self.models.load();
        let mut work =
            place::PlaceWork::new(&self.read_catalog(), &models, default_gpu.as_ref(), query)?;
        work.shared = Some(self.placed_sets.clone());
        work.explore = Some(self.exploration.clone());
        Ok(work)
    }

    /// Predict: one explicit set.
    pub async fn predict(&self, query: PredictQuery) -> Result<PredictResult> {
        let gpu = self.resolve_gpu(query.gpu.clone())?;
        let model = self.current_model(&gpu)?;
        let table = {
            let catalog = self.read_catalog();
            if let Some(unknown) = query.workloads.iter().find(|w| !catalog.contains(*w)) {
                return Err(Error::UnknownWorkload(unknown.as_str().to_string()));
            }
            catalog.gpu(&gpu).unwrap_or_default()
        };
        rank::predict(&query, &gpu, &model, &table)
    }
}

/// Page tokens: a version tag and the hex of the last name of the page, which must be a
/// valid workload name (so at most 2 + 2 x 128 characters). Anything else, including hex of
/// an arbitrary string or an oversized token, is refused before the store is asked.
const PAGE_TOKEN_TAG: &str = "p1";

fn encode_page_token(last_name: &str) -> String {
    format!("{PAGE_TOKEN_TAG}{}", hex::encode(last_name))
}

fn decode_page_token(token: &str) -> Result<Option<String>> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || {
        Error::InvalidRequest(crate::domain::ValidationError::new(
            "page_token",
            "page_token is not one this server issued",
        ))
    };
    if token.len() > PAGE_TOKEN_TAG.len() + 2 * 4 * 128 {
        return Err(invalid());
    }
    let hex_part = token.strip_prefix(PAGE_TOKEN_TAG).ok_or_else(invalid)?;
    let bytes = hex::decode(hex_part).map_err(|_| invalid())?;
    let name = String::from_utf8(bytes).map_err(|_| invalid())?;
    WorkloadName::parse("page_token", &name).map_err(|_| invalid())?;
    Ok(Some(name))
}

/// The catalog's write guard ([`Advisor::write_catalog`]): moves the answers generation
/// on when it drops, while the write lock is still held, so that a reader that read the
/// number before the change sees the change or a newer number.
struct CatalogWrite<'a> {
    guard: std::sync::RwLockWriteGuard<'a, Catalog>,
    answers: &'a std::sync::atomic::AtomicU64,
}

impl std::ops::Deref for CatalogWrite<'_> {
    type Target = Catalog;

    fn deref(&self) -> &Catalog {
        &self.guard
    }
}

impl std::ops::DerefMut for CatalogWrite<'_> {
    fn deref_mut(&mut self) -> &mut Catalog {
        &mut self.guard
    }
}

impl Drop for CatalogWrite<'_> {
    fn drop(&mut self) {
        self.answers
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_garbage_is_rejected() {
        let token = encode_page_token("bert-base-cased_batch8-inf");
        assert_eq!(
            decode_page_token(&token).unwrap().as_deref(),
            Some("bert-base-cased_batch8-inf")
        );
        assert_eq!(decode_page_token("").unwrap(), None);
        let forged = [
            "xyz".to_string(),
            "0".into(),
            "p1zz".into(),
            "p1ff".into(),
            // Hex of a string that is no workload name, with and without the tag.
            hex::encode("not a name/../x"),
            format!("p1{}", hex::encode("not a name/../x")),
            hex::encode("bert-base-cased_batch8-inf"),
            // 1 MB.
            format!("p1{}", "61".repeat(500_000)),
        ];
        for bad in forged {
            assert!(decode_page_token(&bad).is_err(), "{bad:.40} accepted");
        }
    }
}

//! The learning model policy's Place: the service itself, in process. `coloc-online` asks
//! a real [`Advisor`] (a SQLite store in a scratch folder, the service's default settings
//! and `COLOC__*` from the environment, as `coloc serve` reads them), seeded the way
//! `coloc import kace` seeds a fresh deployment (the KACE V100 profiles, the 181
//! measured pairs, `kace-linear` then the default model trained), so it starts from the
//! model the `coloc` policy places with. Each set the cluster ran is emitted as the
//! service's observer sees a cluster (`observed`: the window's timeline and each pod's
//! throughput series from the measured truth); the observer forms the run and stores it
//! through ReportColocation's path, and after every window the service's own
//! retraining turn (`Trainer::run_once`: due after `trainer.min_new_observations` new runs
//! or on drift; the challenger judged against the champion and promoted only if not
//! worse) may replace the model Place answers with. Nothing here decides what to learn or
//! when: the service's code and settings do.
//!
//! The seeded store is built once per `coloc simulate` ([`SeededStore`]) and copied for
//! each run, so that every run starts from the same state.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;

use coloc::{
    advisor::{Advisor, PlaceAnswer, PlaceQuery},
    dataset::{KACE_GPU, KACE_GPU_MEMORY_GB},
    domain::{GpuName, WorkloadName},
    observer::{Formed, GpuKey, Observer, Pod, Segment},
    settings::ObserverSettings,
    settings::{Settings, SettingsSources},
    store::Store,
    trainer::{Trainer, TrainerOutcome},
};

use super::{
    engine::REPORT_AFTER_S,
    observed::{EmittedSeries, EmittedTimeline},
    retraining::{self, Probe, RetrainingTrace},
};

/// A store holding what `coloc import kace` writes, closed, ready to be copied.
pub struct SeededStore {
    _dir: tempfile::TempDir,
    file: PathBuf,
}

fn settings_for(database: &Path) -> anyhow::Result<Settings> {
    Ok(Settings::load(SettingsSources {
        overrides: vec![("database.url", format!("sqlite://{}", database.display()))],
        ..Default::default()
    })?)
}

impl SeededStore {
    /// Imports `kace_v100` into a fresh store, as `coloc import kace` does. On a thread of
    /// its own, so that it may be called from within an async runtime (`coloc`'s main).
    pub fn build(kace_v100: &Path) -> anyhow::Result<Self> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| Self::build_here(kace_v100))
                .join()
                .expect("seeding the store panicked")
        })
    }

    fn build_here(kace_v100: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("a scratch folder for the seeded store")?;
        let file = dir.path().join("seed.db");
        let settings = settings_for(&file)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let store = Store::open(&settings.database.url).await?;
            let advisor =
                Advisor::load(store.clone(), coloc::startup::advisor_options(&settings)?).await?;
            let gpu = GpuName::parse("gpu", KACE_GPU).map_err(|e| anyhow::anyhow!(e.message))?;
            coloc::import::import_kace(&advisor, kace_v100, &gpu, KACE_GPU_MEMORY_GB)
                .await
                .context("seeding the learning policy's store")?;
            store.close().await;
            anyhow::Ok(())
        })?;
        Ok(Self { _dir: dir, file })
    }
}

/// The service answering one run's Place calls and taking its reports.
pub struct LearningService {
    runtime: tokio::runtime::Runtime,
    advisor: Arc<Advisor>,
    trainer: Trainer,
    observer: Observer,
    timeline: Arc<EmittedTimeline>,
    series: Arc<EmittedSeries>,
    store: Store,
    gpu: GpuName,
    _dir: tempfile::TempDir,
    /// Runs reported, retraining turns that trained, and models promoted by them.
    pub reports: u64,
    pub trainings: u64,
    pub promotions: u64,
    /// Of the runs reported, those of three and more members.
    pub crowded_reports: u64,
    /// The version the last retraining turn trained, and whether it was promoted.
    pub last_trained: Option<(u64, bool)>,
}

impl LearningService {
    /// A service over a fresh copy of `seed`.
    pub fn start(seed: &SeededStore) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("a scratch folder for the learning policy")?;
        let file = dir.path().join("coloc.db");
        std::fs::copy(&seed.file, &file).context("copying the seeded store")?;
        let settings = settings_for(&file)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (advisor, store) = runtime.block_on(async {
            let store = Store::open(&settings.database.url).await?;
            let advisor =
                Advisor::load(store.clone(), coloc::startup::advisor_options(&settings)?).await?;
            anyhow::Ok((Arc::new(advisor), store))
        })?;
        let trainer = Trainer::new(
            advisor.clone(),
            store.clone(),
            Duration::from_secs(settings.trainer.interval_secs),
        );
        let (timeline, series) = (
            Arc::new(EmittedTimeline::default()),
            Arc::new(EmittedSeries::default()),
        );
        let observer = Observer::new(
            advisor.clone(),
            store.clone(),
            timeline.clone(),
            vec![series.clone()],
            ObserverSettings {
                settle_secs: 0,
                ..settings.observer.clone()
            },
        );
        Ok(Self {
            runtime,
            advisor,
            trainer,
            observer,
            timeline,
            series,
            store,
            gpu: GpuName::parse("gpu", KACE_GPU).map_err(|e| anyhow::anyhow!(e.message))?,
            _dir: dir,
            reports: 0,
            trainings: 0,
            promotions: 0,
            crowded_reports: 0,
            last_trained: None,
        })
    }

    pub fn place(&self, query: PlaceQuery) -> anyhow::Result<PlaceAnswer> {
        self.runtime
            .block_on(self.advisor.place(query))
            .map_err(|e| anyhow::anyhow!("Place refused the request: {e}"))
    }

    /// Shows the observer a run (members' names and colocated throughputs) that ran
    /// unchanged for [`REPORT_AFTER_S`] until `at_s` simulated seconds, lets it form the
    /// run, then runs the service's retraining turn. Returns whether a new model now
    /// answers.
    pub fn report(&mut self, members: &[(WorkloadName, f64)], at_s: f64) -> anyhow::Result<bool> {
        let end_ms = (at_s * 1000.0) as i64;
        let start_ms = end_ms - (REPORT_AFTER_S * 1000.0) as i64;
        let pods: Vec<Pod> = members
            .iter()
            .enumerate()
            .map(|(i, (workload, _))| Pod {
                uid: format!("{workload}#{i}"),
                workload: workload.as_str().to_string(),
                name: String::new(),
                query: None,
            })
            .collect();
        for (pod, (_, throughput)) in pods.iter().zip(members) {
            self.series.emit(&pod.uid, start_ms, end_ms, *throughput);
        }
        self.timeline.emit(Segment {
            gpu: GpuKey {
                node: "simulated".into(),
                gpu_id: "gpu".into(),
            },
            gpu_model: Some(self.gpu.to_string()),
            pods,
            start_ms,
            end_ms,
        });
        let (observer, trainer) = (&mut self.observer, &self.trainer);
        let (formed, turn) = self.runtime.block_on(async {
            let formed = observer.run_once(end_ms).await?;
            anyhow::Ok((formed, trainer.run_once().await?))
        })?;
        let created = formed
            .iter()
            .filter(|w| matches!(w.formed, Formed::Run { .. }))
            .count();
        if let Some(other) = formed
            .iter()
            .find(|w| !matches!(w.formed, Formed::Run { .. } | Formed::Known))
        {
            anyhow::bail!(
                "the observer did not form a simulated run: {:?}",
                other.formed
            );
        }
        self.reports += created as u64;
        if members.len() >= 3 {
            self.crowded_reports += created as u64;
        }
        let mut changed = false;
        for outcome in turn {
            match outcome {
                TrainerOutcome::Trained { outcome, .. } => {
                    self.trainings += 1;
                    self.last_trained = Some((outcome.model.version, outcome.promoted));
                    if outcome.promoted {
                        self.promotions += 1;
                        changed = true;
                    }
                }
                TrainerOutcome::Failed { error, .. } => {
                    anyhow::bail!("the learning policy's retraining failed: {error}")
                }
            }
        }
        Ok(changed)
    }
}

impl LearningService {
    /// What the serving model says now of every set of `probe` (the retraining trace),
    /// `own` the sets the service was shown.
    pub fn trace(&self, probe: &Probe, own: &HashSet<Vec<u8>>) -> anyhow::Result<RetrainingTrace> {
        let mut traced =
            self.runtime
                .block_on(retraining::trace(&self.advisor, &self.gpu, probe, own))?;
        traced.trainings = self.trainings;
        traced.own_runs = self.reports;
        traced.own_crowded_runs = self.crowded_reports;
        if self.trainings > 0 {
            let (version, promoted) = self.last_trained.expect("set by every training");
            traced.trained_version = Some(version);
            traced.promoted = Some(promoted);
        }
        Ok(traced)
    }
}

impl Drop for LearningService {
    fn drop(&mut self) {
        let store = self.store.clone();
        self.runtime.block_on(store.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> WorkloadName {
        WorkloadName::parse("workload", n).unwrap()
    }

    #[test]
    fn reports_reach_the_store_and_the_service_retrains_after_twenty_new_runs() {
        let seed = SeededStore::build(Path::new("../shared/data/kace-v100")).unwrap();
        let mut service = LearningService::start(&seed).unwrap();
        let gpu = service.gpu.clone();
        let models = |s: &LearningService| s.runtime.block_on(s.advisor.models(&gpu, 10)).unwrap();
        // The import trained kace-linear, then the default, which serves.
        let seeded = models(&service);
        assert_eq!(seeded.len(), 2);
        assert_eq!(service.advisor.current_model(&gpu).unwrap().version, 2);

        // Twenty distinct three-job runs (made-up throughputs, 10 + i for each member of the
        // i-th); the service's default is a retrain after 20 new runs.
        let workloads = [
            "bert-base-cased_batch2-inf",
            "vit-base-patch16-224_batch2-inf",
            "wav2vec2-base-960h_batch2-inf",
            "whisper-large-v2_batch2-inf",
            "bert-base-cased_batch8-inf",
        ];
        let mut runs = Vec::new();
        for a in 0..workloads.len() {
            for b in a..workloads.len() {
                for c in b..workloads.len() {
                    runs.push([workloads[a], workloads[b], workloads[c]]);
                }
            }
        }
        for (i, run) in runs.iter().take(20).enumerate() {
            let members: Vec<(WorkloadName, f64)> =
                run.iter().map(|w| (name(w), 10.0 + i as f64)).collect();
            let changed = service.report(&members, 3600.0 * i as f64).unwrap();
            assert_eq!(service.reports, i as u64 + 1);
            assert_eq!(
                service.trainings,
                u64::from(i == 19),
                "after {} runs",
                i + 1
            );
            assert!(!changed || i == 19);
        }
        // The retrain fitted the default on the 181 pairs and the 20 runs.
        let trained = models(&service);
        assert_eq!(trained.len(), 3);
        assert_eq!(trained[0].version, 3);
        assert_eq!(trained[0].metrics.observations, 201);
        assert_eq!(
            service.promotions,
            u64::from(trained[0].status.as_str() == "promoted")
        );

        // The same run again is one run: not stored twice, no retrain.
        let again: Vec<(WorkloadName, f64)> = runs[0].iter().map(|w| (name(w), 10.0)).collect();
        service.report(&again, 0.0).unwrap();
        assert_eq!((service.reports, service.trainings), (20, 1));
    }
}

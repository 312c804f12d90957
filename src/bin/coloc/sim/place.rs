//! The model policies' one path to a decision: the advisor's Place
//! (`coloc::advisor::place_in_keeping`: the work behind the Place RPC, with the set
//! predictions kept across requests as the service keeps them, on a catalog and model built
//! in process; or the service itself for `coloc-online`, `online.rs`). A policy asks "which of these GPUs (each with its residents) for
//! this job"; Place scores each GPU by the predicted gain under NORMALIZED_SUM (the set's
//! Σ colocated / exclusive with the job minus without; an empty GPU gains 1; a member's
//! prediction is the lowest the model gives it in any subset holding it), leaves out GPUs
//! whose memory would overflow, whose new job would fall below `min_job_fraction`, whose
//! capped residents would fall below their caps (each LS resident's cap is its own floor in
//! the query) or whose new set the policy's [`PlaceRule`] refuses on the predicted members
//! (`policy.rs`); the policy takes the largest gain Place admits, or lets the job wait.
//!
//! Caps are checked by default with [`CapCheck::Cautious`] (`--caps cautious`, chosen with
//! the `fair-share` rule on the selection seeds under the k8s queue, README): the job's
//! through Place's
//! `cautious` and each resident's on the low end of its 80 % interval, so a GPU is taken
//! only if every cap holds at the pessimistic end; `--caps point` checks them on the point
//! predictions. The gain and the rule are read on the point predictions either way. A
//! model without intervals (`kace-linear`) is checked on its point predictions either
//! way.
//!
//! [`Placer`] is the adapter the policies speak to. GPUs with the same residents (and caps)
//! are asked about once, the first of them standing for all (ties go to the lowest GPU).
//!
//! Training data: both model policies are fitted on the measured pairs of
//! `kace-v100/pairs.csv` (all 181, as `coloc import kace` trains the service) and, with
//! `--split-runs --train-on pairs+runs`, the training half of the 3- and 4-way runs, never
//! on a crowded run the simulation judges them on (the split's truth holds only the other
//! half). The simulation judges them on pairs too (the pair measurements are also its
//! truth for 2-job sets).
//! Both place by the same objective with the same caps, so that only the model differs:
//! `kace-linear` predicts only the set's sum, and Place estimates its members from the sum
//! in proportion to their exclusive throughputs (`ModelUsed::members_estimated`).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use anyhow::Context;

use coloc::{
    advisor::{
        place_in_keeping, Catalog, GpuState, Objective, PlaceAnswer, PlaceQuery, PlacedSets,
        Policy as AdvisorPolicy, RunSummary, PLACED_SETS,
    },
    dataset::{KaceDataset, KACE_GPU},
    domain::{GpuName, Profile, ProfileSource, WorkloadName},
    model::{FitMetrics, ModelParams},
    store::StoredModel,
};

use super::{
    online::LearningService,
    policy::{DecisionKey, GpuView, JobView, PlaceRule, Policy},
    retraining::{Probe, RetrainingLog},
    truth::{Workload, GPU_MEMORY_GB},
};

/// One GPU in a Place request: its residents (workload, cap).
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceGpu {
    pub residents: Vec<(u8, Option<f64>)>,
}

#[derive(Debug, Clone)]
pub struct PlaceRequest {
    pub job: u8,
    pub job_cap: Option<f64>,
    pub gpus: Vec<PlaceGpu>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlaceDecision {
    /// Position in the request's GPUs.
    pub gpu: usize,
    pub gain: f64,
}

pub trait Placer {
    fn place(&mut self, request: &PlaceRequest) -> anyhow::Result<Option<PlaceDecision>>;
    /// Whether reported runs reach the model ([`Placer::observe`]).
    fn learns(&self) -> bool {
        false
    }
    /// A run the scheduler reports at `now`: (workload, speed) per member. Returns whether
    /// Place may now answer otherwise.
    fn observe(&mut self, _members: &[(u8, f64)], _now: f64) -> anyhow::Result<bool> {
        Ok(false)
    }
}

/// How the model policies read the LS caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapCheck {
    /// On each member's point prediction.
    Point,
    /// On the low end of each member's 80 % interval where the model has one.
    Cautious,
}

/// Who answers Place.
enum Answerer {
    /// The advisor's own function on a catalog of the simulation's workloads and one fitted
    /// model.
    Fixed {
        catalog: Catalog,
        models: HashMap<GpuName, Arc<StoredModel>>,
        /// Set predictions kept across requests, as the service's Place keeps them.
        kept: Arc<PlacedSets>,
    },
    /// The service in process, retraining from the runs reported to it (`online.rs`).
    Learning(Box<LearningService>),
}

impl Answerer {
    fn answer(&self, query: PlaceQuery) -> anyhow::Result<PlaceAnswer> {
        match self {
            Answerer::Fixed {
                catalog,
                models,
                kept,
            } => place_in_keeping(catalog, models, None, query, kept)
                .map_err(|e| anyhow::anyhow!("Place refused the request: {e}")),
            Answerer::Learning(service) => service.place(query),
        }
    }
}

/// Place, answered by the advisor: with one fitted model, or by the service that learns.
pub struct ServicePlacer {
    answerer: Answerer,
    gpu: GpuName,
    /// By workload index.
    names: Vec<WorkloadName>,
    /// Exclusive throughput by workload index (a reported member's throughput is its speed
    /// times this).
    exclusive: Vec<f64>,
    caps: CapCheck,
    rule: PlaceRule,
    /// The sets reported so far (sorted workload indices): each is reported once, since
    /// the truth gives a set the same throughputs every time it runs.
    reported: HashSet<Vec<u8>>,
    /// Which admitted GPU to take (`--prefer`); the largest gain by default.
    pub prefer: coloc::extender::Prefer,
    pub calls: u64,
    /// Calls answered with a placement marked `explored`, taken.
    pub explored: u64,
    pub nanos: u128,
    /// The learning service's retraining trace, where one is asked for.
    pub retraining: Option<RetrainingLog>,
}

impl ServicePlacer {
    /// `workloads` in the simulation's index order; their profiles come from `dataset`.
    pub fn new(
        dataset: &KaceDataset,
        workloads: &[Workload],
        params: ModelParams,
        metrics: FitMetrics,
        caps: CapCheck,
        rule: PlaceRule,
    ) -> anyhow::Result<Self> {
        let gpu = GpuName::parse("gpu", KACE_GPU).map_err(|e| anyhow::anyhow!(e.message))?;
        let model = Arc::new(StoredModel::fitted_in_process(
            gpu.clone(),
            params,
            metrics,
            "fitted by coloc simulate on the measured pairs",
        ));
        let mut catalog = Catalog::default();
        let mut names = Vec::new();
        for w in workloads {
            let kace = dataset
                .workloads
                .iter()
                .find(|k| k.name.as_str() == w.name)
                .with_context(|| format!("{} has no profile", w.name))?;
            let profile = Profile {
                gpu: gpu.clone(),
                kernel: kace.kernel,
                system: kace.system.clone(),
                source: ProfileSource::Imported,
                gpu_memory_gb: Some(GPU_MEMORY_GB),
                measured_at_ms: 0,
                kernel_missing: false,
            };
            catalog.put_workload(&kace.name, &[profile]);
            names.push(kace.name.clone());
        }
        catalog.set_scoring_model(model.clone());
        // What the service knows from the same pairs once `coloc import kace` stored them
        // (evidence, suspect profiles and their corrected exclusive figures), so that this
        // placer answers as the service does.
        let table = catalog.gpu(&gpu).unwrap_or_default();
        let runs: Vec<Vec<(String, f64)>> = dataset
            .pairs
            .iter()
            .map(|p| {
                vec![
                    (p.workload1.clone(), p.throughput1),
                    (p.workload2.clone(), p.throughput2),
                ]
            })
            .collect();
        let summary = RunSummary::of(runs.iter().map(|r| r.as_slice()), |name| {
            table
                .position(name)
                .map(|i| table.entries()[i].features.exclusive_throughput())
        });
        catalog.set_runs(&gpu, summary);
        let answerer = Answerer::Fixed {
            catalog,
            models: HashMap::from([(gpu.clone(), model)]),
            kept: Arc::new(PlacedSets::new(PLACED_SETS)),
        };
        Ok(Self::answered_by(
            answerer, gpu, names, workloads, caps, rule,
        ))
    }

    fn answered_by(
        answerer: Answerer,
        gpu: GpuName,
        names: Vec<WorkloadName>,
        workloads: &[Workload],
        caps: CapCheck,
        rule: PlaceRule,
    ) -> Self {
        Self {
            answerer,
            gpu,
            names,
            exclusive: workloads.iter().map(|w| w.exclusive_throughput).collect(),
            caps,
            rule,
            reported: HashSet::new(),
            prefer: coloc::extender::Prefer::default(),
            calls: 0,
            explored: 0,
            nanos: 0,
            retraining: None,
        }
    }

    /// Traces the learning service's model now (the seeded one) and after every retraining
    /// turn that trains ([`super::retraining`]); nothing for a fixed model.
    pub fn trace_retraining(&mut self, probe: Arc<Probe>) -> anyhow::Result<()> {
        if let Answerer::Learning(service) = &self.answerer {
            let seeded = service.trace(&probe, &self.reported)?;
            self.retraining = Some(RetrainingLog {
                probe,
                traces: vec![seeded],
            });
        }
        Ok(())
    }

    /// Place answered by the service in process, which learns from reported runs.
    pub fn learning(
        service: LearningService,
        workloads: &[Workload],
        caps: CapCheck,
        rule: PlaceRule,
    ) -> anyhow::Result<Self> {
        let gpu = GpuName::parse("gpu", KACE_GPU).map_err(|e| anyhow::anyhow!(e.message))?;
        let names = workloads
            .iter()
            .map(|w| {
                WorkloadName::parse("workload", &w.name).map_err(|e| anyhow::anyhow!(e.message))
            })
            .collect::<anyhow::Result<_>>()?;
        let answerer = Answerer::Learning(Box::new(service));
        Ok(Self::answered_by(
            answerer, gpu, names, workloads, caps, rule,
        ))
    }

    /// The learning service's counts (reports, trainings, promotions); `None` for a fixed
    /// model.
    pub fn learning_counts(&self) -> Option<(u64, u64, u64)> {
        match &self.answerer {
            Answerer::Learning(s) => Some((s.reports, s.trainings, s.promotions)),
            Answerer::Fixed { .. } => None,
        }
    }
}

impl ServicePlacer {
    /// The catalog and model that answer, when they are fixed (tests compare them with the
    /// other callers of the one prediction).
    #[cfg(test)]
    pub fn fixed(&self) -> Option<(&Catalog, &HashMap<GpuName, Arc<StoredModel>>)> {
        match &self.answerer {
            Answerer::Fixed {
                catalog, models, ..
            } => Some((catalog, models)),
            Answerer::Learning(_) => None,
        }
    }
}

impl Placer for ServicePlacer {
    fn place(&mut self, request: &PlaceRequest) -> anyhow::Result<Option<PlaceDecision>> {
        let started = Instant::now();
        // One GPU per distinct residents-and-caps, the first standing for the rest.
        let mut distinct: Vec<usize> = Vec::new();
        for (i, gpu) in request.gpus.iter().enumerate() {
            let mut key = gpu.residents.clone();
            key.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp_opt(&b.1)));
            if !distinct.iter().any(|&d| {
                let mut other = request.gpus[d].residents.clone();
                other.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp_opt(&b.1)));
                other == key
            }) {
                distinct.push(i);
            }
        }
        let gpus: Vec<GpuState> = distinct
            .iter()
            .map(|&i| GpuState {
                id: i.to_string(),
                node: String::new(),
                gpu: Some(self.gpu.clone()),
                memory_gb: Some(GPU_MEMORY_GB),
                residents: request.gpus[i]
                    .residents
                    .iter()
                    .map(|r| self.names[r.0 as usize].to_string())
                    .collect(),
                resident_floors: request.gpus[i].residents.iter().map(|r| r.1).collect(),
            })
            .collect();
        let mut query = PlaceQuery::new(self.names[request.job as usize].clone(), gpus);
        query.policy = AdvisorPolicy {
            objective: Objective::NormalizedSum,
            rule: Some(self.rule),
            cautious: self.caps == CapCheck::Cautious,
            min_job_fraction: request.job_cap,
            min_partner_fraction: None,
            // As Place's default: a GPU where the job would be a predicted loss (the GPU
            // doing less work than its residents and the job apart) is not offered, even
            // where the rule admits it (a crowded set that keeps each member's fair share).
            include_losses: AdvisorPolicy::default().include_losses,
        };
        let answer = self.answerer.answer(query)?;
        // A placement Place offers to explore (the service's `observer.explore_budget`) is
        // taken, as a scheduler that honours the mark takes it.
        if let Some(explored) = answer.placements.first().filter(|p| p.explored) {
            self.calls += 1;
            self.explored += 1;
            self.nanos += started.elapsed().as_nanos();
            return Ok(Some(PlaceDecision {
                gpu: explored.gpu_id.parse().context("a GPU id")?,
                gain: explored.gain,
            }));
        }
        // Pack ranks occupied GPUs first, spread empty ones; then the largest gain.
        let tier = |index: usize| {
            let occupied = !request.gpus[index].residents.is_empty();
            match self.prefer {
                coloc::extender::Prefer::Gain => 0,
                coloc::extender::Prefer::Pack => u8::from(occupied),
                coloc::extender::Prefer::Spread => u8::from(!occupied),
            }
        };
        let mut best: Option<PlaceDecision> = None;
        for placement in &answer.placements {
            let index: usize = placement.gpu_id.parse().context("a GPU id")?;
            let better = best.is_none_or(|b| {
                (tier(index), placement.gain, std::cmp::Reverse(index))
                    > (tier(b.gpu), b.gain, std::cmp::Reverse(b.gpu))
            });
            if better {
                best = Some(PlaceDecision {
                    gpu: index,
                    gain: placement.gain,
                });
            }
        }
        self.calls += 1;
        self.nanos += started.elapsed().as_nanos();
        Ok(best)
    }

    fn learns(&self) -> bool {
        matches!(self.answerer, Answerer::Learning(_))
    }

    fn observe(&mut self, members: &[(u8, f64)], now: f64) -> anyhow::Result<bool> {
        let Answerer::Learning(service) = &mut self.answerer else {
            return Ok(false);
        };
        let mut set: Vec<u8> = members.iter().map(|m| m.0).collect();
        set.sort_unstable();
        if !self.reported.insert(set) {
            return Ok(false);
        }
        let run: Vec<(WorkloadName, f64)> = members
            .iter()
            .map(|&(w, speed)| {
                (
                    self.names[w as usize].clone(),
                    speed * self.exclusive[w as usize],
                )
            })
            .collect();
        let trainings = service.trainings;
        let changed = service.report(&run, now)?;
        if let Some(log) = self
            .retraining
            .as_mut()
            .filter(|_| service.trainings > trainings)
        {
            let mut traced = service.trace(&log.probe, &self.reported)?;
            traced.at_h = now / 3600.0;
            log.traces.push(traced);
        }
        Ok(changed)
    }
}

trait CapOrder {
    fn total_cmp_opt(&self, other: &Self) -> std::cmp::Ordering;
}

impl CapOrder for Option<f64> {
    fn total_cmp_opt(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Some(a), Some(b)) => a.total_cmp(b),
            (a, b) => a.is_some().cmp(&b.is_some()),
        }
    }
}

/// A policy that asks Place.
pub struct PlacePolicy<P> {
    name: String,
    pub placer: P,
}

impl<P: Placer> PlacePolicy<P> {
    pub fn new(name: &str, placer: P) -> Self {
        Self {
            name: name.into(),
            placer,
        }
    }
}

impl<P: Placer> Policy for PlacePolicy<P> {
    fn name(&self) -> &str {
        &self.name
    }

    fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        let request = PlaceRequest {
            job: job.workload,
            job_cap: job.cap,
            gpus: gpus
                .iter()
                .map(|g| PlaceGpu {
                    residents: g.residents.iter().map(|r| (r.workload, r.cap)).collect(),
                })
                .collect(),
        };
        match self.placer.place(&request) {
            Ok(decision) => decision.map(|d| d.gpu),
            Err(error) => {
                // Every request names known workloads and valid fields; a refusal is a bug.
                panic!("{error:#}")
            }
        }
    }

    /// Place is asked the job's workload and cap, never its gpu_milli.
    fn decision_key(&self, job: &JobView) -> DecisionKey {
        DecisionKey::cap(job)
    }

    fn learns(&self) -> bool {
        self.placer.learns()
    }

    fn observe(&mut self, members: &[(u8, f64)], now: f64) -> bool {
        // A report the service refuses is a bug, as a refused Place request is.
        self.placer
            .observe(members, now)
            .unwrap_or_else(|error| panic!("{error:#}"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sim::truth::Truth;
    use coloc::model::{fit, ModelKind};

    fn placer_of(kind: ModelKind, caps: CapCheck) -> (ServicePlacer, Vec<String>) {
        placer_with(kind, caps, PlaceRule::Gain)
    }

    fn placer_with(
        kind: ModelKind,
        caps: CapCheck,
        rule: PlaceRule,
    ) -> (ServicePlacer, Vec<String>) {
        let data = Path::new("../shared/data");
        let truth = Truth::shared_data();
        let dataset = KaceDataset::read(&data.join("kace-v100")).unwrap();
        let rows = crate::sim::training_rows(&dataset, &[]).unwrap();
        let (params, metrics) = fit(kind, &rows).unwrap();
        let names = truth.workloads.iter().map(|w| w.name.clone()).collect();
        let placer =
            ServicePlacer::new(&dataset, &truth.workloads, params, metrics, caps, rule).unwrap();
        (placer, names)
    }

    fn placer() -> (ServicePlacer, Vec<String>) {
        placer_of(ModelKind::DEFAULT, CapCheck::Point)
    }

    fn index(names: &[String], name: &str) -> u8 {
        names.iter().position(|n| n == name).unwrap() as u8
    }

    fn request(job: u8, gpus: &[&[(u8, Option<f64>)]]) -> PlaceRequest {
        PlaceRequest {
            job,
            job_cap: None,
            gpus: gpus
                .iter()
                .map(|r| PlaceGpu {
                    residents: r.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn place_prefers_an_empty_gpu_leaves_out_memory_overflow_and_keeps_resident_caps() {
        let (mut p, names) = placer();
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        let vit_h = index(&names, "vit_h_14_batch8-train");

        // Alone the job keeps all of its speed: gain 1 (normalized); beside a resident less.
        let decision = p.place(&request(bert, &[&[(vit, None)], &[]])).unwrap();
        assert_eq!(decision, Some(PlaceDecision { gpu: 1, gain: 1.0 }));

        // Beside a light inference job the set gains; a resident whose cap is all of its
        // speed cannot take anyone.
        let shared = p.place(&request(bert, &[&[(vit, None)]])).unwrap();
        assert!(shared.is_some_and(|d| d.gpu == 0 && d.gain > 0.0 && d.gain < 1.0));
        assert_eq!(
            p.place(&request(bert, &[&[(vit, Some(0.999))]])).unwrap(),
            None
        );

        // 17.4 + 17.4 GB do not fit 32 GB.
        assert_eq!(p.place(&request(vit_h, &[&[(vit_h, None)]])).unwrap(), None);
        assert_eq!(p.calls, 4);
    }

    #[test]
    fn pack_takes_the_admitted_occupied_gpu_and_spread_the_empty_one() {
        use coloc::extender::Prefer;
        let (mut p, names) = placer();
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        let gpus: [&[(u8, Option<f64>)]; 3] = [&[], &[(vit, None)], &[]];
        let mut chosen = Vec::new();
        for prefer in [Prefer::Gain, Prefer::Pack, Prefer::Spread] {
            p.prefer = prefer;
            chosen.push(p.place(&request(bert, &gpus)).unwrap().unwrap());
        }
        assert_eq!(chosen[0], PlaceDecision { gpu: 0, gain: 1.0 });
        assert_eq!(chosen[1].gpu, 1, "pack: beside the resident");
        assert!(chosen[1].gain > 0.0 && chosen[1].gain < 1.0);
        assert_eq!(chosen[2], PlaceDecision { gpu: 0, gain: 1.0 });
        // With a resident whose cap refuses the job, pack takes the empty GPU.
        p.prefer = Prefer::Pack;
        let capped: [&[(u8, Option<f64>)]; 2] = [&[(vit, Some(0.999))], &[]];
        assert_eq!(
            p.place(&request(bert, &capped)).unwrap(),
            Some(PlaceDecision { gpu: 1, gain: 1.0 })
        );
    }

    #[test]
    fn gpus_with_the_same_residents_are_one_question_and_the_first_answers() {
        let (mut p, names) = placer();
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        let resident = [(vit, None)];
        let same: Vec<&[(u8, Option<f64>)]> = vec![&resident; 3];
        let decision = p.place(&request(bert, &same)).unwrap().unwrap();
        assert_eq!(decision.gpu, 0);
    }

    /// Each member's (point, low end) share of its exclusive throughput when `job` joins
    /// `residents`, as Place answers it: the job first (a model without intervals: the point
    /// twice).
    fn shares(p: &ServicePlacer, job: u8, residents: &[u8]) -> Vec<(f64, f64)> {
        let gpu = GpuState {
            id: "0".into(),
            node: String::new(),
            gpu: Some(p.gpu.clone()),
            memory_gb: Some(GPU_MEMORY_GB),
            residents: residents
                .iter()
                .map(|&r| p.names[r as usize].to_string())
                .collect(),
            resident_floors: Vec::new(),
        };
        let mut query = PlaceQuery::new(p.names[job as usize].clone(), vec![gpu]);
        query.policy = AdvisorPolicy::unrestricted(Objective::NormalizedSum);
        let answer = p.answerer.answer(query).unwrap();
        answer.placements[0]
            .members
            .iter()
            .map(|m| {
                let point = m.predicted_speed_fraction().unwrap();
                let low = m.speed_fraction_interval().map_or(point, |(low, _)| low);
                (point, low)
            })
            .collect()
    }

    #[test]
    fn cautious_caps_refuse_a_gpu_where_a_cap_holds_on_the_prediction_but_not_on_its_low_end() {
        let (mut point, names) = placer();
        let (mut cautious, _) = placer_of(ModelKind::DEFAULT, CapCheck::Cautious);
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        let shares = shares(&cautious, bert, &[vit]);
        let ((job, job_low), (resident, resident_low)) = (shares[0], shares[1]);
        assert!(job_low < job && resident_low < resident, "{shares:?}");

        // A cap between the low end and the prediction: kept on the prediction only.
        let job_cap = (job + job_low) / 2.0;
        let mut capped_job = request(bert, &[&[(vit, None)]]);
        capped_job.job_cap = Some(job_cap);
        assert!(point
            .place(&capped_job)
            .unwrap()
            .is_some_and(|d| d.gpu == 0));
        assert_eq!(cautious.place(&capped_job).unwrap(), None);

        let resident_cap = Some((resident + resident_low) / 2.0);
        let capped_resident = request(bert, &[&[(vit, resident_cap)]]);
        assert!(point
            .place(&capped_resident)
            .unwrap()
            .is_some_and(|d| d.gpu == 0));
        assert_eq!(cautious.place(&capped_resident).unwrap(), None);

        // Caps at or below the low ends hold either way.
        let mut low = request(bert, &[&[(vit, Some(resident_low))]]);
        low.job_cap = Some(job_low);
        assert!(cautious.place(&low).unwrap().is_some_and(|d| d.gpu == 0));
    }

    #[test]
    fn the_learning_service_answers_as_the_pairs_model_until_it_learns() {
        // Seeded as `coloc import kace` seeds a deployment, the service serves the default
        // model fitted on the same 181 pairs as the `coloc` policy's: before any report
        // both answer every request alike, point and low ends.
        let (mut fixed, names) = placer_of(ModelKind::DEFAULT, CapCheck::Cautious);
        let data = Path::new("../shared/data");
        let truth = Truth::shared_data();
        let seed = crate::sim::online::SeededStore::build(&data.join("kace-v100")).unwrap();
        let mut learning = ServicePlacer::learning(
            LearningService::start(&seed).unwrap(),
            &truth.workloads,
            CapCheck::Cautious,
            PlaceRule::Gain,
        )
        .unwrap();
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        let wav = index(&names, "wav2vec2-base-960h_batch2-inf");
        for (job, residents) in [
            (bert, vec![vit]),
            (vit, vec![bert, wav]),
            (wav, vec![bert, vit, vit]),
        ] {
            assert_eq!(
                shares(&fixed, job, &residents),
                shares(&learning, job, &residents)
            );
        }
        let request = request(bert, &[&[(vit, Some(0.3))], &[(wav, None), (vit, None)]]);
        assert_eq!(
            fixed.place(&request).unwrap(),
            learning.place(&request).unwrap()
        );
        // A set reported once is not reported again.
        assert!(learning.learns() && !fixed.learns());
        learning.observe(&[(bert, 0.5), (vit, 0.6)], 600.0).unwrap();
        learning
            .observe(&[(vit, 0.6), (bert, 0.5)], 1200.0)
            .unwrap();
        assert_eq!(learning.learning_counts(), Some((1, 0, 0)));
    }

    #[test]
    fn kace_linear_places_by_the_normalized_sum_and_keeps_caps_on_estimated_members() {
        let (mut p, names) = placer_of(ModelKind::KaceLinear, CapCheck::Cautious);
        let bert = index(&names, "bert-base-cased_batch2-inf");
        let vit = index(&names, "vit-base-patch16-224_batch2-inf");
        // An empty GPU gains the job's whole share (1), not its exclusive throughput.
        let decision = p.place(&request(bert, &[&[]])).unwrap();
        assert_eq!(decision, Some(PlaceDecision { gpu: 0, gain: 1.0 }));

        // Members estimated from the sum in proportion to their exclusive throughputs: both
        // keep the same share, below 1; a resident cap above it refuses the GPU.
        let shares = shares(&p, bert, &[vit]);
        let (job, resident) = (shares[0].0, shares[1].0);
        assert!((job - resident).abs() < 1e-9 && job < 1.0, "{shares:?}");
        let gain = p
            .place(&request(bert, &[&[(vit, Some(resident))]]))
            .unwrap()
            .map(|d| d.gain);
        assert!(gain.is_none_or(|g| (g - (2.0 * job - 1.0)).abs() < 1e-9));
        assert_eq!(
            p.place(&request(bert, &[&[(vit, Some(resident + 0.01))]]))
                .unwrap(),
            None
        );
        let mut capped_job = request(bert, &[&[(vit, None)]]);
        capped_job.job_cap = Some(job + 0.01);
        assert_eq!(p.place(&capped_job).unwrap(), None);
    }
}

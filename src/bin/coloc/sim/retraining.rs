//! The trace of `coloc-online`'s retrainings (`coloc simulate --trace-retraining FILE`,
//! decision 032's run 4): at the start and after every retraining turn that trained, what the
//! serving model says of the simulation's measured sets, asked through the advisor's
//! Predict (the one prediction and cautious bounds Place reads, [`Advisor::predict`]).
//! Per set size (and, for three and four, whether the service ran the set itself): the
//! error of the point against the measured member throughput, the low end, width and
//! coverage of the members' 80 % intervals, and how many members a cap check on the low end
//! admits at the LS cap. Beside it the serving model's own state: its version, training
//! runs, crowded runs, and which seen bands it has.
//!
//! The truth's pairs are the measured KACE pairs the service was seeded with, so every pair
//! here is one the model was trained on.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use serde::Serialize;

use coloc::{
    advisor::{Advisor, PredictQuery},
    domain::{GpuName, WorkloadName},
    model::ModelParams,
    store::StoredModel,
};

use super::truth::Truth;

/// One measured set, as the trace asks it.
struct ProbeSet {
    /// Sorted workload indices (the key the simulation reports by).
    key: Vec<u8>,
    /// One name per distinct member (Predict answers copies of a workload alike).
    names: Vec<WorkloadName>,
    /// Each distinct member's measured speed (colocated / exclusive throughput of the truth),
    /// in `names`' order.
    measured: Vec<f64>,
    /// Each distinct member's exclusive throughput in the truth.
    exclusive: Vec<f64>,
}

/// Every measured set of the truth, ready to be asked after each retraining.
pub struct Probe {
    sets: Vec<ProbeSet>,
    /// The LS cap the admission counts read at.
    cap: f64,
}

impl Probe {
    pub fn new(truth: &Truth, cap: f64) -> anyhow::Result<Self> {
        let mut sets = Vec::new();
        for (key, speeds) in truth.measured_iter() {
            let members = key.members();
            // Predict takes a set with its copies; the truth averages copies per workload.
            let names = members
                .iter()
                .map(|&w| {
                    WorkloadName::parse("workload", &truth.workloads[w as usize].name)
                        .map_err(|e| anyhow::anyhow!(e.message))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let distinct: Vec<u8> = speeds.keys().copied().collect();
            let mut deduped = members.clone();
            deduped.dedup();
            anyhow::ensure!(deduped == distinct, "a set's members are sorted");
            sets.push(ProbeSet {
                key: members,
                names,
                measured: distinct.iter().map(|w| speeds[w]).collect(),
                exclusive: distinct
                    .iter()
                    .map(|&w| truth.workloads[w as usize].exclusive_throughput)
                    .collect(),
            });
        }
        // A fixed order: the trace of one seed is the same every time.
        sets.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { sets, cap })
    }
}

/// A learning placer's traces so far, and the sets they ask.
pub struct RetrainingLog {
    pub probe: Arc<Probe>,
    pub traces: Vec<RetrainingTrace>,
}

/// One seen band of the serving model: the factors of its members' 80 % interval.
#[derive(Debug, Clone, Serialize)]
pub struct SeenBand {
    pub size: usize,
    pub runs: usize,
    /// e^(lower quantile), e^(upper quantile) of the member residuals.
    pub member_factors: Option<(f64, f64)>,
}

/// One group of measured sets (a size; for crowded sets, ran by the service or not).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupTrace {
    pub size: usize,
    /// For sizes of three and more: the sets the service ran and stored itself (`true`) or
    /// not; `None` for pairs (every pair is a seeded one).
    pub own_runs: Option<bool>,
    pub sets: usize,
    /// Distinct members of those sets, each counted once per set.
    pub members: usize,
    /// Mean and largest |ln(predicted / measured throughput)| over the members.
    pub mean_abs_ln_error: f64,
    pub max_abs_ln_error: f64,
    /// The member with the largest error: "workload in a+b (predicted, measured speed)".
    pub worst: String,
    /// Mean predicted speed and measured speed (throughput / exclusive throughput).
    pub mean_predicted: f64,
    pub mean_measured: f64,
    /// Mean low end and width (high - low) of the members' 80 % intervals, / exclusive.
    pub mean_low: f64,
    pub mean_width: f64,
    /// Share of members whose measured throughput lies inside their interval, below it.
    pub coverage: f64,
    pub below_low_end: f64,
    /// Members whose low end keeps the LS cap (a cautious cap check admits them), and of
    /// those the ones measured below it.
    pub admitted_on_low_end: usize,
    pub admitted_on_low_end_below_cap: usize,
    /// Those members, as `worst` names one.
    pub admitted_below_cap: Vec<String>,
    /// Members answered without an interval (their point read as the low end).
    pub without_interval: usize,
}

/// What the trace records at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct RetrainingTrace {
    /// Filled in by the caller: the seed of the run.
    pub seed: u64,
    /// Simulated hours since the first arrival (0 for the seeded model).
    pub at_h: f64,
    /// Retraining turns that trained so far (0: the seeded model).
    pub trainings: u64,
    /// The version this turn trained and whether it was promoted (`None`: the seeded model).
    pub trained_version: Option<u64>,
    pub promoted: Option<bool>,
    /// The model Place answers with now.
    pub serving_version: u64,
    pub serving_observations: usize,
    pub serving_excluded_outliers: u64,
    /// Runs the service formed and stored of its own placements so far, and of those the
    /// crowded ones (the seeded store has pairs alone).
    pub own_runs: u64,
    pub own_crowded_runs: u64,
    /// The serving model's seen bands (empty: none), its crowded set-level part.
    pub seen_bands: Vec<SeenBand>,
    pub set_linear: bool,
    pub groups: Vec<GroupTrace>,
}

/// The serving model's state and its answers on every set of `probe`. `own` holds the
/// sorted keys of the sets the service stored from its own placements.
pub async fn trace(
    advisor: &Advisor,
    gpu: &GpuName,
    probe: &Probe,
    own: &HashSet<Vec<u8>>,
) -> anyhow::Result<RetrainingTrace> {
    let serving = advisor.current_model(gpu)?;
    let mut groups: BTreeMap<(usize, Option<bool>), Tally> = BTreeMap::new();
    for set in &probe.sets {
        let answer = advisor
            .predict(PredictQuery {
                workloads: set.names.clone(),
                gpu: Some(gpu.clone()),
                gpu_memory_gb: None,
            })
            .await
            .map_err(|e| anyhow::anyhow!("Predict refused a measured set: {e}"))?;
        let own_run = (set.key.len() >= 3).then(|| own.contains(&set.key));
        let tally = groups.entry((set.key.len(), own_run)).or_default();
        tally.sets += 1;
        for ((name, &measured), &exclusive) in
            set.distinct_names().zip(&set.measured).zip(&set.exclusive)
        {
            let member = answer
                .members
                .iter()
                .find(|m| &m.workload == name)
                .expect("Predict answers every member");
            let predicted = member
                .predicted_throughput
                .expect("the default model predicts members");
            // Speeds as Place reads them: over the service's exclusive throughput.
            let served = member.exclusive_throughput;
            let label = format!(
                "{} in {} ({:.3}, {:.3})",
                name,
                set.names
                    .iter()
                    .map(WorkloadName::as_str)
                    .collect::<Vec<_>>()
                    .join("+"),
                predicted / served,
                measured
            );
            tally.add(
                Member {
                    predicted: predicted / served,
                    interval: member
                        .predicted_interval
                        .map(|(lo, hi)| (lo / served, hi / served)),
                    measured,
                    // The measured throughput over the same exclusive figure.
                    measured_read: measured * exclusive / served,
                },
                probe.cap,
                label,
            );
        }
    }
    Ok(RetrainingTrace {
        seed: 0,
        at_h: 0.0,
        trainings: 0,
        trained_version: None,
        promoted: None,
        serving_version: serving.version,
        serving_observations: serving.metrics.observations,
        serving_excluded_outliers: serving.excluded_outliers,
        own_runs: 0,
        own_crowded_runs: 0,
        seen_bands: seen_bands(&serving),
        set_linear: matches!(&serving.params, ModelParams::MemberRidgeGbt(m) if m.set_linear.is_some()),
        groups: groups
            .into_iter()
            .map(|((size, own_runs), tally)| tally.finish(size, own_runs))
            .collect(),
    })
}

impl ProbeSet {
    /// The names of the distinct members, in the order of `measured`.
    fn distinct_names(&self) -> impl Iterator<Item = &WorkloadName> {
        let mut seen = HashSet::new();
        self.key
            .iter()
            .zip(&self.names)
            .filter(move |(w, _)| seen.insert(**w))
            .map(|(_, name)| name)
    }
}

fn seen_bands(model: &StoredModel) -> Vec<SeenBand> {
    let ModelParams::MemberRidgeGbt(params) = &model.params else {
        return Vec::new();
    };
    let Some(seen) = &params.seen else {
        return Vec::new();
    };
    seen.intervals
        .bands
        .iter()
        .enumerate()
        .filter_map(|(i, band)| {
            band.as_ref().map(|band| SeenBand {
                size: i + 2,
                runs: band.runs,
                member_factors: band.member.map(|(lo, hi)| (lo.exp(), hi.exp())),
            })
        })
        .collect()
}

/// One member of a measured set as Predict answers it: speeds over the service's
/// exclusive throughput (what Place's caps read), `measured` over the truth's (what the
/// simulation runs it at; the two differ only for a profile the service holds suspect).
struct Member {
    predicted: f64,
    interval: Option<(f64, f64)>,
    measured: f64,
    measured_read: f64,
}

/// Sums over one group's members.
#[derive(Default)]
struct Tally {
    sets: usize,
    members: usize,
    error: f64,
    worst: (f64, String),
    predicted: f64,
    measured: f64,
    low: f64,
    width: f64,
    inside: usize,
    below: usize,
    admitted: usize,
    admitted_below_cap: Vec<String>,
    without_interval: usize,
}

impl Tally {
    /// One member, its LS admission read at `cap`.
    fn add(&mut self, member: Member, cap: f64, label: String) {
        let Member {
            predicted,
            interval,
            measured,
            measured_read,
        } = member;
        self.members += 1;
        let error = (predicted / measured_read).ln().abs();
        self.error += error;
        if error > self.worst.0 || self.worst.1.is_empty() {
            self.worst = (error, label.clone());
        }
        self.predicted += predicted;
        self.measured += measured_read;
        let (low, high) = interval.unwrap_or_else(|| {
            self.without_interval += 1;
            (predicted, predicted)
        });
        self.low += low;
        self.width += high - low;
        if measured_read < low {
            self.below += 1;
        } else if measured_read <= high {
            self.inside += 1;
        }
        if low >= cap {
            self.admitted += 1;
            if measured < cap {
                self.admitted_below_cap.push(label);
            }
        }
    }

    fn finish(self, size: usize, own_runs: Option<bool>) -> GroupTrace {
        let n = self.members.max(1) as f64;
        GroupTrace {
            size,
            own_runs,
            sets: self.sets,
            members: self.members,
            mean_abs_ln_error: self.error / n,
            max_abs_ln_error: self.worst.0,
            worst: self.worst.1,
            mean_predicted: self.predicted / n,
            mean_measured: self.measured / n,
            mean_low: self.low / n,
            mean_width: self.width / n,
            coverage: self.inside as f64 / n,
            below_low_end: self.below as f64 / n,
            admitted_on_low_end: self.admitted,
            admitted_on_low_end_below_cap: self.admitted_below_cap.len(),
            admitted_below_cap: self.admitted_below_cap,
            without_interval: self.without_interval,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sim::online::{LearningService, SeededStore};

    #[test]
    fn the_trace_reads_the_seeded_model_then_one_retrained_on_a_few_crowded_runs() {
        let truth = Truth::shared_data();
        let probe = Probe::new(&truth, 0.5).unwrap();
        let seed = SeededStore::build(Path::new("../shared/data/kace-v100")).unwrap();
        let mut service = LearningService::start(&seed).unwrap();
        let mut own = HashSet::new();

        // The seeded model (pairs alone): version 2, a seen band of two only; the truth's
        // 91 pairs, 400 sets of three and 1,107 of four (none run by the service yet).
        let seeded = service.trace(&probe, &own).unwrap();
        assert_eq!((seeded.serving_version, seeded.trainings), (2, 0));
        assert_eq!(seeded.trained_version, None);
        let sizes: Vec<usize> = seeded.seen_bands.iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![2]);
        let groups: Vec<(usize, Option<bool>, usize)> = seeded
            .groups
            .iter()
            .map(|g| (g.size, g.own_runs, g.sets))
            .collect();
        assert_eq!(
            groups,
            vec![(2, None, 91), (3, Some(false), 400), (4, Some(false), 1107)]
        );
        for g in &seeded.groups {
            assert!(g.members >= g.sets && g.members <= g.sets * g.size, "{g:?}");
            assert!(g.coverage + g.below_low_end <= 1.0, "{g:?}");
            assert!(g.mean_low < g.mean_predicted && g.mean_width > 0.0, "{g:?}");
            assert!(
                g.admitted_on_low_end_below_cap <= g.admitted_on_low_end,
                "{g:?}"
            );
        }

        // Twenty measured sets of three reported as runs: the service's default retrains
        // after 20 new runs, on 20 crowded runs (fewer than 110: no seen band at all, the
        // pairs' band of two lost with the rest; decision 032, run 4).
        let threes: Vec<Vec<u8>> = probe
            .sets
            .iter()
            .filter(|s| s.key.len() == 3)
            .take(20)
            .map(|s| s.key.clone())
            .collect();
        for (i, key) in threes.iter().enumerate() {
            let set = probe.sets.iter().find(|s| &s.key == key).unwrap();
            let members: Vec<(WorkloadName, f64)> = set
                .key
                .iter()
                .zip(&set.names)
                .map(|(w, name)| {
                    // `measured` holds the distinct members in order.
                    let j = set
                        .key
                        .iter()
                        .filter(|k| *k < w)
                        .collect::<HashSet<_>>()
                        .len();
                    (name.clone(), set.measured[j] * set.exclusive[j])
                })
                .collect();
            service.report(&members, 3600.0 * i as f64).unwrap();
            own.insert(key.clone());
        }
        assert_eq!(service.trainings, 1);
        let retrained = service.trace(&probe, &own).unwrap();
        assert_eq!(retrained.trainings, 1);
        assert_eq!(retrained.trained_version, Some(3));
        assert_eq!((retrained.own_runs, retrained.own_crowded_runs), (20, 20));
        let own_threes = retrained
            .groups
            .iter()
            .find(|g| g.size == 3 && g.own_runs == Some(true))
            .unwrap();
        assert_eq!(own_threes.sets, 20);
        if retrained.promoted == Some(true) {
            assert_eq!(retrained.serving_version, 3);
            // Trained on 20 crowded runs (1-109): only the seen band of two is kept
            // (decision 035, A), none of three or more.
            assert_eq!(
                retrained
                    .seen_bands
                    .iter()
                    .map(|b| b.size)
                    .collect::<Vec<_>>(),
                vec![2],
                "{:?}",
                retrained.seen_bands
            );
        } else {
            assert_eq!(retrained.serving_version, 2);
        }
    }
}

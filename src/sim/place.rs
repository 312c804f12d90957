//! The model policies' one path to a decision: Place. A policy asks "which of these GPUs
//! (each with its residents) for this job"; the answer is the GPU where the set's
//! predicted value gains most with the job (value with the job minus without; an empty
//! GPU gains the job's exclusive value), every capped member predicted at or above its
//! cap, the set within GPU memory, or none when no gain is positive (the job waits). As in
//! the advisor's Place, a member's prediction in a set is the lowest the model gives it in
//! any subset holding it (a co-runner never speeds a job up).
//!
//! [`Placer`] is the adapter: the simulation speaks to it only, so that the service's
//! `Place` RPC (the advisor's place) replaces [`ModelPlacer`] without touching the
//! policies or the engine. [`ModelPlacer`] answers with a fitted model in process, the same
//! rule Place applies.
//!
//! Training data: both model policies are fitted on the measured pairs of
//! `kace-v100/pairs.csv` only (all 181, as `coloc import kace` trains the service), never
//! on a 3-way or 4-way run. The simulation judges them on pairs too (the pair measurements
//! are also its truth for 2-job sets), but every 3- and 4-job set is unseen by the models.

use std::{collections::HashMap, time::Instant};

use coloc::model::{Features, ModelParams};

use super::{
    policy::{GpuView, JobView, Policy},
    truth::{SetKey, Workload, GPU_MEMORY_GB},
};

/// One GPU in a Place request: its residents (workload, cap).
#[derive(Debug, Clone)]
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
    fn place(&mut self, request: &PlaceRequest) -> Option<PlaceDecision>;
}

/// What a set is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Σ throughput in each workload's own units (KACE's objective).
    ThroughputSum,
    /// Σ colocated / exclusive throughput (fair across units; coloc's NORMALIZED_SUM).
    NormalizedSum,
}

#[derive(Debug, Clone)]
struct SetValue {
    value: f64,
    /// Each member's predicted share of its exclusive speed (sorted member order), for
    /// kinds that predict members.
    shares: Option<Vec<f64>>,
}

/// Place answered in process by a fitted model.
pub struct ModelPlacer {
    model: ModelParams,
    workloads: Vec<Workload>,
    objective: Objective,
    cache: HashMap<SetKey, SetValue>,
    pub calls: u64,
    pub nanos: u128,
}

impl ModelPlacer {
    pub fn new(model: ModelParams, workloads: Vec<Workload>, objective: Objective) -> Self {
        Self {
            model,
            workloads,
            objective,
            cache: HashMap::new(),
            calls: 0,
            nanos: 0,
        }
    }

    fn value(&mut self, set: SetKey) -> SetValue {
        if let Some(v) = self.cache.get(&set) {
            return v.clone();
        }
        let members = set.members();
        let exclusive: Vec<f64> = self
            .workloads
            .iter()
            .map(|w| w.exclusive_throughput)
            .collect();
        let excl = |m: u8| exclusive[m as usize];
        let v = match members.as_slice() {
            [] => SetValue {
                value: 0.0,
                shares: Some(Vec::new()),
            },
            [only] => SetValue {
                value: match self.objective {
                    Objective::ThroughputSum => excl(*only),
                    Objective::NormalizedSum => 1.0,
                },
                shares: Some(vec![1.0]),
            },
            _ => {
                let features: Vec<&Features> = members
                    .iter()
                    .map(|&m| &self.workloads[m as usize].features)
                    .collect();
                let prediction = self.model.predict_set(&features);
                match prediction.members {
                    None => SetValue {
                        value: prediction.sum,
                        shares: None,
                    },
                    Some(mut throughputs) => {
                        // Place's rule: a co-runner never speeds a job up, so a member
                        // keeps the lowest prediction of any subset holding it.
                        for j in 0..members.len() {
                            let mut without = members.clone();
                            without.remove(j);
                            let sub = self.value(SetKey::of(&without));
                            let sub = sub.shares.expect("the same model predicts members");
                            for (i, t) in throughputs.iter_mut().enumerate() {
                                if i != j {
                                    let at = if i < j { i } else { i - 1 };
                                    *t = t.min(sub[at] * excl(members[i]));
                                }
                            }
                        }
                        let shares: Vec<f64> = throughputs
                            .iter()
                            .zip(&members)
                            .map(|(t, &m)| t / excl(m))
                            .collect();
                        let value = match self.objective {
                            Objective::NormalizedSum => shares.iter().sum(),
                            Objective::ThroughputSum => throughputs.iter().sum(),
                        };
                        SetValue {
                            value,
                            shares: Some(shares),
                        }
                    }
                }
            }
        };
        self.cache.insert(set, v.clone());
        v
    }
}

impl Placer for ModelPlacer {
    fn place(&mut self, request: &PlaceRequest) -> Option<PlaceDecision> {
        let started = Instant::now();
        let mut best: Option<PlaceDecision> = None;
        for (i, gpu) in request.gpus.iter().enumerate() {
            let residents: Vec<u8> = gpu.residents.iter().map(|r| r.0).collect();
            let without = SetKey::of(&residents);
            let with = without.with(request.job);
            let memory: f64 = with
                .members()
                .iter()
                .map(|&m| self.workloads[m as usize].memory_gb)
                .sum();
            if memory > GPU_MEMORY_GB {
                continue;
            }
            let after = self.value(with);
            if let Some(shares) = &after.shares {
                let members = with.members();
                let caps_hold = gpu
                    .residents
                    .iter()
                    .copied()
                    .chain([(request.job, request.job_cap)])
                    .all(|(w, cap)| {
                        cap.is_none_or(|cap| {
                            let at = members.iter().position(|&m| m == w).expect("a member");
                            shares[at] >= cap
                        })
                    });
                if !caps_hold {
                    continue;
                }
            }
            let gain = after.value - self.value(without).value;
            if gain > 0.0 && best.is_none_or(|b| gain > b.gain) {
                best = Some(PlaceDecision { gpu: i, gain });
            }
        }
        self.calls += 1;
        self.nanos += started.elapsed().as_nanos();
        best
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
        self.placer.place(&request).map(|d| d.gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coloc::model::KaceLinear;

    fn workload(memory_gb: f64) -> Workload {
        let mut features = Features::default();
        features.0[6] = 10.0; // exclusive throughput
        features.0[9] = memory_gb;
        Workload {
            name: "w".into(),
            exclusive_throughput: 10.0,
            memory_gb,
            inference: true,
            batch_size: 2,
            features,
        }
    }

    /// A linear model whose set sum is `factor` x the members' summed exclusive throughput.
    fn placer(factor: f64) -> ModelPlacer {
        let mut coefficients = vec![0.0; 10];
        coefficients[6] = factor;
        ModelPlacer::new(
            ModelParams::KaceLinear(KaceLinear {
                intercept: 0.0,
                coefficients,
            }),
            vec![workload(1.0), workload(31.5)],
            Objective::ThroughputSum,
        )
    }

    fn gpu(residents: &[u8]) -> PlaceGpu {
        PlaceGpu {
            residents: residents.iter().map(|&w| (w, None)).collect(),
        }
    }

    fn request(gpus: Vec<PlaceGpu>) -> PlaceRequest {
        PlaceRequest {
            job: 0,
            job_cap: None,
            gpus,
        }
    }

    #[test]
    fn place_picks_the_largest_gain_and_an_empty_gpu_gains_the_job_alone() {
        let mut p = placer(0.8);
        // Beside a resident: 0.8 x 20 - 10 = 6; alone: 10.
        let both = request(vec![gpu(&[0]), gpu(&[])]);
        assert_eq!(
            p.place(&both),
            Some(PlaceDecision { gpu: 1, gain: 10.0 })
        );
        let shared = request(vec![gpu(&[0]), gpu(&[0])]);
        let decision = p.place(&shared).unwrap();
        assert_eq!(decision.gpu, 0);
        assert!((decision.gain - 6.0).abs() < 1e-12);
        assert_eq!(p.calls, 2);
    }

    #[test]
    fn place_leaves_out_sets_over_memory_and_waits_without_a_positive_gain() {
        // 1 + 31.5 GB does not fit 32 GB.
        assert_eq!(placer(0.8).place(&request(vec![gpu(&[1])])), None);
        // 0.4 x 20 - 10 < 0: the pair is worth less than the resident alone.
        assert_eq!(placer(0.4).place(&request(vec![gpu(&[0])])), None);
    }

    #[test]
    fn a_members_prediction_never_rises_when_a_co_runner_joins() {
        let data = std::path::Path::new("../shared/data");
        let truth = crate::sim::truth::Truth::read(
            &data.join("kace-v100"),
            &data.join("kace-3way/runs.csv"),
            &data.join("kace-4way/runs.csv"),
        )
        .unwrap();
        let rows = crate::sim::pair_rows(&data.join("kace-v100")).unwrap();
        let (model, _) = coloc::model::fit(coloc::model::ModelKind::DEFAULT, &rows).unwrap();
        let mut p = ModelPlacer::new(model, truth.workloads.clone(), Objective::NormalizedSum);
        let n = truth.workloads.len() as u8;
        let mut checked = 0;
        for a in 0..n {
            for b in a..n {
                for c in b..n {
                    let set = SetKey::of(&[a, b, c]);
                    let shares = p.value(set).shares.unwrap();
                    let members = set.members();
                    for j in 0..3 {
                        let mut pair = members.clone();
                        pair.remove(j);
                        let sub = p.value(SetKey::of(&pair)).shares.unwrap();
                        for (i, share) in shares.iter().enumerate().filter(|(i, _)| *i != j) {
                            let at = if i < j { i } else { i - 1 };
                            assert!(*share <= sub[at], "{members:?} member {i}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 560 * 6);
    }
}

//! The simulation's only truth: the measured KACE colocations (pairs, 3-way and 4-way runs
//! on one V100 32 GB under MPS) and each workload's exclusive throughput, turned into each
//! member's speed (colocated / exclusive throughput) per measured set.
//!
//! No invented truth: a set that was measured runs at its measured speeds. A set that was
//! never measured can only arise when departures shrink a measured one; its members then
//! run at the conservative bound "at least as fast as in any measured superset" (the
//! largest speed the member's workload had in a measured superset), and the engine counts
//! the time spent there.
//!
//! With `--split-runs` the truth keeps the pairs and one fixed half of the 3- and 4-way
//! sets ([`in_training_half`] picks the other), and hands the other half over as the model
//! policies' extra training data: no model is judged on a run it trained on.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Mutex,
};

use anyhow::{bail, Context};

use coloc::{advisor::RunSummary, dataset::KaceDataset};

/// GPU memory of the simulated GPUs (the V100 the truth was measured on).
pub const GPU_MEMORY_GB: f64 = 32.0;

/// The seed of the fixed split of the 3- and 4-way runs (`coloc simulate --split-runs`).
pub const SPLIT_SEED: u64 = 0x7370_6c69_7421;

/// A measured run by name: its members and their colocated throughputs, in the same order.
pub type NamedRun = (Vec<String>, Vec<f64>);

/// Whether a measured set falls in the training half of the fixed split: SplitMix64 over
/// its sorted member names (so both copies of a set measured twice fall alike).
pub fn in_training_half(members: &[String]) -> bool {
    let mut sorted: Vec<&str> = members.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    draw(SPLIT_SEED, &sorted.join(",")) & 1 == 0
}

/// The corrected exclusive throughput of each suspect profile among `runs`, by the
/// service's rule ([`RunSummary::of`] against the profiles' recorded figures).
fn suspect_exclusives<'a>(
    dataset: &'a KaceDataset,
    runs: impl Iterator<Item = &'a NamedRun>,
) -> HashMap<String, f64> {
    let runs: Vec<Vec<(String, f64)>> = runs
        .map(|(names, t)| names.iter().cloned().zip(t.iter().copied()).collect())
        .collect();
    RunSummary::of(runs.iter().map(Vec::as_slice), |name| {
        recorded_exclusive(dataset, name)
    })
    .suspects
    .into_iter()
    .map(|s| (s.workload, s.corrected_exclusive))
    .collect()
}

/// The profile's exclusive throughput of the workload `name` in `dataset`.
fn recorded_exclusive(dataset: &KaceDataset, name: &str) -> Option<f64> {
    dataset
        .workloads
        .iter()
        .find(|w| w.name.as_str() == name)
        .map(|w| w.system.exclusive_throughput)
}

/// SplitMix64 over (seed, name): a stable draw that no library version can change.
pub(super) fn draw(seed: u64, name: &str) -> u64 {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    for b in name.bytes() {
        x = (x ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
    }
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Members a set key can hold (5 bits each in a u64).
pub const MAX_SET: usize = 12;

/// A colocated set as a multiset of workload indices (sorted, 5 bits per member, lowest
/// first), usable as a map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetKey(u64);

impl SetKey {
    pub const EMPTY: SetKey = SetKey(0);

    pub fn of(members: &[u8]) -> Self {
        assert!(
            members.len() <= MAX_SET,
            "a set of {} members",
            members.len()
        );
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        let mut key = 0u64;
        for (i, m) in sorted.iter().enumerate() {
            key |= (u64::from(*m) + 1) << (5 * i);
        }
        SetKey(key)
    }

    /// The members, sorted.
    pub fn members(self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut k = self.0;
        while k != 0 {
            out.push((k & 31) as u8 - 1);
            k >>= 5;
        }
        out
    }

    pub fn len(self) -> usize {
        self.members().len()
    }

    pub fn with(self, member: u8) -> Self {
        let mut m = self.members();
        m.push(member);
        Self::of(&m)
    }

    fn counts(self) -> [u8; 32] {
        let mut c = [0u8; 32];
        for m in self.members() {
            c[m as usize] += 1;
        }
        c
    }

    /// True when `self` holds every member of `other` (as multisets).
    pub fn contains(self, other: SetKey) -> bool {
        let (a, b) = (self.counts(), other.counts());
        a.iter().zip(&b).all(|(x, y)| x >= y)
    }
}

/// One workload the simulation may assign.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub exclusive_throughput: f64,
    pub memory_gb: f64,
    pub inference: bool,
    pub batch_size: u32,
}

/// Member speeds of a set, and whether they come from the conservative bound.
#[derive(Debug, Clone, PartialEq)]
pub struct SetSpeeds {
    /// Speed (colocated / exclusive throughput) per distinct workload of the set, by
    /// workload index.
    pub by_workload: BTreeMap<u8, f64>,
    pub bound: bool,
}

impl SetSpeeds {
    pub fn of(&self, workload: u8) -> f64 {
        self.by_workload[&workload]
    }
}

#[derive(Debug)]
pub struct Truth {
    pub workloads: Vec<Workload>,
    /// Measured sets of two or more: each distinct member's speed (members of the same
    /// workload in one set averaged).
    measured: HashMap<SetKey, BTreeMap<u8, f64>>,
    pub gpu_memory_gb: f64,
    /// Bounds already worked out (each is a scan over every measured set).
    bounds: Mutex<HashMap<SetKey, Option<BTreeMap<u8, f64>>>>,
}

/// What the truth says a placement would make of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The new set was measured (or is a job alone).
    Measured,
    /// The new set needs more memory than the GPU has: the job would fail (out of memory).
    OverMemory,
    /// The new set fits but was never measured: no policy may create it.
    Unmeasured,
}

impl Truth {
    /// The KACE truth from `../shared/data`, where the tests read it.
    #[cfg(test)]
    pub fn shared_data() -> Self {
        Self::shared_data_read(false, false).0
    }

    /// [`Self::read_split`] on `../shared/data`, with `split` and `corrected`.
    #[cfg(test)]
    pub fn shared_data_read(split: bool, corrected: bool) -> (Self, Vec<NamedRun>) {
        let data = Path::new("../shared/data");
        Self::read_split(
            &data.join("kace-v100"),
            &data.join("kace-3way/runs.csv"),
            &data.join("kace-4way/runs.csv"),
            split,
            corrected,
        )
        .expect("the shared KACE data")
    }

    /// Builds the truth from explicit measurements (hand-made tests use this): `runs` are
    /// (members by workload index, each member's colocated throughput in the same order).
    pub fn new(workloads: Vec<Workload>, runs: &[(Vec<u8>, Vec<f64>)]) -> anyhow::Result<Self> {
        let mut sums: HashMap<SetKey, BTreeMap<u8, (f64, u32)>> = HashMap::new();
        for (members, throughputs) in runs {
            if members.len() < 2 || members.len() != throughputs.len() {
                bail!("a measured run needs two or more members, each with a throughput");
            }
            let entry = sums.entry(SetKey::of(members)).or_default();
            for (&m, &t) in members.iter().zip(throughputs) {
                let w = workloads
                    .get(m as usize)
                    .with_context(|| format!("no workload {m}"))?;
                let e = entry.entry(m).or_insert((0.0, 0));
                e.0 += t / w.exclusive_throughput;
                e.1 += 1;
            }
        }
        let measured = sums
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    v.into_iter()
                        .map(|(m, (s, n))| (m, s / f64::from(n)))
                        .collect(),
                )
            })
            .collect();
        Ok(Self {
            workloads,
            measured,
            gpu_memory_gb: GPU_MEMORY_GB,
            bounds: Mutex::default(),
        })
    }

    /// Reads the KACE measurements: the workloads are the ones that appear in the 3-way or
    /// 4-way runs (their pairs, 3-sets and 4-sets were all measured on the same testbed);
    /// pairs of other workloads are left out. With `split`, the 3- and 4-way runs of the
    /// training half ([`in_training_half`]) are left out of the truth and returned (members
    /// by name, their colocated throughputs), for the model policies to train on.
    /// With `corrected`, a workload whose runs contradict its recorded exclusive throughput
    /// (a suspect profile by the service's own rule, [`RunSummary`], judged on every run
    /// read, both halves) runs alone at the service's corrected figure instead, so that no
    /// set runs it faster than alone beyond noise in more than two runs.
    pub fn read_split(
        kace_v100: &Path,
        three_way: &Path,
        four_way: &Path,
        split: bool,
        corrected: bool,
    ) -> anyhow::Result<(Self, Vec<NamedRun>)> {
        let dataset = KaceDataset::read(kace_v100)
            .with_context(|| format!("cannot read {}", kace_v100.display()))?;
        let mut runs_by_name: Vec<NamedRun> = Vec::new();
        for (path, n) in [(three_way, 3), (four_way, 4)] {
            let mut reader = csv::Reader::from_path(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let headers = reader.headers()?.clone();
            let col = |name: &str| {
                headers
                    .iter()
                    .position(|h| h == name)
                    .with_context(|| format!("{} has no column {name}", path.display()))
            };
            let names: Vec<usize> = (1..=n)
                .map(|i| col(&format!("workload{i}")))
                .collect::<anyhow::Result<_>>()?;
            let tputs: Vec<usize> = (1..=n)
                .map(|i| col(&format!("w{i}throughput")))
                .collect::<anyhow::Result<_>>()?;
            for record in reader.records() {
                let record = record?;
                let members = names.iter().map(|&c| record[c].to_string()).collect();
                let throughputs = tputs
                    .iter()
                    .map(|&c| record[c].parse::<f64>().context("a throughput"))
                    .collect::<anyhow::Result<_>>()?;
                runs_by_name.push((members, throughputs));
            }
        }
        let pool: std::collections::BTreeSet<String> =
            runs_by_name.iter().flat_map(|r| r.0.clone()).collect();
        let pairs = dataset
            .pairs
            .iter()
            .filter(|p| pool.contains(&p.workload1) && pool.contains(&p.workload2));
        let pair_runs: Vec<NamedRun> = pairs
            .map(|p| {
                (
                    vec![p.workload1.clone(), p.workload2.clone()],
                    vec![p.throughput1, p.throughput2],
                )
            })
            .collect();
        let suspects = if corrected {
            suspect_exclusives(&dataset, runs_by_name.iter().chain(&pair_runs))
        } else {
            HashMap::new()
        };
        let training: Vec<NamedRun> = if split {
            let (training, judged) = runs_by_name
                .into_iter()
                .partition(|(members, _)| in_training_half(members));
            runs_by_name = judged;
            training
        } else {
            Vec::new()
        };
        runs_by_name.extend(pair_runs);
        let mut workloads = Vec::new();
        for name in &pool {
            let w = dataset
                .workloads
                .iter()
                .find(|w| w.name.as_str() == name)
                .with_context(|| format!("{name} has no profile in {}", kace_v100.display()))?;
            workloads.push(Workload {
                name: name.clone(),
                exclusive_throughput: suspects
                    .get(name.as_str())
                    .copied()
                    .unwrap_or(w.system.exclusive_throughput),
                memory_gb: w.system.memory_gb,
                inference: matches!(w.mode, coloc::domain::WorkloadMode::Inference),
                batch_size: w.batch_size,
            });
        }
        let index: HashMap<&str, u8> = workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.as_str(), i as u8))
            .collect();
        let runs: Vec<(Vec<u8>, Vec<f64>)> = runs_by_name
            .iter()
            .map(|(names, t)| (names.iter().map(|n| index[n.as_str()]).collect(), t.clone()))
            .collect();
        Ok((Self::new(workloads, &runs)?, training))
    }

    /// The workloads that run alone in this truth at another figure than their recorded
    /// exclusive throughput (a corrected truth's suspect profiles): (name, recorded,
    /// truth's).
    pub fn corrected_workloads(&self, dataset: &KaceDataset) -> Vec<(String, f64, f64)> {
        self.workloads
            .iter()
            .filter_map(|w| {
                let recorded = recorded_exclusive(dataset, &w.name)?;
                (recorded != w.exclusive_throughput)
                    .then(|| (w.name.clone(), recorded, w.exclusive_throughput))
            })
            .collect()
    }

    /// The report's setup entry: the truth's `mode` (`--truth-exclusive`) and its
    /// [`Self::corrected_workloads`].
    pub fn exclusive_json(&self, dataset: &KaceDataset, mode: &str) -> serde_json::Value {
        let corrected = self.corrected_workloads(dataset).into_iter().map(|(w, recorded, truth)| {
            serde_json::json!({"workload": w, "recorded": recorded, "truth": truth})
        });
        serde_json::json!({"mode": mode, "corrected": corrected.collect::<Vec<_>>()})
    }

    pub fn measured_sets(&self) -> usize {
        self.measured.len()
    }

    /// Every measured set of two or more, with each distinct member's speed.
    pub fn measured_iter(&self) -> impl Iterator<Item = (SetKey, &BTreeMap<u8, f64>)> {
        self.measured.iter().map(|(k, v)| (*k, v))
    }

    pub fn memory_gb(&self, set: SetKey) -> f64 {
        set.members()
            .iter()
            .map(|&m| self.workloads[m as usize].memory_gb)
            .sum()
    }

    pub fn is_measured(&self, set: SetKey) -> bool {
        set.len() <= 1 || self.measured.contains_key(&set)
    }

    /// Whether a placement that makes `set` is allowed, and what it does.
    pub fn admission(&self, set: SetKey) -> Admission {
        if self.memory_gb(set) > self.gpu_memory_gb {
            Admission::OverMemory
        } else if self.is_measured(set) {
            Admission::Measured
        } else {
            Admission::Unmeasured
        }
    }

    /// The measured speeds of a measured set (a job alone runs at 1).
    pub fn measured(&self, set: SetKey) -> Option<BTreeMap<u8, f64>> {
        match set.members().as_slice() {
            [] => Some(BTreeMap::new()),
            [only] => Some(BTreeMap::from([(*only, 1.0)])),
            _ => self.measured.get(&set).cloned(),
        }
    }

    /// Speeds of any set that fits memory: measured, or the conservative bound (each
    /// member at the largest speed its workload had in a measured superset). `None` when
    /// neither exists (a set no departure from a measured set can leave).
    pub fn speeds(&self, set: SetKey) -> Option<SetSpeeds> {
        if let Some(by_workload) = self.measured(set) {
            return Some(SetSpeeds {
                by_workload,
                bound: false,
            });
        }
        let bound = self
            .bounds
            .lock()
            .expect("the bound cache is never poisoned")
            .entry(set)
            .or_insert_with(|| self.bound(set))
            .clone()?;
        Some(SetSpeeds {
            by_workload: bound,
            bound: true,
        })
    }

    fn bound(&self, set: SetKey) -> Option<BTreeMap<u8, f64>> {
        let mut best: BTreeMap<u8, f64> = BTreeMap::new();
        for (superset, speeds) in &self.measured {
            if superset.contains(set) {
                for (w, s) in speeds {
                    if set.members().contains(w) {
                        let e = best.entry(*w).or_insert(0.0);
                        *e = e.max(*s);
                    }
                }
            }
        }
        (!best.is_empty()).then_some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn workload(name: &str, memory_gb: f64) -> Workload {
        Workload {
            name: name.into(),
            exclusive_throughput: 10.0,
            memory_gb,
            inference: true,
            batch_size: 2,
        }
    }

    #[test]
    fn set_keys_are_multisets() {
        assert_eq!(SetKey::of(&[2, 0, 2]), SetKey::of(&[0, 2, 2]));
        assert_eq!(SetKey::of(&[2, 0, 2]).members(), vec![0, 2, 2]);
        assert!(SetKey::of(&[0, 2, 2]).contains(SetKey::of(&[2, 2])));
        assert!(!SetKey::of(&[0, 2]).contains(SetKey::of(&[2, 2])));
        assert_eq!(SetKey::EMPTY.with(3), SetKey::of(&[3]));
    }

    #[test]
    fn an_unmeasured_set_runs_at_the_best_speed_of_a_measured_superset() {
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0), workload("c", 1.0)],
            &[
                (vec![0, 1, 2], vec![3.0, 4.0, 5.0]),
                (vec![0, 1, 1, 2], vec![2.0, 6.0, 2.0, 1.0]),
            ],
        )
        .unwrap();
        assert_eq!(truth.admission(SetKey::of(&[0, 1])), Admission::Unmeasured);
        let speeds = truth.speeds(SetKey::of(&[0, 1])).unwrap();
        assert!(speeds.bound);
        // a: max(0.3, 0.2); b: max(0.4, mean(0.6, 0.2) = 0.4).
        assert_eq!(speeds.of(0), 0.3);
        assert_eq!(speeds.of(1), 0.4);
        assert!(truth.speeds(SetKey::of(&[0, 0])).is_none());
        let measured = truth.speeds(SetKey::of(&[2, 1, 0])).unwrap();
        assert!(!measured.bound);
        assert_eq!(measured.of(2), 0.5);
    }

    #[test]
    fn a_set_over_gpu_memory_is_an_out_of_memory_placement() {
        let truth = Truth::new(vec![workload("big", 20.0)], &[]).unwrap();
        assert_eq!(truth.admission(SetKey::of(&[0])), Admission::Measured);
        assert_eq!(truth.admission(SetKey::of(&[0, 0])), Admission::OverMemory);
    }

    #[test]
    fn the_kace_truth_holds_the_fourteen_workloads_and_every_measured_set() {
        let truth = Truth::shared_data();
        assert_eq!(truth.workloads.len(), 14);
        // 91 measured pairs among them, 400 3-sets, 1 107 4-sets, none repeated.
        assert_eq!(truth.measured_sets(), 91 + 400 + 1107);
    }

    #[test]
    fn the_split_keeps_every_pair_and_judges_on_the_half_it_does_not_train_on() {
        let read = |split| Truth::shared_data_read(split, false);
        let (whole, none) = read(false);
        assert!(none.is_empty());
        let (judged, training) = read(true);
        let names = |t: &Truth| {
            t.workloads
                .iter()
                .map(|w| w.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&judged), names(&whole));
        let index = |name: &String| {
            whole
                .workloads
                .iter()
                .position(|w| &w.name == name)
                .unwrap() as u8
        };
        let training_keys: Vec<SetKey> = training
            .iter()
            .map(|(members, throughputs)| {
                assert!(members.len() >= 3 && members.len() == throughputs.len());
                assert!(in_training_half(members));
                SetKey::of(&members.iter().map(index).collect::<Vec<_>>())
            })
            .collect();
        // The training half is measured in the whole truth and never in the judged one.
        for key in &training_keys {
            assert!(whole.is_measured(*key) && !judged.is_measured(*key));
        }
        // Every set is in exactly one half: the judged truth holds the rest, pairs included.
        assert_eq!(
            judged.measured_sets() + training_keys.len(),
            whole.measured_sets()
        );
        for key in whole.measured.keys() {
            let in_training = training_keys.contains(key);
            assert_eq!(judged.is_measured(*key), !in_training, "{key:?}");
            if key.len() == 2 {
                assert!(!in_training);
            }
        }
        // About half of the 1 507 crowded sets each way.
        assert!(
            (650..=860).contains(&training_keys.len()),
            "{}",
            training_keys.len()
        );
    }

    /// Per workload, the measured sets whose mean speed for it is above 1 + the noise
    /// margin (faster than alone beyond noise).
    fn faster_than_alone(truth: &Truth) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for speeds in truth.measured.values() {
            for (&w, &speed) in speeds {
                if speed > 1.0 + coloc::advisor::EXCLUSIVE_NOISE_MARGIN {
                    *out.entry(truth.workloads[w as usize].name.clone())
                        .or_insert(0) += 1;
                }
            }
        }
        out
    }

    #[test]
    fn the_corrected_truth_runs_no_workload_faster_than_alone_in_more_than_two_sets() {
        let read = |corrected| Truth::shared_data_read(false, corrected).0;
        let (recorded, corrected) = (read(false), read(true));
        // The two workloads docs/api.md names as suspect profiles run faster than alone in
        // many sets of the recorded truth.
        let before = faster_than_alone(&recorded);
        for name in [
            "wav2vec2-base-960h_batch2-inf",
            "whisper-large-v2_batch2-inf",
        ] {
            assert!(
                before.get(name).copied().unwrap_or(0) > 2,
                "{name}: {before:?}"
            );
        }
        // A set's speed is a mean of its runs, so a set above the margin has a run above
        // it, and the corrected figure leaves at most two runs of a workload there.
        let after = faster_than_alone(&corrected);
        assert!(after.values().all(|&n| n <= 2), "{after:?}");
        let dataset = KaceDataset::read(Path::new("../shared/data/kace-v100")).unwrap();
        let changed = corrected.corrected_workloads(&dataset);
        assert!(!changed.is_empty());
        for (name, recorded_figure, truth_figure) in &changed {
            assert!(truth_figure > recorded_figure, "{name}");
        }
        assert!(recorded.corrected_workloads(&dataset).is_empty());
        // The sets are the same; only speeds alone moved.
        assert_eq!(recorded.measured_sets(), corrected.measured_sets());
    }
}

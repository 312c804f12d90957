//! The in-memory view of every profile, per GPU model, that Rank and Predict are served
//! from: no database query on their path.
//!
//! Each GPU model's profiles sit behind their own `Arc`: a reader clones the `Arc` under a
//! short read lock and scores without any lock; a writer changes the table in place
//! (`Arc::make_mut`), copying it only if a reader is scoring with it at that moment.
//!
//! Each entry also carries its [`ProfileCode`] under the GPU model's serving model, so Rank
//! scores a candidate from numbers prepared when the profile or the model arrived.

use std::{
    borrow::Borrow,
    collections::HashMap,
    hash::Hash,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use foldhash::{HashMap as FastMap, HashSet as FastSet};

use super::runs::RunSummary;
use crate::{
    domain::{GpuName, Profile, WorkloadName},
    model::{Features, ProfileCode},
    store::StoredModel,
};

/// One workload's profile on one GPU model, ready to score.
#[derive(Debug, Clone)]
pub struct ProfileEntry {
    pub name: WorkloadName,
    pub features: Features,
    /// Shared by every answer that names it.
    pub throughput_unit: Arc<str>,
    /// Its code under the table's scoring model, when that model has a pair scorer.
    pub code: Option<ProfileCode>,
    /// The exclusive throughput the answers use in place of the profile's, while stored
    /// runs show the profile's figure too low (a suspect profile, `advisor::suspect`).
    pub corrected_exclusive: Option<f64>,
    /// Profiled by NVML alone (Nsight Compute unavailable or forbidden): its kernel metrics
    /// are zeros, and any set it is in is answered by the serving model's NVML-only twin
    /// ([`crate::model::ModelParams::at_level`]), or refused where the model has none.
    pub nvml_only: bool,
}

impl ProfileEntry {
    /// The exclusive throughput every prediction is bounded by and normalized with: the
    /// profile's, or its correction while the profile is suspect.
    pub fn exclusive(&self) -> f64 {
        self.corrected_exclusive
            .unwrap_or_else(|| self.features.exclusive_throughput())
    }
}

/// The features of a profile's entry: NVML-only where the profile lacks kernel metrics
/// (whatever it holds in their place).
fn entry_features(profile: &Profile) -> Features {
    let features = Features::of(profile);
    if profile.kernel_missing {
        features.nvml_only()
    } else {
        features
    }
}

/// The profiles of one GPU model, in a dense vector for fast scans plus a name index.
#[derive(Debug, Clone, Default)]
pub struct GpuProfiles {
    pub memory_gb: Option<f64>,
    entries: Vec<ProfileEntry>,
    /// Rank looks up every named candidate here: foldhash (seeded at random per process),
    /// several times faster than the default SipHash on short names.
    index: FastMap<WorkloadName, usize>,
    /// Workloads profiled here without kernel metrics (their entries are `nvml_only`).
    kernel_missing: FastSet<WorkloadName>,
    /// The model the entries' codes were computed under.
    scoring: Option<Arc<StoredModel>>,
    /// Changes with every change of the entries (positions, profiles, codes): what Place's
    /// set predictions, kept across requests by table position, are valid for.
    generation: u64,
    /// What the stored runs of this GPU model say (evidence, suspect profiles).
    runs: Arc<RunSummary>,
}

/// Generations are unique across every table of the process (a copy made by
/// `Arc::make_mut` gets a new one as soon as it is changed).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl GpuProfiles {
    pub fn get(&self, name: &WorkloadName) -> Option<&ProfileEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// Where `name`'s entry sits in [`GpuProfiles::entries`].
    pub fn position<Q>(&self, name: &Q) -> Option<usize>
    where
        WorkloadName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.get(name).copied()
    }

    /// What the stored runs of this GPU model say.
    pub fn runs(&self) -> &RunSummary {
        &self.runs
    }

    pub fn entries(&self) -> &[ProfileEntry] {
        &self.entries
    }

    pub fn lacks_kernel_metrics<Q>(&self, name: &Q) -> bool
    where
        WorkloadName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.kernel_missing.contains(name)
    }

    /// Identifies the entries as they are now (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) {
        self.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    }

    /// The version of the model the entries' codes belong to.
    pub fn scoring_version(&self) -> Option<u64> {
        self.scoring.as_ref().map(|m| m.version)
    }

    fn code(&self, features: &Features) -> Option<ProfileCode> {
        let scorer = self.scoring.as_ref()?.params.pair_scorer()?;
        Some(scorer.code(features))
    }

    fn upsert(&mut self, mut entry: ProfileEntry) {
        self.changed();
        entry.code = self.code(&entry.features);
        // A new profile ends a suspicion raised against the old one.
        entry.corrected_exclusive = self
            .runs
            .suspect(entry.name.as_str())
            .filter(|s| s.profile_exclusive == entry.features.exclusive_throughput())
            .map(|s| s.corrected_exclusive);
        match self.index.get(&entry.name) {
            Some(&i) => self.entries[i] = entry,
            None => {
                self.index.insert(entry.name.clone(), self.entries.len());
                self.entries.push(entry);
            }
        }
    }

    fn remove(&mut self, name: &WorkloadName) {
        self.changed();
        self.kernel_missing.remove(name);
        if let Some(i) = self.index.remove(name) {
            self.entries.swap_remove(i);
            if let Some(moved) = self.entries.get(i) {
                self.index.insert(moved.name.clone(), i);
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct Catalog {
    workloads: FastSet<WorkloadName>,
    gpus: HashMap<GpuName, Arc<GpuProfiles>>,
}

impl Catalog {
    pub fn contains<Q>(&self, name: &Q) -> bool
    where
        WorkloadName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.workloads.contains(name)
    }

    pub fn gpu(&self, gpu: &GpuName) -> Option<Arc<GpuProfiles>> {
        self.gpus.get(gpu).cloned()
    }

    pub fn gpu_names(&self) -> impl Iterator<Item = &GpuName> {
        self.gpus.keys()
    }

    /// Makes `model` the one the GPU model's entries are coded under: every entry's code is
    /// computed again (a few microseconds each, on all cores).
    pub fn set_scoring_model(&mut self, model: Arc<StoredModel>) {
        let table = Arc::make_mut(self.gpus.entry(model.gpu.clone()).or_default());
        table.changed();
        table.scoring = Some(model);
        let scorer = table.scoring.as_ref().and_then(|m| m.params.pair_scorer());
        use rayon::prelude::*;
        table
            .entries
            .par_iter_mut()
            .for_each(|entry| entry.code = scorer.map(|s| s.code(&entry.features)));
    }

    /// Keeps what the stored runs of `gpu` say, and bounds and normalizes each suspect
    /// profile's predictions by its corrected exclusive throughput (`advisor::runs`).
    pub fn set_runs(&mut self, gpu: &GpuName, runs: RunSummary) {
        let table = Arc::make_mut(self.gpus.entry(gpu.clone()).or_default());
        table.changed();
        for entry in &mut table.entries {
            entry.corrected_exclusive = runs
                .suspect(entry.name.as_str())
                .filter(|s| s.profile_exclusive == entry.features.exclusive_throughput())
                .map(|s| s.corrected_exclusive);
        }
        table.runs = Arc::new(runs);
    }

    pub fn set_gpu_memory(&mut self, gpu: &GpuName, memory_gb: Option<f64>) {
        let table = Arc::make_mut(self.gpus.entry(gpu.clone()).or_default());
        if memory_gb.is_some() {
            table.memory_gb = memory_gb;
        }
    }

    /// Makes the catalog hold exactly these profiles for the workload.
    pub fn put_workload(&mut self, name: &WorkloadName, profiles: &[Profile]) {
        self.workloads.insert(name.clone());
        let profiled_on: FastSet<&GpuName> = profiles.iter().map(|p| &p.gpu).collect();
        for (gpu, table) in self.gpus.iter_mut() {
            let known = table.get(name).is_some() || table.lacks_kernel_metrics(name);
            if !profiled_on.contains(gpu) && known {
                Arc::make_mut(table).remove(name);
            }
        }
        for profile in profiles {
            self.set_gpu_memory(&profile.gpu, profile.gpu_memory_gb);
            let table = Arc::make_mut(self.gpus.get_mut(&profile.gpu).expect("inserted above"));
            if profile.kernel_missing {
                table.kernel_missing.insert(name.clone());
            } else {
                table.kernel_missing.remove(name);
            }
            table.upsert(ProfileEntry {
                name: name.clone(),
                features: entry_features(profile),
                throughput_unit: profile.system.throughput_unit.as_str().into(),
                code: None,
                corrected_exclusive: None,
                nvml_only: profile.kernel_missing,
            });
        }
    }

    /// Whether the catalog holds exactly these profiles for the workload (as
    /// [`Catalog::put_workload`] would leave it).
    pub fn holds(&self, name: &WorkloadName, profiles: &[Profile]) -> bool {
        if !self.workloads.contains(name) {
            return false;
        }
        let profiled_on: FastSet<&GpuName> = profiles.iter().map(|p| &p.gpu).collect();
        let stray = self.gpus.iter().any(|(gpu, table)| {
            !profiled_on.contains(gpu)
                && (table.get(name).is_some() || table.lacks_kernel_metrics(name))
        });
        !stray
            && profiles.iter().all(|profile| {
                let Some(table) = self.gpus.get(&profile.gpu) else {
                    return false;
                };
                if profile.gpu_memory_gb.is_some() && table.memory_gb != profile.gpu_memory_gb {
                    return false;
                }
                if profile.kernel_missing != table.lacks_kernel_metrics(name) {
                    return false;
                }
                table.get(name).is_some_and(|entry| {
                    entry.features == entry_features(profile)
                        && &*entry.throughput_unit == profile.system.throughput_unit.as_str()
                })
            })
    }

    /// Makes the catalog hold exactly the stored workloads and profiles: what changed is
    /// put again, what is gone is removed, the rest is left alone (so set predictions kept
    /// for unchanged tables stay valid). Returns the workloads put or removed.
    pub fn sync(&mut self, stored: &[(WorkloadName, Vec<Profile>)]) -> usize {
        let names: FastSet<&WorkloadName> = stored.iter().map(|(name, _)| name).collect();
        let gone: Vec<WorkloadName> = self
            .workloads
            .iter()
            .filter(|name| !names.contains(name))
            .cloned()
            .collect();
        for name in &gone {
            self.remove_workload(name);
        }
        let mut changed = gone.len();
        for (name, profiles) in stored {
            if !self.holds(name, profiles) {
                self.put_workload(name, profiles);
                changed += 1;
            }
        }
        changed
    }

    pub fn remove_workload(&mut self, name: &WorkloadName) {
        self.workloads.remove(name);
        for table in self.gpus.values_mut() {
            if table.get(name).is_some() || table.lacks_kernel_metrics(name) {
                Arc::make_mut(table).remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::profile_tests::sample_profile;

    fn name(n: &str) -> WorkloadName {
        WorkloadName::parse("name", n).unwrap()
    }

    #[test]
    fn removing_a_workload_keeps_the_index_of_the_moved_entry_right() {
        let mut catalog = Catalog::default();
        let profile = sample_profile();
        for n in ["a", "b", "c"] {
            catalog.put_workload(&name(n), std::slice::from_ref(&profile));
        }
        catalog.remove_workload(&name("a"));
        let table = catalog.gpu(&profile.gpu).unwrap();
        assert_eq!(table.entries().len(), 2);
        assert_eq!(table.get(&name("c")).unwrap().name, name("c"));
        assert!(table.get(&name("a")).is_none());
        assert!(!catalog.contains(&name("a")));
    }

    #[test]
    fn a_reader_keeps_its_snapshot_while_a_writer_changes_the_table() {
        let mut catalog = Catalog::default();
        let profile = sample_profile();
        catalog.put_workload(&name("a"), std::slice::from_ref(&profile));
        let snapshot = catalog.gpu(&profile.gpu).unwrap();
        catalog.put_workload(&name("b"), std::slice::from_ref(&profile));
        assert_eq!(snapshot.entries().len(), 1);
        assert_eq!(catalog.gpu(&profile.gpu).unwrap().entries().len(), 2);
    }

    #[test]
    fn sync_puts_what_changed_removes_what_is_gone_and_leaves_the_rest() {
        let mut catalog = Catalog::default();
        let profile = sample_profile();
        let mut faster = profile.clone();
        faster.system.exclusive_throughput *= 2.0;
        let mut other_gpu = profile.clone();
        other_gpu.gpu = GpuName::parse("gpu", "H100").unwrap();
        for n in ["a", "b", "c"] {
            catalog.put_workload(&name(n), std::slice::from_ref(&profile));
        }
        let stored = vec![
            (name("a"), vec![profile.clone()]),
            (name("b"), vec![profile.clone()]),
            (name("c"), vec![profile.clone()]),
        ];
        let generation = catalog.gpu(&profile.gpu).unwrap().generation();
        assert_eq!(catalog.sync(&stored), 0);
        assert_eq!(
            catalog.gpu(&profile.gpu).unwrap().generation(),
            generation,
            "nothing changed, the table is left alone"
        );
        // b re-profiled, c gone, d new and profiled elsewhere too, e pending (no profile).
        let stored = vec![
            (name("a"), vec![profile.clone()]),
            (name("b"), vec![faster.clone()]),
            (name("d"), vec![profile.clone(), other_gpu.clone()]),
            (name("e"), vec![]),
        ];
        assert_eq!(catalog.sync(&stored), 4);
        let table = catalog.gpu(&profile.gpu).unwrap();
        assert_eq!(
            table.get(&name("b")).unwrap().exclusive(),
            2.0 * profile.system.exclusive_throughput
        );
        assert!(table.get(&name("c")).is_none() && !catalog.contains(&name("c")));
        assert!(catalog
            .gpu(&other_gpu.gpu)
            .unwrap()
            .get(&name("d"))
            .is_some());
        assert!(catalog.contains(&name("e")));
        assert_eq!(catalog.sync(&stored), 0);
        // d no longer profiled on the second GPU model.
        let stored = vec![(name("d"), vec![profile.clone()])];
        assert_eq!(catalog.sync(&stored), 4, "a, b, e removed; d put");
        assert!(catalog
            .gpu(&other_gpu.gpu)
            .unwrap()
            .get(&name("d"))
            .is_none());
    }
}

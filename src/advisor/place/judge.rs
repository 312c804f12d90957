//! One GPU judged, step by step: can it be scored at all (its GPU model, its slots, its
//! residents), does the set fit its memory, what do the members keep with the job (the
//! query's caps), does every resident keep its own floor, and does the new set pass the
//! query's rule. The first step that fails names the reason the GPU is skipped.

use super::{
    rule::Refusal,
    sets::{SetCache, SetValue},
    work::{
        insert_sorted, low_objective_value, objective_value, resident_positions, Ready, Resident,
        Scored,
    },
    GpuState, PlaceSkipCode, PlaceWork, SkippedGpu,
};
use crate::{
    advisor::{policy::is_loss, Objective},
    domain::WorkloadName,
};

/// The memory the job and the residents at table positions `key` need together.
pub(super) fn set_memory_gb(ready: &Ready, key: &[u32]) -> f64 {
    let entries = ready.table.entries();
    entries[ready.job as usize].features.memory_gb()
        + key
            .iter()
            .map(|&i| entries[i as usize].features.memory_gb())
            .sum::<f64>()
}

/// A skipped GPU's answer.
type Skip = std::result::Result<(), SkippedGpu>;

fn skip(gpu: &GpuState, code: PlaceSkipCode, reason: String) -> SkippedGpu {
    SkippedGpu {
        gpu_id: gpu.id.clone(),
        code,
        reason,
        workload: None,
        predicted_fraction: None,
        floor: None,
        on_low_end: false,
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.0} %", fraction * 100.0)
}

/// The new set's members as the checks read them.
struct NewSet<'a, 'c> {
    /// The set with the job, sorted table positions.
    key: &'a [u32],
    after: &'a SetValue,
    /// With `cautious`, the members' intervals where the model has them.
    low_ends: Option<&'a Vec<(f64, f64)>>,
    cache: &'a SetCache<'c>,
    ready: &'a Ready,
}

impl NewSet<'_, '_> {
    fn position(&self, index: u32) -> usize {
        self.key.binary_search(&index).expect("a member of the set")
    }

    /// A member's share of its exclusive throughput on its point prediction.
    fn share(&self, index: u32) -> Option<f64> {
        let members = self.after.members.as_ref()?;
        Some(members[self.position(index)] / self.cache.exclusive(index))
    }

    /// A member's share as the caps and floors read it: the point prediction, or with
    /// `cautious` the low end of its interval where the model has one.
    fn kept(&self, index: u32) -> Option<f64> {
        let members = self.after.members.as_ref()?;
        let position = self.position(index);
        let throughput = self
            .low_ends
            .map_or(members[position], |bounds| bounds[position].0);
        Some(throughput / self.cache.exclusive(index))
    }

    fn predicted_as(&self) -> &'static str {
        if self.low_ends.is_some() {
            "predicted (the low end of its 80 % interval)"
        } else {
            "predicted"
        }
    }

    fn name(&self, index: u32) -> &WorkloadName {
        &self.ready.table.entries()[index as usize].name
    }
}

impl PlaceWork {
    /// Judges the `gpu_index`-th GPU (its residents start at `resident_start`): its score
    /// when it qualifies, else why not. `key` is a buffer.
    pub(super) fn judge(
        &self,
        gpu_index: usize,
        resident_start: usize,
        caches: &mut [Option<SetCache<'_>>],
        key: &mut Vec<u32>,
    ) -> std::result::Result<Scored, SkippedGpu> {
        let gpu = &self.query.gpus[gpu_index];
        let context = self.gpu_context[gpu_index];
        let own = &self.residents[resident_start..resident_start + gpu.residents.len()];
        let ready = self.scorable(gpu, context, own, key)?;
        let (memory, limit) = self.memory(gpu, context, ready, key)?;

        let cache = caches[context].as_mut().expect("ready");
        let policy = self.query.policy;
        key.sort_unstable();
        let before = cache.value(key);
        let value_before = objective_value(policy.objective, &before, key, cache);
        let normalized_before = objective_value(Objective::NormalizedSum, &before, key, cache);
        let low_before = low_objective_value(policy.objective, &before, key, cache);
        let before_key = key.clone();
        insert_sorted(key, ready.job);
        let after = cache.value(key);
        let value_after = objective_value(policy.objective, &after, key, cache);
        let normalized_gain =
            objective_value(Objective::NormalizedSum, &after, key, cache) - normalized_before;
        let gain = value_after - value_before;
        let gain_low = low_objective_value(policy.objective, &after, key, cache) - low_before;

        let set = NewSet {
            key,
            after: &after,
            low_ends: if policy.cautious {
                after.bounds.as_ref()
            } else {
                None
            },
            cache,
            ready,
        };
        self.caps(gpu, &set, &before_key)?;
        self.own_floors(gpu, own, &set)?;
        self.rule(gpu, own, &set, gain)?;
        if !own.is_empty() && !policy.include_losses && is_loss(normalized_gain) {
            return Err(SkippedGpu {
                predicted_fraction: None,
                ..skip(
                    gpu,
                    PlaceSkipCode::PredictedLoss,
                    format!(
                        "a predicted loss: with the job the GPU would do {:.2} of one job's \
                         work less than its residents and the job apart (Σ colocated / \
                         exclusive throughput); ask with include_losses to list it",
                        -normalized_gain
                    ),
                )
            });
        }
        Ok(Scored {
            gpu: gpu_index,
            residents: resident_start,
            context,
            gain,
            gain_low,
            score: if policy.cautious { gain_low } else { gain },
            value_before,
            value_after,
            fits: memory <= limit,
            memory,
            limit,
        })
    }

    /// Whether the GPU can be scored: a model and the job's profile on its GPU model, a
    /// free slot, every resident profiled there (their positions into `key`).
    fn scorable(
        &self,
        gpu: &GpuState,
        context: usize,
        own: &[Resident],
        key: &mut Vec<u32>,
    ) -> std::result::Result<&Ready, SkippedGpu> {
        let context = &self.contexts[context];
        let ready = match &context.ready {
            Ok(ready) => ready,
            Err((code, reason)) => return Err(skip(gpu, *code, reason.clone())),
        };
        if gpu.residents.len() + 1 > self.query.max_jobs_per_gpu {
            return Err(skip(
                gpu,
                PlaceSkipCode::TooManyJobs,
                format!(
                    "it runs {} jobs already; with this one it would run more than the {} allowed",
                    gpu.residents.len(),
                    self.query.max_jobs_per_gpu
                ),
            ));
        }
        let Err(k) = resident_positions(own, key) else {
            return Ok(ready);
        };
        let name = &gpu.residents[k];
        let gpu_name = context.gpu.as_str();
        let (code, reason) = match own[k] {
            Resident::Unknown => (
                PlaceSkipCode::UnknownWorkload,
                format!("resident {name} is not a registered workload"),
            ),
            Resident::KernelMissing => (
                PlaceSkipCode::ResidentNotProfiled,
                format!(
                    "resident {name} was profiled on GPU model {gpu_name:?} without \
                     kernel metrics; profile it again"
                ),
            ),
            _ => (
                PlaceSkipCode::ResidentNotProfiled,
                format!("resident {name} has no profile on GPU model {gpu_name:?}"),
            ),
        };
        Err(SkippedGpu {
            workload: WorkloadName::parse("residents", name).ok(),
            ..skip(gpu, code, reason)
        })
    }

    /// The memory the residents (`key`) and the job need, and the GPU's limit; skipped
    /// when the limit is unknown, or broken and not asked for.
    fn memory(
        &self,
        gpu: &GpuState,
        context: usize,
        ready: &Ready,
        key: &[u32],
    ) -> std::result::Result<(f64, f64), SkippedGpu> {
        let memory = set_memory_gb(ready, key);
        let Some(limit) = gpu.memory_gb.or(ready.table.memory_gb) else {
            return Err(skip(
                gpu,
                PlaceSkipCode::GpuMemoryUnknown,
                format!(
                    "the memory of GPU model {:?} is unknown; give the GPU's memory_gb or \
                     store a profile that carries it",
                    self.contexts[context].gpu.as_str()
                ),
            ));
        };
        if memory > limit && !self.query.include_oversubscribed {
            return Err(skip(
                gpu,
                PlaceSkipCode::ExceedsGpuMemory,
                format!(
                    "with the job it needs {memory:.1} GB, more than the {limit:.1} GB available"
                ),
            ));
        }
        Ok((memory, limit))
    }

    /// The query's caps: the job's `min_job_fraction`, every resident's (the worst one
    /// named) `min_resident_fraction`.
    fn caps(&self, gpu: &GpuState, set: &NewSet<'_, '_>, residents: &[u32]) -> Skip {
        let policy = &self.query.policy;
        let predicted_as = set.predicted_as();
        let broken = |code, reason: String, workload: &WorkloadName, kept, cap| SkippedGpu {
            workload: Some(workload.clone()),
            predicted_fraction: Some(kept),
            floor: Some(cap),
            on_low_end: set.low_ends.is_some(),
            ..skip(gpu, code, reason)
        };
        let job = set.ready.job;
        if let (Some(cap), Some(kept)) = (policy.min_job_fraction, set.kept(job)) {
            if kept < cap {
                return Err(broken(
                    PlaceSkipCode::JobSlowdown,
                    format!(
                        "{predicted_as} to leave the job {} of its exclusive throughput, {} \
                         points below the {} asked for",
                        percent(kept),
                        ((cap - kept) * 100.0).round(),
                        percent(cap)
                    ),
                    &self.query.workload,
                    kept,
                    cap,
                ));
            }
        }
        if let Some(cap) = policy.min_partner_fraction {
            let worst = residents
                .iter()
                .filter_map(|&i| set.kept(i).map(|kept| (i, kept)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((index, kept)) = worst.filter(|w| w.1 < cap) {
                let name = set.name(index);
                return Err(broken(
                    PlaceSkipCode::ResidentSlowdown,
                    format!(
                        "{predicted_as} to leave resident {} {} of its exclusive throughput, \
                         {} points below the {} asked for",
                        name.as_str(),
                        percent(kept),
                        ((cap - kept) * 100.0).round(),
                        percent(cap)
                    ),
                    name,
                    kept,
                    cap,
                ));
            }
        }
        Ok(())
    }

    /// Each resident's own floor, in the order the residents were given (the first one
    /// broken is named), read as the caps are.
    fn own_floors(&self, gpu: &GpuState, own: &[Resident], set: &NewSet<'_, '_>) -> Skip {
        for (k, resident) in own.iter().enumerate() {
            let (Some(floor), Resident::Entry(index)) = (gpu.floor(k), resident) else {
                continue;
            };
            let name = set.name(*index);
            let Some(kept) = set.kept(*index) else {
                return Err(SkippedGpu {
                    workload: Some(name.clone()),
                    ..skip(
                        gpu,
                        PlaceSkipCode::NoModel,
                        format!(
                            "the model predicts no share for resident {name}, so its floor \
                             cannot be checked"
                        ),
                    )
                });
            };
            if kept < floor {
                return Err(SkippedGpu {
                    workload: Some(name.clone()),
                    predicted_fraction: Some(kept),
                    floor: Some(floor),
                    on_low_end: set.low_ends.is_some(),
                    ..skip(
                        gpu,
                        PlaceSkipCode::ResidentSlowdown,
                        format!(
                            "{} to leave resident {name} {} of its exclusive throughput, {} \
                             points below its own floor of {}",
                            set.predicted_as(),
                            percent(kept),
                            ((floor - kept) * 100.0).round(),
                            percent(floor)
                        ),
                    )
                });
            }
        }
        Ok(())
    }

    /// The query's rule on the point predictions of the new set (the job first, then the
    /// residents in the order given); a job alone on a GPU shares it with nobody.
    fn rule(&self, gpu: &GpuState, own: &[Resident], set: &NewSet<'_, '_>, gain: f64) -> Skip {
        let Some(rule) = self.query.policy.rule else {
            return Ok(());
        };
        if own.is_empty() {
            return Ok(());
        }
        let members: Vec<u32> = std::iter::once(set.ready.job)
            .chain(own.iter().filter_map(|r| match r {
                Resident::Entry(i) => Some(*i),
                _ => None,
            }))
            .collect();
        let Some(shares) = members
            .iter()
            .map(|&i| set.share(i))
            .collect::<Option<Vec<f64>>>()
        else {
            return Err(skip(
                gpu,
                PlaceSkipCode::NoModel,
                format!(
                    "the model predicts no share for every member, so the {} rule cannot be \
                     checked",
                    rule.name()
                ),
            ));
        };
        if rule.admits(gain, &shares) {
            return Ok(());
        }
        let names: Vec<&WorkloadName> = members.iter().map(|&i| set.name(i)).collect();
        match rule.refusal(gain, &names, &shares) {
            None => Ok(()),
            Some(Refusal { reason, worst }) => Err(SkippedGpu {
                workload: worst.map(|(name, _)| name.clone()),
                predicted_fraction: worst.map(|(_, share)| share),
                ..skip(gpu, PlaceSkipCode::RuleRefused, reason)
            }),
        }
    }
}

//! The service's [`Placer`]: the advisor's Place, in-process. A node names its GPU model as
//! GPU feature discovery writes it (spaces as dashes); it is matched against the GPU models
//! coloc has a model for, ignoring case and the space/dash difference.
//!
//! One Place query per call, over the distinct GPUs the extender collected, with the
//! server's one [`Policy`] (the `[policy]` settings Rank and Place default to: NORMALIZED_SUM
//! gains, floors read on the low ends of the 80 % intervals, the fair-share rule, no
//! predicted loss), Place's cap of 4 jobs per GPU and
//! its rule that nobody is sped up by a co-runner, the pod's `min_job_fraction` and each
//! resident's own `min_job_fraction` as its floor: Place checks them all and answers
//! which GPUs qualify. What Place skips for a cause the job's placement decides (memory, a
//! cap or floor, too many jobs, the rule) refuses the GPU; what it skips because coloc
//! cannot judge the GPU (no model, a resident without a profile or unknown, memory
//! unknown, a model that predicts no member to check a floor or the rule on) leaves it
//! unscored. So does a GPU model with no runs of the pod's sharing mode (its annotation, or
//! `model.default_sharing_mode`): coloc does not score a mode it has never measured, and
//! when that leaves no GPU of the call to score, the answer is neutral
//! ([`PlacementError::UnmeasuredMode`]).
//!
//! It never explores (`Advisor::place_without_exploring`): the extender scores every GPU by
//! its gain and kube-scheduler picks among nodes, so an offer marked `explored` would not be
//! followed; its calls do not count in `observer.explore_budget` either.

use std::{collections::HashMap, sync::Arc};

use super::{
    decide::{PlaceFuture, PlacementAsk, PlacementError, Placer, SlotOutcome},
    pod::MIN_JOB_FRACTION_ANNOTATION,
};
use crate::{
    advisor::{
        Advisor, Error, GpuState, Objective, PlaceAnswer, PlaceQuery, PlaceRule, PlaceSkipCode,
        Policy, SkippedGpu,
    },
    domain::{GpuName, WorkloadName},
    settings::{ExtenderObjective, ExtenderRule, PolicySettings},
};

pub struct AdvisorPlacer {
    advisor: Arc<Advisor>,
    /// `None`: the advisor's default policy.
    policy: Option<Policy>,
}

impl AdvisorPlacer {
    /// Applies the advisor's default policy ([`Advisor::policy`]), as Rank and Place do.
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self {
            advisor,
            policy: None,
        }
    }

    /// Applies `policy` instead (benchmarks compare policies on one advisor).
    pub fn with_policy(advisor: Arc<Advisor>, policy: Policy) -> Self {
        Self {
            advisor,
            policy: Some(policy),
        }
    }

    /// The GPU model a node's label means; `Err` = coloc has no model for it.
    fn gpu_model(&self, label: Option<&str>) -> Result<Option<GpuName>, String> {
        let Some(label) = label else {
            return Ok(None);
        };
        let wanted = normalized(label);
        self.advisor
            .champions()
            .iter()
            .map(|model| model.gpu.clone())
            .find(|gpu| normalized(gpu.as_str()) == wanted)
            .map(Some)
            .ok_or_else(|| format!("coloc has no model for GPU model {label:?}"))
    }
}

/// The server's default [`Policy`] from the `[policy]` settings: what the extender, Rank
/// and Place apply unless told otherwise.
pub fn policy_from_settings(settings: &PolicySettings) -> Policy {
    let fraction = |f: f64| (f > 0.0).then_some(f);
    Policy {
        objective: match settings.objective {
            ExtenderObjective::NormalizedSum => Objective::NormalizedSum,
            ExtenderObjective::ThroughputSum => Objective::ThroughputSum,
        },
        rule: match settings.rule {
            ExtenderRule::None => None,
            ExtenderRule::Gain => Some(PlaceRule::Gain),
            ExtenderRule::FairShare => Some(PlaceRule::FairShare),
            ExtenderRule::BreakEven => Some(PlaceRule::BreakEven),
        },
        cautious: settings.cautious,
        min_job_fraction: fraction(settings.min_job_fraction),
        min_partner_fraction: fraction(settings.min_partner_fraction),
        include_losses: settings.include_losses,
    }
}

/// The Place query the extender asks for a pod: the policy, with the pod's own
/// `min_job_fraction` as the job's floor where it gives one.
pub fn placement_query(
    job: WorkloadName,
    gpus: Vec<GpuState>,
    policy: Policy,
    min_job_fraction: Option<f64>,
) -> PlaceQuery {
    let mut query = PlaceQuery::new(job, gpus);
    query.policy = policy;
    // The extender and the webhook read each placement's gain only.
    query.with_members = false;
    if min_job_fraction.is_some() {
        query.policy.min_job_fraction = min_job_fraction;
    }
    query
}

/// What the extender makes of one GPU Place left out: refused (a cause the job's placement
/// decides) or unscored (coloc cannot judge it).
pub fn skipped_outcome(skipped: &SkippedGpu) -> SlotOutcome {
    if refuses(skipped.code) {
        SlotOutcome::DoesNotFit {
            reason: resident_floor_reason(skipped).unwrap_or_else(|| skipped.reason.clone()),
        }
    } else {
        SlotOutcome::Unscored {
            reason: skipped.reason.clone(),
        }
    }
}

/// What the extender makes of Place's answer for the GPU `gpu_id` (`None`: not in it).
pub fn outcome_of(answer: &PlaceAnswer, gpu_id: &str) -> Option<SlotOutcome> {
    if let Some(placement) = answer.placements.iter().find(|p| p.gpu_id == gpu_id) {
        return Some(SlotOutcome::Fits {
            gain: placement.gain,
        });
    }
    let skipped = answer.skipped.iter().find(|s| s.gpu_id == gpu_id)?;
    Some(skipped_outcome(skipped))
}

/// The extender's sentence for a resident that would fall below its own
/// `min_job_fraction` (Place's reason names no annotation).
fn resident_floor_reason(skipped: &SkippedGpu) -> Option<String> {
    let (PlaceSkipCode::ResidentSlowdown, Some(workload), Some(kept), Some(floor)) = (
        skipped.code,
        &skipped.workload,
        skipped.predicted_fraction,
        skipped.floor,
    ) else {
        return None;
    };
    Some(format!(
        "predicted to leave resident {workload} {:.0} % of its exclusive throughput{}, \
         below its {MIN_JOB_FRACTION_ANNOTATION} of {:.0} %",
        kept * 100.0,
        if skipped.on_low_end {
            " at the low end of its 80 % interval"
        } else {
            ""
        },
        floor * 100.0
    ))
}

fn normalized(name: &str) -> String {
    name.trim().replace(' ', "-").to_ascii_lowercase()
}

/// Whether a skip is about the job's placement (the node may be filtered out) or about
/// what coloc cannot judge (neutral).
fn refuses(code: PlaceSkipCode) -> bool {
    match code {
        PlaceSkipCode::ExceedsGpuMemory
        | PlaceSkipCode::JobSlowdown
        | PlaceSkipCode::ResidentSlowdown
        | PlaceSkipCode::TooManyJobs
        | PlaceSkipCode::RuleRefused
        | PlaceSkipCode::PredictedLoss => true,
        PlaceSkipCode::UnknownWorkload
        | PlaceSkipCode::NoModel
        | PlaceSkipCode::JobNotProfiled
        | PlaceSkipCode::ResidentNotProfiled
        | PlaceSkipCode::GpuMemoryUnknown => false,
    }
}

impl AdvisorPlacer {
    /// Why `gpu` cannot be scored for `ask`'s sharing mode (its own, or the server's
    /// default): `None` when the GPU model has runs of it.
    fn unmeasured(&self, gpu: &GpuName, ask: &PlacementAsk) -> Option<String> {
        let evidence = self.advisor.mode_evidence(gpu, ask.sharing_mode);
        evidence.unmeasured.then_some(evidence.note)
    }

    /// The policy Place applies to `ask`: this placer's (or the advisor's default), with
    /// the pod's own job floor.
    fn policy_of(&self, ask: &PlacementAsk) -> Policy {
        let mut policy = self.policy.unwrap_or_else(|| self.advisor.policy());
        if ask.min_job_fraction.is_some() {
            policy.min_job_fraction = ask.min_job_fraction;
        }
        policy
    }
}

impl Placer for AdvisorPlacer {
    fn policy(&self, ask: &PlacementAsk) -> Option<String> {
        Some(self.policy_of(ask).describe())
    }

    /// The advisor's: this placer's answers read its catalog and serving models, and a
    /// policy fixed at start-up.
    fn answers_generation(&self) -> Option<u64> {
        Some(self.advisor.answers_generation())
    }

    fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
        Box::pin(async move {
            let job = WorkloadName::parse("workload", &ask.workload)
                .map_err(|_| PlacementError::UnknownWorkload(ask.workload.clone()))?;
            let mut outcomes: Vec<Option<SlotOutcome>> = vec![None; ask.slots.len()];
            let mut gpus = Vec::with_capacity(ask.slots.len());
            let mut unmeasured = None;
            let mut unmeasured_slots = 0;
            // Each GPU model's verdict on the mode, once per call (slots repeat models).
            let mut mode_notes: HashMap<GpuName, Option<String>> = HashMap::new();
            // Each node label's GPU model, once per call (slots repeat labels).
            let mut models_of: HashMap<Option<&str>, Result<Option<GpuName>, String>> =
                HashMap::new();
            for (i, slot) in ask.slots.iter().enumerate() {
                let label = slot.gpu_model.as_deref();
                let model = models_of
                    .entry(label)
                    .or_insert_with(|| self.gpu_model(label))
                    .clone();
                if let Some(note) = model
                    .as_ref()
                    .ok()
                    .and_then(Option::as_ref)
                    .and_then(|gpu| {
                        mode_notes
                            .entry(gpu.clone())
                            .or_insert_with(|| self.unmeasured(gpu, ask))
                            .clone()
                    })
                {
                    unmeasured_slots += 1;
                    outcomes[i] = Some(SlotOutcome::Unscored {
                        reason: note.clone(),
                    });
                    unmeasured = Some(note);
                    continue;
                }
                match model {
                    Ok(gpu) => gpus.push(GpuState {
                        id: i.to_string(),
                        node: String::new(),
                        gpu,
                        memory_gb: slot.memory_gb,
                        residents: slot.residents.clone(),
                        resident_floors: slot.resident_floors.clone(),
                    }),
                    Err(reason) => outcomes[i] = Some(SlotOutcome::Unscored { reason }),
                }
            }
            if let Some(note) = unmeasured.filter(|_| unmeasured_slots == ask.slots.len()) {
                return Err(PlacementError::UnmeasuredMode(note));
            }
            if !gpus.is_empty() {
                let query = placement_query(
                    job,
                    gpus,
                    self.policy.unwrap_or_else(|| self.advisor.policy()),
                    ask.min_job_fraction,
                );
                let answer = self.advisor.place_without_exploring(query).await.map_err(
                    |error| match error {
                        Error::UnknownWorkload(name)
                        | Error::UnknownTarget(name)
                        | Error::UnknownPlaceWorkload(name) => {
                            PlacementError::UnknownWorkload(name)
                        }
                        other => PlacementError::Unavailable(other.to_string()),
                    },
                )?;
                let slots = outcomes.len();
                let slot_of = |id: &str| id.parse::<usize>().ok().filter(|i| *i < slots);
                for placement in &answer.placements {
                    if let Some(i) = slot_of(&placement.gpu_id) {
                        outcomes[i] = Some(SlotOutcome::Fits {
                            gain: placement.gain,
                        });
                    }
                }
                for skipped in &answer.skipped {
                    if let Some(i) = slot_of(&skipped.gpu_id) {
                        outcomes[i] = Some(skipped_outcome(skipped));
                    }
                }
            }
            Ok(outcomes
                .into_iter()
                .map(|outcome| {
                    outcome.unwrap_or(SlotOutcome::Unscored {
                        reason: "Place did not answer for this GPU".into(),
                    })
                })
                .collect())
        })
    }
}

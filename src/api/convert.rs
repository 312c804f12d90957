//! Conversions between the generated protobuf types and domain types. Incoming messages are
//! validated here (into domain types) before anything else sees them.

use crate::{
    advisor::{
        Evidence, GpuFilter, GpuState, JobAssignment, MemberPrediction, Objective, PlaceAnswer,
        PlaceQuery, PlaceSkipCode, Placement, Policy, PolicyChanges, PredictQuery, PredictResult,
        RankQuery, RankResult, RankedCandidate, SkipCode, Skipped,
    },
    domain::{
        check_memory_gb, ColocatedMember, GpuName, KernelMetrics, LaunchSpec, NewWorkload,
        Observation, Profile, ProfileSource, SystemMetrics, ValidationError, WorkloadMode,
        WorkloadName, WorkloadState,
    },
    model::{ModelKind, ProfileLevel},
    proto as pb,
    store::{Assigned, ModelStatus, PredictedRun, StoredModel, WorkloadRecord},
};

pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

fn timestamp_ms(field: &str, ts: &prost_types::Timestamp) -> Result<i64, ValidationError> {
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return Err(ValidationError::new(
            field,
            format!("{field} has invalid nanos"),
        ));
    }
    // Year 1970 to 9999: the range RFC 3339 (and grpcurl's JSON) can express.
    if !(0..=253_402_300_799).contains(&ts.seconds) {
        return Err(ValidationError::new(
            field,
            format!("{field} is out of range"),
        ));
    }
    Ok(ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000))
}

pub fn workload_name(field: &str, raw: &str) -> Result<WorkloadName, ValidationError> {
    WorkloadName::parse(field, raw)
}

/// An optional GPU model: empty means "not given".
pub fn optional_gpu(field: &str, raw: &str) -> Result<Option<GpuName>, ValidationError> {
    if raw.is_empty() {
        Ok(None)
    } else {
        GpuName::parse(field, raw).map(Some)
    }
}

/// An optional memory limit: 0 means "not given".
fn optional_memory(field: &str, value: f64) -> Result<Option<f64>, ValidationError> {
    check_memory_gb(field, value)?;
    Ok((value > 0.0).then_some(value))
}

fn mode(raw: i32) -> Result<WorkloadMode, ValidationError> {
    match pb::WorkloadMode::try_from(raw) {
        Ok(pb::WorkloadMode::Training) => Ok(WorkloadMode::Training),
        Ok(pb::WorkloadMode::Inference) => Ok(WorkloadMode::Inference),
        Ok(pb::WorkloadMode::Unspecified) => Err(ValidationError::new(
            "mode",
            "mode must be TRAINING or INFERENCE",
        )),
        Err(_) => Err(ValidationError::new(
            "mode",
            format!("mode {raw} is not a known value"),
        )),
    }
}

fn mode_to_pb(mode: WorkloadMode) -> pb::WorkloadMode {
    match mode {
        WorkloadMode::Training => pb::WorkloadMode::Training,
        WorkloadMode::Inference => pb::WorkloadMode::Inference,
    }
}

pub fn state_filter(raw: i32) -> Result<Option<WorkloadState>, ValidationError> {
    match pb::WorkloadState::try_from(raw) {
        Ok(pb::WorkloadState::Unspecified) => Ok(None),
        Ok(pb::WorkloadState::PendingProfile) => Ok(Some(WorkloadState::PendingProfile)),
        Ok(pb::WorkloadState::Profiled) => Ok(Some(WorkloadState::Profiled)),
        Ok(pb::WorkloadState::Failed) => Ok(Some(WorkloadState::Failed)),
        Err(_) => Err(ValidationError::new(
            "state",
            format!("state {raw} is not a known value"),
        )),
    }
}

fn state_to_pb(state: WorkloadState) -> pb::WorkloadState {
    match state {
        WorkloadState::PendingProfile => pb::WorkloadState::PendingProfile,
        WorkloadState::Profiled => pb::WorkloadState::Profiled,
        WorkloadState::Failed => pb::WorkloadState::Failed,
    }
}

fn source(raw: i32) -> Result<ProfileSource, ValidationError> {
    match pb::ProfileSource::try_from(raw) {
        Ok(pb::ProfileSource::Unspecified | pb::ProfileSource::ClientSupplied) => {
            Ok(ProfileSource::ClientSupplied)
        }
        Ok(pb::ProfileSource::Imported) => Ok(ProfileSource::Imported),
        Ok(pb::ProfileSource::Measured) => Ok(ProfileSource::Measured),
        Ok(pb::ProfileSource::Replay) => Ok(ProfileSource::Replay),
        Err(_) => Err(ValidationError::new(
            "profile.source",
            format!("profile.source {raw} is not a known value"),
        )),
    }
}

fn source_to_pb(source: ProfileSource) -> pb::ProfileSource {
    match source {
        ProfileSource::Imported => pb::ProfileSource::Imported,
        ProfileSource::ClientSupplied => pb::ProfileSource::ClientSupplied,
        ProfileSource::Measured => pb::ProfileSource::Measured,
        ProfileSource::Replay => pb::ProfileSource::Replay,
    }
}

pub fn profile(raw: Option<pb::Profile>, now_ms: i64) -> Result<Profile, ValidationError> {
    let raw = raw.ok_or_else(|| ValidationError::new("profile", "profile is required"))?;
    // A profile may come without kernel metrics only when it says so.
    let kernel = match (raw.kernel, raw.kernel_missing) {
        (_, true) => pb::KernelMetrics::default(),
        (Some(kernel), false) => kernel,
        (None, false) => {
            return Err(ValidationError::new(
                "profile.kernel",
                "profile.kernel is required (or set profile.kernel_missing)",
            ))
        }
    };
    let system = raw
        .system
        .ok_or_else(|| ValidationError::new("profile.system", "profile.system is required"))?;
    let profile = Profile {
        gpu: GpuName::parse("profile.gpu", &raw.gpu)?,
        kernel: KernelMetrics {
            threads: kernel.threads,
            compute_throughput_pct: kernel.compute_throughput_pct,
            dram_throughput_pct: kernel.dram_throughput_pct,
            memory_throughput_pct: kernel.memory_throughput_pct,
            registers: kernel.registers,
            static_shared_memory_bytes: kernel.static_shared_memory_bytes,
        },
        system: SystemMetrics {
            exclusive_throughput: system.exclusive_throughput,
            throughput_unit: system.throughput_unit,
            sm_busy_pct: system.sm_busy_pct,
            mem_busy_pct: system.mem_busy_pct,
            memory_gb: system.memory_gb,
        },
        source: source(raw.source)?,
        gpu_memory_gb: optional_memory("profile.gpu_memory_gb", raw.gpu_memory_gb)?,
        measured_at_ms: now_ms,
        kernel_missing: raw.kernel_missing,
    };
    profile.validate()?;
    Ok(profile)
}

pub fn profile_to_pb(profile: &Profile) -> pb::Profile {
    let k = &profile.kernel;
    let s = &profile.system;
    pb::Profile {
        gpu: profile.gpu.to_string(),
        kernel: Some(pb::KernelMetrics {
            threads: k.threads,
            compute_throughput_pct: k.compute_throughput_pct,
            dram_throughput_pct: k.dram_throughput_pct,
            memory_throughput_pct: k.memory_throughput_pct,
            registers: k.registers,
            static_shared_memory_bytes: k.static_shared_memory_bytes,
        }),
        system: Some(pb::SystemMetrics {
            exclusive_throughput: s.exclusive_throughput,
            throughput_unit: s.throughput_unit.clone(),
            sm_busy_pct: s.sm_busy_pct,
            mem_busy_pct: s.mem_busy_pct,
            memory_gb: s.memory_gb,
        }),
        source: source_to_pb(profile.source) as i32,
        gpu_memory_gb: profile.gpu_memory_gb.unwrap_or(0.0),
        measured_at: Some(timestamp(profile.measured_at_ms)),
        kernel_missing: profile.kernel_missing,
    }
}

pub fn new_workload(
    raw: pb::RegisterWorkloadRequest,
    now_ms: i64,
) -> Result<NewWorkload, ValidationError> {
    let name = workload_name("name", &raw.name)?;
    let mode = mode(raw.mode)?;
    let labels = raw.labels.into_iter().collect();
    NewWorkload::validate_text(&raw.model, raw.batch_size, &labels)?;
    let profile = raw.profile.map(|p| profile(Some(p), now_ms)).transpose()?;
    let launch = raw.launch.map(launch_spec).transpose()?;
    let profile_on = profile_on_gpus(raw.profile_on_gpus)?;
    if profile.is_some() && !profile_on.is_empty() {
        return Err(ValidationError::new(
            "profile_on_gpus",
            "profile_on_gpus asks for profiling jobs, but the workload comes with a profile; \
             send one or the other",
        ));
    }
    Ok(NewWorkload {
        name,
        mode,
        model: raw.model,
        batch_size: raw.batch_size,
        labels,
        profile,
        launch,
        profile_on,
    })
}

/// The most GPU models a workload may ask to be profiled on.
pub const MAX_PROFILE_ON_GPUS: usize = 64;

/// RegisterWorkload's GPU models to profile on: valid names, each once, at most 64.
fn profile_on_gpus(raw: Vec<String>) -> Result<Vec<GpuName>, ValidationError> {
    if raw.len() > MAX_PROFILE_ON_GPUS {
        return Err(ValidationError::new(
            "profile_on_gpus",
            format!(
                "profile_on_gpus names {} GPU models; at most {MAX_PROFILE_ON_GPUS}",
                raw.len()
            ),
        ));
    }
    let mut gpus: Vec<GpuName> = Vec::with_capacity(raw.len());
    for (i, name) in raw.iter().enumerate() {
        let gpu = GpuName::parse(&format!("profile_on_gpus[{i}]"), name)?;
        if gpus.contains(&gpu) {
            return Err(ValidationError::new(
                format!("profile_on_gpus[{i}]"),
                format!("profile_on_gpus names {name:?} twice"),
            ));
        }
        gpus.push(gpu);
    }
    Ok(gpus)
}

pub fn launch_spec(raw: pb::LaunchSpec) -> Result<LaunchSpec, ValidationError> {
    let spec = LaunchSpec {
        program: raw.program,
        args: raw.args,
        env: raw.env.into_iter().collect(),
        working_dir: (!raw.working_dir.is_empty()).then_some(raw.working_dir),
        timeout_secs: (raw.timeout_secs != 0).then_some(raw.timeout_secs),
        throughput_regex: (!raw.throughput_regex.is_empty()).then_some(raw.throughput_regex),
        nvtx_range: raw.nvtx_range,
        image: (!raw.image.is_empty()).then_some(raw.image),
    };
    spec.validate()?;
    Ok(spec)
}

pub fn launch_spec_to_pb(spec: LaunchSpec) -> pb::LaunchSpec {
    pb::LaunchSpec {
        program: spec.program,
        args: spec.args,
        env: spec.env.into_iter().collect(),
        working_dir: spec.working_dir.unwrap_or_default(),
        timeout_secs: spec.timeout_secs.unwrap_or(0),
        throughput_regex: spec.throughput_regex.unwrap_or_default(),
        nvtx_range: spec.nvtx_range,
        image: spec.image.unwrap_or_default(),
    }
}

pub fn workload_to_pb(record: WorkloadRecord) -> pb::Workload {
    pb::Workload {
        name: record.name.to_string(),
        mode: mode_to_pb(record.mode) as i32,
        model: record.model,
        batch_size: record.batch_size,
        labels: record.labels.into_iter().collect(),
        state: state_to_pb(record.state) as i32,
        state_reason: record.state_reason,
        profiles: record.profiles.iter().map(profile_to_pb).collect(),
        created_at: Some(timestamp(record.created_at_ms)),
        updated_at: Some(timestamp(record.updated_at_ms)),
        launch: record.launch.map(launch_spec_to_pb),
        suspect_profiles: Vec::new(),
    }
}

pub(super) fn objective(raw: i32) -> Result<Objective, ValidationError> {
    match pb::Objective::try_from(raw) {
        Ok(pb::Objective::ThroughputSum) => Ok(Objective::ThroughputSum),
        Ok(pb::Objective::NormalizedSum) => Ok(Objective::NormalizedSum),
        Err(_) => Err(ValidationError::new(
            "objective",
            format!("objective {raw} is not a known value"),
        )),
    }
}

pub fn rank_query(raw: pb::RankRequest, defaults: &Policy) -> Result<RankQuery, ValidationError> {
    let objective = raw.objective.map(objective).transpose()?;
    #[allow(deprecated)] // The old name is still honoured.
    let deprecated_fraction = raw.max_target_slowdown;
    let min_target_fraction = match (raw.min_target_speed_fraction, deprecated_fraction) {
        (0.0, 0.0) => None,
        (fraction, 0.0) => Some(("min_target_speed_fraction", fraction)),
        (0.0, fraction) => Some(("max_target_slowdown", fraction)),
        (new, old) if new == old => Some(("min_target_speed_fraction", new)),
        (new, old) => {
            return Err(ValidationError::new(
                "min_target_speed_fraction",
                format!(
                    "min_target_speed_fraction {new} and its deprecated name \
                     max_target_slowdown {old} disagree: send one of them"
                ),
            ))
        }
    };
    if let Some((field, fraction)) = min_target_fraction {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(ValidationError::new(
                field,
                format!(
                    "{field} is the fraction of its exclusive throughput the target keeps: \
                     between 0 (no limit) and 1, got {fraction}"
                ),
            ));
        }
    }
    if raw.top_k < 0 {
        return Err(ValidationError::new(
            "top_k",
            format!("top_k must not be negative, got {}", raw.top_k),
        ));
    }
    for candidate in &raw.candidates {
        WorkloadName::check("candidate", candidate)?;
    }
    // The defaults, then the policy, then the fields of old where set (not their zero).
    let legacy = PolicyChanges {
        objective,
        cautious: raw.cautious.then_some(true),
        min_job_fraction: min_target_fraction.map(|(_, fraction)| fraction),
        include_losses: raw.include_below_break_even.then_some(true),
        ..PolicyChanges::default()
    };
    let policy = defaults
        .with(super::policy::policy_changes(raw.policy)?)
        .with(legacy);
    let query = RankQuery {
        target: workload_name("target", &raw.target)?,
        candidates: raw.candidates,
        top_k: raw.top_k as usize,
        gpu: optional_gpu("gpu", &raw.gpu)?,
        gpu_memory_gb: optional_memory("gpu_memory_gb", raw.gpu_memory_gb)?,
        include_oversubscribed: raw.include_oversubscribed,
        policy,
        min_benefit: raw.min_benefit,
    };
    query.validate()?;
    Ok(query)
}

fn member_to_pb(member: MemberPrediction) -> pb::MemberPrediction {
    #[allow(deprecated)] // Filled for clients that still read the old name.
    pb::MemberPrediction {
        predicted_slowdown: member.predicted_speed_fraction(),
        predicted_speed_fraction: member.predicted_speed_fraction(),
        predicted_throughput_low: member.predicted_interval.map(|i| i.0),
        predicted_throughput_high: member.predicted_interval.map(|i| i.1),
        predicted_speed_fraction_low: member.speed_fraction_interval().map(|i| i.0),
        predicted_speed_fraction_high: member.speed_fraction_interval().map(|i| i.1),
        workload: member.workload.as_str().to_owned(),
        exclusive_throughput: member.exclusive_throughput,
        throughput_unit: member.throughput_unit.to_string(),
        predicted_throughput: member.predicted_throughput,
        evidence: match member.evidence {
            Evidence::RunsOfSet => pb::Evidence::RunsOfSet,
            Evidence::RunsOfWorkload => pb::Evidence::RunsOfWorkload,
            Evidence::ProfileOnly => pb::Evidence::ProfileOnly,
        } as i32,
        exclusive_suspect: member.exclusive_suspect(),
        profile_exclusive_throughput: member.profile_exclusive_throughput,
        profile_level: match member.profile_level {
            ProfileLevel::Full => pb::ProfileLevel::Full,
            ProfileLevel::NvmlOnly => pb::ProfileLevel::NvmlOnly,
        } as i32,
    }
}

fn ranked_to_pb(candidate: RankedCandidate) -> pb::RankedCandidate {
    pb::RankedCandidate {
        workload: candidate.workload.as_str().to_owned(),
        predicted_throughput_sum: candidate.predicted_throughput_sum,
        predicted_normalized_sum: candidate.predicted_normalized_sum,
        predicted_normalized_sum_low: candidate.predicted_normalized_sum_low,
        fits_memory: candidate.fits_memory,
        memory_gb: candidate.memory_gb,
        members: candidate.members.into_iter().map(member_to_pb).collect(),
    }
}

fn skip_code_to_pb(code: SkipCode) -> pb::SkipReason {
    match code {
        SkipCode::UnknownWorkload => pb::SkipReason::UnknownWorkload,
        SkipCode::NotProfiledOnGpu => pb::SkipReason::NotProfiledOnGpu,
        SkipCode::ExceedsGpuMemory => pb::SkipReason::ExceedsGpuMemory,
        SkipCode::TargetSlowdown => pb::SkipReason::TargetSlowdown,
        SkipCode::KernelMetricsMissing => pb::SkipReason::KernelMetricsMissing,
        SkipCode::BelowBreakEven => pb::SkipReason::BelowBreakEven,
        SkipCode::PartnerSlowdown => pb::SkipReason::PartnerSlowdown,
        SkipCode::RuleRefused => pb::SkipReason::RuleRefused,
    }
}

fn skipped_to_pb(skipped: Skipped) -> pb::SkippedCandidate {
    pb::SkippedCandidate {
        workload: skipped.workload,
        reason: skipped.reason,
        code: skip_code_to_pb(skipped.code) as i32,
    }
}

/// Skipped candidates listed by name in a Rank answer; the rest are only counted.
pub const MAX_SKIPPED_LISTED: usize = 100;
/// A Rank answer stays under this many bytes: gRPC clients refuse answers over 4 MiB by
/// default, and the rest of the answer (skipped, framing) needs a little room.
pub const MAX_RANK_ANSWER_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

pub fn rank_to_pb(result: RankResult) -> pb::RankResponse {
    use prost::Message;
    let mut counts: Vec<pb::SkippedCount> = Vec::new();
    for skipped in &result.skipped {
        let code = skip_code_to_pb(skipped.code) as i32;
        match counts.iter_mut().find(|c| c.code == code) {
            Some(count) => count.count += 1,
            None => counts.push(pb::SkippedCount { code, count: 1 }),
        }
    }
    counts.sort_by_key(|c| c.code);
    let skipped: Vec<pb::SkippedCandidate> = result
        .skipped
        .into_iter()
        .take(MAX_SKIPPED_LISTED)
        .map(skipped_to_pb)
        .collect();
    let mut budget = MAX_RANK_ANSWER_BYTES
        .saturating_sub(skipped.iter().map(|s| s.encoded_len() + 8).sum::<usize>());
    let total = result.ranked.len();
    let mut ranked = Vec::with_capacity(total.min(4096));
    for candidate in result.ranked {
        let candidate = ranked_to_pb(candidate);
        // The entry, its tag and its length prefix.
        let size = candidate.encoded_len() + 8;
        if size > budget {
            break;
        }
        budget -= size;
        ranked.push(candidate);
    }
    pb::RankResponse {
        ranked_not_listed: (total - ranked.len()) as u64,
        ranked,
        skipped,
        model_version: result.model_version,
        gpu: result.gpu.to_string(),
        gpu_memory_gb: result.gpu_memory_gb,
        skipped_counts: counts,
        objective: match result.policy.objective {
            Objective::ThroughputSum => pb::Objective::ThroughputSum,
            Objective::NormalizedSum => pb::Objective::NormalizedSum,
        } as i32,
        members_estimated: result.members_estimated,
        policy: Some(super::policy::policy_to_pb(&result.policy)),
        // The mode: `sharing::rank_with_mode`.
        ..Default::default()
    }
}

pub fn predict_query(raw: pb::PredictRequest) -> Result<PredictQuery, ValidationError> {
    let query = PredictQuery {
        workloads: raw
            .workloads
            .iter()
            .map(|w| workload_name("workload", w))
            .collect::<Result<_, _>>()?,
        gpu: optional_gpu("gpu", &raw.gpu)?,
        gpu_memory_gb: optional_memory("gpu_memory_gb", raw.gpu_memory_gb)?,
    };
    query.validate()?;
    Ok(query)
}

pub fn predict_to_pb(result: PredictResult) -> pb::PredictResponse {
    pb::PredictResponse {
        predicted_throughput_sum: result.predicted_throughput_sum,
        predicted_normalized_sum: result.predicted_normalized_sum,
        members: result.members.into_iter().map(member_to_pb).collect(),
        fits_memory: result.fits_memory,
        memory_gb: result.memory_gb,
        model_version: result.model_version,
        gpu: result.gpu.to_string(),
        members_estimated: result.members_estimated,
        predicted_throughput_sum_low: result.sum_interval.map(|i| i.0),
        predicted_throughput_sum_high: result.sum_interval.map(|i| i.1),
        ..Default::default()
    }
}

/// A reported run on `gpu` (the request's, or the server's default when it named none).
pub fn observation(
    raw: pb::ReportColocationRequest,
    gpu: GpuName,
    now_ms: i64,
) -> Result<Observation, ValidationError> {
    let members = colocated_members(raw.members)?;
    let observed_at_ms = match &raw.observed_at {
        Some(ts) => timestamp_ms("observed_at", ts)?,
        None => now_ms,
    };
    Observation::new(gpu, members, observed_at_ms)
}

/// A calibrated run's members and when it was measured (`now_ms` when unset); its GPU
/// model is the agent's, which the advisor knows.
pub fn calibration(
    raw: pb::SubmitCalibrationRequest,
    now_ms: i64,
) -> Result<(Vec<ColocatedMember>, i64), ValidationError> {
    let observed_at_ms = match &raw.observed_at {
        Some(ts) => timestamp_ms("observed_at", ts)?,
        None => now_ms,
    };
    Ok((colocated_members(raw.members)?, observed_at_ms))
}

fn colocated_members(
    raw: Vec<pb::ColocatedMember>,
) -> Result<Vec<ColocatedMember>, ValidationError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, m)| {
            // The same rule for a job id as AssignJob's (empty: not given).
            optional_id(&format!("members[{i}].job_id"), &m.job_id)?;
            Ok(ColocatedMember {
                workload: workload_name(&format!("members[{i}].workload"), &m.workload)?,
                throughput: m.throughput,
                job_id: m.job_id,
            })
        })
        .collect()
}

/// An optional model kind: empty means the server's default.
pub fn model_kind(raw: &str) -> Result<Option<ModelKind>, ValidationError> {
    if raw.is_empty() {
        return Ok(None);
    }
    ModelKind::parse(raw).map(Some).ok_or_else(|| {
        ValidationError::new(
            "kind",
            format!(
                "kind {raw:?} is not one of {:?}",
                ModelKind::ALL.map(ModelKind::as_str)
            ),
        )
    })
}

/// What is true of a GPU model's models right now, for reporting one of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelContext {
    pub serving_version: Option<u64>,
    pub pinned_version: Option<u64>,
    /// The serving model's rolling error and how many runs it covers.
    pub rolling_error: Option<(f64, usize)>,
}

pub fn model_to_pb(model: &StoredModel, context: &ModelContext) -> pb::Model {
    let pb_coefficients = |coefficients: Vec<(String, f64)>| {
        coefficients
            .into_iter()
            .map(|(feature, value)| pb::Coefficient { feature, value })
            .collect()
    };
    let (intercept, coefficients) = model.params.coefficients();
    let coefficients = pb_coefficients(coefficients);
    let set_linear = model
        .params
        .set_linear_coefficients()
        .map(|(intercept, coefficients)| pb::LinearPart {
            intercept,
            coefficients: pb_coefficients(coefficients),
        });
    let serving = context.serving_version == Some(model.version);
    let rolling = context.rolling_error.filter(|_| serving);
    pb::Model {
        gpu: model.gpu.to_string(),
        version: model.version,
        kind: model.params.kind().as_str().to_string(),
        trained_at: Some(timestamp(model.created_at_ms)),
        observations: model.metrics.observations as u64,
        r2: model.metrics.r2,
        mse: model.metrics.mse,
        intercept,
        coefficients,
        status: match model.status {
            ModelStatus::Promoted => pb::ModelStatus::Promoted,
            ModelStatus::Rejected => pb::ModelStatus::Rejected,
        } as i32,
        reason: model.reason.clone(),
        cv_score: model.comparison.map(|c| c.score),
        cv_mse: model.comparison.map(|c| c.mse),
        champion_cv_score: model.comparison.map(|c| c.champion_score),
        champion_cv_mse: model.comparison.map(|c| c.champion_mse),
        excluded_outliers: model.excluded_outliers,
        serving,
        pinned: context.pinned_version == Some(model.version),
        rolling_error: rolling.map(|r| r.0),
        rolling_error_samples: rolling.map_or(0, |r| r.1 as u64),
        history: Vec::new(),
        set_linear,
    }
}

/// A free-text label such as a node name: at most 253 characters (a DNS name), no control
/// characters.
fn label(field: &str, raw: &str) -> Result<(), ValidationError> {
    if raw.chars().count() > 253 || raw.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            format!("{field} must be at most 253 characters without control characters"),
        ));
    }
    Ok(())
}

/// An id of the scheduler's (a job, a GPU): present, and a label.
fn id(field: &str, raw: &str) -> Result<(), ValidationError> {
    if raw.is_empty() {
        return Err(ValidationError::new(
            field,
            format!("{field} must not be empty"),
        ));
    }
    label(field, raw)
}

/// An optional id: empty means "not given".
pub fn optional_id<'a>(field: &str, raw: &'a str) -> Result<Option<&'a str>, ValidationError> {
    if raw.is_empty() {
        return Ok(None);
    }
    label(field, raw)?;
    Ok(Some(raw))
}

pub fn job_id(raw: String) -> Result<String, ValidationError> {
    id("job_id", &raw)?;
    Ok(raw)
}

pub fn gpu_filter(nodes: Vec<String>, gpu: &str) -> Result<GpuFilter, ValidationError> {
    for (i, node) in nodes.iter().enumerate() {
        label(&format!("nodes[{i}]"), node)?;
    }
    Ok(GpuFilter {
        nodes,
        gpu: optional_gpu("gpu", gpu)?,
    })
}

pub fn job_assignment(raw: pb::AssignJobRequest) -> Result<JobAssignment, ValidationError> {
    id("gpu_id", &raw.gpu_id)?;
    label("node", &raw.node)?;
    let assignment = JobAssignment {
        job_id: job_id(raw.job_id)?,
        gpu_id: raw.gpu_id,
        node: raw.node,
        gpu: optional_gpu("gpu", &raw.gpu)?,
        workload: workload_name("workload", &raw.workload)?,
        lease_secs: u64::from(raw.lease_secs),
    };
    assignment.validate()?;
    Ok(assignment)
}

pub fn assigned_to_pb(assigned: Assigned) -> pb::AssignJobResponse {
    pb::AssignJobResponse {
        created: assigned.outcome == crate::store::AssignOutcome::Assigned,
        expires_at: assigned.expires_at_ms.map(timestamp),
        gpu: assigned.gpu.to_string(),
    }
}

fn gpu_state(i: usize, raw: pb::GpuState) -> Result<GpuState, ValidationError> {
    let field = |name: &str| format!("gpus[{i}].{name}");
    id(&field("id"), &raw.id)?;
    label(&field("node"), &raw.node)?;
    for (j, resident) in raw.residents.iter().enumerate() {
        WorkloadName::check(&format!("gpus[{i}].residents[{j}]"), resident)?;
    }
    // 0 = no floor; a length other than the residents' and values outside [0, 1] are
    // refused by `PlaceQuery::validate`.
    let resident_floors = raw
        .resident_min_fractions
        .into_iter()
        .map(optional_fraction)
        .collect();
    Ok(GpuState {
        id: raw.id,
        node: raw.node,
        gpu: optional_gpu(&field("gpu"), &raw.gpu)?,
        memory_gb: optional_memory(&field("memory_gb"), raw.memory_gb)?,
        residents: raw.residents,
        resident_floors,
    })
}

pub(super) fn place_rule(raw: i32) -> Result<Option<crate::advisor::PlaceRule>, ValidationError> {
    use crate::advisor::PlaceRule;
    match pb::PlaceRule::try_from(raw) {
        Ok(pb::PlaceRule::Unspecified | pb::PlaceRule::None) => Ok(None),
        Ok(pb::PlaceRule::Gain) => Ok(Some(PlaceRule::Gain)),
        Ok(pb::PlaceRule::FairShare) => Ok(Some(PlaceRule::FairShare)),
        Ok(pb::PlaceRule::BreakEven) => Ok(Some(PlaceRule::BreakEven)),
        Err(_) => Err(ValidationError::new(
            "rule",
            format!("rule {raw} is not a known value"),
        )),
    }
}

/// 0 means "no cap"; anything else (NaN included) is checked by `PlaceQuery::validate`.
fn optional_fraction(value: f64) -> Option<f64> {
    (value != 0.0).then_some(value)
}

pub fn place_query(
    raw: pb::PlaceRequest,
    defaults: &Policy,
) -> Result<PlaceQuery, ValidationError> {
    if raw.top_k < 0 {
        return Err(ValidationError::new(
            "top_k",
            format!("top_k must not be negative, got {}", raw.top_k),
        ));
    }
    let filter = gpu_filter(raw.nodes, &raw.gpu)?;
    let query = PlaceQuery {
        workload: workload_name("workload", &raw.workload)?,
        gpus: raw
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| gpu_state(i, g))
            .collect::<Result<_, _>>()?,
        nodes: filter.nodes,
        gpu_filter: filter.gpu,
        policy: defaults
            .with(super::policy::policy_changes(raw.policy)?)
            .with(PolicyChanges {
                objective: raw.objective.map(objective).transpose()?,
                rule: match raw.rule {
                    0 => None,
                    rule => Some(place_rule(rule)?),
                },
                cautious: raw.cautious.then_some(true),
                min_job_fraction: optional_fraction(raw.min_job_fraction),
                min_partner_fraction: optional_fraction(raw.min_resident_fraction),
                include_losses: None,
            }),
        max_jobs_per_gpu: match raw.max_jobs_per_gpu {
            0 => crate::advisor::DEFAULT_MAX_JOBS_PER_GPU,
            n => n as usize,
        },
        top_k: raw.top_k as usize,
        include_oversubscribed: raw.include_oversubscribed,
        with_members: true,
    };
    query.validate()?;
    Ok(query)
}

fn placement_to_pb(placement: Placement) -> pb::Placement {
    pb::Placement {
        gpu_id: placement.gpu_id,
        node: placement.node,
        gpu: placement.gpu.to_string(),
        gain: placement.gain,
        gain_low: placement.gain_low,
        value_before: placement.value_before,
        value_after: placement.value_after,
        members: placement.members.into_iter().map(member_to_pb).collect(),
        fits_memory: placement.fits_memory,
        memory_gb: placement.memory_gb,
        gpu_memory_gb: placement.gpu_memory_gb,
        model_version: placement.model_version,
        explored: placement.explored,
    }
}

fn place_skip_to_pb(code: PlaceSkipCode) -> pb::PlaceSkipReason {
    match code {
        PlaceSkipCode::ExceedsGpuMemory => pb::PlaceSkipReason::PlaceExceedsGpuMemory,
        PlaceSkipCode::JobSlowdown => pb::PlaceSkipReason::PlaceJobSlowdown,
        PlaceSkipCode::ResidentSlowdown => pb::PlaceSkipReason::PlaceResidentSlowdown,
        PlaceSkipCode::TooManyJobs => pb::PlaceSkipReason::PlaceTooManyJobs,
        PlaceSkipCode::UnknownWorkload => pb::PlaceSkipReason::PlaceUnknownWorkload,
        PlaceSkipCode::NoModel => pb::PlaceSkipReason::PlaceNoModel,
        PlaceSkipCode::JobNotProfiled => pb::PlaceSkipReason::PlaceJobNotProfiled,
        PlaceSkipCode::ResidentNotProfiled => pb::PlaceSkipReason::PlaceResidentNotProfiled,
        PlaceSkipCode::GpuMemoryUnknown => pb::PlaceSkipReason::PlaceGpuMemoryUnknown,
        PlaceSkipCode::RuleRefused => pb::PlaceSkipReason::PlaceRuleRefused,
        PlaceSkipCode::PredictedLoss => pb::PlaceSkipReason::PlacePredictedLoss,
    }
}

pub fn place_to_pb(answer: PlaceAnswer) -> pb::PlaceResponse {
    pb::PlaceResponse {
        placements: answer.placements.into_iter().map(placement_to_pb).collect(),
        skipped: answer
            .skipped
            .into_iter()
            .map(|s| pb::SkippedGpu {
                gpu_id: s.gpu_id,
                reason: s.reason,
                code: place_skip_to_pb(s.code) as i32,
                workload: s
                    .workload
                    .map(|w| w.as_str().to_owned())
                    .unwrap_or_default(),
                predicted_fraction: s.predicted_fraction,
                floor: s.floor,
                on_low_end: s.on_low_end,
            })
            .collect(),
        models: answer
            .models
            .into_iter()
            .map(|m| pb::ModelUsed {
                gpu: m.gpu.to_string(),
                version: m.version,
                kind: m.kind.as_str().to_string(),
                members_estimated: m.members_estimated,
                ..Default::default()
            })
            .collect(),
        policy: Some(super::policy::policy_to_pb(&answer.policy)),
        ..Default::default()
    }
}

pub fn predicted_run_to_pb(run: &PredictedRun) -> pb::ReportedRun {
    pb::ReportedRun {
        observation_id: run.id as u64,
        reported_at: Some(timestamp(run.recorded_at_ms)),
        observed_at: Some(timestamp(run.observed_at_ms)),
        predicted_sum: run.predicted_sum,
        observed_sum: run.observed_sum,
        predicted_by_version: run.predicted_by_version,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn name(prefix: &str, i: usize) -> WorkloadName {
        WorkloadName::parse("name", &format!("{prefix}-{i:0>120}")).unwrap()
    }

    /// 20 000 ranked entries with the longest names and 20 000 skipped ones: the answer a
    /// client with gRPC's default 4 MiB limit could not read.
    #[test]
    fn a_rank_answer_stays_under_4_mib_and_counts_what_it_leaves_out() {
        let unit: std::sync::Arc<str> = "samples/s".into();
        let member = |w: WorkloadName| MemberPrediction {
            workload: w,
            exclusive_throughput: 10.0,
            throughput_unit: unit.clone(),
            predicted_throughput: Some(5.0),
            predicted_interval: None,
            evidence: Evidence::ProfileOnly,
            profile_exclusive_throughput: 10.0,
            profile_level: crate::model::ProfileLevel::Full,
        };
        let result = RankResult {
            gpu: GpuName::parse("gpu", "GPU").unwrap(),
            gpu_memory_gb: 16.0,
            model_version: 1,
            policy: Policy::default(),
            members_estimated: false,
            ranked: (0..20_000)
                .map(|i| RankedCandidate {
                    workload: name("c", i),
                    predicted_throughput_sum: 20_000.0 - i as f64,
                    predicted_normalized_sum: Some(1.0),
                    predicted_normalized_sum_low: None,
                    fits_memory: true,
                    memory_gb: 2.0,
                    members: vec![member(name("t", 0)), member(name("c", i))],
                })
                .collect(),
            skipped: (0..20_000)
                .map(|i| Skipped {
                    workload: format!("u-{i:0>120}"),
                    code: if i % 4 == 0 {
                        SkipCode::NotProfiledOnGpu
                    } else {
                        SkipCode::UnknownWorkload
                    },
                    reason: "workload is not registered".into(),
                })
                .collect(),
        };
        let answer = rank_to_pb(result);
        assert!(
            answer.encoded_len() < 4 * 1024 * 1024,
            "{}",
            answer.encoded_len()
        );
        assert_eq!(answer.skipped.len(), MAX_SKIPPED_LISTED);
        assert_eq!(
            answer.skipped_counts,
            [
                pb::SkippedCount {
                    code: pb::SkipReason::UnknownWorkload as i32,
                    count: 15_000
                },
                pb::SkippedCount {
                    code: pb::SkipReason::NotProfiledOnGpu as i32,
                    count: 5_000
                },
            ]
        );
        assert!(answer.ranked_not_listed > 0);
        assert_eq!(
            answer.ranked.len() as u64 + answer.ranked_not_listed,
            20_000
        );
        // The best are kept.
        assert_eq!(answer.ranked[0].predicted_throughput_sum, 20_000.0);
    }
}

//! What the service is told, from its settings: the gRPC server's and the extender's TLS
//! (files read now, so a bad one fails before any port is bound), the advisor's options
//! and the retraining's lifecycle policy. Each failure names its settings key.

use anyhow::Context;
use tonic::transport::{Identity, ServerTlsConfig};

use crate::{
    advisor::{AdvisorOptions, AgentPolicy, LifecyclePolicy},
    domain::GpuName,
    extender::{
        http::{tls_acceptor, ServeOptions},
        placer::policy_from_settings,
    },
    model::{ModelKind, MIN_TRAINING_ROWS},
    settings::{
        ModelKindSetting, ProfilerBackend, ProfilerDispatch, Settings, SettingsError,
        TrainerSettings, MIN_TRAINING_RUNS,
    },
    tokens::Tokens,
};

/// The gRPC server's TLS identity, when server.tls_cert_file and server.tls_key_file
/// are both set.
pub(super) fn grpc_tls(settings: &Settings) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (
        &settings.server.tls_cert_file,
        &settings.server.tls_key_file,
    ) else {
        return Ok(None);
    };
    let read = |key_name: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| {
            format!(
                "setting {key_name} is invalid: cannot read {}",
                path.display()
            )
        })
    };
    let identity = Identity::from_pem(
        read("server.tls_cert_file", cert)?,
        read("server.tls_key_file", key)?,
    );
    Ok(Some(ServerTlsConfig::new().identity(identity)))
}

/// How the extender serves, from the settings: TLS (and client CA) read now, so a bad
/// file fails before any port is bound.
pub(super) fn extender_options(
    settings: &Settings,
    tokens: Option<&Tokens>,
) -> anyhow::Result<ServeOptions> {
    let extender = &settings.extender;
    let read = |key_name: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| {
            format!(
                "setting {key_name} is invalid: cannot read {}",
                path.display()
            )
        })
    };
    let tls = match (&extender.tls_cert_file, &extender.tls_key_file) {
        (Some(cert), Some(key)) => {
            let client_ca = match &extender.tls_client_ca_file {
                Some(path) => Some(read("extender.tls_client_ca_file", path)?),
                None => None,
            };
            Some(
                tls_acceptor(
                    &read("extender.tls_cert_file", cert)?,
                    &read("extender.tls_key_file", key)?,
                    client_ca.as_deref(),
                )
                .context("settings extender.tls_* are invalid")?,
            )
        }
        _ => None,
    };
    Ok(ServeOptions {
        url_prefix: extender.url_prefix.clone(),
        max_request_bytes: extender.max_request_bytes,
        tokens: tokens.filter(|_| extender.require_token).cloned(),
        tls,
        extra_routes: None,
    })
}

/// What the advisor is told, from the settings: the default GPU model and model kind as
/// domain values, the compiled program allow-list, the lifecycle policy. Fails naming the
/// settings key, before any port is bound.
pub fn advisor_options(settings: &Settings) -> Result<AdvisorOptions, SettingsError> {
    let default_gpu =
        match &settings.model.default_gpu {
            None => None,
            Some(name) => Some(GpuName::parse("model.default_gpu", name).map_err(|e| {
                SettingsError::Invalid {
                    key: "model.default_gpu",
                    message: e.message,
                }
            })?),
        };
    Ok(AdvisorOptions {
        default_gpu,
        default_kind: model_kind(settings.model.kind),
        allowed_programs: settings.allowed_programs()?,
        lifecycle: lifecycle_policy(&settings.trainer),
        policy: policy_from_settings(&settings.policy),
        default_sharing_mode: settings.model.default_sharing_mode,
        explore_budget: settings.observer.explore_budget,
        // Kubernetes Jobs take the jobs of their GPU models (and of any GPU model).
        no_profiler_reason: (settings.profiler.backend == ProfilerBackend::Off
            && settings.profiler.dispatch != ProfilerDispatch::KubernetesJobs)
            .then(|| {
                "waiting: this server runs no profiler (profiler.backend = \"off\"); run `coloc \
             agent` on a GPU node, send the profile with PutProfile, or run a server with \
             profiler.backend = \"nvml\""
                    .to_string()
            }),
        agents: AgentPolicy {
            lease_ms: settings.agents.lease_secs as i64 * 1000,
            live_ms: settings.agents.live_secs as i64 * 1000,
            max_attempts: settings.profiler.max_attempts,
        },
    })
}

/// The model layer's kind for a `model.kind` setting.
pub fn model_kind(setting: ModelKindSetting) -> ModelKind {
    match setting {
        ModelKindSetting::MemberRidgeGbt => ModelKind::MemberRidgeGbt,
        ModelKindSetting::KaceLinear => ModelKind::KaceLinear,
    }
}

fn lifecycle_policy(trainer: &TrainerSettings) -> LifecyclePolicy {
    LifecyclePolicy {
        min_new_observations: trainer.min_new_observations,
        cv_folds: trainer.cv_folds,
        max_training_runs: trainer.max_training_runs,
        training_threads: trainer.training_threads,
        score_tolerance: trainer.score_tolerance,
        mse_tolerance: trainer.mse_tolerance,
        outlier_threshold: trainer.outlier_threshold,
        drift_threshold: trainer.drift_threshold,
        drift_window: trainer.drift_window,
    }
}

// The settings layer knows the smallest training set without importing the model.
const _: () = assert!(MIN_TRAINING_RUNS == MIN_TRAINING_ROWS);

//! The checks every loaded settings value passes before any port is bound: each failure
//! names its key.

use super::{ProfilerBackend, Settings, SettingsError, MIN_TRAINING_RUNS};

impl Settings {
    pub fn validate(&self) -> Result<(), SettingsError> {
        let listen = self.server.listen;
        if !listen.ip().is_loopback()
            && self.auth.tokens_file.is_none()
            && !self.server.allow_unauthenticated_non_loopback
        {
            return Err(SettingsError::Invalid {
                key: "server.listen",
                message: format!(
                    "{listen} is reachable from the network but auth is off: set auth.tokens_file, \
                     or server.allow_unauthenticated_non_loopback = true to accept that"
                ),
            });
        }
        if self.server.tls_cert_file.is_none() != self.server.tls_key_file.is_none() {
            return Err(SettingsError::Invalid {
                key: "server.tls_cert_file",
                message: "TLS needs both server.tls_cert_file and server.tls_key_file".into(),
            });
        }
        self.validate_extender()?;
        for (key, fraction) in [
            ("policy.min_job_fraction", self.policy.min_job_fraction),
            (
                "policy.min_partner_fraction",
                self.policy.min_partner_fraction,
            ),
        ] {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(SettingsError::Invalid {
                    key,
                    message: format!(
                        "a fraction of the job's exclusive throughput: between 0 (none) and 1, \
                         got {fraction}"
                    ),
                });
            }
        }
        if self.server.max_request_bytes < 1024 {
            return Err(SettingsError::Invalid {
                key: "server.max_request_bytes",
                message: "must be at least 1024".into(),
            });
        }
        let url = &self.database.url;
        if !["sqlite:", "postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(SettingsError::Invalid {
                key: "database.url",
                message: format!(
                    "{url:?} is neither a sqlite: URL nor a postgres:// (postgresql://) one"
                ),
            });
        }
        self.validate_profiler()?;
        self.validate_trainer()?;
        self.validate_leader()?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level).map_err(|e| {
            SettingsError::Invalid {
                key: "log.level",
                message: e.to_string(),
            }
        })?;
        Ok(())
    }

    fn validate_extender(&self) -> Result<(), SettingsError> {
        let extender = &self.extender;
        if extender.tls_cert_file.is_none() != extender.tls_key_file.is_none() {
            return Err(SettingsError::Invalid {
                key: "extender.tls_cert_file",
                message: "HTTPS needs both extender.tls_cert_file and extender.tls_key_file".into(),
            });
        }
        if extender.tls_client_ca_file.is_some() && extender.tls_cert_file.is_none() {
            return Err(SettingsError::Invalid {
                key: "extender.tls_client_ca_file",
                message: "client certificates need HTTPS: set extender.tls_cert_file and \
                          extender.tls_key_file"
                    .into(),
            });
        }
        if extender.require_token && self.auth.tokens_file.is_none() {
            return Err(SettingsError::Invalid {
                key: "extender.require_token",
                message: "tokens come from auth.tokens_file, which is not set".into(),
            });
        }
        if !extender.url_prefix.is_empty()
            && (!extender.url_prefix.starts_with('/') || extender.url_prefix.ends_with('/'))
        {
            return Err(SettingsError::Invalid {
                key: "extender.url_prefix",
                message: format!(
                    "{:?} must be empty or start with / and not end with one, like \"/coloc\"",
                    extender.url_prefix
                ),
            });
        }
        if extender.max_request_bytes < 1024 {
            return Err(SettingsError::Invalid {
                key: "extender.max_request_bytes",
                message: "must be at least 1024".into(),
            });
        }
        if let Some(listen) = extender.listen {
            let authenticated = extender.tls_client_ca_file.is_some() || extender.require_token;
            if !listen.ip().is_loopback()
                && !authenticated
                && !self.server.allow_unauthenticated_non_loopback
            {
                return Err(SettingsError::Invalid {
                    key: "extender.listen",
                    message: format!(
                        "{listen} is reachable from the network but callers are not checked: set \
                         extender.tls_client_ca_file (kube-scheduler's client certificate) or \
                         extender.require_token, or server.allow_unauthenticated_non_loopback = \
                         true to accept that"
                    ),
                });
            }
        }
        Ok(())
    }

    fn validate_profiler(&self) -> Result<(), SettingsError> {
        let p = &self.profiler;
        let invalid =
            |key: &'static str, message: String| Err(SettingsError::Invalid { key, message });
        if p.backend == ProfilerBackend::Replay && p.replay_dir.is_none() {
            return invalid(
                "profiler.replay_dir",
                "the replay backend needs a dataset folder".into(),
            );
        }
        if !(p.replay_gpu_memory_gb > 0.0 && p.replay_gpu_memory_gb.is_finite()) {
            return invalid(
                "profiler.replay_gpu_memory_gb",
                "must be a positive number of GB".into(),
            );
        }
        self.allowed_programs()?;
        for (key, value) in [
            ("profiler.sample_interval_ms", p.sample_interval_ms),
            ("profiler.system_timeout_secs", p.system_timeout_secs),
            ("profiler.kernel_timeout_secs", p.kernel_timeout_secs),
            ("profiler.poll_interval_ms", p.poll_interval_ms),
            ("profiler.max_attempts", u64::from(p.max_attempts)),
            ("profiler.output_limit_bytes", p.output_limit_bytes as u64),
            ("profiler.ncu_launch_count", p.ncu_launch_count),
        ] {
            if value == 0 {
                return invalid(key, "must be greater than 0".into());
            }
        }
        let a = &self.agents;
        // A day at most: the lease is also how long a dead agent's job waits.
        if !(1..=86_400).contains(&a.lease_secs) {
            return invalid("agents.lease_secs", "must be 1 to 86400 seconds".into());
        }
        if a.live_secs < a.lease_secs || a.live_secs > 86_400 * 7 {
            return invalid(
                "agents.live_secs",
                "must be at least agents.lease_secs and at most a week".into(),
            );
        }
        Ok(())
    }

    fn validate_leader(&self) -> Result<(), SettingsError> {
        let l = &self.leader;
        let invalid = |key: &'static str, message: &str| {
            Err(SettingsError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if !(1_000..=600_000).contains(&l.lease_ttl_ms) {
            return invalid("leader.lease_ttl_ms", "must be 1000 to 600000 ms");
        }
        // Two tries at least before the lease runs out, so one slow try does not lose it.
        if l.renew_interval_ms < 100 || l.renew_interval_ms * 2 > l.lease_ttl_ms {
            return invalid(
                "leader.renew_interval_ms",
                "must be at least 100 ms and at most half of leader.lease_ttl_ms",
            );
        }
        if !(100..=60_000).contains(&l.model_poll_ms) {
            return invalid("leader.model_poll_ms", "must be 100 to 60000 ms");
        }
        Ok(())
    }

    fn validate_trainer(&self) -> Result<(), SettingsError> {
        let t = &self.trainer;
        let invalid = |key: &'static str, message: &str| {
            Err(SettingsError::Invalid {
                key,
                message: message.into(),
            })
        };
        if t.cv_folds < 2 {
            return invalid("trainer.cv_folds", "must be at least 2");
        }
        if t.max_training_runs != 0 && t.max_training_runs < MIN_TRAINING_RUNS {
            return invalid(
                "trainer.max_training_runs",
                "must be 0 (every run) or at least the 12 runs a fit needs",
            );
        }
        if t.min_new_observations == 0 {
            return invalid("trainer.min_new_observations", "must be greater than 0");
        }
        if t.drift_window == 0 {
            return invalid("trainer.drift_window", "must be greater than 0");
        }
        for (key, value) in [
            ("trainer.score_tolerance", t.score_tolerance),
            ("trainer.mse_tolerance", t.mse_tolerance),
            ("trainer.outlier_threshold", t.outlier_threshold),
            ("trainer.drift_threshold", t.drift_threshold),
        ] {
            if !value.is_finite() || value < 0.0 {
                return invalid(key, "must be a finite number >= 0");
            }
        }
        if self.trainer.outlier_threshold == 0.0 || self.trainer.drift_threshold == 0.0 {
            return invalid(
                "trainer.outlier_threshold",
                "thresholds must be greater than 0",
            );
        }
        Ok(())
    }
}

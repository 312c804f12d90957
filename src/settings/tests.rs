//! Loading, layering and checking settings.

use std::io::Write;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Option<Map<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[test]
fn defaults_work_with_no_file_and_no_environment() {
    let settings = Settings::load(SettingsSources {
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.server.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(settings.database.url, "sqlite://./coloc.db");
    assert_eq!(settings.model.default_gpu, None);
    assert_eq!(settings.profiler.backend, ProfilerBackend::Off);
    assert_eq!(
        settings.metrics.listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:50052")
    );
}

#[test]
fn file_then_environment_then_flags_take_precedence_in_that_order() {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(file, "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"sqlite://file.db\"\n[model]\ndefault_gpu = \"from file\"").unwrap();
    let settings = Settings::load(SettingsSources {
        file: Some(file.path()),
        environment: env(&[
            ("COLOC__DATABASE__URL", "sqlite://env.db"),
            ("COLOC__SERVER__LISTEN", "127.0.0.1:2"),
        ]),
        overrides: vec![("server.listen", "127.0.0.1:3".into())],
    })
    .unwrap();
    assert_eq!(settings.model.default_gpu.as_deref(), Some("from file"));
    assert_eq!(settings.database.url, "sqlite://env.db");
    assert_eq!(settings.server.listen.to_string(), "127.0.0.1:3");
}

#[test]
fn list_settings_come_from_comma_separated_environment_variables() {
    let settings = Settings::load(SettingsSources {
        environment: env(&[
            (
                "COLOC__PROFILER__ALLOWED_PROGRAMS",
                "/usr/bin/python3,/opt/jobs/*",
            ),
            ("COLOC__PROFILER__BACKEND", "nvml"),
            ("COLOC__PROFILER__GPU_INDEX", "2"),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        settings.profiler.allowed_programs,
        ["/usr/bin/python3", "/opt/jobs/*"]
    );
    assert_eq!(
        (settings.profiler.backend, settings.profiler.gpu_index),
        (ProfilerBackend::Nvml, 2)
    );
    assert!(!settings.allowed_programs().unwrap().is_empty());
}

#[test]
fn profiler_settings_are_checked() {
    for (key, value) in [
        ("COLOC__PROFILER__BACKEND", "cuda"),
        ("COLOC__PROFILER__ALLOWED_PROGRAMS", "python3"),
        ("COLOC__PROFILER__MAX_ATTEMPTS", "0"),
        ("COLOC__MODEL__KIND", "forest"),
    ] {
        let error = Settings::load(SettingsSources {
            environment: env(&[(key, value)]),
            ..Default::default()
        })
        .unwrap_err();
        let expected = key
            .trim_start_matches("COLOC__")
            .replace("__", ".")
            .to_lowercase();
        assert!(error.to_string().contains(&expected), "{key}: {error}");
    }
    // The replay backend needs its dataset.
    let error = Settings::load(SettingsSources {
        environment: env(&[("COLOC__PROFILER__BACKEND", "replay")]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("profiler.replay_dir"), "{error}");
}

#[test]
fn without_auth_only_loopback_is_bound_unless_explicitly_allowed() {
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(SettingsSources {
            environment: env(pairs),
            ..Default::default()
        })
    };
    let error = load(&[("COLOC__SERVER__LISTEN", "0.0.0.0:50051")]).unwrap_err();
    assert!(error.to_string().contains("server.listen"), "{error}");
    load(&[
        ("COLOC__SERVER__LISTEN", "0.0.0.0:50051"),
        ("COLOC__AUTH__TOKENS_FILE", "/etc/coloc/tokens"),
    ])
    .unwrap();
    load(&[
        ("COLOC__SERVER__LISTEN", "0.0.0.0:50051"),
        ("COLOC__SERVER__ALLOW_UNAUTHENTICATED_NON_LOOPBACK", "true"),
    ])
    .unwrap();
    load(&[("COLOC__SERVER__LISTEN", "[::1]:50051")]).unwrap();
    let half_tls = load(&[("COLOC__SERVER__TLS_CERT_FILE", "/etc/coloc/cert.pem")]).unwrap_err();
    assert!(
        half_tls.to_string().contains("server.tls_cert_file"),
        "{half_tls}"
    );
    let metrics = load(&[("COLOC__METRICS__LISTEN", "nowhere")]).unwrap_err();
    assert!(metrics.to_string().contains("metrics.listen"), "{metrics}");
}

#[test]
fn the_documented_example_settings_file_is_accepted_and_matches_the_defaults() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/coloc.example.toml");
    let from_file = Settings::load(SettingsSources {
        file: Some(&example),
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap();
    let defaults = Settings::load(SettingsSources {
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(from_file, defaults);
}

#[test]
fn a_bad_value_is_reported_with_its_key() {
    let error = Settings::load(SettingsSources {
        environment: env(&[("COLOC__SERVER__LISTEN", "not an address")]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("server.listen"), "{error}");
}

#[test]
fn an_unknown_key_is_rejected_with_its_name() {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(file, "[server]\nlisen = \"127.0.0.1:1\"").unwrap();
    let error = Settings::load(SettingsSources {
        file: Some(file.path()),
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("lisen"), "{error}");
}

#[test]
fn a_gpu_model_that_looks_like_a_number_stays_the_string_it_was_given() {
    for name in ["1080", "0800", "1e3", "true"] {
        let settings = Settings::load(SettingsSources {
            environment: env(&[
                ("COLOC__MODEL__DEFAULT_GPU", name),
                ("COLOC__PROFILER__REPLAY_GPU", name),
            ]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(settings.model.default_gpu.as_deref(), Some(name));
        assert_eq!(settings.profiler.replay_gpu, name);
    }
    // Numbers and switches still read as numbers and switches.
    let settings = Settings::load(SettingsSources {
        environment: env(&[
            ("COLOC__TRAINER__CV_FOLDS", "7"),
            ("COLOC__TRAINER__SCORE_TOLERANCE", "0.01"),
            ("COLOC__SERVER__ALLOW_UNAUTHENTICATED_NON_LOOPBACK", "true"),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.trainer.cv_folds, 7);
    assert_eq!(settings.trainer.score_tolerance, 0.01);
    assert!(settings.server.allow_unauthenticated_non_loopback);
}

#[test]
fn empty_strings_still_mean_off_and_typed_values_print_back_as_they_were_given() {
    let settings = Settings::load(SettingsSources {
        environment: env(&[
            ("COLOC__METRICS__LISTEN", ""),
            ("COLOC__LOG__FORMAT", "json"),
            ("COLOC__MODEL__KIND", "kace-linear"),
            ("COLOC__PROFILER__BACKEND", "replay"),
            ("COLOC__PROFILER__REPLAY_DIR", "/data/kace"),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.metrics.listen, None);
    assert_eq!(settings.auth.tokens_file, None);
    assert_eq!(settings.log.format, LogFormat::Json);
    assert_eq!(settings.model.kind, ModelKindSetting::KaceLinear);
    assert_eq!(
        settings.profiler.replay_dir.as_deref(),
        Some(Path::new("/data/kace"))
    );
    let printed = toml::to_string(&settings).unwrap();
    for line in [
        "listen = \"\"",
        "format = \"json\"",
        "kind = \"kace-linear\"",
        "backend = \"replay\"",
        "replay_dir = \"/data/kace\"",
        "tokens_file = \"\"",
    ] {
        assert!(printed.contains(line), "{line} not in\n{printed}");
    }
}

#[test]
fn the_extender_is_off_by_default_and_refuses_an_unchecked_network_address() {
    let defaults = Settings::load(SettingsSources {
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(defaults.extender.listen, None);
    assert!(!defaults.extender.watch_cluster);
    let error = Settings::load(SettingsSources {
        environment: env(&[("COLOC__EXTENDER__LISTEN", "0.0.0.0:50053")]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("extender.listen"), "{error}");
    let error = Settings::load(SettingsSources {
        environment: env(&[("COLOC__EXTENDER__REQUIRE_TOKEN", "true")]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        error.to_string().contains("extender.require_token"),
        "{error}"
    );
    let loopback = Settings::load(SettingsSources {
        environment: env(&[
            ("COLOC__EXTENDER__LISTEN", "127.0.0.1:50053"),
            ("COLOC__EXTENDER__URL_PREFIX", "/coloc"),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(loopback.extender.url_prefix, "/coloc");
}

#[test]
fn a_bad_choice_is_reported_with_its_key() {
    for (variable, key) in [
        ("COLOC__LOG__FORMAT", "log.format"),
        ("COLOC__MODEL__KIND", "model.kind"),
        ("COLOC__PROFILER__BACKEND", "profiler.backend"),
        ("COLOC__METRICS__LISTEN", "metrics.listen"),
    ] {
        let error = Settings::load(SettingsSources {
            environment: env(&[(variable, "xml")]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains(key), "{variable}: {error}");
    }
}

#[test]
fn kubernetes_jobs_dispatch_and_its_gpu_models_come_from_the_environment() {
    let settings = Settings::load(SettingsSources {
        environment: env(&[
            ("COLOC__PROFILER__DISPATCH", "kubernetes-jobs"),
            (
                "COLOC__PROFILER__KUBERNETES__GPUS",
                "Tesla T4,NVIDIA H100 80GB HBM3",
            ),
            (
                "COLOC__PROFILER__KUBERNETES__TOKEN_SECRET",
                "coloc-agent-token",
            ),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.profiler.dispatch, ProfilerDispatch::KubernetesJobs);
    assert_eq!(
        settings.profiler.kubernetes.gpus,
        ["Tesla T4", "NVIDIA H100 80GB HBM3"]
    );
    assert_eq!(
        settings.profiler.kubernetes.token_secret,
        "coloc-agent-token"
    );
    let defaults = Settings::load(SettingsSources {
        environment: env(&[]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        defaults.profiler.dispatch,
        ProfilerDispatch::Agents,
        "off by default"
    );
    let error = Settings::load(SettingsSources {
        environment: env(&[("COLOC__PROFILER__DISPATCH", "jobs")]),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("kubernetes-jobs"), "{error}");
}

#[test]
fn the_binding_mode_and_its_bounds_are_checked() {
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(SettingsSources {
            environment: env(pairs),
            ..Default::default()
        })
    };
    assert_eq!(
        load(&[]).unwrap().extender.binding,
        super::BindingMode::NodeOnly
    );
    assert_eq!(
        load(&[("COLOC__EXTENDER__BINDING", "hami")])
            .unwrap()
            .extender
            .binding,
        super::BindingMode::Hami
    );
    for (variable, value, key) in [
        ("COLOC__EXTENDER__BINDING", "kai", "extender.binding"),
        (
            "COLOC__EXTENDER__BINDING_GPUS",
            "0",
            "extender.binding_gpus",
        ),
        (
            "COLOC__EXTENDER__RESERVATION_TTL_SECS",
            "0",
            "extender.reservation_ttl_secs",
        ),
    ] {
        let error = load(&[(variable, value)]).unwrap_err();
        assert!(error.to_string().contains(key), "{variable}: {error}");
    }
}

#[test]
fn leader_settings_are_checked() {
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(SettingsSources {
            environment: env(pairs),
            ..Default::default()
        })
    };
    let settings = load(&[
        ("COLOC__LEADER__LEASE_TTL_MS", "3000"),
        ("COLOC__LEADER__RENEW_INTERVAL_MS", "1500"),
    ])
    .unwrap();
    assert_eq!(
        (
            settings.leader.lease_ttl_ms,
            settings.leader.renew_interval_ms
        ),
        (3000, 1500)
    );
    for (pairs, key) in [
        (
            &[("COLOC__LEADER__LEASE_TTL_MS", "500")][..],
            "leader.lease_ttl_ms",
        ),
        (
            &[("COLOC__LEADER__RENEW_INTERVAL_MS", "6000")][..],
            "leader.renew_interval_ms",
        ),
        (
            &[("COLOC__LEADER__MODEL_POLL_MS", "0")][..],
            "leader.model_poll_ms",
        ),
    ] {
        let error = load(pairs).unwrap_err();
        assert!(error.to_string().contains(key), "{pairs:?}: {error}");
    }
}

#[test]
fn the_exploration_budget_is_off_by_default_and_a_share_between_0_and_1() {
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(SettingsSources {
            environment: env(pairs),
            ..Default::default()
        })
    };
    assert_eq!(load(&[]).unwrap().observer.explore_budget, 0.0);
    let five = load(&[("COLOC__OBSERVER__EXPLORE_BUDGET", "0.05")]).unwrap();
    assert_eq!(five.observer.explore_budget, 0.05);
    for bad in ["1.5", "-0.1"] {
        match load(&[("COLOC__OBSERVER__EXPLORE_BUDGET", bad)]) {
            Err(SettingsError::Invalid { key, .. }) => assert_eq!(key, "observer.explore_budget"),
            other => panic!("{bad} accepted: {other:?}"),
        }
    }
}

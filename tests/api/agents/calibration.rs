//! Calibration through the service: `coloc calibrate` as an agent of its GPU model (real
//! child processes), and SubmitCalibration's rules.

use super::*;

/// `coloc calibrate` on a GPU node (a real child process; NVML replaced by the 24 GB
/// recording) talks to the service only, with an agent's token: it announces itself,
/// runs every pair of the workloads with a launch spec and a profile on its GPU model,
/// and the service stores each as a `calibrated` run of that GPU model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_runs_pairs_through_the_service_as_an_agent_of_its_gpu_model() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    for request in [
        profiled("a", GPU_24, 25.0, &["ok", "20"]),
        profiled("b", GPU_24, 35.0, &["ok", "30"]),
        // Profiled on another GPU model only, and without a launch spec: not paired.
        profiled("other-gpu", GPU_16, 10.0, &["ok", "5"]),
        profiled("no-launch", GPU_24, 10.0, &[]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }

    let calibrated = calibrate(&app, &["--pairs", "10"]).await;
    let stdout = String::from_utf8_lossy(&calibrated.stdout);
    assert!(
        calibrated.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&calibrated.stderr)
    );
    assert!(stdout.contains(&format!("GPU {GPU_24}")), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "3 pairs stored as calibrated runs of {GPU_24}, 0 failed"
        )),
        "{stdout}"
    );
    // a+a, a+b, b+b, each a calibrated run of the agent's GPU model.
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE source = 'calibrated' AND gpu = '{GPU_24}'"
        ))
        .await,
        3
    );
    assert_eq!(app.count("observations").await, 3);
    let members = |workload: &str, throughput: f64| {
        format!(
            "SELECT COUNT(*) FROM observation_members WHERE workload = '{workload}' \
             AND throughput = {throughput} AND job_id LIKE 'calibrate-%'"
        )
    };
    assert_eq!(app.query_i64(&members("a", 20.0)).await, 3);
    assert_eq!(app.query_i64(&members("b", 30.0)).await, 3);
    // It announced itself: the service knows this node's GPU model.
    let agents = agents_client(&app)
        .list_agents(with_token(pb::ListAgentsRequest {}, READER_TOKEN))
        .await
        .unwrap()
        .into_inner()
        .agents;
    let listed: Vec<(&str, &str, &str)> = agents
        .iter()
        .map(|a| (a.agent_id.as_str(), a.node.as_str(), a.gpu.as_str()))
        .collect();
    assert_eq!(listed, [("node-c-gpu0", "node-c", GPU_24)]);
}

/// `--with` runs only the pairs holding that workload, `--sharing shared` says so in the
/// job ids, and the members of a pair share a start line: the member that is ready first
/// (the example workloads' own wait, `coloc_workload.py`) waits for the slow one, so both
/// start timing together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_with_runs_only_its_pairs_and_members_start_timing_together() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    let dir = TempDir::new().unwrap();
    let marks = |name: &str| dir.path().join(name).display().to_string();
    let (quick_file, slow_file) = (marks("quick"), marks("slow"));
    for request in [
        profiled("quick", GPU_24, 25.0, &["start", &quick_file, "0"]),
        profiled("slow", GPU_24, 35.0, &["start", &slow_file, "1.5"]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }

    let calibrated = calibrate(&app, &["--with", "slow", "--sharing", "shared"]).await;
    let stdout = String::from_utf8_lossy(&calibrated.stdout);
    assert!(
        calibrated.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&calibrated.stderr)
    );
    assert!(
        stdout.contains(&format!("GPU {GPU_24} (shared sharing)")),
        "{stdout}"
    );
    // quick+slow and slow+slow; quick+quick holds no `slow`.
    assert!(
        stdout.contains(&format!("2 pairs stored as calibrated runs of {GPU_24}")),
        "{stdout}"
    );
    assert_eq!(
        app.query_i64(
            "SELECT COUNT(*) FROM observation_members WHERE workload = 'quick' \
             AND job_id LIKE 'calibrate-shared-%'"
        )
        .await,
        1
    );
    // Without MPS the two processes' contexts took turns: time-sliced runs.
    assert_eq!(
        app.query_i64(
            "SELECT COUNT(*) FROM observations WHERE source = 'calibrated' \
             AND sharing_mode = 'time-slicing'"
        )
        .await,
        2
    );

    // Each line: arrived at the line, passed it, the pair's start folder, the member count.
    let lines = |file: &str| -> Vec<(f64, f64, String, String)> {
        std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].to_string(),
                    f[3].to_string(),
                )
            })
            .collect()
    };
    let quick = lines(&quick_file);
    let slow = lines(&slow_file);
    assert_eq!(quick.len(), 1, "quick ran in one pair: {quick:?}");
    assert_eq!(
        slow.len(),
        3,
        "slow ran in two pairs, twice in its own: {slow:?}"
    );
    let (q_arrived, q_passed, q_folder, q_count) = &quick[0];
    assert_eq!(q_count, "2");
    let partner = slow
        .iter()
        .find(|(.., folder, _)| folder == q_folder)
        .expect("the slow member of quick's pair saw the same start folder");
    // quick arrived about 1.5 s before slow, and passed the line only when slow arrived.
    assert!(q_passed - q_arrived > 1.0, "{quick:?} {slow:?}");
    assert!((q_passed - partner.1).abs() < 0.5, "{quick:?} {slow:?}");
    // Each pair had a start folder of its own.
    assert_eq!(
        slow.iter()
            .filter(|(.., folder, _)| folder != q_folder)
            .count(),
        2
    );

    // MPS asked for where none is installed is an error, before anything runs.
    if which_mps().is_none() {
        let refused = calibrate(&app, &["--sharing", "mps"]).await;
        assert!(!refused.status.success());
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("MPS sharing was asked for"),
            "{}",
            String::from_utf8_lossy(&refused.stderr)
        );
        assert_eq!(app.count("observations").await, 2);
    }
}

/// Where `nvidia-cuda-mps-control` is in PATH, if anywhere.
fn which_mps() -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("nvidia-cuda-mps-control"))
        .find(|path| path.is_file())
}

/// A calibration run of `agent`: these members at one fixed time.
fn run(agent: &str, members: &[(&str, f64)]) -> pb::SubmitCalibrationRequest {
    pb::SubmitCalibrationRequest {
        agent_id: agent.into(),
        members: members
            .iter()
            .enumerate()
            .map(|(k, (workload, throughput))| pb::ColocatedMember {
                workload: workload.to_string(),
                throughput: *throughput,
                job_id: format!("calibrate-shared-{k}"),
            })
            .collect(),
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_780_000_000,
            nanos: 0,
        }),
        sharing_mode: Some(pb::SharingMode::TimeSlicing as i32),
    }
}

/// SubmitCalibration stores only what an agent can have measured: on its own GPU model,
/// for workloads profiled there, from an agent's (or operator's) token; anything else is
/// refused with its code and changes nothing. A repeat is stored once.
#[tokio::test]
async fn submit_calibration_is_an_agents_call_for_its_own_gpu_model() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    for request in [
        profiled("a", GPU_16, 25.0, &["ok"]),
        profiled("b", GPU_16, 35.0, &["ok"]),
        profiled("elsewhere", GPU_24, 10.0, &["ok"]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }
    let mut agents = agents_client(&app);
    agents
        .announce_agent(with_token(announce("cal", GPU_16), AGENT_TOKEN))
        .await
        .unwrap();
    let before = app.dump_store().await;
    let refusals = [
        // Not an agent's token.
        (
            run("cal", &[("a", 1.0), ("b", 2.0)]),
            READER_TOKEN,
            Code::PermissionDenied,
        ),
        // Never announced.
        (
            run("stranger", &[("a", 1.0), ("b", 2.0)]),
            AGENT_TOKEN,
            Code::NotFound,
        ),
        // A workload not profiled on the agent's GPU model.
        (
            run("cal", &[("a", 1.0), ("elsewhere", 2.0)]),
            AGENT_TOKEN,
            Code::FailedPrecondition,
        ),
        (
            run("cal", &[("a", 1.0), ("unknown", 2.0)]),
            AGENT_TOKEN,
            Code::NotFound,
        ),
        (
            run("cal", &[("a", 1.0)]),
            AGENT_TOKEN,
            Code::InvalidArgument,
        ),
        (
            run("cal", &[("a", f64::NAN), ("b", 2.0)]),
            AGENT_TOKEN,
            Code::InvalidArgument,
        ),
    ];
    for (request, token, code) in refusals {
        expect_code(
            agents.submit_calibration(with_token(request, token)).await,
            code,
        );
    }
    // An agent token still may not report runs of its own choosing.
    expect_code(
        client
            .report_colocation(with_token(
                pb::ReportColocationRequest {
                    gpu: GPU_16.into(),
                    members: run("cal", &[("a", 1.0), ("b", 2.0)]).members,
                    ..Default::default()
                },
                AGENT_TOKEN,
            ))
            .await,
        Code::PermissionDenied,
    );
    assert_eq!(app.dump_store().await, before);

    let stored = agents
        .submit_calibration(with_token(
            run("cal", &[("a", 11.0), ("b", 12.0)]),
            AGENT_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(stored.created);
    let again = agents
        .submit_calibration(with_token(
            run("cal", &[("a", 11.0), ("b", 12.0)]),
            AGENT_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.observation_id, stored.observation_id);
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE source = 'calibrated' AND gpu = '{GPU_16}'"
        ))
        .await,
        1
    );
}

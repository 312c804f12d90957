//! The workload registry: register with and without a profile (a job is queued), get,
//! paged list with state filter, forged page tokens, delete, and invalid registrations.

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{expect_code, profile, register_request, spawn_app, GPU};

#[tokio::test]
async fn register_with_a_profile_makes_the_workload_profiled() {
    let mut app = spawn_app().await;
    let workload = app
        .client
        .register_workload(register_request("bert_b8-inf", Some(profile(1, 2.0))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(workload.name, "bert_b8-inf");
    assert_eq!(workload.state(), pb::WorkloadState::Profiled);
    assert_eq!(workload.mode(), pb::WorkloadMode::Training);
    assert_eq!(workload.batch_size, 16);
    assert_eq!(
        workload.labels.get("team").map(String::as_str),
        Some("vision")
    );
    assert_eq!(workload.profiles.len(), 1);
    assert_eq!(workload.profiles[0].gpu, GPU);
    assert_eq!(workload.profiles[0].system.as_ref().unwrap().memory_gb, 2.0);
    assert_eq!(app.count("profiling_jobs").await, 0);
}

#[tokio::test]
async fn register_without_a_profile_queues_a_profiling_job() {
    let mut app = spawn_app().await;
    let workload = app
        .client
        .register_workload(register_request("pending", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(workload.state(), pb::WorkloadState::PendingProfile);
    assert!(workload.profiles.is_empty());
    assert_eq!(app.count("profiling_jobs").await, 1);
    // This server runs no profiler (the default backend is off): the workload says why it
    // waits, at once and when read again.
    assert!(
        workload.state_reason.contains("profiler.backend"),
        "{:?}",
        workload.state_reason
    );
    let read = app
        .client
        .get_workload(pb::GetWorkloadRequest {
            name: "pending".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.state_reason, workload.state_reason);
}

#[tokio::test]
async fn get_returns_what_was_registered_and_unknown_names_are_not_found() {
    let mut app = spawn_app().await;
    let registered = app
        .client
        .register_workload(register_request("a", Some(profile(2, 1.0))))
        .await
        .unwrap()
        .into_inner();
    let fetched = app
        .client
        .get_workload(pb::GetWorkloadRequest { name: "a".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fetched, registered);
    let message = expect_code(
        app.client
            .get_workload(pb::GetWorkloadRequest {
                name: "missing".into(),
            })
            .await,
        Code::NotFound,
    );
    assert_eq!(message, r#"workload "missing" not found"#);
}

#[tokio::test]
async fn registering_a_taken_name_is_already_exists_and_changes_nothing() {
    let mut app = spawn_app().await;
    app.client
        .register_workload(register_request("a", Some(profile(3, 1.0))))
        .await
        .unwrap();
    let before = app.dump_store().await;
    expect_code(
        app.client
            .register_workload(register_request("a", Some(profile(4, 2.0))))
            .await,
        Code::AlreadyExists,
    );
    expect_code(
        app.client
            .register_workload(register_request("a", None))
            .await,
        Code::AlreadyExists,
    );
    assert_eq!(app.dump_store().await, before);
    // The failed transaction released the database: a new write still goes through.
    app.client
        .register_workload(register_request("b", None))
        .await
        .unwrap();
}

#[tokio::test]
async fn list_pages_through_every_workload_in_name_order_and_filters_by_state() {
    let mut app = spawn_app().await;
    for name in ["e", "c", "a", "d", "b"] {
        let profile = (name != "c").then(|| profile(5, 1.0));
        app.client
            .register_workload(register_request(name, profile))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = app
            .client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 2,
                page_token: token.clone(),
                state: 0,
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.workloads.len() <= 2);
        seen.extend(page.workloads.into_iter().map(|w| w.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    assert_eq!(pages, 3);

    let pending = app
        .client
        .list_workloads(pb::ListWorkloadsRequest {
            page_size: 0,
            page_token: String::new(),
            state: pb::WorkloadState::PendingProfile as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pending
            .workloads
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>(),
        ["c"]
    );
    assert!(pending.next_page_token.is_empty());
}

#[tokio::test]
async fn list_rejects_a_forged_page_token_and_an_unknown_state() {
    let mut app = spawn_app().await;
    expect_code(
        app.client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 1,
                page_token: "not-a-token".into(),
                state: 0,
            })
            .await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 1,
                page_token: String::new(),
                state: 42,
            })
            .await,
        Code::InvalidArgument,
    );
}

#[tokio::test]
async fn delete_removes_the_workload_and_its_profiles_but_keeps_reported_runs() {
    let mut app = spawn_app().await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(6, 1.0))))
            .await
            .unwrap();
    }
    app.client
        .report_colocation(pb::ReportColocationRequest {
            sharing_mode: None,
            gpu_id: String::new(),
            gpu: GPU.into(),
            members: vec![
                pb::ColocatedMember {
                    workload: "a".into(),
                    throughput: 1.0,
                    job_id: String::new(),
                },
                pb::ColocatedMember {
                    workload: "b".into(),
                    throughput: 2.0,
                    job_id: String::new(),
                },
            ],
            observed_at: None,
        })
        .await
        .unwrap();
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: "a".into() })
        .await
        .unwrap();
    expect_code(
        app.client
            .get_workload(pb::GetWorkloadRequest { name: "a".into() })
            .await,
        Code::NotFound,
    );
    assert_eq!(app.count("profiles").await, 1);
    assert_eq!(app.count("observations").await, 1);
    expect_code(
        app.client
            .delete_workload(pb::DeleteWorkloadRequest { name: "a".into() })
            .await,
        Code::NotFound,
    );
}

#[tokio::test]
async fn invalid_registrations_are_rejected_with_invalid_argument_and_change_nothing() {
    let mut app = spawn_app().await;
    app.client
        .register_workload(register_request("existing", Some(profile(7, 1.0))))
        .await
        .unwrap();
    let before = app.dump_store().await;

    let with_kernel = |f: fn(&mut pb::KernelMetrics)| {
        let mut p = profile(8, 1.0);
        f(p.kernel.as_mut().unwrap());
        register_request("new", Some(p))
    };
    let with_system = |f: fn(&mut pb::SystemMetrics)| {
        let mut p = profile(8, 1.0);
        f(p.system.as_mut().unwrap());
        register_request("new", Some(p))
    };
    let mut cases: Vec<(&str, pb::RegisterWorkloadRequest)> = vec![
        ("empty name", register_request("", None)),
        ("long name", register_request(&"x".repeat(129), None)),
        ("name with a space", register_request("a b", None)),
        ("NaN threads", with_kernel(|k| k.threads = f64::NAN)),
        ("negative registers", with_kernel(|k| k.registers = -5.0)),
        (
            "infinite dram",
            with_kernel(|k| k.dram_throughput_pct = f64::INFINITY),
        ),
        (
            "percentage above 100",
            with_kernel(|k| k.compute_throughput_pct = 250.0),
        ),
        (
            "zero exclusive throughput",
            with_system(|s| s.exclusive_throughput = 0.0),
        ),
        ("negative memory", with_system(|s| s.memory_gb = -1.0)),
        ("NaN sm busy", with_system(|s| s.sm_busy_pct = f64::NAN)),
    ];
    let mut unspecified_mode = register_request("new", None);
    unspecified_mode.mode = 0;
    cases.push(("unspecified mode", unspecified_mode));
    let mut unknown_mode = register_request("new", None);
    unknown_mode.mode = 9;
    cases.push(("unknown mode", unknown_mode));
    let mut no_kernel = register_request("new", Some(profile(8, 1.0)));
    no_kernel.profile.as_mut().unwrap().kernel = None;
    cases.push(("profile without kernel metrics", no_kernel));
    let mut no_gpu = register_request("new", Some(profile(8, 1.0)));
    no_gpu.profile.as_mut().unwrap().gpu = String::new();
    cases.push(("profile without gpu", no_gpu));
    let mut bad_source = register_request("new", Some(profile(8, 1.0)));
    bad_source.profile.as_mut().unwrap().source = 77;
    cases.push(("unknown profile source", bad_source));
    let mut huge_batch = register_request("new", None);
    huge_batch.batch_size = u32::MAX;
    cases.push(("absurd batch size", huge_batch));

    for (what, request) in cases {
        let result = app.client.register_workload(request).await;
        assert!(
            matches!(&result, Err(s) if s.code() == Code::InvalidArgument),
            "{what}: {result:?}"
        );
    }
    assert_eq!(app.dump_store().await, before);
}

//! Undo, with a trail, through the real server and the generated client: DeleteRuns (by
//! id, source, time stored, import batch), ForgetGpus, DeleteProfile and ListAudit. A dry
//! run changes nothing; bad input changes nothing and gets its gRPC code; each change is
//! in the audit trail with who made it; a change to training data retrains.

use std::sync::Arc;

use coloc::{domain::GpuName, import::import_kace, proto as pb};
use tempfile::TempDir;
use tonic::Code;

use crate::helpers::{
    expect_code, kace_dir, profile, register_request, report_request, spawn_app,
    spawn_app_with_config, trained_app, TestApp, GPU,
};

const KACE_GPU: &str = "Tesla V100-SXM2-32GB";

fn delete_runs(
    selector: pb::delete_runs_request::Selector,
    dry_run: bool,
) -> pb::DeleteRunsRequest {
    pb::DeleteRunsRequest {
        gpu: String::new(),
        dry_run,
        actor: "alice".into(),
        selector: Some(selector),
    }
}

fn ids(ids: &[u64]) -> pb::delete_runs_request::Selector {
    pb::delete_runs_request::Selector::Ids(pb::RunIds { ids: ids.to_vec() })
}

async fn audit(app: &mut TestApp) -> Vec<pb::AuditEntry> {
    app.client
        .list_audit(pb::ListAuditRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .entries
}

#[tokio::test]
async fn deleting_a_run_by_id_is_audited_and_retrains_and_a_dry_run_changes_nothing() {
    let (mut app, workloads) = trained_app(8).await;
    let runs_before = app.count("observations").await;
    let wrong = app
        .client
        .report_colocation(report_request(
            GPU,
            &[(&workloads[0].0, 1.0), (&workloads[1].0, 1.0)],
            1_700_000_000,
        ))
        .await
        .unwrap()
        .into_inner()
        .observation_id;
    let trainings_before = app.count("training_runs").await;

    let store_before = app.dump_store().await;
    let dry = app
        .client
        .delete_runs(delete_runs(ids(&[wrong]), true))
        .await
        .unwrap()
        .into_inner();
    assert!(dry.dry_run);
    assert_eq!(dry.rows, 1);
    assert_eq!(dry.audit_id, 0);
    assert!(dry.retrained.is_empty());
    assert_eq!(app.dump_store().await, store_before, "a dry run wrote");

    let done = app
        .client
        .delete_runs(delete_runs(ids(&[wrong]), false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.rows, 1);
    assert!(
        done.what.contains(&format!("runs {wrong}")),
        "{}",
        done.what
    );
    assert_eq!(app.count("observations").await, runs_before);
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observation_members WHERE observation_id = {wrong}"
        ))
        .await,
        0
    );
    assert_eq!(done.retrained.len(), 1, "{:?}", done.retrained);
    assert!(done.retrained[0].starts_with(GPU), "{:?}", done.retrained);
    assert_eq!(app.count("training_runs").await, trainings_before + 1);
    assert_eq!(
        app.query_i64("SELECT COUNT(*) FROM training_runs WHERE trigger = 'undo'")
            .await,
        1
    );

    let trail = audit(&mut app).await;
    assert_eq!(trail.len(), 1);
    let entry = &trail[0];
    assert_eq!(entry.id, done.audit_id);
    assert_eq!(entry.action, "delete_runs");
    assert_eq!(entry.rows, 1);
    assert!(entry.actor.starts_with("alice ("), "{}", entry.actor);
    assert!(entry.actor.contains("127.0.0.1"), "{}", entry.actor);
    assert_eq!(entry.retrained, done.retrained[0]);
    assert!(entry.at.is_some());
}

#[tokio::test]
async fn bad_undo_requests_get_their_code_and_change_nothing() {
    let (mut app, workloads) = trained_app(6).await;
    let store_before = app.dump_store().await;
    use pb::delete_runs_request::Selector;
    let mut no_selector = delete_runs(Selector::Source("reported".into()), false);
    no_selector.selector = None;
    let message = expect_code(
        app.client.delete_runs(no_selector).await,
        Code::InvalidArgument,
    );
    assert!(message.contains("one of ids, source"), "{message}");
    let message = expect_code(
        app.client
            .delete_runs(delete_runs(ids(&[1, 999_999]), false))
            .await,
        Code::NotFound,
    );
    assert!(message.contains("999999"), "{message}");
    assert!(!message.contains("1,"), "{message}");
    for bad in [
        Selector::Ids(pb::RunIds { ids: vec![] }),
        Selector::Ids(pb::RunIds { ids: vec![0] }),
        Selector::Source("invented".into()),
        Selector::Stored(pb::TimeRange::default()),
        Selector::Stored(pb::TimeRange {
            from: Some(prost_types::Timestamp {
                seconds: 20,
                nanos: 0,
            }),
            to: Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 0,
            }),
        }),
        Selector::ImportBatch(-3),
    ] {
        expect_code(
            app.client
                .delete_runs(delete_runs(bad.clone(), false))
                .await,
            Code::InvalidArgument,
        );
    }
    let mut bad_actor = delete_runs(ids(&[1]), false);
    bad_actor.actor = "eve\nroot".into();
    expect_code(
        app.client.delete_runs(bad_actor).await,
        Code::InvalidArgument,
    );

    let forget = |gpu_id: &str, node: &str| pb::ForgetGpusRequest {
        gpu_id: gpu_id.into(),
        node: node.into(),
        dry_run: false,
        actor: String::new(),
    };
    expect_code(
        app.client.forget_gpus(forget("", "")).await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client.forget_gpus(forget("g", "n")).await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client.forget_gpus(forget("gpu-9", "")).await,
        Code::NotFound,
    );
    expect_code(
        app.client.forget_gpus(forget("", "node-z")).await,
        Code::NotFound,
    );

    let unprofile = |name: &str, gpu: &str| pb::DeleteProfileRequest {
        name: name.into(),
        gpu: gpu.into(),
        dry_run: false,
        actor: String::new(),
    };
    expect_code(
        app.client.delete_profile(unprofile("nobody", GPU)).await,
        Code::NotFound,
    );
    expect_code(
        app.client
            .delete_profile(unprofile(&workloads[0].0, "Other GPU 8GB"))
            .await,
        Code::NotFound,
    );
    expect_code(
        app.client.delete_profile(unprofile("", GPU)).await,
        Code::InvalidArgument,
    );
    assert_eq!(app.dump_store().await, store_before, "a refused undo wrote");
}

#[tokio::test]
async fn an_import_batch_is_deleted_whole_and_runs_go_by_source_and_by_time_stored() {
    let mut app = spawn_app().await;
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    let summary = import_kace(&app.advisor, &kace_dir(), &gpu, 32.0)
        .await
        .unwrap();
    let batch = summary.import_batch.expect("new runs make a batch");
    assert_eq!(summary.observations_new, 181);
    // A reported run beside the import, stored after it.
    let reported = app
        .client
        .report_colocation(report_request(
            KACE_GPU,
            &[
                ("bert-base-cased_batch16-train", 40.0),
                ("vit-base-patch16-224_batch1-inf", 30.0),
            ],
            1_700_000_000,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(reported.created);

    use pb::delete_runs_request::Selector;
    let dry = app
        .client
        .delete_runs(delete_runs(Selector::ImportBatch(batch), true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.rows, 181);
    assert_eq!(dry.batches.len(), 1);
    assert_eq!((dry.batches[0].id, dry.batches[0].runs), (batch, 181));
    assert_eq!(dry.batches[0].gpu, KACE_GPU);
    assert_eq!(app.count("observations").await, 182);

    // Runs stored before the import: none.
    let before = Selector::Stored(pb::TimeRange {
        from: None,
        to: Some(coloc::api::timestamp(batch)),
    });
    let none = app
        .client
        .delete_runs(delete_runs(before, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((none.rows, none.audit_id), (0, 0));
    assert!(
        audit(&mut app).await.is_empty(),
        "nothing deleted, nothing audited"
    );

    let gone = app
        .client
        .delete_runs(delete_runs(Selector::ImportBatch(batch), false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.rows, 181);
    assert_eq!(app.count("observations").await, 1);
    // One run left: too few to fit, said rather than raised; the champion stays.
    assert_eq!(gone.retrained.len(), 1);
    assert!(
        gone.retrained[0].contains("cannot train"),
        "{:?}",
        gone.retrained
    );

    let by_source = app
        .client
        .delete_runs(delete_runs(Selector::Source("reported".into()), false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_source.rows, 1);
    assert_eq!(app.count("observations").await, 0);
    let trail = audit(&mut app).await;
    assert_eq!(
        trail
            .iter()
            .map(|e| (e.action.as_str(), e.rows))
            .collect::<Vec<_>>(),
        [("delete_runs", 1), ("delete_runs", 181)]
    );
}

fn assign(job: &str, gpu_id: &str, node: &str, workload: &str) -> pb::AssignJobRequest {
    pb::AssignJobRequest {
        job_id: job.into(),
        gpu_id: gpu_id.into(),
        node: node.into(),
        gpu: GPU.into(),
        workload: workload.into(),
        lease_secs: 0,
    }
}

#[tokio::test]
async fn a_forgotten_gpu_can_be_assigned_again_on_another_node() {
    let (mut app, workloads) = trained_app(6).await;
    let w = &workloads[0].0;
    app.client
        .assign_job(assign("j1", "gpu-1", "n1", w))
        .await
        .unwrap();
    app.client
        .assign_job(assign("j2", "gpu-2", "n1", w))
        .await
        .unwrap();
    app.client
        .assign_job(assign("j3", "gpu-3", "n2", w))
        .await
        .unwrap();
    expect_code(
        app.client
            .assign_job(assign("j4", "gpu-1", "node-a", w))
            .await,
        Code::FailedPrecondition,
    );
    let forget = |gpu_id: &str, node: &str, dry_run: bool| pb::ForgetGpusRequest {
        gpu_id: gpu_id.into(),
        node: node.into(),
        dry_run,
        actor: "bob".into(),
    };
    let dry = app
        .client
        .forget_gpus(forget("gpu-1", "", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.rows, 2, "the GPU and its job");
    let gpus = |app: &mut TestApp| {
        let mut client = app.client.clone();
        async move {
            let mut ids: Vec<String> = client
                .list_gpus(pb::ListGpusRequest::default())
                .await
                .unwrap()
                .into_inner()
                .gpus
                .into_iter()
                .map(|g| format!("{}@{}", g.id, g.node))
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(gpus(&mut app).await, ["gpu-1@n1", "gpu-2@n1", "gpu-3@n2"]);

    let done = app
        .client
        .forget_gpus(forget("gpu-1", "", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.rows, 2);
    assert!(done.retrained.is_empty(), "occupancy is no training data");
    app.client
        .assign_job(assign("j1", "gpu-1", "node-a", w))
        .await
        .unwrap();
    let by_node = app
        .client
        .forget_gpus(forget("", "n1", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_node.rows, 2, "gpu-2 and its job");
    assert_eq!(gpus(&mut app).await, ["gpu-1@node-a", "gpu-3@n2"]);
    assert_eq!(app.count("cluster_gpus").await, 2);
    assert_eq!(app.count("cluster_jobs").await, 2);

    // The store holds what readers saw: a restart reads the same occupancy.
    let dir = app.stop().await;
    let mut app = crate::helpers::spawn_app_in(dir).await;
    assert_eq!(gpus(&mut app).await, ["gpu-1@node-a", "gpu-3@n2"]);
    let trail = audit(&mut app).await;
    assert_eq!(trail.len(), 2);
    assert!(trail.iter().all(|e| e.action == "forget_gpus"));
    assert!(trail[1].what.contains("gpu-1"), "{}", trail[1].what);
}

#[tokio::test]
async fn a_profile_removed_on_one_gpu_model_leaves_the_others_and_retrains() {
    let (mut app, workloads) = trained_app(6).await;
    let name = workloads[0].0.clone();
    let mut other = profile(99, 2.0);
    other.gpu = "Other GPU 8GB".into();
    other.gpu_memory_gb = 8.0;
    app.client
        .put_profile(pb::PutProfileRequest {
            name: name.clone(),
            profile: Some(other),
        })
        .await
        .unwrap();
    let unprofile = |gpu: &str, dry_run: bool| pb::DeleteProfileRequest {
        name: name.clone(),
        gpu: gpu.into(),
        dry_run,
        actor: "carol".into(),
    };
    let dry = app
        .client
        .delete_profile(unprofile(GPU, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.rows, 1);
    app.client
        .rank(pb::RankRequest {
            target: name.clone(),
            gpu: GPU.into(),
            ..Default::default()
        })
        .await
        .expect("a dry run left the profile");

    let done = app
        .client
        .delete_profile(unprofile(GPU, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.rows, 1);
    assert_eq!(done.retrained.len(), 1);
    let left = app
        .client
        .get_workload(pb::GetWorkloadRequest { name: name.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        left.profiles
            .iter()
            .map(|p| p.gpu.as_str())
            .collect::<Vec<_>>(),
        ["Other GPU 8GB"]
    );
    assert_eq!(left.state, pb::WorkloadState::Profiled as i32);
    expect_code(
        app.client
            .rank(pb::RankRequest {
                target: name.clone(),
                gpu: GPU.into(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
    );
    // Its last profile gone, the workload waits for one again, and says why.
    app.client
        .delete_profile(unprofile("Other GPU 8GB", false))
        .await
        .unwrap();
    let waiting = app
        .client
        .get_workload(pb::GetWorkloadRequest { name })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waiting.state, pb::WorkloadState::PendingProfile as i32);
    assert!(
        waiting.state_reason.contains("removed"),
        "{}",
        waiting.state_reason
    );
    assert_eq!(audit(&mut app).await.len(), 2);
}

/// `body` with a bearer token.
fn authed<T>(token: &str, body: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test]
async fn undo_needs_an_operator_token_and_the_trail_names_its_role() {
    const READER: &str = "reader-0123456789abcdef";
    const OPERATOR: &str = "operator-0123456789abcdef";
    let dir = Arc::new(TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("reader {READER}\noperator {OPERATOR}\n")).unwrap();
    let config = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    let app = spawn_app_with_config(dir, &config).await;
    let mut client = app.client.clone();
    client
        .register_workload(authed(
            OPERATOR,
            register_request("w0", Some(profile(1, 1.0))),
        ))
        .await
        .unwrap();
    client
        .assign_job(authed(OPERATOR, assign("j1", "gpu-1", "n1", "w0")))
        .await
        .unwrap();

    let body = pb::ForgetGpusRequest {
        gpu_id: "gpu-1".into(),
        ..Default::default()
    };
    expect_code(
        client.forget_gpus(authed(READER, body.clone())).await,
        Code::PermissionDenied,
    );
    expect_code(
        client
            .list_audit(authed(READER, pb::ListAuditRequest::default()))
            .await,
        Code::PermissionDenied,
    );
    assert_eq!(app.count("cluster_gpus").await, 1);
    client.forget_gpus(authed(OPERATOR, body)).await.unwrap();
    assert_eq!(app.count("cluster_gpus").await, 0);
    let actor = app
        .query_i64("SELECT COUNT(*) FROM audit WHERE actor LIKE 'unnamed (operator token, from 127.0.0.1:%'")
        .await;
    assert_eq!(actor, 1);
}

//! The occupancy coloc keeps (AssignJob, ReleaseJob, ListGpus) and Place against it:
//! durable across restarts, the rules for a job assigned or released twice, GPUs whose
//! model has no model, filters, and bad requests refused without touching the store.

use coloc::proto as pb;
use tonic::Code;

use crate::{
    helpers::{expect_code, slowdown_app, spawn_app_in, TestApp, GPU},
    place::{gpu, place},
};

fn assign(job: &str, gpu_id: &str, node: &str, workload: &str) -> pb::AssignJobRequest {
    pb::AssignJobRequest {
        job_id: job.into(),
        gpu_id: gpu_id.into(),
        node: node.into(),
        gpu: String::new(),
        workload: workload.into(),
        lease_secs: 0,
    }
}

async fn list(app: &mut TestApp, request: pb::ListGpusRequest) -> Vec<(String, Vec<String>)> {
    app.client
        .list_gpus(request)
        .await
        .unwrap()
        .into_inner()
        .gpus
        .into_iter()
        .map(|g| (g.id, g.jobs.into_iter().map(|j| j.workload).collect()))
        .collect()
}

/// Four GPUs on two nodes: g1 {w01}, g2 {w02, w03}, g3 {} (its job released), g4 {w01}.
async fn small_cluster(app: &mut TestApp) {
    for (job, gpu_id, node, workload) in [
        ("j1", "g1", "n1", "w01"),
        ("j2", "g2", "n1", "w02"),
        ("j3", "g2", "n1", "w03"),
        ("j4", "g3", "n2", "w04"),
        ("j5", "g4", "n2", "w01"),
    ] {
        let answer = app
            .client
            .assign_job(assign(job, gpu_id, node, workload))
            .await
            .unwrap()
            .into_inner();
        assert!(answer.created);
        assert_eq!(answer.gpu, GPU);
        assert_eq!(answer.expires_at, None);
    }
    let released = app
        .client
        .release_job(pb::ReleaseJobRequest {
            job_id: "j4".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(released.released);
}

#[tokio::test]
async fn place_without_gpus_answers_against_the_stored_occupancy_which_survives_a_restart() {
    let (mut app, _) = slowdown_app(5).await;
    small_cluster(&mut app).await;
    let explicit = app
        .client
        .place(place(
            "w00",
            vec![
                gpu("g1", &["w01"]),
                gpu("g2", &["w02", "w03"]),
                gpu("g3", &[]),
                gpu("g4", &["w01"]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    let stored = app
        .client
        .place(place("w00", vec![]))
        .await
        .unwrap()
        .into_inner();
    let gains = |answer: &pb::PlaceResponse| -> Vec<(String, f64)> {
        answer
            .placements
            .iter()
            .map(|p| (p.gpu_id.clone(), p.gain))
            .collect()
    };
    assert_eq!(gains(&stored), gains(&explicit));
    assert_eq!(stored.placements.len(), 4);
    let g2 = stored.placements.iter().find(|p| p.gpu_id == "g2").unwrap();
    assert_eq!(g2.node, "n1");

    let expected = vec![
        ("g1".to_string(), vec!["w01".to_string()]),
        ("g2".into(), vec!["w02".into(), "w03".into()]),
        ("g3".into(), vec![]),
        ("g4".into(), vec!["w01".into()]),
    ];
    assert_eq!(list(&mut app, Default::default()).await, expected);

    // Filters: nodes and GPU model.
    let mut on_n2 = place("w00", vec![]);
    on_n2.nodes = vec!["n2".into()];
    let answer = app.client.place(on_n2).await.unwrap().into_inner();
    let mut ids: Vec<&str> = answer
        .placements
        .iter()
        .map(|p| p.gpu_id.as_str())
        .collect();
    ids.sort();
    assert_eq!(ids, ["g3", "g4"]);
    let mut other_model = place("w00", vec![]);
    other_model.gpu = "Other GPU 80GB".into();
    let answer = app.client.place(other_model).await.unwrap().into_inner();
    assert!(answer.placements.is_empty() && answer.skipped.is_empty());

    // Paging by id.
    let first = app
        .client
        .list_gpus(pb::ListGpusRequest {
            page_size: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.gpus.len(), 3);
    let second = app
        .client
        .list_gpus(pb::ListGpusRequest {
            page_size: 3,
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.gpus.len(), 1);
    assert_eq!(second.gpus[0].id, "g4");
    assert!(second.next_page_token.is_empty());

    // Acknowledged = committed: a restart sees the same occupancy.
    let dir = app.stop().await;
    let mut app = spawn_app_in(dir).await;
    assert_eq!(list(&mut app, Default::default()).await, expected);
    let again = app
        .client
        .place(place("w00", vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gains(&again), gains(&explicit));
}

#[tokio::test]
async fn a_job_assigned_or_released_twice_follows_the_documented_rules() {
    let (mut app, _) = slowdown_app(5).await;
    small_cluster(&mut app).await;
    // The same job on the same GPU again: a renewal, with a lease now.
    let mut renew = assign("j1", "g1", "n1", "w01");
    renew.lease_secs = 3600;
    let renewed = app.client.assign_job(renew).await.unwrap().into_inner();
    assert!(!renewed.created);
    assert!(renewed.expires_at.is_some());
    assert_eq!(app.count("cluster_jobs").await, 4);

    let before = app.dump_store().await;
    // Elsewhere, or as another workload: refused until released.
    let message = expect_code(
        app.client.assign_job(assign("j1", "g2", "n1", "w01")).await,
        Code::AlreadyExists,
    );
    assert!(message.contains("g1"), "{message}");
    expect_code(
        app.client.assign_job(assign("j1", "g1", "n1", "w02")).await,
        Code::AlreadyExists,
    );
    // A GPU keeps its node and model.
    let message = expect_code(
        app.client.assign_job(assign("j9", "g1", "n2", "w01")).await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("n1"), "{message}");
    // Unknown workload; bad fields.
    expect_code(
        app.client
            .assign_job(assign("j9", "g9", "n1", "nobody"))
            .await,
        Code::NotFound,
    );
    for (request, field) in [
        (assign("", "g9", "n1", "w01"), "job_id"),
        (assign("j9", "", "n1", "w01"), "gpu_id"),
        (assign("j9", "g9", "n\u{7}", "w01"), "node"),
        (assign("j9", "g9", "n1", "bad name"), "workload"),
        (
            pb::AssignJobRequest {
                lease_secs: 400 * 86_400,
                ..assign("j9", "g9", "n1", "w01")
            },
            "lease_secs",
        ),
    ] {
        let message = expect_code(app.client.assign_job(request).await, Code::InvalidArgument);
        assert!(message.contains(field), "{field}: {message}");
    }
    expect_code(
        app.client
            .release_job(pb::ReleaseJobRequest {
                job_id: String::new(),
            })
            .await,
        Code::InvalidArgument,
    );
    assert_eq!(app.dump_store().await, before);

    // Released twice: the second time says it was not running, and changes nothing.
    for expected in [true, false] {
        let released = app
            .client
            .release_job(pb::ReleaseJobRequest {
                job_id: "j1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(released.released, expected);
    }
    // Now free, the id may go anywhere.
    let moved = app
        .client
        .assign_job(assign("j1", "g2", "n1", "w01"))
        .await
        .unwrap()
        .into_inner();
    assert!(moved.created);
}

#[tokio::test]
async fn a_gpu_whose_model_has_no_model_is_accepted_and_skipped_by_place() {
    let (mut app, _) = slowdown_app(5).await;
    let mut request = assign("j1", "h1", "n3", "w01");
    request.gpu = "Other GPU 80GB".into();
    let answer = app.client.assign_job(request).await.unwrap().into_inner();
    assert_eq!(answer.gpu, "Other GPU 80GB");
    app.client
        .assign_job(assign("j2", "g1", "n1", "w02"))
        .await
        .unwrap();
    let answer = app
        .client
        .place(place("w00", vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.placements.len(), 1);
    assert_eq!(answer.placements[0].gpu_id, "g1");
    assert_eq!(answer.skipped.len(), 1);
    assert_eq!(answer.skipped[0].gpu_id, "h1");
    assert_eq!(answer.skipped[0].code(), pb::PlaceSkipReason::PlaceNoModel);
}

#[tokio::test]
async fn a_reported_run_may_name_its_gpu_which_fixes_its_gpu_model() {
    let (mut app, _) = slowdown_app(5).await;
    small_cluster(&mut app).await;
    let run = |gpu: &str, gpu_id: &str| pb::ReportColocationRequest {
        sharing_mode: None,
        gpu: gpu.into(),
        gpu_id: gpu_id.into(),
        members: ["w01", "w02"]
            .iter()
            .map(|w| pb::ColocatedMember {
                workload: w.to_string(),
                throughput: 3.0,
                ..Default::default()
            })
            .collect(),
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
    };
    let stored = app
        .client
        .report_colocation(run("", "g1"))
        .await
        .unwrap()
        .into_inner();
    assert!(stored.created);
    let id = stored.observation_id;
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE id = {id} AND gpu_id = 'g1' AND gpu = '{GPU}'"
        ))
        .await,
        1
    );
    let before = app.dump_store().await;
    let message = expect_code(
        app.client
            .report_colocation(run("Other GPU 80GB", "g1"))
            .await,
        Code::FailedPrecondition,
    );
    assert!(message.contains(GPU), "{message}");
    assert_eq!(app.dump_store().await, before);
}

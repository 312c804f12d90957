//! The sharing mode (docs/decisions/030-sharing-mode.md): a reported run keeps its mode and
//! an unknown mode is refused with nothing stored; Rank, Predict and Place asked for a mode
//! the GPU model has no runs of answer and say so, until a run of that mode is trained on;
//! the extender reads KAI-Scheduler's annotation and the binding webhook the DRA claim's
//! GpuConfig, and neither has an opinion on a mode without runs; the CLI takes the mode.

use coloc::proto as pb;
use serde_json::{json, Value};
use tonic::Code;

use crate::{
    extender::{assert_neutral, post, EXTENDER_ON},
    extender_view::{sample, scrape},
    helpers::{
        expect_code, profile, register_request, report_request, set_test_node, slowdown_app,
        slowdown_app_with_config, spawn_app, TestApp, GPU,
    },
    place::gpu,
};

const TIME_SLICING: i32 = pb::SharingMode::TimeSlicing as i32;
const MPS: i32 = pb::SharingMode::Mps as i32;

fn report(members: &[(&str, f64)], at: i64, mode: Option<i32>) -> pb::ReportColocationRequest {
    pb::ReportColocationRequest {
        sharing_mode: mode,
        ..report_request(GPU, members, at)
    }
}

async fn runs_of(app: &TestApp, mode: &str) -> i64 {
    app.query_i64(&format!(
        "SELECT COUNT(*) FROM observations WHERE sharing_mode = '{mode}'"
    ))
    .await
}

#[tokio::test]
async fn a_run_keeps_its_sharing_mode_and_an_unknown_mode_stores_nothing() {
    let mut app = spawn_app().await;
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        app.client
            .register_workload(register_request(name, Some(profile(i as u64, 1.0))))
            .await
            .unwrap();
    }
    let sliced = app
        .client
        .report_colocation(report(
            &[("a", 3.0), ("b", 4.0)],
            1_750_000_000,
            Some(TIME_SLICING),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(sliced.created);
    // Unset and UNSPECIFIED: MPS, the mode of every shipped dataset.
    for (at, mode) in [(1_750_000_100, None), (1_750_000_200, Some(0))] {
        app.client
            .report_colocation(report(&[("a", 5.0), ("b", 6.0)], at, mode))
            .await
            .unwrap();
    }
    assert_eq!(runs_of(&app, "time-slicing").await, 1);
    assert_eq!(runs_of(&app, "mps").await, 2);

    let before = app.dump_store().await;
    let message = expect_code(
        app.client
            .report_colocation(report(&[("a", 7.0), ("b", 8.0)], 1_750_000_300, Some(9)))
            .await,
        Code::InvalidArgument,
    );
    assert!(message.contains("sharing_mode"), "{message}");
    assert_eq!(
        app.dump_store().await,
        before,
        "a refused run leaves no trace"
    );
    app.stop().await;
}

fn rank(mode: Option<i32>) -> pb::RankRequest {
    pb::RankRequest {
        target: "w00".into(),
        sharing_mode: mode,
        ..Default::default()
    }
}

#[tokio::test]
async fn rank_predict_and_place_for_an_unmeasured_mode_answer_and_say_so_until_it_has_runs() {
    let (mut app, _) = slowdown_app(6).await;
    let mps = app.client.rank(rank(None)).await.unwrap().into_inner();
    assert_eq!(mps.sharing_mode, MPS, "the server's default");
    assert!(!mps.mode_unmeasured);
    assert_eq!(mps.mode_note, "");

    let sliced = app
        .client
        .rank(rank(Some(TIME_SLICING)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sliced.sharing_mode, TIME_SLICING);
    assert!(sliced.mode_unmeasured, "{sliced:?}");
    assert!(
        sliced.mode_note.contains("time-slicing") && sliced.mode_note.contains("mps"),
        "{}",
        sliced.mode_note
    );
    assert!(!sliced.ranked.is_empty(), "still answered");
    assert_eq!(sliced.ranked, mps.ranked, "from the same model");

    let predicted = app
        .client
        .predict(pb::PredictRequest {
            workloads: vec!["w00".into(), "w01".into()],
            sharing_mode: Some(TIME_SLICING),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(predicted.mode_unmeasured && !predicted.mode_note.is_empty());

    let placed = app
        .client
        .place(pb::PlaceRequest {
            workload: "w00".into(),
            gpus: vec![gpu("g0", &[]), gpu("g1", &["w01"])],
            sharing_mode: Some(TIME_SLICING),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(placed.sharing_mode, TIME_SLICING);
    assert!(!placed.models.is_empty());
    assert!(
        placed.models.iter().all(|m| m.mode_unmeasured),
        "{placed:?}"
    );

    let bad = app.client.rank(rank(Some(5))).await;
    expect_code(bad, Code::InvalidArgument);

    // One time-sliced run, trained on: the mode is measured now.
    app.client
        .report_colocation(report(
            &[("w00", 1.0), ("w01", 1.0)],
            1_760_000_000,
            Some(TIME_SLICING),
        ))
        .await
        .unwrap();
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let sliced = app
        .client
        .rank(rank(Some(TIME_SLICING)))
        .await
        .unwrap()
        .into_inner();
    assert!(!sliced.mode_unmeasured, "{}", sliced.mode_note);
    app.stop().await;
}

#[tokio::test]
async fn a_server_defaulting_to_time_slicing_flags_requests_that_name_no_mode() {
    let config = "[model]\ndefault_sharing_mode = \"time-slicing\"\n";
    let (mut app, _) = slowdown_app_with_config(6, config).await;
    let answer = app.client.rank(rank(None)).await.unwrap().into_inner();
    assert_eq!(answer.sharing_mode, TIME_SLICING);
    assert!(answer.mode_unmeasured);
    let answer = app.client.rank(rank(Some(MPS))).await.unwrap().into_inner();
    assert!(!answer.mode_unmeasured, "{}", answer.mode_note);
    app.stop().await;
}

fn kai_pod(mode: Option<&str>) -> Value {
    let path = format!(
        "{}/tests/fixtures/kubernetes/pod-kai-time-slicing.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut pod: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    if let Some(mode) = mode {
        pod["metadata"]["annotations"]["kai.scheduler/gpu-compute-sharing-mode"] = json!(mode);
    }
    pod
}

#[tokio::test]
async fn the_extender_reads_kais_mode_and_has_no_opinion_on_a_mode_without_runs() {
    let (app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.expect("extender on");
    for node in ["a", "b"] {
        set_test_node(&app, node, 1);
    }
    // As KAI writes it: time-slicing, of which the store has no run.
    assert_neutral(addr, kai_pod(None), &["a", "b"], "time-slicing").await;
    // The same pod under MPS (KAI's "sm-sharing") is judged.
    let args = json!({"Pod": kai_pod(Some("sm-sharing")), "Nodes": null, "NodeNames": ["a", "b"]});
    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200);
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .all(|p| p["Score"].as_i64() > Some(0)),
        "{body}"
    );
    // A value KAI does not write.
    assert_neutral(addr, kai_pod(Some("mps")), &["a", "b"], "malformed").await;

    let text = scrape(app.metrics_addr.expect("metrics on")).await;
    let neutral = |reason: &str| {
        sample(
            &text,
            "coloc_extender_neutral_answers_total",
            &["verb=\"prioritize\"", &format!("reason=\"{reason}\"")],
        )
    };
    assert_eq!(neutral("unmeasured_sharing_mode"), Some(1.0), "{text}");
    assert_eq!(neutral("malformed_annotation"), Some(1.0));
    app.stop().await;
}

#[tokio::test]
async fn the_cli_ranks_for_a_mode_and_reports_a_runs_mode() {
    let (app, _) = slowdown_app(6).await;
    let (ok, out, err) =
        crate::cli::coloc(&app, &["rank", "w00", "--sharing-mode", "time-slicing"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("note: coloc has no runs of sharing mode time-slicing"),
        "{out}"
    );
    let (ok, out, err) = crate::cli::coloc(&app, &["rank", "w00"]).await;
    assert!(ok, "{err}");
    assert!(!out.contains("note:"), "{out}");
    let report = [
        "report",
        "w00=1.5",
        "w01=2.5",
        "--at",
        "2026-11-23T18:00:00Z",
        "--sharing-mode",
        "time-slicing",
    ];
    let (ok, _, err) = crate::cli::coloc(&app, &report).await;
    assert!(ok, "{err}");
    assert_eq!(runs_of(&app, "time-slicing").await, 1);
    app.stop().await;
}

/// The claim-create review with the NVIDIA DRA driver's `GpuConfig` sharing `strategy`, shaped
/// as in NVIDIA/k8s-dra-driver-gpu's demo specs (`demo/specs/quickstart`).
fn claim_review(strategy: &str) -> Value {
    let mut review = crate::binding::fixture("admission-review-claim-create.json");
    review["request"]["object"]["spec"]["devices"]["config"] = json!([{
        "requests": ["gpu"],
        "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": strategy}}}
    }]);
    review
}

#[tokio::test]
async fn the_binding_webhook_pins_an_mps_claim_and_leaves_a_time_sliced_one_alone() {
    let (app, _) = slowdown_app_with_config(7, &crate::binding::config("dra", 2)).await;
    let slice =
        serde_json::from_value(crate::binding::fixture("resourceslice-nvidia.json")).unwrap();
    app.inventory.apply_slice(&slice);
    let addr = app.extender_addr.unwrap();
    let mps = claim_review("MPS");
    let (status, response) = post(addr, "/coloc/mutate", &mps, "").await;
    assert_eq!(status, 200, "{response}");
    assert!(
        crate::binding::patched(&mps, &response).is_some(),
        "{response}"
    );
    let sliced = claim_review("TimeSlicing");
    let (status, response) = post(addr, "/coloc/mutate", &sliced, "").await;
    assert_eq!(status, 200, "{response}");
    assert!(
        crate::binding::patched(&sliced, &response).is_none(),
        "no runs of time-slicing: no opinion, no patch: {response}"
    );
    app.stop().await;
}

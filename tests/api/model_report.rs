//! GetModelReport and `coloc model report --plot`: each reported run's stored prediction
//! against what was observed, and the models' history, through the real server and CLI.

use coloc::proto as pb;
use tokio::process::Command;

use crate::helpers::{trained_app_with, true_sum, TestApp, GPU};

/// A run of workloads `k` and `k + 1` that went `factor` times the known truth, split
/// evenly between the two members.
fn run(
    workloads: &[(String, pb::Profile)],
    k: usize,
    factor: f64,
) -> (pb::ReportColocationRequest, f64) {
    let (a, pa) = &workloads[k];
    let (b, pb_) = &workloads[k + 1];
    let sum = true_sum(pa, pb_);
    let member = |workload: &String| pb::ColocatedMember {
        workload: workload.clone(),
        throughput: sum * factor / 2.0,
        job_id: String::new(),
    };
    (
        pb::ReportColocationRequest {
            sharing_mode: None,
            gpu_id: String::new(),
            gpu: GPU.into(),
            members: vec![member(a), member(b)],
            observed_at: Some(prost_types::Timestamp {
                seconds: 1_900_000_000 + k as i64,
                nanos: 0,
            }),
        },
        sum,
    )
}

async fn report(app: &mut TestApp, limit: u32) -> pb::ModelReport {
    app.client
        .get_model_report(pb::GetModelReportRequest {
            gpu: String::new(),
            limit,
        })
        .await
        .unwrap()
        .into_inner()
}

/// A KACE-linear model fitted on runs that follow the known linear truth (so it predicts
/// the truth), then `runs` reported runs that went 1.5 times the truth: their predicted
/// sums are the truth. Returns the truths in report order.
async fn app_with_reported_runs(runs: usize) -> (TestApp, Vec<(String, pb::Profile)>, Vec<f64>) {
    let (mut app, workloads) = trained_app_with(8, "kace-linear").await;
    let mut truths = Vec::new();
    for k in 0..runs {
        let (request, truth) = run(&workloads, k, 1.5);
        app.client.report_colocation(request).await.unwrap();
        truths.push(truth);
    }
    (app, workloads, truths)
}

#[tokio::test]
async fn the_report_pairs_each_reported_runs_prediction_with_what_was_observed() {
    let (mut app, workloads, truths) = app_with_reported_runs(3).await;

    let answer = report(&mut app, 0).await;
    assert_eq!(answer.gpu, GPU);
    // The 36 seeded runs were stored before any model served: no prediction, left out.
    assert_eq!(answer.runs.len(), 3, "{:?}", answer.runs);
    for (run, truth) in answer.runs.iter().zip(&truths) {
        assert_eq!(run.predicted_by_version, 1);
        assert!(
            (run.predicted_sum - truth).abs() < 1e-6 * truth,
            "predicted {} for a truth of {truth}",
            run.predicted_sum
        );
        assert!((run.observed_sum - 1.5 * truth).abs() < 1e-9 * truth);
        assert!(run.reported_at.is_some());
    }
    assert_eq!(
        answer.runs[0].observed_at.as_ref().unwrap().seconds,
        1_900_000_000
    );
    let ids: Vec<u64> = answer.runs.iter().map(|r| r.observation_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");

    // A second version; the runs reported after it are predicted by the one serving.
    let trained = app
        .client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let serving = trained.champion_version;
    let (request, _) = run(&workloads, 5, 1.0);
    app.client.report_colocation(request).await.unwrap();

    let answer = report(&mut app, 0).await;
    assert_eq!(answer.runs.len(), 4);
    assert_eq!(answer.runs[3].predicted_by_version, serving);
    let versions: Vec<(u64, i32)> = answer
        .models
        .iter()
        .map(|m| (m.version, m.status))
        .collect();
    let listed = app
        .client
        .list_models(pb::ListModelsRequest {
            gpu: String::new(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut expected: Vec<(u64, i32)> = listed
        .models
        .iter()
        .map(|m| (m.version, m.status))
        .collect();
    expected.reverse();
    assert_eq!(versions, expected, "every version, oldest first");
    assert_eq!(versions.len(), 2);
    assert!(answer.models.iter().all(|m| m.trained_at.is_some()));

    // limit: the newest runs, still oldest first.
    let newest = report(&mut app, 2).await;
    assert_eq!(newest.runs, answer.runs[2..].to_vec());
}

async fn coloc(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(args)
        .env("COLOC_ADDR", format!("http://{}", app.addr))
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn the_cli_draws_the_report_into_a_png() {
    let (app, _, _) = app_with_reported_runs(6).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.png");
    let (code, out, err) = coloc(
        &app,
        &[
            "model",
            "report",
            "--plot",
            path.to_str().unwrap(),
            "--window",
            "4",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("6 reported runs"), "{out}");
    // Every run went 1.5 times its prediction: an error of 1/3.
    assert!(out.contains("rolling error now 33.3 %"), "{out}");

    let png = std::fs::read(&path).unwrap();

    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "the PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1600, 720));
    assert!(
        png.len() > 20_000,
        "axes, labels and points, not a blank picture: {} bytes",
        png.len()
    );
}

#[tokio::test]
async fn a_server_without_reported_runs_says_so_and_draws_nothing() {
    // Trained on runs stored before any model served: none has a prediction.
    let (app, _) = trained_app_with(5, "kace-linear").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.png");
    let (code, _, err) = coloc(&app, &["model", "report", "--plot", path.to_str().unwrap()]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no reported runs with a prediction yet"),
        "{err}"
    );
    assert!(!path.exists(), "no empty picture");

    // A bare server knows no GPU model: FAILED_PRECONDITION, said in words.
    let bare = crate::helpers::spawn_app().await;
    let (code, _, err) = coloc(
        &bare,
        &["model", "report", "--plot", path.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 64 + 9, "{err}");
    assert!(err.contains("no GPU model is known yet"), "{err}");
    assert!(!path.exists());
}

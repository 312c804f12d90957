//! The operator CLI against a running server: the same binary, over gRPC.

use tokio::process::Command;

use crate::helpers::{trained_app, TestApp};

async fn coloc(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(args)
        .env("COLOC_ADDR", format!("http://{}", app.addr))
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn the_operator_cli_lists_ranks_reports_and_checks_health() {
    let (app, _) = trained_app(6).await;

    let (ok, out, err) = coloc(&app, &["health"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "SERVING");

    let (ok, out, err) = coloc(&app, &["workloads", "list", "--json"]).await;
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 6);
    assert_eq!(listed[0]["name"], "w00");
    assert_eq!(listed[0]["state"], "profiled");

    let (ok, out, _) = coloc(&app, &["workloads", "list"]).await;
    assert!(ok);
    assert!(out.lines().next().unwrap().starts_with("NAME"), "{out}");
    assert_eq!(out.lines().count(), 7, "a header and six rows:\n{out}");

    let (ok, out, err) = coloc(&app, &["rank", "w01", "--top", "2", "--json"]).await;
    assert!(ok, "{err}");
    let ranked: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sums: Vec<f64> = ranked["ranked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["predicted_throughput_sum"].as_f64().unwrap())
        .collect();
    assert_eq!(sums.len(), 2);
    assert!(sums[0] >= sums[1]);

    let (ok, out, err) = coloc(
        &app,
        &[
            "report",
            "--gpu",
            crate::helpers::GPU,
            "w00=10",
            "w01=12.5",
            "--json",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let reported: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reported["created"], true);

    let (ok, out, err) = coloc(&app, &["model"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("version 1 (member-ridge-gbt) serving"),
        "{out}"
    );

    // Errors carry the gRPC code and message, and a failing exit status.
    let (ok, _, err) = coloc(&app, &["workloads", "get", "ghost"]).await;
    assert!(!ok);
    assert!(
        err.contains(r#"NotFound: workload "ghost" not found"#),
        "{err}"
    );
    let (ok, _, err) = coloc(&app, &["report", "--gpu", "g", "w00=fast", "w01=1"]).await;
    assert!(!ok);
    assert!(err.contains("not a number"), "{err}");
}

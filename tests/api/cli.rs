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

#[tokio::test]
async fn the_cli_assigns_jobs_lists_gpus_and_places_from_a_file_or_the_occupancy() {
    let (app, _) = crate::helpers::slowdown_app(5).await;
    for (job, gpu, workload) in [
        ("j1", "g1", "w01"),
        ("j2", "g1", "w02"),
        ("j3", "g2", "w03"),
    ] {
        let (ok, out, err) = coloc(
            &app,
            &[
                "jobs",
                "assign",
                job,
                gpu,
                "--workload",
                workload,
                "--node",
                "n1",
            ],
        )
        .await;
        assert!(ok, "{err}");
        assert!(
            out.contains(&format!("job {job} assigned on GPU {gpu}")),
            "{out}"
        );
    }
    let (ok, out, err) = coloc(&app, &["jobs", "release", "j3"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "job j3 released");
    let (ok, out, _) = coloc(&app, &["jobs", "release", "j3"]).await;
    assert!(ok);
    assert_eq!(out.trim(), "job j3 was not running");

    let (ok, out, err) = coloc(&app, &["gpus", "list", "--json"]).await;
    assert!(ok, "{err}");
    let gpus: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(gpus[0]["id"], "g1");
    assert_eq!(gpus[0]["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(gpus[1]["jobs"].as_array().unwrap().len(), 0);

    // Against the occupancy: the empty g2 and g1 with two residents.
    let (ok, out, err) = coloc(&app, &["place", "w00", "--json"]).await;
    assert!(ok, "{err}");
    let placed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<&str> = placed["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["gpu_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"g1") && ids.contains(&"g2"));

    // From a file, as a table, with a GPU skipped and why.
    let file = app.dir.path().join("gpus.json");
    std::fs::write(
        &file,
        r#"[{"id": "a", "residents": ["w01"]}, {"id": "b", "residents": ["nobody"]},
            {"id": "c", "node": "n2", "memory_gb": 40}]"#,
    )
    .unwrap();
    let (ok, out, err) = coloc(
        &app,
        &[
            "place",
            "w00",
            "--gpu-state",
            file.to_str().unwrap(),
            "--top",
            "5",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("GPU model "), "{out}");
    assert!(lines[1].starts_with("#"), "{out}");
    assert!(
        lines[2].contains("(empty)") || lines[3].contains("(empty)"),
        "{out}"
    );
    assert!(
        out.contains("skipped b: resident nobody is not a registered workload"),
        "{out}"
    );
    let (ok, _, err) = coloc(&app, &["place", "w00", "--gpu-state", "/nonexistent.json"]).await;
    assert!(!ok);
    assert!(err.contains("/nonexistent.json"), "{err}");
}

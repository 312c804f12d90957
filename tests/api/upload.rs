//! Bring your own profile, end to end: `coloc workloads register --ncu --nvml
//! --throughput` and `coloc workloads submit-profile` (the real binary) against the real
//! server, on the real H100 recordings of `tests/fixtures` (ncu CSV and NVML samples of the
//! same run). The profile stored is the one `tests/fixtures/nvml/expected.py` computes
//! apart from the Rust code; a file `coloc ncu` refuses, or another GPU model, is refused
//! before anything is sent.

use tokio::process::Command;

use coloc::proto as pb;

use crate::helpers::{spawn_app, TestApp};

const H100: &str = "NVIDIA H100 80GB HBM3";

fn fixture(path: &str) -> String {
    format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"))
}

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
async fn a_profile_measured_elsewhere_is_registered_and_submitted_as_recorded() {
    let mut app = spawn_app().await;
    let (ncu, nvml) = (
        fixture("ncu/h100_bmm_nvtx_details.csv"),
        fixture("nvml/h100_bmm_samples.jsonl"),
    );
    let (ok, stdout, stderr) = coloc(
        &app,
        &[
            "workloads",
            "register",
            "bmm-2048_batch8-inf",
            "--mode",
            "inference",
            "--ncu",
            &ncu,
            "--nvml",
            &nvml,
            "--throughput",
            "371.335",
            "--throughput-unit",
            "iterations/s",
            "--gpu",
            H100,
        ],
    )
    .await;
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("profiled"), "{stdout}");
    let stored = app
        .client
        .get_workload(pb::GetWorkloadRequest {
            name: "bmm-2048_batch8-inf".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.state, pb::WorkloadState::Profiled as i32);
    let profile = &stored.profiles[0];
    assert_eq!(profile.gpu, H100);
    assert_eq!(profile.source, pb::ProfileSource::ClientSupplied as i32);
    let system = profile.system.as_ref().unwrap();
    // expected.py: the steady window's means and the peak of the whole recording.
    assert!(
        (system.sm_busy_pct - 10844.0 / 109.0).abs() < 1e-9,
        "{system:?}"
    );
    assert!(
        (system.mem_busy_pct - 866.0 / 109.0).abs() < 1e-9,
        "{system:?}"
    );
    assert!((system.memory_gb - 0.978515625).abs() < 1e-12);
    assert_eq!(system.exclusive_throughput, 371.335);
    assert_eq!(system.throughput_unit, "iterations/s");
    assert!((profile.gpu_memory_gb - 79.6474609375).abs() < 1e-9);
    // The kernel metrics are what `coloc ncu --json` reads from the same file.
    let (ok, check, _) = coloc(&app, &["ncu", &ncu, "--json"]).await;
    assert!(ok);
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    let kernel = profile.kernel.as_ref().unwrap();
    assert_eq!(
        check["kernel_metrics"]["threads"].as_f64(),
        Some(kernel.threads)
    );
    assert_eq!(
        check["kernel_metrics"]["dram_throughput_pct"].as_f64(),
        Some(kernel.dram_throughput_pct)
    );

    // submit-profile replaces it (the bert run's recordings, under the same name).
    let (ok, stdout, stderr) = coloc(
        &app,
        &[
            "workloads",
            "submit-profile",
            "bmm-2048_batch8-inf",
            "--ncu",
            &fixture("ncu/h100_bert_encoder_nvtx_details.csv"),
            "--nvml",
            &fixture("nvml/h100_bert_encoder_samples.jsonl"),
            "--throughput",
            "1638.66",
        ],
    )
    .await;
    assert!(ok, "{stdout}{stderr}");
    let replaced = app
        .client
        .get_workload(pb::GetWorkloadRequest {
            name: "bmm-2048_batch8-inf".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let system = replaced.profiles[0].system.as_ref().unwrap();
    assert_eq!(system.exclusive_throughput, 1638.66);
    assert!((system.memory_gb - 1.193359375).abs() < 1e-12);
}

#[tokio::test]
async fn an_upload_coloc_ncu_refuses_or_of_another_gpu_stores_nothing() {
    let mut app = spawn_app().await;
    let nvml = fixture("nvml/h100_bmm_samples.jsonl");
    let empty = fixture("ncu/real_no_kernels_profiled.csv");
    let (ncu_ok, _, ncu_stderr) = coloc(&app, &["ncu", &empty]).await;
    assert!(!ncu_ok);
    let (ok, _, stderr) = coloc(
        &app,
        &[
            "workloads",
            "register",
            "w",
            "--mode",
            "inference",
            "--ncu",
            &empty,
            "--nvml",
            &nvml,
            "--throughput",
            "1",
        ],
    )
    .await;
    assert!(!ok);
    // The same reason `coloc ncu` gives for the file.
    let reason = ncu_stderr.trim().rsplit(": ").next().unwrap().to_string();
    assert!(stderr.contains(&reason), "{stderr} / {ncu_stderr}");

    let (ok, _, stderr) = coloc(
        &app,
        &[
            "workloads",
            "register",
            "w",
            "--mode",
            "inference",
            "--ncu",
            &fixture("ncu/h100_bmm_nvtx_details.csv"),
            "--nvml",
            &nvml,
            "--throughput",
            "1",
            "--gpu",
            "Tesla V100-SXM2-32GB",
        ],
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("was made on \"NVIDIA H100 80GB HBM3\""),
        "{stderr}"
    );
    let (ok, _, stderr) = coloc(
        &app,
        &[
            "workloads",
            "register",
            "w",
            "--mode",
            "inference",
            "--ncu",
            &empty,
        ],
    )
    .await;
    assert!(!ok, "--ncu without --nvml and --throughput");
    assert!(stderr.contains("--nvml"), "{stderr}");
    assert!(app
        .client
        .list_workloads(pb::ListWorkloadsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .workloads
        .is_empty());
}

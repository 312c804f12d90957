//! The published KACE V100 data, imported with the real `coloc import` command.

use std::{process::Command, sync::Arc};

use coloc::proto as pb;
use tempfile::TempDir;

use crate::helpers::{database_url, kace_dir, spawn_app_in};

const V100: &str = "Tesla V100-SXM2-32GB";

pub fn import(dir: &TempDir) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["import", "kace"])
        .arg(kace_dir())
        .args(["--gpu", V100, "--gpu-memory-gb", "32"])
        .args(["--database", &database_url(dir)])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn importing_the_kace_data_twice_adds_no_rows_and_ranks_real_workloads() {
    let dir = Arc::new(TempDir::new().unwrap());
    let first = import(&dir);
    assert!(first.contains("181 new of 181 pairs"), "{first}");
    let second = import(&dir);
    assert!(second.contains("0 new of 181 pairs"), "{second}");
    assert!(second.contains("0 registered, 0 updated"), "{second}");

    let mut app = spawn_app_in(dir).await;
    assert_eq!(app.count("observations").await, 181);
    assert_eq!(app.count("observation_members").await, 362);
    assert_eq!(
        app.count("models").await,
        2,
        "the KACE baseline, then the default kind"
    );

    // The model in use is coloc's per-member model.
    let model = app
        .client
        .get_model(pb::GetModelRequest {
            gpu: String::new(),
            version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (model.gpu.as_str(), model.version, model.kind.as_str()),
        (V100, 2, "member-ridge-gbt")
    );
    assert_eq!(model.observations, 181);

    // The KACE baseline is visible: a linear model on the ten summed metrics.
    let baseline = app
        .client
        .get_model(pb::GetModelRequest {
            gpu: V100.into(),
            version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(baseline.kind, "kace-linear");
    assert_eq!(baseline.observations, 181);
    assert_eq!(baseline.coefficients.len(), 10);
    assert!(baseline.coefficients.iter().all(|c| c.value.is_finite()));
    // The same least-squares fit an independent solver gives on these 181 pairs.
    assert!((baseline.r2 - 0.888614).abs() < 1e-5, "{}", baseline.r2);
    assert!(
        (baseline.intercept - (-12.435977)).abs() < 1e-4,
        "{}",
        baseline.intercept
    );
    assert!(model.r2 > baseline.r2, "{} vs {}", model.r2, baseline.r2);

    let workload = app
        .client
        .get_workload(pb::GetWorkloadRequest {
            name: "bert-base-cased_batch8-inf".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(workload.model, "bert-base-cased");
    assert_eq!(workload.batch_size, 8);
    assert_eq!(workload.mode(), pb::WorkloadMode::Inference);
    assert_eq!(workload.profiles[0].source(), pb::ProfileSource::Imported);
    assert_eq!(workload.profiles[0].gpu_memory_gb, 32.0);

    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "whisper-large-v2_batch16-inf".into(),
            // The KACE paper's ordering, with pairs predicted to lose kept.
            objective: Some(pb::Objective::ThroughputSum as i32),
            include_below_break_even: true,
            policy: Some(crate::helpers::open_policy()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ranked.ranked.len() >= 20, "{}", ranked.ranked.len());
    for pair in ranked.ranked.windows(2) {
        assert!(pair[0].predicted_throughput_sum >= pair[1].predicted_throughput_sum);
    }
    // whisper b16 uses 15.4 GB: every pair that fits in 32 GB is ranked, none that does not.
    for candidate in &ranked.ranked {
        assert!(
            candidate.memory_gb <= 32.0 && candidate.fits_memory,
            "{candidate:?}"
        );
    }
    for skipped in &ranked.skipped {
        assert_eq!(
            skipped.code(),
            pb::SkipReason::ExceedsGpuMemory,
            "{skipped:?}"
        );
    }
}

/// Runs the coloc binary without blocking the test's runtime, which also serves the app.
async fn coloc(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn importing_into_a_running_service_goes_through_its_api_and_rank_works_at_once() {
    let mut app = spawn_app_in(Arc::new(TempDir::new().unwrap())).await;
    let kace = kace_dir();
    let addr = app.addr.to_string();

    // Writing the file behind the running server's back is refused, and writes nothing.
    let direct = coloc(&[
        "import",
        "kace",
        kace.to_str().unwrap(),
        "--gpu",
        V100,
        "--gpu-memory-gb",
        "32",
        "--database",
        &database_url(&app.dir),
    ])
    .await;
    assert!(!direct.status.success());
    let error = String::from_utf8_lossy(&direct.stderr);
    assert!(error.contains("held by a running coloc serve"), "{error}");
    assert!(error.contains("--addr"), "{error}");
    assert_eq!(app.count("workloads").await, 0);

    // Through the API: the same summary as the direct import.
    let first = coloc(&[
        "import",
        "kace",
        kace.to_str().unwrap(),
        "--gpu",
        V100,
        "--gpu-memory-gb",
        "32",
        "--addr",
        &addr,
    ])
    .await;
    let out = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        out.contains("29 registered, 0 updated, 0 unchanged"),
        "{out}"
    );
    assert!(out.contains("181 new of 181 pairs"), "{out}");
    assert!(
        out.contains("(kace-linear)") && out.contains("(member-ridge-gbt)"),
        "{out}"
    );

    // The running server knows everything at once: no restart.
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "whisper-large-v2_batch16-inf".into(),
            // whisper b16 loses with every partner: by default none would be ranked.
            include_below_break_even: true,
            policy: Some(crate::helpers::open_policy()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ranked.ranked.len() >= 20, "{}", ranked.ranked.len());
    assert_eq!(ranked.model_version, 2);

    // Idempotent: a second import adds nothing and trains nothing.
    let second = coloc(&[
        "import",
        "kace",
        kace.to_str().unwrap(),
        "--gpu",
        V100,
        "--gpu-memory-gb",
        "32",
        "--addr",
        &addr,
    ])
    .await;
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(
        out.contains("0 registered, 0 updated, 29 unchanged"),
        "{out}"
    );
    assert!(out.contains("0 new of 181 pairs"), "{out}");
    assert_eq!(app.count("observations").await, 181);
    assert_eq!(app.count("models").await, 2);
}

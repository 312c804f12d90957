//! The H100 starter dataset (`datasets/h100/`, measured by coloc on a real H100): it
//! imports as any KACE-format folder does, trains, and Rank's default (normalized sum)
//! picks partners for each of its six workloads that the measured pairs bear out, at least
//! 0.9 of the best partner on average (the target of the real-GPU work).

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use coloc::{domain::GpuName, import::import_kace, proto as pb};
use tempfile::TempDir;

use crate::helpers::spawn_app_in;

const H100: &str = "NVIDIA H100 80GB HBM3";

fn starter_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/h100")
}

/// Each (workload, workload) pair's measured normalized sums, from the files themselves.
fn measured_normalized() -> HashMap<(String, String), Vec<f64>> {
    let mut exclusive = HashMap::new();
    for row in csv::Reader::from_path(starter_dir().join("system_metrics.csv"))
        .unwrap()
        .records()
    {
        let row = row.unwrap();
        exclusive.insert(row[0].to_string(), row[1].parse::<f64>().unwrap());
    }
    let mut reader = csv::Reader::from_path(starter_dir().join("pairs.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (w1, w2, t1, t2) = (
        column("workload1"),
        column("workload2"),
        column("w1throughput"),
        column("w2throughput"),
    );
    let mut sums: HashMap<(String, String), Vec<f64>> = HashMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        let (a, b) = (row[w1].to_string(), row[w2].to_string());
        let value = row[t1].parse::<f64>().unwrap() / exclusive[&a]
            + row[t2].parse::<f64>().unwrap() / exclusive[&b];
        sums.entry((a.clone(), b.clone())).or_default().push(value);
        if a != b {
            sums.entry((b, a)).or_default().push(value);
        }
    }
    sums
}

#[tokio::test]
async fn the_h100_starter_dataset_imports_trains_and_ranks_its_workloads() {
    let mut app = spawn_app_in(Arc::new(TempDir::new().unwrap())).await;
    let gpu = GpuName::parse("gpu", H100).unwrap();
    let summary = import_kace(&app.advisor, &starter_dir(), &gpu, 79.6474609375)
        .await
        .unwrap();
    assert_eq!(summary.workloads_registered, 6);
    assert_eq!(summary.observations_new, 42);
    assert!(summary.incomplete_workloads.is_empty());

    let measured = measured_normalized();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let targets = [
        "bert-encoder_batch16-inf",
        "bmm-2048_batch8-inf",
        "gpt-decoder_batch4-inf",
        "resnet18_batch32-train",
        "resnet50_batch32-train",
        "vit-b-16_batch8-inf",
    ];
    let mut scores = Vec::new();
    for target in targets {
        let ranked = app
            .client
            .rank(pb::RankRequest {
                target: target.into(),
                gpu: H100.into(),
                include_below_break_even: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .ranked;
        // Every workload is a candidate, a copy of the target included.
        assert_eq!(ranked.len(), 6, "{target}: {ranked:?}");
        let value = |partner: &str| mean(&measured[&(target.to_string(), partner.to_string())]);
        let best = targets.iter().map(|p| value(p)).fold(f64::MIN, f64::max);
        scores.push(value(&ranked[0].workload) / best);
    }
    let score = mean(&scores);
    assert!(score >= 0.9, "mean score {score}: {scores:?}");
}

//! `coloc backup` on the database of a running service under write load: the copy is
//! consistent, and a service started on it has the same workloads, models and champion.

use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

use coloc::proto as pb;
use tempfile::TempDir;

use crate::helpers::{database_url, report_request, spawn_app_in, trained_app, GPU};

fn run(a: &str, b: &str, t: f64, at: i64) -> pb::ReportColocationRequest {
    report_request(GPU, &[(a, t), (b, t)], at)
}

#[tokio::test]
async fn a_backup_taken_under_write_load_restores_to_the_same_workloads_models_and_champion() {
    let (app, workloads) = trained_app(6).await;
    let names: Vec<String> = workloads.iter().map(|(n, _)| n.clone()).collect();
    let runs_before = app.count("observations").await;

    // Reports keep arriving while the backup runs.
    let writing = Arc::new(AtomicBool::new(true));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let writer = {
        let (writing, acknowledged) = (writing.clone(), acknowledged.clone());
        let mut client = app.client.clone();
        let names = names.clone();
        tokio::spawn(async move {
            let mut at = 1_700_000_000;
            while writing.load(Ordering::Relaxed) {
                at += 1;
                let a = &names[at as usize % names.len()];
                let b = &names[(at as usize / 7) % names.len()];
                client.report_colocation(run(a, b, 1.0, at)).await.unwrap();
                acknowledged.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while acknowledged.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let backups = TempDir::new().unwrap();
    let copy = backups.path().join("coloc.db");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["backup", copy.to_str().unwrap(), "--json"])
        .args(["--database", &database_url(&app.dir)])
        .output()
        .await
        .unwrap();
    let during = acknowledged.load(Ordering::Relaxed);
    writing.store(false, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["workloads"], 6);

    // A second backup to the same file is refused; the first copy is untouched.
    let again = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["backup", copy.to_str().unwrap()])
        .args(["--database", &database_url(&app.dir)])
        .output()
        .await
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));

    let mut original = app.client.clone();
    let original_model = original
        .get_model(pb::GetModelRequest::default())
        .await
        .unwrap()
        .into_inner();

    // Restore: a service started on the copy.
    let restored_dir = Arc::new(backups);
    let mut restored = spawn_app_in(restored_dir).await;
    let listed = restored
        .client
        .list_workloads(pb::ListWorkloadsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed
            .workloads
            .iter()
            .map(|w| w.name.clone())
            .collect::<Vec<_>>(),
        names
    );
    let model = restored
        .client
        .get_model(pb::GetModelRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (model.version, model.kind, model.observations),
        (
            original_model.version,
            original_model.kind,
            original_model.observations
        )
    );
    // The copy holds the runs of one moment: every run stored before the backup began, and
    // no more than were acknowledged by the time it ended.
    let runs = restored.count("observations").await;
    assert!(
        runs >= runs_before + 20 && runs <= runs_before + during as i64,
        "{runs} runs in the copy; {runs_before} before, {during} reported during"
    );
    // Reports still work on the restored store.
    restored
        .client
        .report_colocation(run(&names[0], &names[1], 2.0, 1))
        .await
        .unwrap();
}

//! `coloc export kace`: the published KACE V100 data imported with the real `coloc import`,
//! exported with the real binary, read back with `KaceDataset::read` and imported again;
//! what it refuses; what it counts instead of exporting; and that it runs beside a live
//! server on the same database.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::Arc,
};

use coloc::{
    dataset::{KaceDataset, KaceWorkload},
    domain::{
        ColocatedMember, GpuName, KernelMetrics, NewWorkload, Observation, WorkloadMode,
        WorkloadName,
    },
    proto as pb,
    store::{ObservationSource, Store},
};
use tempfile::TempDir;

use crate::{
    helpers::{database_url, kace_dir, report_request, spawn_app_in},
    kace::import,
};

const V100: &str = "Tesla V100-SXM2-32GB";

fn export(database: &TempDir, dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["export", "kace"])
        .arg(dir)
        .args(["--gpu", V100, "--database", &database_url(database)])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A workload's name and its ten metrics (the model's features, all of them), as bits.
fn workload_bits(w: &KaceWorkload) -> (String, [u64; 10]) {
    (
        w.name.to_string(),
        coloc::model::Features::from_metrics(&w.kernel, &w.system)
            .0
            .map(f64::to_bits),
    )
}

fn pair_bits(data: &KaceDataset) -> Vec<(String, String, u64, u64)> {
    data.pairs
        .iter()
        .map(|p| {
            (
                p.workload1.clone(),
                p.workload2.clone(),
                p.throughput1.to_bits(),
                p.throughput2.to_bits(),
            )
        })
        .collect()
}

fn first_line(path: PathBuf) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn an_exported_kace_import_reads_back_with_the_same_workloads_and_pairs_bit_for_bit() {
    let database = TempDir::new().unwrap();
    let imported = import(&database);
    assert!(imported.contains("181 new of 181 pairs"), "{imported}");
    let out = TempDir::new().unwrap();
    let dir = out.path().join("v100");
    let printed = stdout_of(&export(&database, &dir, &[]));
    assert_eq!(
        printed,
        format!(
            "exported 29 workloads and 181 pairs of {V100} to {}\n",
            dir.display()
        )
    );

    let original = KaceDataset::read(&kace_dir()).unwrap();
    let exported = KaceDataset::read(&dir).unwrap();
    // Workloads: the 29 with both kernel and system metrics (the 23 with only one are not
    // imported, so not exported), by name, every metric bit for bit.
    assert_eq!(original.workloads.len(), 29);
    assert!(exported.incomplete_workloads.is_empty());
    assert_eq!(
        exported
            .workloads
            .iter()
            .map(workload_bits)
            .collect::<Vec<_>>(),
        original
            .workloads
            .iter()
            .map(workload_bits)
            .collect::<Vec<_>>()
    );
    // Pairs: pairs.csv has 181 rows and the import stores 181 runs. Imported runs are all
    // at time 0, so two rows with the same members and throughputs would share a
    // fingerprint and be stored once; no two rows of the published file do (the import
    // says "181 new of 181"). The export writes one row per stored run, oldest first, and
    // the import stored them in file order: the same rows, in the same order.
    let original_pairs = pair_bits(&original);
    assert_eq!(original_pairs.len(), 181);
    assert_eq!(pair_bits(&exported), original_pairs);

    // The published headers, less system_metrics.csv's Exclusive50 (a measurement at 50 %
    // MPS threads that coloc does not keep).
    for file in ["kernel_metrics.csv", "pairs.csv"] {
        assert_eq!(
            first_line(dir.join(file)),
            first_line(kace_dir().join(file)),
            "{file}"
        );
    }
    assert_eq!(
        first_line(dir.join("system_metrics.csv")),
        first_line(kace_dir().join("system_metrics.csv")).replace(",Exclusive50", "")
    );
    // idx1/idx2: 1-based positions in kernel_metrics.csv.
    let pairs = std::fs::read_to_string(dir.join("pairs.csv")).unwrap();
    let names: Vec<&str> = exported.workloads.iter().map(|w| w.name.as_str()).collect();
    for line in pairs.lines().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let idx1: usize = fields[14].parse().unwrap();
        let idx2: usize = fields[15].parse().unwrap();
        assert_eq!((names[idx1 - 1], names[idx2 - 1]), (fields[12], fields[13]));
    }
}

#[test]
fn an_export_imports_again_into_a_fresh_store_with_the_same_workloads_and_pairs() {
    let database = TempDir::new().unwrap();
    import(&database);
    let out = TempDir::new().unwrap();
    let first = out.path().join("first");
    stdout_of(&export(&database, &first, &[]));

    let again = TempDir::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["import", "kace"])
        .arg(&first)
        .args(["--database", &database_url(&again)])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let reimported = stdout_of(&output);
    assert!(
        reimported.contains("workloads: 29 registered, 0 updated, 0 unchanged; 0 skipped"),
        "{reimported}"
    );
    assert!(
        reimported.contains("181 new of 181 pairs (0 already stored); 0 pairs skipped"),
        "{reimported}"
    );

    // Exported once more from the second store: the same bytes.
    let second = out.path().join("second");
    stdout_of(&export(&again, &second, &[]));
    for file in ["kernel_metrics.csv", "system_metrics.csv", "pairs.csv"] {
        assert_eq!(
            std::fs::read(first.join(file)).unwrap(),
            std::fs::read(second.join(file)).unwrap(),
            "{file}"
        );
    }
}

#[test]
fn export_refuses_existing_dataset_files_unknown_gpu_models_and_missing_databases() {
    let database = TempDir::new().unwrap();
    import(&database);
    let out = TempDir::new().unwrap();
    let pairs = out.path().join("pairs.csv");
    std::fs::write(&pairs, "mine\n").unwrap();

    let refused = export(&database, out.path(), &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains(&format!("{} already exists", pairs.display())),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&pairs).unwrap(), "mine\n");
    let left: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["pairs.csv"],
        "nothing else written, no temporary file"
    );

    // --force replaces it.
    stdout_of(&export(&database, out.path(), &["--force"]));
    assert_eq!(KaceDataset::read(out.path()).unwrap().pairs.len(), 181);

    // An unknown GPU model names the ones the store knows, and writes nothing.
    let elsewhere = out.path().join("a100");
    let unknown = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["export", "kace"])
        .arg(&elsewhere)
        .args(["--gpu", "NVIDIA A100-SXM4-80GB"])
        .args(["--database", &database_url(&database)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success());
    assert!(
        stderr.contains("no workload has a profile on GPU model \"NVIDIA A100-SXM4-80GB\"")
            && stderr.contains(&format!("the store has profiles on: \"{V100}\"")),
        "{stderr}"
    );
    assert!(!elsewhere.exists());

    // A missing database is an error, never created.
    let empty = TempDir::new().unwrap();
    let missing = export(&empty, &elsewhere, &[]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

fn member(name: &str, throughput: f64) -> ColocatedMember {
    ColocatedMember {
        workload: WorkloadName::parse("workload", name).unwrap(),
        throughput,
        job_id: String::new(),
    }
}

fn reported(members: &[(&str, f64)], at: i64) -> pb::ReportColocationRequest {
    report_request(V100, members, at)
}

#[tokio::test]
async fn runs_that_the_pair_format_cannot_hold_are_counted_and_export_runs_beside_a_live_server() {
    let database = Arc::new(TempDir::new().unwrap());
    import(&database);
    // Written directly, before any server holds the file: a profile without kernel
    // metrics, and a pair naming it (not exportable: KACE's pairs.csv repeats both
    // members' kernel metrics).
    let store = Store::open(&database_url(&database)).await.unwrap();
    let gpu = GpuName::parse("gpu", V100).unwrap();
    let stored = store
        .get_workload("bert-base-cased_batch8-inf")
        .await
        .unwrap()
        .unwrap();
    let mut partial = stored.profiles[0].clone();
    partial.kernel = KernelMetrics::MISSING;
    partial.kernel_missing = true;
    store
        .register_workload(
            &NewWorkload {
                name: WorkloadName::parse("name", "no-ncu_batch1-inf").unwrap(),
                mode: WorkloadMode::Inference,
                model: "no-ncu".into(),
                batch_size: 1,
                labels: Default::default(),
                profile: Some(partial),
                launch: None,
                profile_on: Vec::new(),
            },
            1,
        )
        .await
        .unwrap();
    let half_profiled = Observation::new(
        gpu.clone(),
        vec![
            member("no-ncu_batch1-inf", 3.0),
            member("bert-base-cased_batch8-inf", 50.0),
        ],
        1_700_000_000_000,
    )
    .unwrap();
    store
        .insert_observations(&[half_profiled], ObservationSource::Reported, 1)
        .await
        .unwrap();
    store.close().await;

    // A live server on the same file (it holds the database lock), taking reports.
    let mut app = spawn_app_in(database.clone()).await;
    let three = [
        ("bert-base-cased_batch8-inf", 40.0),
        ("wav2vec2-base-960h_batch2-inf", 15.0),
        ("vit-base-patch16-224_batch8-inf", 20.0),
    ];
    app.client
        .report_colocation(reported(&three, 1_700_000_100))
        .await
        .unwrap();
    // A pair measured under time-slicing: the format's pairs are MPS runs.
    let sliced = [
        ("bert-base-cased_batch8-inf", 30.0),
        ("vit-base-patch16-224_batch8-inf", 12.0),
    ];
    app.client
        .report_colocation(pb::ReportColocationRequest {
            sharing_mode: Some(pb::SharingMode::TimeSlicing as i32),
            ..reported(&sliced, 1_700_000_150)
        })
        .await
        .unwrap();
    let newest = [
        ("wav2vec2-base-960h_batch2-inf", 16.25),
        ("bert-base-cased_batch8-inf", 61.5),
    ];
    app.client
        .report_colocation(reported(&newest, 1_700_000_200))
        .await
        .unwrap();

    let out = TempDir::new().unwrap();
    let printed = stdout_of(&export(&database, out.path(), &[]));
    assert_eq!(
        printed,
        format!(
            "exported 29 workloads and 182 pairs of {V100} to {}\n\
             1 workloads profiled on {V100} without kernel metrics not exported\n\
             1 runs of 3 or more members not exported\n\
             1 pairs not exported: a member has no complete profile on {V100}\n\
             1 runs measured under time-slicing not exported: the KACE format holds MPS runs\n",
            out.path().display()
        )
    );
    let exported = KaceDataset::read(out.path()).unwrap();
    assert_eq!(exported.pairs.len(), 182);
    let last = exported.pairs.last().unwrap();
    assert_eq!(
        (
            last.workload1.as_str(),
            last.workload2.as_str(),
            last.throughput1,
            last.throughput2
        ),
        (newest[0].0, newest[1].0, newest[0].1, newest[1].1),
        "oldest first: the newest run last, members in report order"
    );
    assert!(exported
        .workloads
        .iter()
        .all(|w| w.name.as_str() != "no-ncu_batch1-inf"));

    // The server kept serving and writing throughout.
    app.client
        .report_colocation(reported(&newest, 1_700_000_300))
        .await
        .unwrap();
    app.stop().await;
}

//! `scripts/fetch-data.sh --from DIR`: the layout step of fetching the public data, from
//! local clones (no network): every file lands where the tools look, byte for byte; a data
//! set already there is kept; a clone that lacks a file lays out nothing and names it.

use std::{path::Path, process::Command};

const SOURCES: [(&str, &str); 9] = [
    (
        "KACE-artifact/profiling/kernel_metrics/output_KACE/kernel_total/bert.csv",
        "kace-v100/profiling/kernel_metrics/output_KACE/kernel_total/bert.csv",
    ),
    (
        "KACE-artifact/profiling/system_metrics/KACE/baseline_labels.csv",
        "kace-v100/profiling/system_metrics/KACE/baseline_labels.csv",
    ),
    (
        "KACE-artifact/output/dataset/MPS100/MPS100_kernel_labels_targetMPS100.csv",
        "kace-v100/output/dataset/MPS100/MPS100_kernel_labels_targetMPS100.csv",
    ),
    (
        "KACE-artifact/scripts/multiinstance/dataset/KACE/0907_total_labels_comb4_batch2-8_targetMPS100.csv",
        "kace-4way/artifact/0907_total_labels_comb4_batch2-8_targetMPS100.csv",
    ),
    (
        "KACE-artifact/scripts/multiinstance/dataset/comb3/batch2-8/MPS100/unseen_partition_batch/rand10/KACE/trainbatch2/training_set.csv",
        "kace-3way/artifact/training_set.csv",
    ),
    (
        "KACE-artifact/scripts/multiinstance/dataset/comb3/batch2-8/MPS100/unseen_partition_batch/rand10/KACE/trainbatch2/testing_set.csv",
        "kace-3way/artifact/testing_set.csv",
    ),
    (
        "clusterdata/cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv",
        "alibaba-gpu-v2023/openb_pod_list_default.csv",
    ),
    (
        "clusterdata/cluster-trace-gpu-v2023/csv/openb_pod_list_gpushare100.csv",
        "alibaba-gpu-v2023/openb_pod_list_gpushare100.csv",
    ),
    (
        "clusterdata/cluster-trace-gpu-v2023/csv/openb_node_list_gpu_node.csv",
        "alibaba-gpu-v2023/openb_node_list_gpu_node.csv",
    ),
];

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-data.sh")
}

/// The artifact's own first rows of its 3-way files (tests/fixtures/kace-artifact-comb3), from
/// which the script derives runs.csv; the other files' contents are only copied.
fn content(i: usize, source: &str) -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kace-artifact-comb3");
    match i {
        4 => std::fs::read_to_string(fixtures.join("training_set.csv")).unwrap(),
        5 => std::fs::read_to_string(fixtures.join("testing_set.csv")).unwrap(),
        _ => format!("file {i}: {source}\n"),
    }
}

fn clones(dir: &Path, leave_out: Option<usize>) {
    for (i, (source, _)) in SOURCES.iter().enumerate() {
        if Some(i) == leave_out {
            continue;
        }
        let path = dir.join(source);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content(i, source)).unwrap();
    }
}

fn fetch(from: &Path, dest: &Path) -> std::process::Output {
    Command::new("bash")
        .arg(script())
        .arg("--from")
        .arg(from)
        .arg(dest)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .unwrap()
}

#[test]
fn the_public_data_is_laid_out_where_the_tools_look_from_local_clones() {
    let from = tempfile::TempDir::new().unwrap();
    let dest = tempfile::TempDir::new().unwrap();
    clones(from.path(), None);
    let output = fetch(from.path(), dest.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (i, (source, target)) in SOURCES.iter().enumerate() {
        let laid = std::fs::read_to_string(dest.path().join(target))
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(laid, content(i, source));
    }
    three_way_runs_match_the_shared_ones(&dest.path().join("kace-3way/runs.csv"));
    // Where the tools look by default (relative to the repository: ../shared/data/...).
    for default in ["alibaba-gpu-v2023/openb_pod_list_default.csv", "kace-v100"] {
        assert!(dest.path().join(default).exists(), "{default}");
    }
    assert_eq!(stdout.matches("laid out:").count(), 4, "{stdout}");
    assert!(
        !dest.path().join(".sources").exists(),
        "--from fetched anyway"
    );

    // Again: every set is there already and kept as it is.
    std::fs::write(dest.path().join(SOURCES[6].1), "edited\n").unwrap();
    let again = fetch(from.path(), dest.path());
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout)
            .matches("kept:")
            .count(),
        4
    );
    assert_eq!(
        std::fs::read_to_string(dest.path().join(SOURCES[6].1)).unwrap(),
        "edited\n"
    );
}

#[test]
fn a_clone_that_lacks_a_file_lays_out_nothing_and_names_it() {
    let from = tempfile::TempDir::new().unwrap();
    let dest = tempfile::TempDir::new().unwrap();
    clones(from.path(), Some(7));
    let output = fetch(from.path(), dest.path());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("openb_pod_list_gpushare100.csv"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(dest.path()).unwrap().count(), 0);
}

/// The runs the script derived from the artifact's first rows are the runs of the shared
/// kace-3way/runs.csv with the same origin (training rows 1-2 are run ids 1-2, testing rows
/// 1-2 follow the 70 training runs: ids 71-72), column by column.
fn three_way_runs_match_the_shared_ones(derived: &Path) {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-3way/runs.csv");
    let shared =
        std::fs::read_to_string(&shared).unwrap_or_else(|e| panic!("{}: {e}", shared.display()));
    let derived = std::fs::read_to_string(derived).unwrap();
    let mut shared_lines = shared.lines();
    let mut derived_lines = derived.lines();
    assert_eq!(derived_lines.next(), shared_lines.next(), "the header");
    let shared_rows: Vec<&str> = shared_lines.collect();
    let derived_rows: Vec<&str> = derived_lines.collect();
    assert_eq!(derived_rows.len(), 4, "{derived}");
    for (row, shared_id) in derived_rows.iter().zip([1, 2, 71, 72]) {
        let got: Vec<&str> = row.split(',').collect();
        let want: Vec<&str> = shared_rows[shared_id - 1].split(',').collect();
        assert_eq!(want[0], shared_id.to_string());
        assert_eq!(got.len(), want.len(), "{row}");
        // Names, throughputs and the file as written; the sum to the last bits.
        assert_eq!(got[1..10], want[1..10], "{row}");
        assert_eq!(got[11], want[11], "{row}");
        let (got_sum, want_sum): (f64, f64) = (got[10].parse().unwrap(), want[10].parse().unwrap());
        assert!(
            (got_sum - want_sum).abs() <= 1e-9 * want_sum,
            "{got_sum} vs {want_sum}"
        );
    }
}

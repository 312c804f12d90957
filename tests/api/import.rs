//! `coloc import kace` on hostile files: a symlink to /dev/zero, a folder, one endless
//! line. Each fails at once with a message naming the file, and leaves no new database.
//! And an import always names its GPU model: the flags or the dataset's `gpu.json`, never
//! a default; flags against `gpu.json`, or a memory size against the store's, are refused.

use tokio::process::Command;

use crate::helpers::kace_dir;

/// A copy of the KACE dataset whose pairs.csv is replaced by `make`.
fn dataset_with(dir: &std::path::Path, make: impl FnOnce(&std::path::Path)) {
    for entry in std::fs::read_dir(kace_dir()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "pairs.csv" {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    make(&dir.join("pairs.csv"));
}

#[tokio::test]
async fn hostile_dataset_files_fail_the_import_and_leave_no_database() {
    type Make = fn(&std::path::Path);
    let cases: [(&str, Make, &str); 3] = [
        (
            "dev zero",
            |p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
            "not a regular file",
        ),
        (
            "folder",
            |p| std::fs::create_dir(p).unwrap(),
            "not a regular file",
        ),
        (
            "endless line",
            |p| std::fs::write(p, "a".repeat(200_000)).unwrap(),
            "longer than",
        ),
    ];
    for (what, make, expected) in cases {
        let data = tempfile::TempDir::new().unwrap();
        dataset_with(data.path(), make);
        let db_dir = tempfile::TempDir::new().unwrap();
        let db = db_dir.path().join("new.db");
        let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
            .args(["import", "kace"])
            .arg(data.path())
            .args(["--gpu", "Tesla V100-SXM2-32GB", "--gpu-memory-gb", "32"])
            .arg("--database")
            .arg(format!("sqlite://{}", db.display()))
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what}: imported");
        assert!(stderr.contains(expected), "{what}: {stderr}");
        assert!(!stderr.contains("backtrace"), "{what}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(db_dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{what}: left {left:?}");
    }
}

const V100: &str = "Tesla V100-SXM2-32GB";

/// `coloc import kace DIR ARGS... --database` a database in `db_dir`: (success, stdout,
/// stderr).
async fn import(
    dir: &std::path::Path,
    args: &[&str],
    db_dir: &std::path::Path,
) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["import", "kace"])
        .arg(dir)
        .args(args)
        .arg("--database")
        .arg(format!("sqlite://{}", db_dir.join("coloc.db").display()))
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn h100_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/h100")
}

#[tokio::test]
async fn a_dataset_that_names_no_gpu_needs_the_flags_and_nothing_is_written_without_them() {
    let db_dir = tempfile::TempDir::new().unwrap();
    let (ok, _, stderr) = import(&kace_dir(), &[], db_dir.path()).await;
    assert!(!ok);
    assert!(
        stderr.contains("--gpu") && stderr.contains(V100),
        "{stderr}"
    );
    let (ok, _, stderr) = import(&kace_dir(), &["--gpu", V100], db_dir.path()).await;
    assert!(!ok);
    assert!(stderr.contains("--gpu-memory-gb"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(db_dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left {left:?}");
}

#[tokio::test]
async fn the_h100_set_files_itself_under_its_own_gpu_and_refuses_another() {
    let db_dir = tempfile::TempDir::new().unwrap();
    let (ok, _, stderr) = import(&h100_dir(), &["--gpu", V100], db_dir.path()).await;
    assert!(!ok);
    assert!(stderr.contains("NVIDIA H100 80GB HBM3"), "{stderr}");
    let (ok, _, stderr) = import(&h100_dir(), &["--gpu-memory-gb", "32"], db_dir.path()).await;
    assert!(!ok, "a memory size against gpu.json was taken");
    assert!(stderr.contains("79.6474609375"), "{stderr}");
    let (ok, stdout, stderr) = import(&h100_dir(), &[], db_dir.path()).await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("observations on NVIDIA H100 80GB HBM3"),
        "{stdout}"
    );
}

#[tokio::test]
async fn another_memory_size_for_a_known_gpu_model_is_refused_and_changes_nothing() {
    let db_dir = tempfile::TempDir::new().unwrap();
    let v100 = ["--gpu", V100, "--gpu-memory-gb", "32"];
    let (ok, _, stderr) = import(&kace_dir(), &v100, db_dir.path()).await;
    assert!(ok, "{stderr}");
    let database = db_dir.path().join("coloc.db");
    let before = std::fs::read(&database).unwrap();
    let (ok, _, stderr) = import(
        &h100_dir(),
        &["--gpu", V100, "--gpu-memory-gb", "80"],
        db_dir.path(),
    )
    .await;
    assert!(!ok, "H100 data went under the V100's name");
    // gpu.json says H100: refused before the store is opened.
    assert!(stderr.contains("NVIDIA H100 80GB HBM3"), "{stderr}");
    let (ok, _, stderr) = import(
        &kace_dir(),
        &["--gpu", V100, "--gpu-memory-gb", "80"],
        db_dir.path(),
    )
    .await;
    assert!(!ok, "another memory size was taken");
    assert!(
        stderr.contains("32 GB") && stderr.contains("80 GB"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&database).unwrap(),
        before,
        "the store changed"
    );
}

#[tokio::test]
async fn an_import_prints_its_summary_without_the_services_info_lines() {
    let db_dir = tempfile::TempDir::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["import", "kace"])
        .arg(h100_dir())
        .arg("--database")
        .arg(format!(
            "sqlite://{}",
            db_dir.path().join("coloc.db").display()
        ))
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("INFO"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("model: version 2"), "{stdout}");
}

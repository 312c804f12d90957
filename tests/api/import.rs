//! `coloc import kace` on hostile files: a symlink to /dev/zero, a folder, one endless
//! line. Each fails at once with a message naming the file, and leaves no new database.

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

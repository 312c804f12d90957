//! Moving a SQLite store to PostgreSQL as docs/storage.md says: `coloc export kace` from the
//! SQLite file, `coloc import kace` into a fresh PostgreSQL database (the shared server,
//! `store_url`), then `coloc export kace` from PostgreSQL gives the same bytes as from
//! SQLite. Skipped (with a message) where no PostgreSQL server answers, except under CI.

use std::{path::Path, process::Command};

use tempfile::TempDir;

use crate::helpers::kace_dir;

const V100: &str = "Tesla V100-SXM2-32GB";

fn coloc(args: &[&str], database: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(args)
        .args(["--database", database])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "coloc {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_sqlite_store_moves_to_postgresql_through_export_and_import() {
    let probe = std::net::TcpStream::connect("127.0.0.1:5432");
    if probe.is_err() {
        crate::faults::unavailable("no PostgreSQL server at 127.0.0.1:5432");
        return;
    }
    let sqlite_dir = TempDir::new().unwrap();
    let sqlite = format!("sqlite://{}", sqlite_dir.path().join("coloc.db").display());
    coloc(
        &[
            "import",
            "kace",
            path(&kace_dir()),
            "--gpu",
            V100,
            "--gpu-memory-gb",
            "32",
        ],
        &sqlite,
    );
    let out = TempDir::new().unwrap();
    let from_sqlite = out.path().join("from-sqlite");
    coloc(
        &["export", "kace", path(&from_sqlite), "--gpu", V100],
        &sqlite,
    );

    let postgres_dir = TempDir::new().unwrap();
    let postgres = crate::store_url::postgres_url(postgres_dir.path());
    let imported = coloc(&["import", "kace", path(&from_sqlite)], &postgres);
    assert!(
        imported.contains("workloads: 29 registered, 0 updated, 0 unchanged; 0 skipped"),
        "{imported}"
    );
    assert!(
        imported.contains("181 new of 181 pairs (0 already stored); 0 pairs skipped"),
        "{imported}"
    );
    let from_postgres = out.path().join("from-postgres");
    coloc(
        &["export", "kace", path(&from_postgres), "--gpu", V100],
        &postgres,
    );
    for file in [
        "kernel_metrics.csv",
        "system_metrics.csv",
        "pairs.csv",
        "gpu.json",
    ] {
        assert_eq!(
            std::fs::read(from_sqlite.join(file)).unwrap(),
            std::fs::read(from_postgres.join(file)).unwrap(),
            "{file}"
        );
    }
    crate::store_url::drop_database(postgres_dir.path());
}

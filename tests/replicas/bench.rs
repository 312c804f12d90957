//! `coloc bench` against replicas: two in-process servers on a fresh PostgreSQL database,
//! the echo floor beside Rank, in a run of about five seconds, then three `coloc serve`
//! processes on the same database; and the bench's bulk seeding
//! of PostgreSQL writes the runs SQLite's store path writes for the same seed.

use std::{collections::BTreeSet, process::Command};

use sqlx::{Connection, PgConnection, SqliteConnection};

use crate::pg::FreshDatabase;

/// `coloc bench ARGS --json`: its JSON report, or its error output when it failed.
fn bench(args: &[&str]) -> Result<serde_json::Value, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    if !output.status.success() {
        return Err(stderr);
    }
    let stdout = String::from_utf8(output.stdout).unwrap();
    let start = stdout
        .find('{')
        .ok_or_else(|| format!("no JSON: {stdout} {stderr}"))?;
    Ok(serde_json::from_str(&stdout[start..]).unwrap())
}

const SMALL_STORE: [&str; 8] = [
    "--workloads",
    "30",
    "--observations",
    "120",
    "--crowded-share",
    "0.3",
    "--seed",
    "5",
];

/// (observed_at_ms, recorded_at_ms, source, fingerprint, gpu_id, members as
/// position:workload:throughput bits:job_id) of every seeded run (the report scenario's
/// runs come later on the bench's clock, from 1.7e12 ms).
type Run = (i64, i64, String, String, String, String);

const SEEDED_RUNS: &str = "SELECT o.observed_at_ms, o.recorded_at_ms, o.source, o.fingerprint, \
     o.gpu_id, m.position, m.workload, m.throughput, m.job_id FROM observations o \
     JOIN observation_members m ON m.observation_id = o.id \
     WHERE o.observed_at_ms < 1000000000000 ORDER BY o.observed_at_ms, m.position";

/// One row of [`SEEDED_RUNS`]: a run's columns, then one member's.
type Row = (i64, i64, String, String, String, i64, String, f64, String);

fn runs(rows: Vec<Row>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (at, recorded, source, fingerprint, gpu_id, position, workload, throughput, job) in rows {
        let member = format!("{position}:{workload}:{}:{job};", throughput.to_bits());
        match runs.last_mut() {
            Some(last) if last.0 == at => last.5.push_str(&member),
            _ => runs.push((at, recorded, source, fingerprint, gpu_id, member)),
        }
    }
    runs
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_measures_two_replicas_and_the_echo_floor_on_postgres() {
    // More than one replica needs PostgreSQL: refused before anything starts.
    let refused = bench(&["--replicas", "2", "--scenarios", "health"]).unwrap_err();
    assert!(refused.contains("--postgres"), "{refused}");

    let Some(db) = FreshDatabase::create("bench").await else {
        return;
    };
    let scenarios = ["health", "echo_rank_10", "rank_10", "report"];
    let mut args = vec!["--postgres", &db.url, "--replicas", "2"];
    args.extend(SMALL_STORE);
    let joined = scenarios.join(",");
    args.extend([
        "-c",
        "4",
        "--connections",
        "2",
        "-t",
        "0.5",
        "--warmup",
        "0.2",
    ]);
    args.extend(["--scenarios", &joined]);
    let report = bench(&args).unwrap();
    let setup = &report["setup"];
    assert_eq!(setup["store"], "postgres", "{report}");
    assert_eq!(setup["replicas"], 2, "{report}");
    assert_eq!(setup["connections"], 2, "{report}");
    assert_eq!(setup["seed_runs_by"], "bulk", "{report}");
    assert_eq!(setup["train_observations"], 120, "{report}");
    assert!(setup["echo_rank_10_answer_bytes"].as_u64().unwrap() > 100);
    assert!(setup["echo_rank_10_request_bytes"].as_u64().unwrap() > 10 * 7);
    for scenario in scenarios {
        let result = &report[scenario];
        assert!(
            result["rps"].as_f64().unwrap() > 0.0,
            "{scenario}: {report}"
        );
        assert_eq!(result["errors"], 0, "{scenario}: {report}");
    }
    let vs_echo = &report["vs_echo"]["rank_10"];
    assert!(vs_echo["rps_ratio"].as_f64().unwrap() > 0.0, "{report}");
    assert!(vs_echo["p99_ratio"].as_f64().unwrap() > 0.0, "{report}");

    // Three replicas as `coloc serve` processes on the same (now seeded) database.
    let mut args = vec![
        "--postgres",
        &db.url,
        "--replicas",
        "3",
        "--replica-processes",
    ];
    args.extend(SMALL_STORE);
    args.extend([
        "-c",
        "6",
        "--connections",
        "3",
        "-t",
        "0.5",
        "--warmup",
        "0.2",
        "--scenarios",
        "health,rank_10,report",
    ]);
    let processes = bench(&args).unwrap();
    assert_eq!(processes["setup"]["replicas"], 3, "{processes}");
    assert_eq!(processes["setup"]["replica_processes"], true, "{processes}");
    for scenario in ["health", "rank_10", "report"] {
        let result = &processes[scenario];
        assert!(
            result["rps"].as_f64().unwrap() > 0.0,
            "{scenario}: {processes}"
        );
        assert_eq!(result["errors"], 0, "{scenario}: {processes}");
    }

    // The same seed through the store's own path on SQLite: the same runs, row for row.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bench.db");
    let mut args = vec!["--database", file.to_str().unwrap()];
    args.extend(SMALL_STORE);
    args.extend([
        "-c",
        "1",
        "--connections",
        "1",
        "-t",
        "0.1",
        "--warmup",
        "0",
    ]);
    args.extend(["--scenarios", "health"]);
    let sqlite = bench(&args).unwrap();
    assert_eq!(sqlite["setup"]["seed_runs_by"], "store", "{sqlite}");
    let mut lite = SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let from_sqlite = runs(
        sqlx::query_as(SEEDED_RUNS)
            .fetch_all(&mut lite)
            .await
            .unwrap(),
    );
    let mut pg = PgConnection::connect(&db.url).await.unwrap();
    let from_pg = runs(
        sqlx::query_as(SEEDED_RUNS)
            .fetch_all(&mut pg)
            .await
            .unwrap(),
    );
    assert_eq!(from_sqlite.len(), 120);
    let sizes: BTreeSet<usize> = from_pg.iter().map(|r| r.5.matches(';').count()).collect();
    assert!(sizes.len() > 1, "pairs and larger sets: {sizes:?}");
    assert_eq!(from_pg.len(), from_sqlite.len());
    for (pg, sqlite) in from_pg.iter().zip(&from_sqlite) {
        assert_eq!(pg, sqlite, "PostgreSQL's run, then SQLite's");
    }
}

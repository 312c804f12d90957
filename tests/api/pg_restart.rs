//! A PostgreSQL store whose server goes away and comes back, under a report load: on a
//! PostgreSQL server the test starts itself (initdb and pg_ctl from
//! /usr/lib/postgresql/*/bin, in a temporary folder, on a free loopback port; as the
//! `postgres` user when the test runs as root, since initdb refuses root), never the shared
//! server other tests use. While the server is down, reports answer UNAVAILABLE and the
//! advisor's health says NOT_SERVING; once it is back, writes succeed again by themselves
//! within 5 s and health says SERVING; every acknowledged report is stored, once. Skipped
//! (with a message) where PostgreSQL's server programs are missing, except under CI.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tonic::Code;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

use crate::{
    faults::{report, unavailable},
    helpers::{free_port, profile, register_request, spawn_app_on, TestApp},
};

/// The newest installed PostgreSQL's server programs.
fn server_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A PostgreSQL server of the test's own, stopped when dropped.
struct OwnServer {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    fn command(&self, program: &str) -> Command {
        command(&self.bin, program, self.as_postgres)
    }

    fn init() -> Option<Self> {
        let bin = server_bin()?;
        let dir = tempfile::TempDir::new().unwrap();
        let uid = Command::new("id").arg("-u").output().unwrap().stdout;
        let as_postgres = String::from_utf8_lossy(&uid).trim() == "0";
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown postgres {}", dir.path().display());
        }
        let data = dir.path().join("data");
        let status = command(&bin, "initdb", as_postgres)
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&data)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "initdb failed");
        let server = Self {
            bin,
            data,
            port: free_port(),
            as_postgres,
            _dir: dir,
        };
        server.start();
        Some(server)
    }

    fn pg_ctl(&self, action: &str) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=on",
            self.port,
            self.data.display()
        );
        let log = self.data.join("server.log");
        let status = self
            .command("pg_ctl")
            .args([action, "-w", "-t", "30", "-m", "fast", "-D"])
            .arg(&self.data)
            .args(["-o", &options, "-l"])
            .arg(&log)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl {action} failed");
    }

    fn start(&self) {
        self.pg_ctl("start");
    }

    fn stop(&self) {
        self.pg_ctl("stop");
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// `program` of the server's `bin`, as the `postgres` user when asked.
fn command(bin: &Path, program: &str, as_postgres: bool) -> Command {
    let path = bin.join(program);
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        Command::new(path)
    }
}

async fn advisor_health(app: &TestApp) -> ServingStatus {
    HealthClient::new(app.channel().await)
        .check(HealthCheckRequest {
            service: "coloc.v1.ColocationAdvisor".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

/// Report streams at full speed: what each acknowledged (run number, id) and refused
/// (run number, code), until `stop`.
struct Load {
    acknowledged: Arc<Mutex<HashSet<(u64, u64)>>>,
    refused: Arc<Mutex<Vec<(u64, Code)>>>,
    stop: Arc<AtomicBool>,
    reporters: Vec<tokio::task::JoinHandle<()>>,
}

const REPORTERS: u64 = 8;

impl Load {
    fn start(app: &TestApp) -> Self {
        let acknowledged = Arc::new(Mutex::new(HashSet::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut reporters = Vec::new();
        for reporter in 0..REPORTERS {
            let mut client = app.client.clone();
            let (acknowledged, refused, stop) =
                (acknowledged.clone(), refused.clone(), stop.clone());
            reporters.push(tokio::spawn(async move {
                let mut n = reporter;
                while !stop.load(Ordering::Relaxed) {
                    match client.report_colocation(report(n)).await {
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            assert!(answer.created, "run {n} was stored before");
                            acknowledged
                                .lock()
                                .unwrap()
                                .insert((n, answer.observation_id));
                        }
                        Err(status) => {
                            refused.lock().unwrap().push((n, status.code()));
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    // A refused run is never retried under its number.
                    n += REPORTERS;
                }
            }));
        }
        Self {
            acknowledged,
            refused,
            stop,
            reporters,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    fn refused(&self) -> usize {
        self.refused.lock().unwrap().len()
    }

    /// Stops the streams: (acknowledged, refused).
    async fn finish(self) -> (HashSet<(u64, u64)>, Vec<(u64, Code)>) {
        self.stop.store(true, Ordering::Relaxed);
        for reporter in self.reporters {
            reporter.await.unwrap();
        }
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        let refused = self.refused.lock().unwrap().clone();
        (acknowledged, refused)
    }
}

/// The test's server, with an empty `coloc` database, and a service on it with workloads
/// a and b.
async fn server_and_app() -> Option<(Arc<OwnServer>, TestApp, String)> {
    let Some(server) = tokio::task::spawn_blocking(OwnServer::init).await.unwrap() else {
        unavailable("no PostgreSQL server programs under /usr/lib/postgresql/*/bin");
        return None;
    };
    let mut admin = crate::store_url::connect(&server.url("postgres")).await;
    sqlx::query("CREATE DATABASE coloc")
        .execute(&mut admin)
        .await
        .unwrap();
    drop(admin);
    let url = server.url("coloc");
    let dir = Arc::new(tempfile::TempDir::new().unwrap());
    let mut app = spawn_app_on(dir, "", url.clone()).await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    Some((Arc::new(server), app, url))
}

/// Every acknowledged report is in the database at `url`, whole; the number of refused
/// runs found stored anyway (a commit whose answer the lost server never sent).
async fn check_stored(
    url: &str,
    acknowledged: &HashSet<(u64, u64)>,
    refused: &[(u64, Code)],
) -> usize {
    let mut connection = crate::store_url::connect(url).await;
    let stored: Vec<(i64, f64)> = sqlx::query_as(
        "SELECT observation_id, throughput FROM observation_members WHERE job_id <> ''",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let stored: HashSet<(u64, u64)> = stored
        .into_iter()
        .map(|(id, throughput)| ((throughput - 1.0).round() as u64, id as u64))
        .collect();
    let missing: Vec<_> = acknowledged.difference(&stored).take(5).collect();
    assert!(missing.is_empty(), "acknowledged reports lost: {missing:?}");
    let members: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM observation_members")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM observations")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(members, 2 * runs, "a run was half written");
    let refused_runs: HashSet<u64> = refused.iter().map(|(n, _)| *n).collect();
    stored
        .iter()
        .filter(|(n, _)| refused_runs.contains(n))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_recover_by_themselves_after_the_postgresql_server_restarts_under_load() {
    let Some((server, app, url)) = server_and_app().await else {
        return;
    };
    let load = Load::start(&app);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(load.acknowledged() > 0, "no report stored before the fault");

    // The server goes away for 2 s.
    let stopping = server.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap();
    let down = Instant::now();
    let mut saw_not_serving = false;
    while down.elapsed() < Duration::from_secs(2) {
        saw_not_serving |= advisor_health(&app).await == ServingStatus::NotServing;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused_while_down = load.refused();
    let acknowledged_while_down = load.acknowledged();
    let starting = server.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap();
    let back = Instant::now();

    // Writes succeed again by themselves, within 5 s, and health follows.
    loop {
        if load.acknowledged() >= acknowledged_while_down + 50
            && advisor_health(&app).await == ServingStatus::Serving
        {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "writes did not recover within 5 s of the server's return ({} refused so far)",
            load.refused()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered_in = back.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (acknowledged, refused) = load.finish().await;
    assert!(
        saw_not_serving,
        "health stayed SERVING while the server was down"
    );
    assert!(refused_while_down > 0, "the lost server refused no report");
    let other: Vec<_> = refused
        .iter()
        .filter(|(_, code)| *code != Code::Unavailable)
        .take(5)
        .collect();
    assert!(
        other.is_empty(),
        "refusals other than UNAVAILABLE: {other:?}"
    );

    // Every acknowledged report is stored, once, whole.
    let stored_refused = check_stored(&url, &acknowledged, &refused).await;
    eprintln!(
        "PostgreSQL restart: {} reports acknowledged, {} refused (all UNAVAILABLE), \
         writes back {:.2} s after the server, {stored_refused} refused runs found stored anyway",
        acknowledged.len(),
        refused.len(),
        recovered_in.as_secs_f64(),
    );
    app.stop().await;
}

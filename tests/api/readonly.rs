//! A read-only storage fault (SQLite only: it makes the store's files immutable): the
//! database file and its write-ahead log get `chattr +i` for 4 s while 8 clients report at
//! full speed, then are released. Connections the pool opens during the fault come back
//! read-only; they must not be kept. Writes succeed again within 5 s of the lift by
//! themselves, health says NOT_SERVING only while writes fail, and no acknowledged report
//! is lost. Skipped (with a message) where the test cannot set the immutable attribute,
//! except under CI, where that fails.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
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
    faults::unavailable,
    helpers::{profile, register_request, report_request, spawn_app, TestApp, GPU},
};

/// Files made immutable, released when dropped (also when the test fails).
struct Immutable(Vec<PathBuf>);

impl Immutable {
    fn set(paths: &[PathBuf]) -> Self {
        let guard = Self(paths.to_vec());
        for path in paths {
            assert!(chattr("+i", path), "chattr +i {}", path.display());
        }
        guard
    }

    fn lift(self) {
        drop(self);
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for path in &self.0 {
            chattr("-i", path);
        }
    }
}

fn chattr(flag: &str, path: &Path) -> bool {
    std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether this machine lets the test set the immutable attribute on a file in `dir`.
fn can_set_immutable(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::fs::write(&probe, "").unwrap();
    let why = match std::process::Command::new("chattr")
        .arg("+i")
        .arg(&probe)
        .output()
    {
        Ok(set) if set.status.success() => None,
        Ok(set) => Some(String::from_utf8_lossy(&set.stderr).trim().to_string()),
        Err(error) => Some(format!("`chattr` (e2fsprogs) did not run: {error}")),
    };
    chattr("-i", &probe);
    let _ = std::fs::remove_file(&probe);
    if let Some(why) = why {
        unavailable(&format!("cannot set the immutable attribute here ({why})"));
        return false;
    }
    true
}

/// What the reporters saw: acknowledged runs (their n and id, and when), refusals.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<(u64, u64, Instant)>,
    refused: Vec<(u64, Code, Instant)>,
}

fn report(n: u64) -> coloc::proto::ReportColocationRequest {
    let mut request = report_request(GPU, &[("a", 1.0 + n as f64), ("b", 2.0)], 1_750_000_000);
    request.members[0].job_id = format!("job-{n}");
    request
}

/// 8 reporters at full speed until `stop`; each run is reported once.
fn start_reporters(
    app: &TestApp,
    seen: &Arc<Mutex<Seen>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..8u64)
        .map(|reporter| {
            let mut client = app.client.clone();
            let (seen, stop) = (seen.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = reporter;
                while !stop.load(Ordering::Relaxed) {
                    match client.report_colocation(report(n)).await {
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            assert!(answer.created, "run {n} was stored before");
                            let at = Instant::now();
                            let mut seen = seen.lock().unwrap();
                            seen.acknowledged.push((n, answer.observation_id, at));
                        }
                        Err(status) => {
                            let at = Instant::now();
                            seen.lock().unwrap().refused.push((n, status.code(), at));
                        }
                    }
                    n += 8;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Refusals come back at once: pace the retries a little.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect()
}

/// The advisor's health every 25 ms until `stop`, with when it was read.
fn watch_health(
    app: &TestApp,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(Instant, ServingStatus)>> {
    let endpoint = format!("http://{}", app.addr);
    let stop = stop.clone();
    tokio::spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(endpoint)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let mut readings = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let status = health
                .check(HealthCheckRequest {
                    service: "coloc.v1.ColocationAdvisor".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status();
            readings.push((Instant::now(), status));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        readings
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_recover_by_themselves_after_a_read_only_fault_under_load() {
    let mut app = spawn_app().await;
    if !can_set_immutable(app.dir.path()) {
        return;
    }
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    let db = app.dir.path().join("coloc.db");
    let files = [db.clone(), app.dir.path().join("coloc.db-wal")];
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let reporters = start_reporters(&app, &seen, &stop);
    let health = watch_health(&app, &stop);

    tokio::time::sleep(Duration::from_millis(500)).await;
    // The fault begins while `chattr` runs, which may take a while on a loaded machine:
    // its start is taken before, so no reading taken meanwhile counts as before the fault.
    let fault_began = Instant::now();
    let fault = Immutable::set(&files);
    tokio::time::sleep(Duration::from_secs(4)).await;
    fault.lift();
    let lifted = Instant::now();
    // Load goes on for 6 s after the lift: recovery must come within 5 s of it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    for reporter in reporters {
        reporter.await.unwrap();
    }
    let health = health.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());

    let refused_in_fault = seen
        .refused
        .iter()
        .filter(|(_, _, at)| *at > fault_began && *at < lifted)
        .count();
    assert!(refused_in_fault > 0, "the fault refused no report");
    let other: Vec<_> = seen
        .refused
        .iter()
        .filter(|(_, code, _)| *code != Code::Unavailable)
        .take(5)
        .map(|(n, code, _)| (n, code))
        .collect();
    assert!(
        other.is_empty(),
        "refusals other than UNAVAILABLE: {other:?}"
    );

    // Writes succeed again within 5 s of the lift, and keep succeeding.
    let after_lift: Vec<Instant> = seen
        .acknowledged
        .iter()
        .map(|(_, _, at)| *at)
        .filter(|at| *at > lifted)
        .collect();
    let first_ok = after_lift
        .iter()
        .min()
        .copied()
        .unwrap_or_else(|| panic!("0 reports acknowledged in the 6 s after the lift"));
    let recovered_in = first_ok - lifted;
    eprintln!(
        "read-only fault: {} reports acknowledged, {} refused ({refused_in_fault} during the \
         fault); first write after the lift in {:.0} ms; {} acknowledged after it",
        seen.acknowledged.len(),
        seen.refused.len(),
        recovered_in.as_secs_f64() * 1e3,
        after_lift.len(),
    );
    assert!(
        recovered_in < Duration::from_secs(5),
        "writes recovered {recovered_in:?} after the lift"
    );
    let last_refusal = seen.refused.iter().map(|(_, _, at)| *at).max().unwrap();
    assert!(
        last_refusal < lifted + Duration::from_secs(5),
        "reports still refused {:?} after the lift",
        last_refusal - lifted
    );

    check_health(&health, fault_began, lifted, last_refusal.max(first_ok));

    // 0 acknowledged reports lost, none stored twice, none half written.
    let ids: HashSet<u64> = seen.acknowledged.iter().map(|(_, id, _)| *id).collect();
    assert_eq!(ids.len(), seen.acknowledged.len(), "two runs got one id");
    let stored = app.count("observations").await;
    assert_eq!(stored, seen.acknowledged.len() as i64);
    assert_eq!(
        app.count("observation_members").await,
        2 * stored,
        "a run was half written"
    );
    let url = crate::helpers::database_url(&app.dir);
    let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let stored_ids: HashSet<u64> = sqlx::query_scalar::<_, i64>("SELECT id FROM observations")
        .fetch_all(&mut connection)
        .await
        .unwrap()
        .into_iter()
        .map(|id| id as u64)
        .collect();
    assert_eq!(
        stored_ids, ids,
        "the stored runs are not the acknowledged ones"
    );
    drop(connection);
    drop(app.stop().await);
}

/// Health: SERVING before the fault, NOT_SERVING during it, SERVING once writes succeed
/// again (`writes_back`: the later of the last refusal and the first write after the
/// lift).
fn check_health(
    health: &[(Instant, ServingStatus)],
    fault_began: Instant,
    lifted: Instant,
    writes_back: Instant,
) {
    // Health: NOT_SERVING while writes failed, SERVING once they succeed again.
    assert!(
        health.iter().any(|(at, status)| *at > fault_began
            && *at < lifted
            && *status == ServingStatus::NotServing),
        "health stayed SERVING through the fault"
    );
    let settled = writes_back + Duration::from_millis(200);
    let wrong: Vec<_> = health
        .iter()
        .filter(|(at, status)| *at > settled && *status != ServingStatus::Serving)
        .map(|(at, status)| (*at - lifted, *status))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty(),
        "NOT_SERVING after writes succeeded again (since the lift): {wrong:?}"
    );
    let before_fault: Vec<_> = health
        .iter()
        .filter(|(at, status)| *at < fault_began && *status != ServingStatus::Serving)
        .map(|(at, _)| fault_began - *at)
        .take(5)
        .collect();
    assert!(
        before_fault.is_empty(),
        "NOT_SERVING before the fault (this long before it): {before_fault:?}"
    );
}

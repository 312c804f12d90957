//! Storage faults: commits that fail (the store's fault switch, a SQLite commit hook that
//! turns each COMMIT into a ROLLBACK as a failed write to disk does) and a real full disk
//! (a small tmpfs, where the machine lets a test mount one). Writes answer UNAVAILABLE
//! while the fault lasts, health and metrics say so, and the service recovers by itself
//! once it is gone: no acknowledged write lost or stored twice, none half written.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use coloc::proto as pb;
use tonic::Code;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

use crate::{
    helpers::{profile, register_request, spawn_app, TestApp, GPU},
    operations::{scrape, value},
};

pub fn report(n: u64) -> pb::ReportColocationRequest {
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu: GPU.into(),
        gpu_id: String::new(),
        members: vec![
            pb::ColocatedMember {
                workload: "a".into(),
                throughput: 1.0 + n as f64,
                job_id: format!("job-{n}"),
            },
            pb::ColocatedMember {
                workload: "b".into(),
                throughput: 2.0,
                job_id: String::new(),
            },
        ],
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_750_000_000,
            nanos: 0,
        }),
    }
}

async fn advisor_health(app: &TestApp, service: &str) -> ServingStatus {
    HealthClient::new(app.channel().await)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

async fn register_two(app: &mut TestApp) {
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn writes_recover_by_themselves_after_commits_fail() {
    let mut app = spawn_app().await;
    register_two(&mut app).await;
    let before = app.dump_store().await;
    let store = app.advisor.store().clone();

    store.faults().fail_commits(true);
    let refused = app.client.report_colocation(report(1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(!refused.message().contains("SQLite"), "{refused:?}");
    let refused = app
        .client
        .register_workload(register_request("c", Some(profile(2, 1.0))))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(
        app.dump_store().await,
        before,
        "a failed write left rows behind"
    );
    assert_eq!(
        advisor_health(&app, "coloc.v1.ColocationAdvisor").await,
        ServingStatus::NotServing
    );
    // The process itself is alive: liveness must not restart it.
    assert_eq!(advisor_health(&app, "").await, ServingStatus::Serving);
    let samples = scrape(&app).await;
    assert_eq!(value(&samples, "coloc_store_writes_failing"), 1.0);
    assert!(value(&samples, "coloc_store_write_failures_total") >= 2.0);

    store.faults().fail_commits(false);
    // No client write is needed: the store's probe notices the recovery by itself.
    let lifted = Instant::now();
    while advisor_health(&app, "coloc.v1.ColocationAdvisor").await != ServingStatus::Serving {
        assert!(
            lifted.elapsed() < Duration::from_secs(5),
            "health still NOT_SERVING 5 s after the fault was lifted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        value(&scrape(&app).await, "coloc_store_writes_failing"),
        0.0
    );
    // Every connection of the pool writes again (each was used while commits failed).
    for n in 10..30 {
        app.client.report_colocation(report(n)).await.unwrap();
    }
    app.client
        .register_workload(register_request("c", Some(profile(2, 1.0))))
        .await
        .unwrap();
    assert_eq!(app.count("observations").await, 20);
}

/// The chaos test: reports at full speed from several clients while commits fail for a
/// while. Every acknowledged report is stored exactly once, writes succeed again within a
/// few seconds of the fault's end, and the server never restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_reports_at_full_speed_through_a_storage_fault() {
    let mut app = spawn_app().await;
    register_two(&mut app).await;
    let store = app.advisor.store().clone();
    let acknowledged = Arc::new(Mutex::new(HashSet::new()));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut reporters = Vec::new();
    for reporter in 0..4u64 {
        let mut client = app.client.clone();
        let (acknowledged, refused, stop) = (acknowledged.clone(), refused.clone(), stop.clone());
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
                    Err(status) => refused.lock().unwrap().push((n, status.code())),
                }
                n += 4;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.faults().fail_commits(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.faults().fail_commits(false);
    let lifted = Instant::now();
    let refused_during_fault = refused.lock().unwrap().len();
    // Writes succeed again within a few seconds.
    let acknowledged_at_lift = acknowledged.lock().unwrap().len();
    while acknowledged.lock().unwrap().len() < acknowledged_at_lift + 50 {
        assert!(
            lifted.elapsed() < Duration::from_secs(3),
            "writes did not recover within 3 s of the fault's end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for reporter in reporters {
        reporter.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    let refused = refused.lock().unwrap().clone();
    assert!(refused_during_fault > 0, "the fault refused no report");
    assert!(
        refused.iter().all(|(_, code)| *code == Code::Unavailable),
        "refusals other than UNAVAILABLE: {:?}",
        refused
            .iter()
            .filter(|(_, c)| *c != Code::Unavailable)
            .take(5)
            .collect::<Vec<_>>()
    );
    // Stored exactly once: one row per acknowledged report, none for a refused one.
    assert_eq!(app.count("observations").await, acknowledged.len() as i64);
    assert_eq!(
        app.count("observation_members").await,
        2 * acknowledged.len() as i64,
        "a run was half written"
    );
    let ids: HashSet<u64> = acknowledged.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids.len(), acknowledged.len(), "two runs got one id");
    assert_eq!(
        advisor_health(&app, "coloc.v1.ColocationAdvisor").await,
        ServingStatus::Serving
    );
}

/// A test that needs a tool or a privilege this machine lacks: under CI (`CI` set, as
/// `.ci/run`, which installs what the tests need, runs them) the test fails; elsewhere it
/// is skipped with the reason printed.
pub fn unavailable(reason: &str) {
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    assert!(
        !in_ci,
        "{reason}: CI must provide it (.ci/run installs what the tests need)"
    );
    eprintln!("skipped: {reason}");
}

/// A tmpfs mounted for one test, unmounted when dropped (also when the test fails).
struct Tmpfs {
    dir: Arc<tempfile::TempDir>,
}

impl Tmpfs {
    /// `None` when this machine does not let the test mount one (not root, no tmpfs, no
    /// `mount`); a failure instead under CI.
    fn mount(size: &str) -> Option<Self> {
        let dir = Arc::new(tempfile::TempDir::new().unwrap());
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        let why = match mounted {
            Ok(mounted) if mounted.status.success() => return Some(Self { dir }),
            Ok(mounted) => String::from_utf8_lossy(&mounted.stderr).trim().to_string(),
            Err(error) => format!("`mount` did not run: {error}"),
        };
        unavailable(&format!("cannot mount a tmpfs here ({why})"));
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system holding `path` until it is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut filler = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    while filler.write_all(&block).is_ok() {}
    while filler.write_all(&block[..512]).is_ok() {}
    let _ = filler.sync_all();
}

/// A real full disk: the database on a small tmpfs, filled up while reports arrive, then
/// given space again. Skipped (with a message) where a test cannot mount a tmpfs, except
/// under CI, where that fails.
#[tokio::test]
async fn a_real_full_disk_refuses_writes_until_space_returns() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let mut app = crate::helpers::spawn_app_in(tmpfs.dir.clone()).await;
    register_two(&mut app).await;
    app.client.report_colocation(report(0)).await.unwrap();
    let filler = tmpfs.dir.path().join("filler");
    fill(&filler);
    let mut refused = None;
    for n in 1..200 {
        if let Err(status) = app.client.report_colocation(report(n)).await {
            refused = Some(status);
            break;
        }
    }
    let refused = refused.expect("a full disk refused no report");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(
        advisor_health(&app, "coloc.v1.ColocationAdvisor").await,
        ServingStatus::NotServing
    );
    let stored_while_full = app.count("observations").await;

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    loop {
        match app.client.report_colocation(report(1000)).await {
            Ok(_) => break,
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(
                    freed.elapsed() < Duration::from_secs(5),
                    "writes did not recover within 5 s of freeing the disk"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    app.client
        .register_workload(register_request("c", Some(profile(2, 1.0))))
        .await
        .unwrap();
    assert_eq!(app.count("observations").await, stored_while_full + 1);
    while advisor_health(&app, "coloc.v1.ColocationAdvisor").await != ServingStatus::Serving {
        assert!(
            freed.elapsed() < Duration::from_secs(5),
            "health stayed NOT_SERVING"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(app.stop().await);
}

/// The `-shm` file made immutable while the server writes: ext4 refuses the write to the
/// memory-mapped WAL index and the kernel stops the process with SIGBUS. It used to die
/// without a word; it now says why on stderr first. Skipped (with a message) where the
/// test cannot set the immutable attribute (not root, no chattr, a file system without it),
/// except under CI, where that fails.
#[tokio::test]
async fn an_immutable_shm_file_stops_the_server_with_a_note_not_silently() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::TempDir::new().unwrap();
    let probe = dir.path().join("probe");
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
    if let Some(why) = why {
        unavailable(&format!("cannot set the immutable attribute here ({why})"));
        return;
    }
    let _ = std::process::Command::new("chattr")
        .arg("-i")
        .arg(&probe)
        .status();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let db = dir.path().join("coloc.db");
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--database")
        .arg(format!("sqlite://{}", db.display()))
        .env("COLOC__METRICS__LISTEN", "")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    let started = Instant::now();
    let channel = loop {
        if let Ok(channel) = endpoint.connect().await {
            break channel;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut client = pb::colocation_advisor_client::ColocationAdvisorClient::new(channel);
    for name in ["a", "b"] {
        client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    client.report_colocation(report(0)).await.unwrap();
    let shm = dir.path().join("coloc.db-shm");
    let unlock = |path: &std::path::Path| {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(path)
            .status();
    };
    assert!(std::process::Command::new("chattr")
        .arg("+i")
        .arg(&shm)
        .status()
        .unwrap()
        .success());
    // Written back, the mapped pages are clean: the next write to them faults.
    let _ = std::process::Command::new("sync").status();
    for n in 1..50 {
        if client.report_colocation(report(n)).await.is_err() {
            break;
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .map_err(|_| unlock(&shm))
        .expect("the server kept running")
        .unwrap();
    unlock(&shm);
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(server.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert_eq!(status.signal(), Some(7), "{status:?}: {stderr}");
    assert!(stderr.contains("SIGBUS"), "{stderr}");
}

/// The agents' service writes too (claims, leases, submissions): its health entry follows
/// the store's writes as the advisor's does, and comes back by itself.
#[tokio::test]
async fn the_agents_service_health_follows_storage_faults() {
    let mut app = spawn_app().await;
    let agents = "coloc.v1.ProfilingAgents";
    assert_eq!(advisor_health(&app, agents).await, ServingStatus::Serving);
    let store = app.advisor.store().clone();
    store.faults().fail_commits(true);
    let refused = app
        .client
        .register_workload(register_request("c", Some(profile(2, 1.0))))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let failing = Instant::now();
    while advisor_health(&app, agents).await != ServingStatus::NotServing {
        assert!(
            failing.elapsed() < Duration::from_secs(5),
            "the agents service stayed SERVING while writes failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(advisor_health(&app, "").await, ServingStatus::Serving);
    store.faults().fail_commits(false);
    let lifted = Instant::now();
    while advisor_health(&app, agents).await != ServingStatus::Serving {
        assert!(
            lifted.elapsed() < Duration::from_secs(5),
            "the agents service still NOT_SERVING 5 s after the fault was lifted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

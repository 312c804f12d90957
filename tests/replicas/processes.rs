//! Three `coloc serve` processes on loopback sharing one fresh PostgreSQL database, with a
//! short lease (3 s, renewed every 0.5 s) and the champions read every 0.2 s. The store is
//! seeded first through one server alone (workloads, profiles, every pair's runs, a trained
//! model), so that the three replicas load the same catalog at start.
//!
//! One test, in phases: a pin made on one replica is served by all three within 2 s; under
//! a report load spread over the replicas the leader is killed with SIGKILL: a new leader
//! within 15 s, every acknowledged report stored, no two models trained on the same runs;
//! the new leader is paused with SIGSTOP past its lease: another takes over, and when the
//! paused one resumes it stops its leader's tasks (its late writes are refused:
//! `lease::one_leader_at_a_time_*`).

use std::{
    process::Stdio,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};
use nix::{sys::signal::Signal, unistd::Pid};
use sqlx::{Connection, PgConnection};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tonic::transport::Channel;

use crate::{free_port::free_port, pg::FreshDatabase};

pub const GPU: &str = "Test GPU 16GB";
const WORKLOADS: usize = 8;

/// One `coloc serve` process and what it logged so far.
pub struct Replica {
    child: Child,
    pub port: u16,
    /// The metrics endpoint's port.
    metrics_port: u16,
    log: Arc<std::sync::Mutex<String>>,
}

/// Tries of [`Replica::start`] whose replica exits because a port was taken.
const START_TRIES: usize = 5;

impl Replica {
    /// A replica serving on fresh loopback ports. A port free when probed can still be
    /// taken before the server binds it (by another test's server or another process), so
    /// a replica that exits for that alone is started again on other ports.
    pub async fn start(url: &str, dir: &std::path::Path) -> Self {
        for _ in 0..START_TRIES {
            match Self::try_start(url, dir).await {
                Ok(replica) => return replica,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("{log}"),
            }
        }
        panic!("no replica started in {START_TRIES} tries: its ports were taken each time");
    }

    /// One start: the replica once it answers, or what it logged if it exited.
    async fn try_start(url: &str, dir: &std::path::Path) -> Result<Self, String> {
        let (port, metrics_port) = (free_port(), free_port());
        let config = dir.join(format!("coloc-{port}.toml"));
        std::fs::write(
            &config,
            "[trainer]\ninterval_secs = 1\nmin_new_observations = 200\n\n[leader]\n\
             lease_ttl_ms = 3000\nrenew_interval_ms = 500\nmodel_poll_ms = 200\n",
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_coloc"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(&config)
            .args(["--database", url])
            .env(
                "COLOC__METRICS__LISTEN",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("COLOC__MODEL__DEFAULT_GPU", GPU)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut replica = Self {
            child,
            port,
            metrics_port,
            log,
        };
        let started = Instant::now();
        while replica.client().await.is_none() {
            if let Ok(Some(status)) = replica.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(format!(
                    "replica on {port} exited ({status}):\n{}",
                    replica.log()
                ));
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "replica on {port} did not start:\n{}",
                replica.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(replica)
    }

    pub async fn client(&self) -> Option<ColocationAdvisorClient<Channel>> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port))
                .unwrap()
                .timeout(Duration::from_secs(5));
        endpoint
            .connect()
            .await
            .ok()
            .map(ColocationAdvisorClient::new)
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().unwrap() as i32)
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// The value of the unlabelled metric `name` on the replica's metrics endpoint.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
            .await
            .ok()?;
        answer.lines().find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse().ok())?
        })
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub async fn stop(mut self) {
        self.signal(Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}

fn profile(seed: u64) -> pb::Profile {
    let f = |k: u64| ((seed * 7919 + k * 104_729) % 1000) as f64 / 1000.0;
    pb::Profile {
        gpu: GPU.into(),
        kernel: Some(pb::KernelMetrics {
            threads: 1e5 + f(1) * 4e6,
            compute_throughput_pct: 20.0 + f(2) * 70.0,
            dram_throughput_pct: 5.0 + f(3) * 60.0,
            memory_throughput_pct: 20.0 + f(4) * 70.0,
            registers: 5e6 + f(5) * 9e7,
            static_shared_memory_bytes: 2e3 + f(6) * 3e4,
        }),
        system: Some(pb::SystemMetrics {
            exclusive_throughput: 5.0 + f(7) * 100.0,
            throughput_unit: "samples/s".into(),
            sm_busy_pct: 30.0 + f(8) * 65.0,
            mem_busy_pct: 5.0 + f(9) * 40.0,
            memory_gb: 1.0 + (seed % 4) as f64,
        }),
        source: pb::ProfileSource::ClientSupplied as i32,
        gpu_memory_gb: 16.0,
        measured_at: None,
        kernel_missing: false,
    }
}

/// A report of workloads `a` and `b` together, unique by `n`.
fn report(a: usize, b: usize, n: u64) -> pb::ReportColocationRequest {
    let member = |i: usize, share: f64| pb::ColocatedMember {
        workload: format!("w{i:02}"),
        throughput: 10.0 + share * (1 + (n % 7)) as f64,
        job_id: String::new(),
    };
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: GPU.into(),
        members: vec![member(a, 4.0), member(b, 6.0)],
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_700_000_000 + n as i64,
            nanos: 0,
        }),
    }
}

/// Workloads, profiles, every pair's runs and a trained model, through one server.
pub async fn seed(url: &str, dir: &std::path::Path) {
    let server = Replica::start(url, dir).await;
    let mut client = server.client().await.unwrap();
    for i in 0..WORKLOADS {
        client
            .register_workload(pb::RegisterWorkloadRequest {
                name: format!("w{i:02}"),
                mode: pb::WorkloadMode::Training as i32,
                model: "resnet-18".into(),
                batch_size: 16,
                labels: Default::default(),
                profile: Some(profile(i as u64)),
                launch: None,
                profile_on_gpus: Vec::new(),
            })
            .await
            .unwrap();
    }
    let mut n = 0;
    for a in 0..WORKLOADS {
        for b in a..WORKLOADS {
            n += 1;
            client.report_colocation(report(a, b, n)).await.unwrap();
        }
    }
    // The server leads alone: its retraining task trains the first model by itself.
    let started = Instant::now();
    while count(url, "SELECT COUNT(*) FROM models").await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no model trained:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}

/// Every stored model: version, kind, the run it was trained up to, status, reason.
async fn models(url: &str) -> Vec<(i64, String, i64, String, String)> {
    let mut db = PgConnection::connect(url).await.unwrap();
    sqlx::query_as(
        "SELECT version, kind, last_observation_id, status, reason FROM models ORDER BY version",
    )
    .fetch_all(&mut db)
    .await
    .unwrap()
}

/// The lease's holder and token, read from the database.
async fn lease(url: &str) -> Option<(String, i64)> {
    let mut db = PgConnection::connect(url).await.unwrap();
    sqlx::query_as("SELECT holder, token FROM leader_lease WHERE id = 1")
        .fetch_optional(&mut db)
        .await
        .unwrap()
}

async fn count(url: &str, sql: &str) -> i64 {
    let mut db = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut db)
        .await
        .unwrap()
}

/// The replica whose process id the lease's holder names, waiting for one at most `limit`.
async fn leader_index(
    url: &str,
    replicas: &[Replica],
    past_token: i64,
    limit: Duration,
) -> (usize, i64) {
    let started = Instant::now();
    loop {
        if let Some((holder, token)) = lease(url).await {
            if token > past_token {
                let pid = holder.split('/').nth(1).unwrap().parse::<i32>().unwrap();
                if let Some(i) = replicas.iter().position(|r| r.pid().as_raw() == pid) {
                    return (i, token);
                }
            }
        }
        assert!(started.elapsed() < limit, "no new leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The metrics say what the lease says: `leader` shows `coloc_leader` 1 and its token,
/// every other replica 0 (read again for up to 2 s: a follower learns at its next try).
async fn one_leader_in_the_metrics(replicas: &[Replica], leader: usize, token: i64) {
    let started = Instant::now();
    loop {
        let mut seen = Vec::new();
        for replica in replicas {
            seen.push((
                replica.metric("coloc_leader").await,
                replica.metric("coloc_leader_token").await,
            ));
        }
        let expected: Vec<_> = (0..replicas.len())
            .map(|i| match i == leader {
                true => (Some(1.0), Some(token as f64)),
                false => (Some(0.0), Some(0.0)),
            })
            .collect();
        if seen == expected {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "leader {leader} (token {token}); the replicas' metrics say {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pauses the leader `paused` (SIGSTOP) until another replica than it and `earlier` leads
/// (within 15 s), resumes it, and waits (10 s) for it to say its leadership ended. Returns
/// the new leader and its token.
async fn pause_until_replaced(
    url: &str,
    replicas: &[Replica],
    paused: usize,
    paused_token: i64,
    earlier: usize,
) -> (usize, i64) {
    replicas[paused].signal(Signal::SIGSTOP);
    let paused_at = Instant::now();
    let (next, next_token) =
        leader_index(url, replicas, paused_token, Duration::from_secs(15)).await;
    eprintln!(
        "leader {paused} paused; replica {next} leads (token {next_token}) after {:?}",
        paused_at.elapsed()
    );
    assert!(next != paused && next != earlier);
    replicas[paused].signal(Signal::SIGCONT);
    let resumed = Instant::now();
    loop {
        let log = replicas[paused].log();
        if log.contains("leadership ends") {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "the resumed leader kept leading:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the paused leader stopped its tasks {:?} after it resumed",
        resumed.elapsed()
    );
    (next, next_token)
}

/// The model version a replica's Rank answers with.
async fn served_version(replica: &Replica) -> Option<u64> {
    let mut client = replica.client().await?;
    let answer = client
        .rank(pb::RankRequest {
            target: "w00".into(),
            gpu: GPU.into(),
            ..Default::default()
        })
        .await
        .ok()?;
    Some(answer.into_inner().model_version)
}

/// A second model trained and version 1 pinned through replica `pin_on`: every replica
/// answers Rank with the pinned version within 2 s.
async fn a_pin_reaches_every_replica(url: &str, replicas: &[Replica], pin_on: usize) {
    // A pin on a follower reaches every replica within 2 s.
    let mut client = replicas[pin_on].client().await.unwrap();
    client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap();
    let versions = count(url, "SELECT COUNT(*) FROM models").await as u64;
    assert!(versions >= 2, "{versions} models");
    // Every replica serves the same champion first (the Train's outcome has spread) ...
    let started = Instant::now();
    let champion = loop {
        let mut served = Vec::new();
        for replica in replicas {
            served.push(served_version(replica).await);
        }
        if served[0].is_some() && served.iter().all(|v| *v == served[0]) {
            break served[0].unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{served:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // ... then another version is pinned.
    let pinned = if champion == 1 { 2 } else { 1 };
    client
        .pin_model(pb::PinModelRequest {
            gpu: GPU.into(),
            version: pinned,
        })
        .await
        .unwrap();
    let pinned_at = Instant::now();
    let mut reached = [None; 3];
    while reached.iter().any(Option::is_none) && pinned_at.elapsed() < Duration::from_secs(5) {
        for (i, replica) in replicas.iter().enumerate() {
            if reached[i].is_none() && served_version(replica).await == Some(pinned) {
                reached[i] = Some(pinned_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("pin of version {pinned} served by the replicas after {reached:?}");
    for (i, at) in reached.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("replica {i} never served the pin"));
        assert!(at <= Duration::from_secs(2), "replica {i}: {at:?}");
    }
}

/// A workload registered through one replica, and its deletion, reach every replica's
/// catalog within 2 s: Predict on the others answers for it, then NOT_FOUND again.
async fn a_workload_reaches_every_replica(replicas: &[Replica], register_on: usize) {
    let name = "w-registered-late";
    async fn predict(replica: &Replica) -> Result<(), tonic::Code> {
        let mut client = replica.client().await.unwrap();
        client
            .predict(pb::PredictRequest {
                sharing_mode: None,
                workloads: vec!["w-registered-late".into(), "w00".into()],
                gpu: GPU.into(),
                gpu_memory_gb: 0.0,
            })
            .await
            .map(|_| ())
            .map_err(|status| status.code())
    }
    for replica in replicas {
        assert_eq!(predict(replica).await, Err(tonic::Code::NotFound));
    }
    let mut client = replicas[register_on].client().await.unwrap();
    client
        .register_workload(pb::RegisterWorkloadRequest {
            name: name.into(),
            mode: pb::WorkloadMode::Inference as i32,
            model: "resnet-18".into(),
            batch_size: 8,
            labels: Default::default(),
            profile: Some(profile(99)),
            launch: None,
            profile_on_gpus: Vec::new(),
        })
        .await
        .unwrap();
    for (expected, what) in [
        (Ok(()), "registration"),
        (Err(tonic::Code::NotFound), "deletion"),
    ] {
        if expected.is_err() {
            client
                .delete_workload(pb::DeleteWorkloadRequest { name: name.into() })
                .await
                .unwrap();
        }
        let started = Instant::now();
        let mut reached = Vec::new();
        for (i, replica) in replicas.iter().enumerate() {
            while predict(replica).await != expected {
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "replica {i} does not know of the {what} 2 s later"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            reached.push(started.elapsed());
        }
        eprintln!("{what} through replica {register_on} served by all after {reached:?}");
    }
}

/// The whole story on a seeded store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_one_leader_one_model() {
    let Some(database) = FreshDatabase::create("procs").await else {
        return;
    };
    let url = database.url.clone();
    let dir = tempfile::tempdir().unwrap();
    seed(&url, dir.path()).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&url, dir.path()).await);
    }
    let (first, first_token) = leader_index(&url, &replicas, 0, Duration::from_secs(10)).await;
    one_leader_in_the_metrics(&replicas, first, first_token).await;

    a_pin_reaches_every_replica(&url, &replicas, (first + 1) % 3).await;
    a_workload_reaches_every_replica(&replicas, (first + 2) % 3).await;

    // A report load over the three replicas; the leader killed with SIGKILL.
    let before = count(&url, "SELECT COUNT(*) FROM observations").await;
    let acked = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(1_000_000));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut load = Vec::new();
    for replica in &replicas {
        for _ in 0..3 {
            let (acked, next, stop) = (acked.clone(), next.clone(), stop.clone());
            let mut client = replica.client().await.unwrap();
            load.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let (a, b) = (
                        (n % WORKLOADS as u64) as usize,
                        ((n / 3) % WORKLOADS as u64) as usize,
                    );
                    match client.report_colocation(report(a, b, n)).await {
                        Ok(_) => {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = Instant::now();
    replicas[first].signal(Signal::SIGKILL);
    let (second, second_token) =
        leader_index(&url, &replicas, first_token, Duration::from_secs(15)).await;
    let takeover = killed_at.elapsed();
    eprintln!(
        "leader {first} killed; replica {second} leads (token {second_token}) after {takeover:?}"
    );
    assert_ne!(second, first);
    assert!(takeover <= Duration::from_secs(15), "{takeover:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    for task in load {
        task.await.unwrap();
    }
    let acked = acked.load(Ordering::Relaxed) as i64;
    let stored = count(&url, "SELECT COUNT(*) FROM observations").await - before;
    eprintln!("{acked} reports acknowledged, {stored} stored");
    assert!(acked > 0);
    assert!(stored >= acked, "{acked} acknowledged, {stored} stored");
    let retrained_twice = count(
        &url,
        "SELECT COUNT(*) FROM (SELECT last_observation_id, kind FROM models \
         GROUP BY last_observation_id, kind HAVING COUNT(*) > 1) twice",
    )
    .await;
    assert_eq!(
        retrained_twice,
        0,
        "two models trained on the same runs: {:#?}",
        models(&url).await
    );

    // The new leader paused past its lease: a third takes over; resumed, it stops leading.
    let (_, third_token) = pause_until_replaced(&url, &replicas, second, second_token, first).await;
    assert_eq!(
        lease(&url).await.unwrap().1,
        third_token,
        "the lease stays with the new leader"
    );
    for replica in replicas {
        replica.stop().await;
    }
}

/// Leadership alone, on an empty store: the leader killed with SIGKILL is replaced within
/// 15 s; the next one, paused with SIGSTOP past its lease, is replaced too, and once resumed
/// it stops its leader's tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_or_paused_leader_is_replaced() {
    let Some(database) = FreshDatabase::create("elect").await else {
        return;
    };
    let url = database.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&url, dir.path()).await);
    }
    let (first, first_token) = leader_index(&url, &replicas, 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lease(&url).await.unwrap().1,
        first_token,
        "renewals keep the token"
    );
    for (i, replica) in replicas.iter().enumerate() {
        assert_eq!(
            replica.log().contains("became leader"),
            i == first,
            "replica {i}:\n{}",
            replica.log()
        );
    }
    let killed_at = Instant::now();
    replicas[first].signal(Signal::SIGKILL);
    let (second, second_token) =
        leader_index(&url, &replicas, first_token, Duration::from_secs(15)).await;
    eprintln!(
        "leader {first} killed; replica {second} leads (token {second_token}) after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(second, first);
    assert_eq!(second_token, first_token + 1);

    let (third, third_token) =
        pause_until_replaced(&url, &replicas, second, second_token, first).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        lease(&url).await.unwrap(),
        (lease(&url).await.unwrap().0, third_token),
        "the lease stays with the new leader"
    );
    let holder = lease(&url).await.unwrap().0;
    assert!(
        holder.contains(&format!("/{}/", replicas[third].pid())),
        "{holder}"
    );
    for replica in replicas {
        replica.stop().await;
    }
}

//! Readiness and a rolling restart, as the replicas overlay runs them: a replica is Ready
//! (health service `coloc.v1.Ready` SERVING) once it serves a champion model; all three are
//! replaced one at a time (the new one Ready before the old one gets SIGTERM, as
//! `maxUnavailable: 0` does) while a client calls Rank without pause, each call retried on
//! another replica when one fails (at most 3 tries): no call may fail.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

use crate::{
    pg::FreshDatabase,
    processes::{seed, Replica, GPU},
};

/// The readiness a probe of `coloc.v1.Ready` sees on `port`.
async fn ready(port: u16) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .ok()?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "coloc.v1.Ready".into(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(answer.into_inner().status).ok()
}

async fn wait_ready(replica: &Replica) -> Duration {
    let started = Instant::now();
    while ready(replica.port).await != Some(ServingStatus::Serving) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replica on {} never Ready:\n{}",
            replica.port,
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// One Rank, tried on up to 3 of the listed replicas in turn; the error of the last try.
async fn rank_with_retries(ports: &Mutex<Vec<u16>>, turn: u64) -> Result<(), tonic::Status> {
    let mut last = None;
    for attempt in 0..3u64 {
        let port = {
            let ports = ports.lock().unwrap();
            ports[((turn + attempt) % ports.len() as u64) as usize]
        };
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_secs(5));
        let Ok(channel) = endpoint.connect().await else {
            last = Some(tonic::Status::unavailable(format!(
                "cannot connect to {port}"
            )));
            continue;
        };
        let answer = ColocationAdvisorClient::new(channel)
            .rank(pb::RankRequest {
                target: "w00".into(),
                gpu: GPU.into(),
                ..Default::default()
            })
            .await;
        match answer {
            Ok(_) => return Ok(()),
            Err(status) => last = Some(status),
        }
    }
    Err(last.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_and_a_rolling_restart_under_rank_calls() {
    let Some(database) = FreshDatabase::create("roll").await else {
        return;
    };
    let url = database.url.clone();
    let dir = tempfile::tempdir().unwrap();

    // An empty store: serving, but not Ready.
    let empty = Replica::start(&url, dir.path()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ready(empty.port).await, Some(ServingStatus::NotServing));
    empty.stop().await;

    seed(&url, dir.path()).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let replica = Replica::start(&url, dir.path()).await;
        wait_ready(&replica).await;
        replicas.push(replica);
    }
    let ports = Arc::new(Mutex::new(
        replicas.iter().map(|r| r.port).collect::<Vec<_>>(),
    ));
    let (calls, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = tokio_util::sync::CancellationToken::new();
    let client = {
        let (ports, calls, failed, stop) =
            (ports.clone(), calls.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let turn = calls.fetch_add(1, Ordering::Relaxed);
                if let Err(status) = rank_with_retries(&ports, turn).await {
                    failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("a Rank call failed after 3 tries: {status}");
                }
            }
        })
    };
    let started = Instant::now();
    // Calls made while each replica was replaced: the client must have been calling
    // through every step, however slow the machine.
    let mut during = Vec::new();
    for n in 0..3 {
        let before = calls.load(Ordering::Relaxed);
        let new = Replica::start(&url, dir.path()).await;
        let waited = wait_ready(&new).await;
        let old = replicas.remove(0);
        {
            let mut ports = ports.lock().unwrap();
            ports.retain(|p| *p != old.port);
            ports.push(new.port);
        }
        old.stop().await;
        during.push(calls.load(Ordering::Relaxed) - before);
        eprintln!("replica {n} replaced (the new one Ready {waited:?} after it listened)");
        replicas.push(new);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    client.await.unwrap();
    let (calls, failed) = (
        calls.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    eprintln!(
        "rolling restart of 3 replicas in {:?}: {calls} Rank calls, {failed} failed",
        started.elapsed()
    );
    assert!(
        during.iter().all(|&n| n >= 5),
        "Rank calls during each replacement: {during:?}"
    );
    assert_eq!(failed, 0);
    for replica in replicas {
        replica.stop().await;
    }
}

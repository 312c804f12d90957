//! Occupancy across replicas: two stores (each with its own writer and readers' copy, as
//! two `coloc serve` replicas have) on one database, a SQLite file or a fresh database on
//! the real PostgreSQL server, under 10,000 concurrent AssignJob attempts on the same
//! slots. The store is the arbiter: no job is acknowledged on two GPUs, no GPU past its
//! most jobs, and the database holds exactly what was acknowledged.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use coloc::{
    domain::{GpuName, WorkloadName, MAX_MEMBERS},
    store::{Assignment, OccupancyConflict, Store, StoreError},
};

use crate::pg::FreshDatabase;

fn assignment(job: &str, gpu_id: &str) -> Assignment {
    Assignment {
        job_id: job.into(),
        gpu_id: gpu_id.into(),
        node: "n1".into(),
        gpu: GpuName::parse("gpu", "Test GPU 16GB").unwrap(),
        workload: WorkloadName::parse("workload", "w01").unwrap(),
        lease_ms: None,
    }
}

/// Each server's copy for Place follows the other's writes by itself, within 2 s.
async fn copies_catch_up(replicas: &[Store], acknowledged: &HashMap<String, String>) {
    let started = Instant::now();
    for store in replicas {
        loop {
            let seen: HashMap<String, String> = store
                .occupancy()
                .gpus()
                .flat_map(|gpu| {
                    gpu.jobs
                        .iter()
                        .map(|job| (job.job_id.to_string(), gpu.id.to_string()))
                })
                .collect();
            if seen == *acknowledged {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "a server's copy is still behind 2 s later"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// 10,000 concurrent assignments of 1,000 job ids to 40 GPUs (at most 640 places), each
/// sent to either of two stores on `url`. Returns the acknowledged bookings (job -> GPUs)
/// and the refusals (booked elsewhere, GPU full).
async fn attempts(replicas: &[Store; 2]) -> (HashMap<String, HashSet<String>>, usize, usize) {
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    let mut attempts = tokio::task::JoinSet::new();
    for i in 0..10_000 {
        let job = format!("j{}", i % 1_000);
        let gpu = format!("g{}", next() % 40);
        let store = replicas[next() % 2].clone();
        attempts.spawn(async move {
            let outcome = store.assign_cluster_job(assignment(&job, &gpu), 1).await;
            (job, gpu, outcome)
        });
    }
    let mut booked: HashMap<String, HashSet<String>> = HashMap::new();
    let (mut elsewhere, mut full) = (0, 0);
    while let Some(attempt) = attempts.join_next().await {
        let (job, gpu, outcome) = attempt.unwrap();
        match outcome {
            Ok(_) => {
                booked.entry(job).or_default().insert(gpu);
            }
            Err(StoreError::Occupancy(OccupancyConflict::JobAssignedElsewhere { .. })) => {
                elsewhere += 1
            }
            Err(StoreError::Occupancy(OccupancyConflict::GpuFull { .. })) => full += 1,
            Err(error) => panic!("{error:?}"),
        }
    }
    (booked, elsewhere, full)
}

async fn two_servers_never_double_book(url: &str) {
    let replicas = [
        Store::open(url).await.unwrap(),
        Store::open(url).await.unwrap(),
    ];
    let started = Instant::now();
    let (booked, elsewhere, full) = attempts(&replicas).await;
    let took = started.elapsed();
    assert!(
        elsewhere > 0 && full > 0,
        "{elsewhere} moves and {full} full GPUs refused"
    );
    let doubled: Vec<_> = booked.iter().filter(|(_, gpus)| gpus.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "jobs acknowledged on two GPUs: {:?}",
        &doubled[..doubled.len().min(5)]
    );
    let mut per_gpu: HashMap<&str, usize> = HashMap::new();
    for gpus in booked.values() {
        *per_gpu.entry(gpus.iter().next().unwrap()).or_default() += 1;
    }
    assert!(
        per_gpu.values().all(|&jobs| jobs <= MAX_MEMBERS),
        "{per_gpu:?}"
    );
    let stored: Vec<(String, String)> = sqlx::query_as("SELECT job_id, gpu_id FROM cluster_jobs")
        .fetch_all(replicas[0].pool())
        .await
        .unwrap();
    let stored: HashMap<String, String> = stored.into_iter().collect();
    let acknowledged: HashMap<String, String> = booked
        .into_iter()
        .map(|(job, gpus)| (job, gpus.into_iter().next().unwrap()))
        .collect();
    assert_eq!(stored, acknowledged);
    copies_catch_up(&replicas, &acknowledged).await;
    // A write on one server alone reaches the other's copy.
    replicas[0]
        .assign_cluster_job(assignment("late", "g-late"), 2)
        .await
        .unwrap();
    let written = Instant::now();
    while replicas[1].occupancy().gpu("g-late").is_none() {
        assert!(written.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "10,000 attempts on 2 servers in {took:?}: {} jobs booked, {elsewhere} refused as \
         booked elsewhere, {full} as a full GPU, 0 double bookings; the other server's copy \
         had a lone write after {:?}",
        acknowledged.len(),
        written.elapsed()
    );
    for store in replicas {
        store.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_sqlite_file_never_double_book() {
    let dir = tempfile::TempDir::new().unwrap();
    let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
    two_servers_never_double_book(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_database_never_double_book() {
    let Some(database) = FreshDatabase::create("occupancy").await else {
        return;
    };
    two_servers_never_double_book(&database.url).await;
}

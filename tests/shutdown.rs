//! Ordered shutdown, watched through the service's own logs: the API stops first (no new
//! calls), then the profiling worker puts its running job back to pending, then the other
//! background tasks stop, and the store closes last. Every task's exit is logged.
//!
//! A test binary of its own: it installs the process-wide log subscriber, which the other
//! integration tests (one binary, many tests on many threads) must not share.

use std::{
    io::Write,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use coloc::{
    profiler::{Backend, NvmlBackend, RecordedSampler},
    proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient},
    settings::ProfilerSettings,
    startup::App,
    store::Store,
    worker::Worker,
};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use coloc::settings::{Settings, SettingsSources};

/// Log lines written by the subscriber under test, in order.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedLogs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl CapturedLogs {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Where the first line containing every one of `needles` stands in the log.
fn position(lines: &[String], needles: &[&str]) -> usize {
    lines
        .iter()
        .position(|line| needles.iter().all(|n| line.contains(n)))
        .unwrap_or_else(|| panic!("no log line with {needles:?} in:\n{}", lines.join("\n")))
}

fn database_url(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.path().join("coloc.db").display())
}

/// Settings on a database in `dir`, ports chosen by the system, a worker that polls often.
fn settings_in(dir: &TempDir) -> Settings {
    let config_path = dir.path().join("coloc.toml");
    std::fs::write(
        &config_path,
        format!(
            "[profiler]\nallowed_programs = [\"{}/*\"]\npoll_interval_ms = 20\nsample_interval_ms = 1\n",
            fixtures().join("workloads").display()
        ),
    )
    .unwrap();
    Settings::load(SettingsSources {
        file: Some(&config_path),
        environment: Some(Default::default()),
        overrides: vec![
            ("server.listen", "127.0.0.1:0".into()),
            ("metrics.listen", "127.0.0.1:0".into()),
            ("database.url", database_url(dir)),
        ],
    })
    .unwrap()
}

/// The API stops first, then the job is re-queued, the tasks exit, and the store closes
/// last.
fn the_shutdown_ran_in_order(lines: &[String]) {
    let api_closed = position(lines, &["no new requests accepted"]);
    let api_exited = position(lines, &["task exited", "gRPC API"]);
    let requeued = position(lines, &["interrupted; job re-queued"]);
    let worker_exited = position(lines, &["task exited", "profiling worker"]);
    let sweeper_exited = position(lines, &["task exited", "lease sweeper"]);
    let trainer_exited = position(lines, &["task exited", "retraining task"]);
    let metrics_exited = position(lines, &["task exited", "metrics endpoint"]);
    let writer_exited = position(lines, &["task exited", "observation writer"]);
    let store_closed = position(lines, &["store closed"]);
    let order = [
        api_closed,
        api_exited,
        requeued,
        worker_exited,
        sweeper_exited,
        trainer_exited,
        metrics_exited,
        writer_exited,
        store_closed,
    ];
    assert!(
        order.windows(2).all(|pair| pair[0] < pair[1]),
        "shutdown out of order {order:?}:\n{}",
        lines.join("\n")
    );
}

#[tokio::test]
async fn a_shutdown_stops_the_api_first_requeues_the_running_job_and_closes_the_store_last() {
    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let dir = Arc::new(TempDir::new().unwrap());
    let settings = settings_in(&dir);
    let app = App::build(&settings).await.unwrap();
    // The worker the nvml backend would run, with NVML replaced by a recording.
    let profiler = ProfilerSettings {
        ncu_path: fixtures().join("workloads/fake_ncu.py"),
        ..settings.profiler.clone()
    };
    let sampler =
        RecordedSampler::from_file(&fixtures().join("nvml/synthetic_samples.jsonl")).unwrap();
    let worker = Worker::new(
        app.advisor(),
        app.advisor().store().clone(),
        Arc::new(Backend::Nvml(NvmlBackend::new(
            profiler.clone(),
            Some(Arc::new(sampler)),
        ))),
        profiler,
    );
    let app = app.with_worker(worker);
    let addr = app.local_addr();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));

    let mut client = ColocationAdvisorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    client
        .register_workload(pb::RegisterWorkloadRequest {
            name: "w".into(),
            mode: pb::WorkloadMode::Inference as i32,
            model: "fake".into(),
            batch_size: 1,
            launch: Some(pb::LaunchSpec {
                program: fixtures()
                    .join("workloads/fake_workload.py")
                    .display()
                    .to_string(),
                args: vec!["hang".into(), pid_file.display().to_string()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    // The worker is running the job once the workload has started its grandchild.
    for _ in 0..1000 {
        if pid_file.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(pid_file.exists(), "the job never started");

    shutdown.cancel();
    server.await.unwrap().unwrap();
    assert!(
        client
            .get_workload(pb::GetWorkloadRequest { name: "w".into() })
            .await
            .is_err(),
        "a stopped server answered"
    );

    the_shutdown_ran_in_order(&logs.lines());

    // The re-queue reached the file before it closed: the job is pending again and its
    // attempt was not counted.
    let store = Store::open(&database_url(&dir)).await.unwrap();
    assert_eq!(store.job_counts().await.unwrap(), (1, 0, 0, 0));
    store.close().await;
}

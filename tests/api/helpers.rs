//! Test harness: the real server on a loopback port 0 with a fresh SQLite file per test,
//! and the generated client. No fixed ports and no sleeps: `App::build` has bound the
//! listener before it returns, so the client can connect at once.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use coloc::{
    proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient},
    settings::{Settings, SettingsSources},
    startup::App,
};
use sqlx::Row;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub const GPU: &str = "Test GPU 16GB";
pub const GPU_MEMORY_GB: f64 = 16.0;
/// [`GPU`] as GPU feature discovery labels a node with it (spaces as dashes).
pub const GPU_LABEL: &str = "Test-GPU-16GB";

/// Tells the extender's cluster view that `node` has `count` GPUs of [`GPU_LABEL`], as the
/// node watcher would from its labels.
pub fn set_test_node(app: &TestApp, node: &str, count: usize) {
    app.cluster.set_node(
        node,
        Some(coloc::cluster::NodeGpus {
            count: count as u32,
            gpu_model: Some(GPU_LABEL.into()),
            memory_gb: None,
        }),
    );
}

/// The public KACE V100 measurements, read in place (never copied into the repository).
/// The policy of the tests written before policies: no rule, point predictions, losses
/// listed (the objective and floors as each request says).
pub fn open_policy() -> pb::Policy {
    pb::Policy {
        rule: pb::PlaceRule::None as i32,
        cautious: Some(false),
        include_losses: Some(true),
        ..Default::default()
    }
}

pub fn kace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100")
}

pub struct TestApp {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// The scheduler extender, when the settings turn it on.
    pub extender_addr: Option<SocketAddr>,
    /// What the extender knows of the cluster (tests feed it as the watcher would).
    pub cluster: Arc<coloc::extender::ClusterView>,
    /// Every GPU the binding webhook decides over (tests feed it as its watcher would).
    pub inventory: Arc<coloc::extender::binding::Inventory>,
    pub client: ColocationAdvisorClient<Channel>,
    pub dir: Arc<TempDir>,
    /// The server's advisor, to drive a profiling worker beside it.
    pub advisor: Arc<coloc::advisor::Advisor>,
    pub settings: Settings,
    shutdown: CancellationToken,
    server: JoinHandle<anyhow::Result<()>>,
    /// Drops a PostgreSQL database with the last handle on `dir` (after `dir` itself).
    _database: crate::store_url::DatabaseGuard,
}

/// The store of the tests in `dir`: its SQLite file, or under `COLOC_TEST_STORE=postgres`
/// its PostgreSQL database (`store_url`).
pub fn database_url(dir: &TempDir) -> String {
    if crate::store_url::on_postgres() {
        return crate::store_url::postgres_url(dir.path());
    }
    format!("sqlite://{}", dir.path().join("coloc.db").display())
}

/// A server on a fresh database.
pub async fn spawn_app() -> TestApp {
    spawn_app_in(Arc::new(TempDir::new().unwrap())).await
}

/// A server on the database in `dir` (a restart when a server ran there before).
pub async fn spawn_app_in(dir: Arc<TempDir>) -> TestApp {
    spawn_app_with_config(dir, "").await
}

/// A server on the database in `dir`, with `config` (TOML) as its settings file.
pub async fn spawn_app_with_config(dir: Arc<TempDir>, config: &str) -> TestApp {
    let url = database_url(&dir);
    spawn_app_on(dir, config, url).await
}

/// A server on the database at `url`, with `dir` for its files and `config` (TOML) as its
/// settings file.
pub async fn spawn_app_on(dir: Arc<TempDir>, config: &str, url: String) -> TestApp {
    if std::env::var_os("COLOC_TEST_LOG").is_some() {
        // The servers' logs on the test's output, for debugging a failing test.
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    }
    let config_path = dir.path().join("coloc.toml");
    std::fs::write(&config_path, config).unwrap();
    let settings = Settings::load(SettingsSources {
        file: Some(&config_path),
        environment: Some(Default::default()),
        overrides: vec![
            ("server.listen", "127.0.0.1:0".into()),
            ("metrics.listen", "127.0.0.1:0".into()),
            ("database.url", url),
        ],
    })
    .unwrap();
    let app = App::build(&settings).await.unwrap();
    let addr = app.local_addr();
    let metrics_addr = app.metrics_addr();
    let extender_addr = app.extender_addr();
    let cluster = app.cluster();
    let inventory = app.inventory();
    let advisor = app.advisor();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    // Lazy: a TLS server would refuse an eager plaintext handshake; tests of TLS build
    // their own channel.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let client = ColocationAdvisorClient::new(channel);
    let _database = crate::store_url::DatabaseGuard {
        dir: Arc::downgrade(&dir),
        path: dir.path().to_path_buf(),
    };
    TestApp {
        addr,
        metrics_addr,
        extender_addr,
        cluster,
        inventory,
        client,
        dir,
        advisor,
        settings,
        shutdown,
        server,
        _database,
    }
}

impl TestApp {
    /// A fresh connection to the server, for the health and reflection clients.
    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Stops the server and waits until it has closed the database.
    pub async fn stop(self) -> Arc<TempDir> {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
        self.dir
    }

    /// Every row of every table, as text: equal dumps mean an unchanged store. The leader's
    /// lease (`leader_lease`, renewed every few seconds by the server itself) is no data and
    /// left out.
    pub async fn dump_store(&self) -> String {
        let url = database_url(&self.dir);
        if crate::store_url::on_postgres() {
            return crate::store_url::dump(&url).await;
        }
        let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
             AND name <> 'leader_lease' ORDER BY name",
        )
        .fetch_all(&mut connection)
        .await
        .unwrap();
        let mut dump = String::new();
        for table in tables {
            let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
                .bind(&table)
                .fetch_all(&mut connection)
                .await
                .unwrap();
            let sql = format!(
                "SELECT json_group_array(json_array({})) FROM (SELECT * FROM \"{table}\" ORDER BY rowid)",
                columns.iter().map(|c| format!("quote(\"{c}\")")).collect::<Vec<_>>().join(", ")
            );
            let rows: String = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut connection)
                .await
                .unwrap()
                .get(0);
            dump.push_str(&format!("{table}: {rows}\n"));
        }
        dump
    }

    /// The number of rows in one table.
    pub async fn count(&self, table: &str) -> i64 {
        self.query_i64(&format!("SELECT COUNT(*) FROM \"{table}\""))
            .await
    }

    /// One integer read straight from the database file.
    pub async fn query_i64(&self, sql: &str) -> i64 {
        let url = database_url(&self.dir);
        if crate::store_url::on_postgres() {
            return crate::store_url::query_i64(&url, sql).await;
        }
        let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_one(&mut connection)
            .await
            .unwrap()
    }
}

/// SplitMix64: a small deterministic pseudo-random sequence in [0, 1). Its output mixes
/// the seed non-linearly, so profiles built from consecutive seeds are not collinear.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A plausible profile on the test GPU, varied by `seed`.
pub fn profile(seed: u64, memory_gb: f64) -> pb::Profile {
    let mut r = SplitMix(seed);
    pb::Profile {
        gpu: GPU.into(),
        kernel: Some(pb::KernelMetrics {
            threads: 1e5 + r.next() * 4e6,
            compute_throughput_pct: 20.0 + r.next() * 70.0,
            dram_throughput_pct: 5.0 + r.next() * 60.0,
            memory_throughput_pct: 20.0 + r.next() * 70.0,
            registers: 5e6 + r.next() * 9e7,
            static_shared_memory_bytes: 2e3 + r.next() * 3e4,
        }),
        system: Some(pb::SystemMetrics {
            exclusive_throughput: 5.0 + r.next() * 100.0,
            throughput_unit: "samples/s".into(),
            sm_busy_pct: 30.0 + r.next() * 65.0,
            mem_busy_pct: 5.0 + r.next() * 40.0,
            memory_gb,
        }),
        source: pb::ProfileSource::ClientSupplied as i32,
        gpu_memory_gb: GPU_MEMORY_GB,
        measured_at: None,
        kernel_missing: false,
    }
}

/// A ReportColocation of `members` (workload, throughput) on `gpu`, observed at `at`
/// (seconds since the epoch).
pub fn report_request(gpu: &str, members: &[(&str, f64)], at: i64) -> pb::ReportColocationRequest {
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: gpu.into(),
        members: members
            .iter()
            .map(|(w, t)| pb::ColocatedMember {
                workload: w.to_string(),
                throughput: *t,
                ..Default::default()
            })
            .collect(),
        observed_at: Some(prost_types::Timestamp {
            seconds: at,
            nanos: 0,
        }),
    }
}

pub fn register_request(name: &str, profile: Option<pb::Profile>) -> pb::RegisterWorkloadRequest {
    pb::RegisterWorkloadRequest {
        name: name.into(),
        mode: pb::WorkloadMode::Training as i32,
        model: "resnet-18".into(),
        batch_size: 16,
        labels: [("team".to_string(), "vision".to_string())].into(),
        profile,
        launch: None,
        profile_on_gpus: Vec::new(),
    }
}

/// The ten features of a profile, in the model's order.
pub fn features(p: &pb::Profile) -> [f64; 10] {
    let k = p.kernel.as_ref().unwrap();
    let s = p.system.as_ref().unwrap();
    [
        k.threads,
        k.compute_throughput_pct,
        k.dram_throughput_pct,
        k.memory_throughput_pct,
        k.registers,
        k.static_shared_memory_bytes,
        s.exclusive_throughput,
        s.sm_busy_pct,
        s.mem_busy_pct,
        s.memory_gb,
    ]
}

/// A known linear truth for the throughput sum of a pair, for fit tests.
pub const TRUE_INTERCEPT: f64 = 20.0;
pub const TRUE_COEFFICIENTS: [f64; 10] = [1e-6, 0.2, -0.3, 0.1, 5e-8, -2e-4, 0.9, -0.1, 0.05, -0.5];

pub fn true_sum(a: &pb::Profile, b: &pb::Profile) -> f64 {
    let (fa, fb) = (features(a), features(b));
    TRUE_INTERCEPT
        + (0..10)
            .map(|i| TRUE_COEFFICIENTS[i] * (fa[i] + fb[i]))
            .sum::<f64>()
}

/// Registers `n` profiled workloads w00.. (profile seed `seed + i`, memory `memory(i)` GB)
/// and reports every pair among them, a workload with itself included, with the members'
/// throughputs given by `throughputs(a, b)`. Returns the profiles.
async fn register_and_report_all_pairs(
    app: &mut TestApp,
    n: usize,
    seed: u64,
    memory: impl Fn(usize) -> f64,
    throughputs: impl Fn(&pb::Profile, &pb::Profile) -> (f64, f64),
) -> Vec<(String, pb::Profile)> {
    let mut workloads = Vec::new();
    for i in 0..n {
        let name = format!("w{i:02}");
        let p = profile(seed + i as u64, memory(i));
        app.client
            .register_workload(register_request(&name, Some(p.clone())))
            .await
            .unwrap();
        workloads.push((name, p));
    }
    for i in 0..n {
        for j in i..n {
            let (a, pa) = &workloads[i];
            let (b, pb_) = &workloads[j];
            let (ta, tb) = throughputs(pa, pb_);
            let member = |workload: &str, throughput: f64| pb::ColocatedMember {
                workload: workload.into(),
                throughput,
                job_id: String::new(),
            };
            app.client
                .report_colocation(pb::ReportColocationRequest {
                    sharing_mode: None,
                    gpu_id: String::new(),
                    gpu: GPU.into(),
                    members: vec![member(a, ta), member(b, tb)],
                    observed_at: Some(prost_types::Timestamp {
                        seconds: 1_700_000_000 + (i * n + j) as i64,
                        nanos: 0,
                    }),
                })
                .await
                .unwrap();
        }
    }
    workloads
}

/// Registers `n` profiled workloads w00.. (memory 1 + i GB) and reports every pair among
/// them with throughputs that follow the known linear truth exactly (split 40/60 between
/// the members). Returns the profiles.
pub async fn seed_workloads_and_runs(app: &mut TestApp, n: usize) -> Vec<(String, pb::Profile)> {
    register_and_report_all_pairs(
        app,
        n,
        0,
        |i| 1.0 + i as f64,
        |a, b| {
            let sum = true_sum(a, b);
            (sum * 0.4, sum * 0.6)
        },
    )
    .await
}

/// A known per-member interference law: a member keeps less of its exclusive throughput
/// the busier the SMs of the pair are in total, and never more than all of it.
pub fn true_kept_fraction(own: &pb::Profile, other: &pb::Profile) -> f64 {
    let busy = (features(own)[7] + features(other)[7]) / 100.0;
    (1.25 - 0.5 * busy).clamp(0.2, 1.0)
}

/// Registers `n` profiled workloads and reports every pair among them with each member's
/// throughput following [`true_kept_fraction`]; then trains the default kind.
pub async fn slowdown_app(n: usize) -> (TestApp, Vec<(String, pb::Profile)>) {
    slowdown_app_with_config(n, "").await
}

/// [`slowdown_app`] with `config` (TOML) as the server's settings file.
pub async fn slowdown_app_with_config(
    n: usize,
    config: &str,
) -> (TestApp, Vec<(String, pb::Profile)>) {
    let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), config).await;
    let exclusive = |p: &pb::Profile| p.system.as_ref().unwrap().exclusive_throughput;
    let workloads = register_and_report_all_pairs(
        &mut app,
        n,
        100,
        |i| 1.0 + (i % 6) as f64,
        |a, b| {
            (
                exclusive(a) * true_kept_fraction(a, b),
                exclusive(b) * true_kept_fraction(b, a),
            )
        },
    )
    .await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    (app, workloads)
}

/// Seeds workloads and runs, then trains the server's default model kind.
pub async fn trained_app(n: usize) -> (TestApp, Vec<(String, pb::Profile)>) {
    trained_app_with(n, "").await
}

/// Seeds workloads and runs, then trains `kind` ("" = the default); returns the profiles.
pub async fn trained_app_with(n: usize, kind: &str) -> (TestApp, Vec<(String, pb::Profile)>) {
    let mut app = spawn_app().await;
    let workloads = seed_workloads_and_runs(&mut app, n).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: kind.into(),
        })
        .await
        .unwrap();
    (app, workloads)
}

/// Asserts that a call failed with `code`, and returns its message.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
) -> String {
    match result {
        Ok(value) => panic!("expected {code:?}, got success: {value:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "message: {}", status.message());
            status.message().to_string()
        }
    }
}

/// Every workload on the server in `state` (0 = any), page after page.
pub async fn all_workloads(
    client: &mut ColocationAdvisorClient<Channel>,
    state: i32,
) -> Result<Vec<pb::Workload>, tonic::Status> {
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 1000,
                page_token,
                state,
            })
            .await?
            .into_inner();
        all.extend(page.workloads);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

pub use crate::free_port::free_port;

//! The observer end to end. Against a real Prometheus (Debian's `prometheus`, started here
//! on a free port with a temporary config and data folder) scraping a test exporter over
//! real HTTP, whose gauges follow a scripted timeline of pods on two GPUs: the runs formed
//! are exactly the script's (members, windows, throughputs to 1e-6), bad series are skipped
//! with their reason, and a server restart in the middle stores nothing twice. And the push
//! endpoint on the metrics listener: bad bodies get clear errors and change nothing, good
//! ones make a solo window from the cluster view.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use coloc::{
    domain::now_ms,
    observer::{
        prometheus::PrometheusSource, Formed, GpuKey, Observer, Pod, Recorder, SkipReason,
        ThroughputSource,
    },
    settings::{ObserverSettings, PrometheusSettings},
    store::Store,
};

use crate::helpers::{
    database_url, free_port, profile, register_request, spawn_app_in, spawn_app_with_config, GPU,
};

/// The scripted gauges: pod UID -> throughput now (absent = no series).
type Gauges = Arc<Mutex<BTreeMap<String, f64>>>;

/// Serves `GET /metrics` with one `coloc_test_throughput{pod_uid=..}` gauge per pod, in the
/// text exposition format.
async fn exporter(gauges: Gauges) -> SocketAddr {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let gauges = gauges.clone();
            async move {
                let mut text = String::from(
                    "# HELP coloc_test_throughput Samples per second.\n\
                     # TYPE coloc_test_throughput gauge\n",
                );
                for (uid, value) in gauges.lock().unwrap().iter() {
                    text.push_str(&format!(
                        "coloc_test_throughput{{pod_uid=\"{uid}\"}} {value}\n"
                    ));
                }
                text
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A Prometheus process, stopped when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Prometheus scraping `target` every second; `None` (the test skips) when the
/// binary is missing outside CI.
async fn start_prometheus(target: SocketAddr) -> Option<Prometheus> {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus is missing (.ci/run installs Debian's package)"
        );
        eprintln!("skipped: no prometheus binary (apt-get install prometheus)");
        return None;
    }
    let dir = tempfile::TempDir::new().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: exporter\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let prometheus = Prometheus {
        child,
        url: url.clone(),
        _dir: dir,
    };
    for _ in 0..100 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let request = "GET /-/ready HTTP/1.0\r\n\r\n";
            if stream.write_all(request.as_bytes()).await.is_ok() {
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer).await;
                if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Scraping starts a moment after readiness: wait for the first scrape of the exporter.
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for _ in 0..100 {
        if let Ok((200, body)) = tokio::time::timeout(
            Duration::from_secs(2),
            http(
                addr,
                "GET",
                "/api/v1/query?query=up%7Bjob%3D%22exporter%22%7D",
                "",
            ),
        )
        .await
        {
            if body.contains("\"1\"]") {
                return Some(prometheus);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("prometheus did not scrape the exporter at {url}");
}

fn pod(uid: &str) -> Pod {
    Pod {
        uid: uid.into(),
        workload: format!("obs-{uid}"),
        name: format!("ml/{uid}"),
        query: None,
    }
}

fn gpu(id: &str) -> GpuKey {
    GpuKey {
        node: "n1".into(),
        gpu_id: id.into(),
    }
}

/// One step of the script, `at_s` seconds after the start: the GPU's pods from then on, and
/// each one's gauge (`None`: the pod exports no series).
struct Step {
    at_s: i64,
    gpu: &'static str,
    pods: &'static [(&'static str, Option<f64>)],
}

/// Two GPUs, 8-second windows. g0: a alone (solo, 100), a+b (70, 40), a+b+c for 2 s (too
/// short), a+c (60, 30). g1: d+e where e's series vanishes after 3 s (stale), d+f where f
/// exports nothing (missing), d+h where h exports -5 (absurd).
const SCRIPT: &[Step] = &[
    Step {
        at_s: 0,
        gpu: "g0",
        pods: &[("a", Some(100.0))],
    },
    Step {
        at_s: 0,
        gpu: "g1",
        pods: &[("d", Some(50.0)), ("e", Some(20.0))],
    },
    Step {
        at_s: 8,
        gpu: "g0",
        pods: &[("a", Some(70.0)), ("b", Some(40.0))],
    },
    Step {
        at_s: 8,
        gpu: "g1",
        pods: &[("d", Some(45.0)), ("f", None)],
    },
    Step {
        at_s: 16,
        gpu: "g0",
        pods: &[("a", Some(65.0)), ("b", Some(35.0)), ("c", Some(25.0))],
    },
    Step {
        at_s: 16,
        gpu: "g1",
        pods: &[("d", Some(55.0)), ("h", Some(-5.0))],
    },
    Step {
        at_s: 18,
        gpu: "g0",
        pods: &[("a", Some(60.0)), ("c", Some(30.0))],
    },
    Step {
        at_s: 24,
        gpu: "g1",
        pods: &[],
    },
    Step {
        at_s: 26,
        gpu: "g0",
        pods: &[],
    },
];

fn observer_settings() -> ObserverSettings {
    ObserverSettings {
        min_window_secs: 5,
        guard_secs: 2,
        settle_secs: 0,
        stale_secs: 1,
        ..ObserverSettings::default()
    }
}

fn observer(
    app: &crate::helpers::TestApp,
    store: Store,
    recorder: Arc<Recorder>,
    prometheus: &str,
) -> Observer {
    let source: Arc<dyn ThroughputSource> = Arc::new(PrometheusSource::new(PrometheusSettings {
        url: prometheus.into(),
        step_secs: 1,
        default_query: r#"coloc_test_throughput{pod_uid="{pod_uid}"}"#.into(),
        ..PrometheusSettings::default()
    }));
    Observer::new(
        app.advisor.clone(),
        store,
        recorder,
        vec![source],
        observer_settings(),
    )
}

/// Plays the script's steps up to `until_s`, in real time from `t0` (ms), switching the
/// exporter's gauges and recording each change at the same instant.
async fn play(t0: i64, steps: &[Step], recorder: &Recorder, gauges: &Gauges, removed_e: &mut bool) {
    for step in steps {
        let at = t0 + step.at_s * 1000;
        loop {
            // e's series vanishes 3 s into its window.
            if !*removed_e && now_ms() >= t0 + 3000 {
                gauges.lock().unwrap().remove("e");
                *removed_e = true;
            }
            let wait = at - now_ms();
            if wait <= 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(wait.min(100) as u64)).await;
        }
        let mut values = gauges.lock().unwrap();
        let pods: Vec<Pod> = step.pods.iter().map(|(uid, _)| pod(uid)).collect();
        for (uid, value) in step.pods {
            match value {
                Some(v) => values.insert(uid.to_string(), *v),
                None => values.remove(*uid),
            };
        }
        recorder.set_gpu(at, gpu(step.gpu), Some(GPU.into()), pods);
    }
}

fn summary(outcomes: &[coloc::observer::WindowOutcome], t0: i64) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| {
            let what = match &o.formed {
                Formed::Run { members, .. } => members
                    .iter()
                    .map(|(uid, _, m)| format!("{uid}={m:.6}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                Formed::Solo {
                    workload,
                    throughput,
                    ..
                } => format!("solo {workload}={throughput:.6}"),
                other => format!("{other:?}"),
            };
            format!(
                "{} {}-{}s {what}",
                o.gpu.gpu_id,
                (o.start_ms - t0) / 1000,
                (o.end_ms - t0) / 1000
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_timeline_on_a_real_prometheus_makes_exactly_the_expected_runs() {
    let gauges: Gauges = Default::default();
    let target = exporter(gauges.clone()).await;
    let Some(prometheus) = start_prometheus(target).await else {
        return;
    };
    let dir = Arc::new(tempfile::TempDir::new().unwrap());
    let mut app = spawn_app_in(dir.clone()).await;
    for (i, uid) in ["a", "b", "c", "d", "e", "f", "h"].iter().enumerate() {
        app.client
            .register_workload(register_request(
                &format!("obs-{uid}"),
                Some(profile(i as u64 + 1, 2.0)),
            ))
            .await
            .unwrap();
    }
    let recorder = Arc::new(Recorder::new());
    let store = Store::open(&database_url(&dir)).await.unwrap();
    let mut first = observer(&app, store, recorder.clone(), &prometheus.url);
    // Whole seconds, so that the query steps fall on the same instants as the windows.
    let t0 = (now_ms() / 1000 + 2) * 1000;
    let mut removed_e = false;
    play(t0, &SCRIPT[..4], &recorder, &gauges, &mut removed_e).await;
    play(t0, &SCRIPT[4..6], &recorder, &gauges, &mut removed_e).await;
    let before = summary(&first.run_once(now_ms()).await.unwrap(), t0);
    assert_eq!(
        before,
        [
            "g0 0-8s solo obs-a=100.000000",
            "g1 0-8s Skipped(Stale)",
            "g0 8-16s a=70.000000 b=40.000000",
            "g1 8-16s Skipped(Missing)",
        ],
    );
    // The server restarts in the middle; a new observer reads the whole timeline again.
    let dir = app.stop().await;
    let app = spawn_app_in(dir.clone()).await;
    let store = Store::open(&database_url(&dir)).await.unwrap();
    let mut second = observer(&app, store, recorder.clone(), &prometheus.url);
    play(t0, &SCRIPT[6..], &recorder, &gauges, &mut removed_e).await;
    let outcomes = second.run_once(now_ms()).await.unwrap();
    assert_eq!(summary(&outcomes, t0), expected_after());
    // Exactly two runs stored, each member once, with the pods' UIDs as job ids and the
    // script's throughputs.
    assert_eq!(app.count("observations").await, 2);
    let members: Vec<(String, f64, String)> = sqlx::query_as(
        "SELECT workload, throughput, job_id FROM observation_members ORDER BY observation_id, job_id",
    )
    .fetch_all(Store::open(&database_url(&dir)).await.unwrap().pool())
    .await
    .unwrap();
    let expected = [
        ("obs-a", 70.0, "a"),
        ("obs-b", 40.0, "b"),
        ("obs-a", 60.0, "a"),
        ("obs-c", 30.0, "c"),
    ];
    assert_eq!(members.len(), expected.len(), "{members:?}");
    for ((workload, throughput, job), (w, t, j)) in members.iter().zip(expected) {
        assert_eq!((workload.as_str(), job.as_str()), (w, j));
        assert!(
            (throughput - t).abs() < 1e-6,
            "{workload}: {throughput} vs {t}"
        );
    }
    for (observer, stale, missing, absurd) in [(&first, 1, 1, 0), (&second, 1, 1, 1)] {
        let stats = observer.stats();
        assert_eq!(
            (
                stats.skipped(SkipReason::Stale),
                stats.skipped(SkipReason::Missing),
                stats.skipped(SkipReason::Absurd)
            ),
            (stale, missing, absurd)
        );
    }
    assert_eq!(app.count("observer_runs").await, 3);
    drop(prometheus);
}

/// The second observer's outcomes, in the order windows closed.
fn expected_after() -> Vec<String> {
    [
        "g0 0-8s Known",
        "g1 0-8s Skipped(Stale)",
        "g0 8-16s Known",
        "g1 8-16s Skipped(Missing)",
        "g0 16-18s Short",
        "g1 16-24s Skipped(Absurd)",
        "g0 18-26s a=60.000000 c=30.000000",
    ]
    .map(String::from)
    .to_vec()
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_make_a_solo_window_and_bad_pushes_change_nothing() {
    let dir = Arc::new(tempfile::TempDir::new().unwrap());
    let mut app = spawn_app_with_config(
        dir,
        "[observer]\nsources = [\"push\"]\ninterval_secs = 1\nmin_window_secs = 2\n\
         guard_secs = 0\nsettle_secs = 0\nstale_secs = 5\n",
    )
    .await;
    let measured = profile(1, 2.0);
    let exclusive = measured.system.as_ref().unwrap().exclusive_throughput;
    app.client
        .register_workload(register_request("obs-p", Some(measured)))
        .await
        .unwrap();
    let metrics = app.metrics_addr.unwrap();
    let path = coloc::observer::push::PUSH_PATH;
    // Each bad push would move the mean off 10 if it were kept.
    let bad: [(&str, u16, &str); 6] = [
        (
            "{\"pod_uid\": \"uid-p\", \"throughput\": -1}",
            400,
            "throughput must be a finite number >= 0",
        ),
        (
            "{\"pod_uid\": \"uid-p\", \"throughput\": 1e13}",
            400,
            "at most 1e12",
        ),
        (
            "{\"pod_uid\": \"uid-p\", \"throughput\": 99, \"steps\": 5}",
            400,
            "unknown field `steps`",
        ),
        (
            "{\"pod_uid\": \"\", \"throughput\": 99}",
            400,
            "pod_uid must be 1 to 256 characters",
        ),
        ("{\"throughput\": 99}", 400, "missing field `pod_uid`"),
        ("99", 400, "the body must be JSON"),
    ];
    app.cluster.set_pod(
        "uid-p",
        Some(coloc::extender::pod::Residency {
            node: "n1".into(),
            gpus: vec!["g0".into()],
            workload: "obs-p".into(),
            min_job_fraction: None,
        }),
    );
    let started = now_ms();
    while now_ms() - started < 4_000 {
        let (status, text) = http(
            metrics,
            "POST",
            path,
            r#"{"pod_uid": "uid-p", "throughput": 10}"#,
        )
        .await;
        assert_eq!(status, 204, "{text}");
        for (body, status, reason) in &bad {
            let (got, text) = http(metrics, "POST", path, body).await;
            assert_eq!(got, *status, "{body}: {text}");
            assert!(text.contains(reason), "{body}: {text}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let big = format!(
        "{{\"pod_uid\": \"uid-p\", \"throughput\": 99, \"pad\": \"{}\"}}",
        "x".repeat(5000)
    );
    assert_eq!(http(metrics, "POST", path, &big).await.0, 413);
    assert_eq!(http(metrics, "GET", path, "").await.0, 405);
    app.cluster.set_pod("uid-p", None);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (status, text) = http(metrics, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("coloc_observer_windows_total{outcome=\"solo\"} 1"),
        "{text}"
    );
    let drift: f64 = text
        .lines()
        .find(|l| l.starts_with("coloc_observer_exclusive_drift_ratio{") && l.contains("obs-p"))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no drift line in {text}"));
    assert!(
        (drift - 10.0 / exclusive).abs() < 1e-9,
        "{drift} vs {}",
        10.0 / exclusive
    );
    assert_eq!(app.count("observations").await, 0);
    assert_eq!(app.count("observer_runs").await, 1);
    // The profile said otherwise beyond noise: the solo window's 10 is now its exclusive
    // throughput, through PutProfile's path (the store, and what GetWorkload answers).
    assert!((exclusive - 10.0).abs() > 0.1 * exclusive, "{exclusive}");
    let workload = app
        .client
        .get_workload(coloc::proto::GetWorkloadRequest {
            name: "obs-p".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let system = workload.profiles[0].system.as_ref().unwrap().clone();
    assert!(
        (system.exclusive_throughput - 10.0).abs() < 1e-9,
        "{system:?}"
    );
}

/// A `query_range` endpoint shaped as Prometheus answers it: while `down` is set, 503 with
/// Prometheus' error body; else one series per query, the value each pod's UID maps to in
/// `values` at every step of the asked range.
async fn flaky_prometheus(down: Arc<Mutex<bool>>, values: BTreeMap<String, f64>) -> String {
    let router = axum::Router::new().route(
        "/api/v1/query_range",
        axum::routing::get(
            move |uri: axum::http::Uri| {
                let (down, values) = (down.clone(), values.clone());
                let params: BTreeMap<String, String> =
                    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                        .into_owned()
                        .collect();
                async move {
                    if *down.lock().unwrap() {
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            r#"{"status":"error","errorType":"unavailable","error":"shutting down"}"#
                                .to_string(),
                        );
                    }
                    let query = &params["query"];
                    let value = values
                        .iter()
                        .find(|(uid, _)| query.contains(&format!("\"{uid}\"")))
                        .map(|(_, v)| *v)
                        .unwrap();
                    let [start, end, step]: [f64; 3] =
                        ["start", "end", "step"].map(|k| params[k].parse().unwrap());
                    let mut points = Vec::new();
                    let mut at = start;
                    while at <= end + 1e-9 {
                        points.push(format!("[{at},\"{value}\"]"));
                        at += step;
                    }
                    let body = format!(
                        r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
                        points.join(",")
                    );
                    (axum::http::StatusCode::OK, body)
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_whose_prometheus_failed_is_formed_when_it_answers_again_for_an_hour() {
    let down = Arc::new(Mutex::new(true));
    let url = flaky_prometheus(
        down.clone(),
        BTreeMap::from([("a".to_string(), 20.0), ("b".to_string(), 10.0)]),
    )
    .await;
    let dir = Arc::new(tempfile::TempDir::new().unwrap());
    let mut app = spawn_app_in(dir.clone()).await;
    for (i, uid) in ["a", "b"].iter().enumerate() {
        app.client
            .register_workload(register_request(
                &format!("obs-{uid}"),
                Some(profile(i as u64 + 1, 2.0)),
            ))
            .await
            .unwrap();
    }
    let recorder = Arc::new(Recorder::new());
    let store = Store::open(&database_url(&dir)).await.unwrap();
    let mut observer = observer(&app, store, recorder.clone(), &url);
    let t0 = 1_800_000_000_000;
    recorder.set_gpu(t0, gpu("g0"), Some(GPU.into()), vec![pod("a"), pod("b")]);
    recorder.set_gpu(t0 + 10_000, gpu("g0"), Some(GPU.into()), vec![]);
    // Down: deferred, twice, nothing stored.
    for turn in 1..=2 {
        let outcomes = observer
            .run_once(t0 + 10_000 + turn * 15_000)
            .await
            .unwrap();
        assert_eq!(summary(&outcomes, t0), ["g0 0-10s Deferred"], "turn {turn}");
    }
    assert_eq!(app.count("observations").await, 0);
    // Up again: the window is formed, once.
    *down.lock().unwrap() = false;
    let outcomes = observer.run_once(t0 + 60_000).await.unwrap();
    assert_eq!(summary(&outcomes, t0), ["g0 0-10s a=20.000000 b=10.000000"]);
    assert!(observer.run_once(t0 + 75_000).await.unwrap().is_empty());
    assert_eq!(app.count("observations").await, 1);

    // Bounded: a window whose source still fails an hour after it closed is skipped.
    recorder.set_gpu(
        t0 + 100_000,
        gpu("g1"),
        Some(GPU.into()),
        vec![pod("a"), pod("b")],
    );
    recorder.set_gpu(t0 + 110_000, gpu("g1"), Some(GPU.into()), vec![]);
    *down.lock().unwrap() = true;
    let outcomes = observer.run_once(t0 + 120_000).await.unwrap();
    assert_eq!(summary(&outcomes, t0), ["g1 100-110s Deferred"]);
    let late = t0 + 110_000 + coloc::observer::RETRY_FOR_MS;
    let outcomes = observer.run_once(late).await.unwrap();
    assert_eq!(
        summary(&outcomes, t0),
        ["g1 100-110s Skipped(SourceFailed)"]
    );
    *down.lock().unwrap() = false;
    assert!(observer.run_once(late + 15_000).await.unwrap().is_empty());
    assert_eq!(app.count("observations").await, 1);
    let stats = observer.stats();
    assert_eq!(stats.skipped(SkipReason::SourceFailed), 1);
    assert_eq!(stats.windows(coloc::observer::WindowKind::Deferred), 3);
}

#[tokio::test]
async fn the_extender_never_explores_and_spends_none_of_the_exploration_budget() {
    use coloc::extender::{
        decide::{GpuSlot, PlacementAsk, Placer, SlotOutcome},
        placer::AdvisorPlacer,
    };
    let (mut app, _) =
        crate::helpers::slowdown_app_with_config(6, "[observer]\nexplore_budget = 1.0\n").await;
    let placer = AdvisorPlacer::new(app.advisor.clone());
    let slot = |residents: &[&str]| GpuSlot {
        gpu_model: Some(GPU.into()),
        memory_gb: None,
        residents: residents.iter().map(|r| r.to_string()).collect(),
        resident_floors: vec![None; residents.len()],
    };
    let ask = PlacementAsk {
        workload: "w00".into(),
        min_job_fraction: None,
        sharing_mode: None,
        slots: vec![slot(&[]), slot(&["w01"]), slot(&["w02", "w03"])],
    };
    for _ in 0..5 {
        let outcomes = placer.place(&ask).await.unwrap();
        assert!(
            outcomes
                .iter()
                .any(|o| matches!(o, SlotOutcome::Fits { .. })),
            "{outcomes:?}"
        );
    }
    assert_eq!(app.advisor.placements_explored(), (0, 0));
    // A Place call of the API on the same GPUs is one placement of the budget.
    let answer = app
        .client
        .place(crate::place::place(
            "w00",
            vec![
                crate::place::gpu("a", &[]),
                crate::place::gpu("b", &["w01"]),
                crate::place::gpu("c", &["w02", "w03"]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.placements.is_empty());
    assert_eq!(app.advisor.placements_explored().0, 1);
}

/// Pushes `value` for `pod_uid` every 200 ms for `for_ms`.
async fn push_for(metrics: SocketAddr, pod_uid: &str, value: f64, for_ms: i64) {
    let body = format!(r#"{{"pod_uid": "{pod_uid}", "throughput": {value}}}"#);
    let started = now_ms();
    while now_ms() - started < for_ms {
        let (status, text) = http(metrics, "POST", coloc::observer::push::PUSH_PATH, &body).await;
        assert_eq!(status, 204, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_pushed_before_a_restart_enter_no_window_after_it() {
    let config = "[observer]\nsources = [\"push\"]\ninterval_secs = 1\nmin_window_secs = 2\n\
                  guard_secs = 0\nsettle_secs = 0\nstale_secs = 5\n";
    let dir = Arc::new(tempfile::TempDir::new().unwrap());
    let mut app = spawn_app_with_config(dir, config).await;
    app.client
        .register_workload(register_request("obs-r", Some(profile(1, 2.0))))
        .await
        .unwrap();
    let residency = || {
        Some(coloc::extender::pod::Residency {
            node: "n1".into(),
            gpus: vec!["g0".into()],
            workload: "obs-r".into(),
            min_job_fraction: None,
        })
    };
    // Before the restart: 99 for 1.5 s, the pod still on its GPU when the server stops.
    app.cluster.set_pod("uid-r", residency());
    push_for(app.metrics_addr.unwrap(), "uid-r", 99.0, 1_500).await;
    let dir = app.stop().await;
    // After it: the same pod (the watcher lists it again) pushes 10 for 4.5 s, then leaves.
    let app = spawn_app_with_config(dir, config).await;
    // Nothing pushed before the restart was kept by the new process.
    app.cluster.set_pod("uid-r", residency());
    push_for(app.metrics_addr.unwrap(), "uid-r", 10.0, 4_500).await;
    app.cluster.set_pod("uid-r", None);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // One solo window, its mean the new process's 10 alone: no 99 from before the restart.
    let (_, text) = http(app.metrics_addr.unwrap(), "GET", "/metrics", "").await;
    assert!(
        text.contains("coloc_observer_windows_total{outcome=\"solo\"} 1"),
        "{text}"
    );
    assert_eq!(app.count("observer_runs").await, 1);
    let workload = app
        .client
        .clone()
        .get_workload(coloc::proto::GetWorkloadRequest {
            name: "obs-r".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let exclusive = workload.profiles[0]
        .system
        .as_ref()
        .unwrap()
        .exclusive_throughput;
    assert!((exclusive - 10.0).abs() < 1e-9, "{exclusive}");
}

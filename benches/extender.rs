//! The scheduler extender's prioritize call over a large cluster: 5,000 nodes with 8 GPUs
//! each, 0 to 3 residents per GPU drawn from the KACE V100 workloads (skewed: a few
//! workloads are common, as in a real cluster), the request as kube-scheduler sends it with
//! `nodeCacheCapable` (`NodeNames`), through the extender's router in-process: JSON in,
//! every GPU judged by the advisor's placement, JSON out. Health (the router's `/healthz`)
//! is measured in the same run as the baseline.
//!
//! `cargo bench --bench extender`; besides criterion's mean (warm: Place keeps set
//! predictions across requests), it prints the p50/p99 of single calls, warm and cold.

use std::{path::Path, sync::Arc, time::Duration};

use axum::body::Body;
use coloc::{
    advisor::{Advisor, Objective, Policy},
    domain::GpuName,
    extender::{
        http::{router, ServeOptions},
        node::NodeGpus,
        placer::AdvisorPlacer,
        pod::Residency,
        ClusterView, Extender,
    },
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    settings::{Settings, SettingsSources},
    startup::advisor_options,
    store::Store,
};
use criterion::{criterion_group, criterion_main, Criterion};
use tower::ServiceExt;

/// The allocator the `coloc` binary serves with, so that the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const GPUS_PER_NODE: u32 = 8;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A trained advisor on the KACE V100 data, in a scratch store.
async fn advisor(dir: &Path) -> Arc<Advisor> {
    let settings = Settings::load(SettingsSources {
        environment: Some(Default::default()),
        overrides: vec![(
            "database.url",
            format!("sqlite://{}/bench.db", dir.display()),
        )],
        ..Default::default()
    })
    .unwrap();
    let store = Store::open(&settings.database.url).await.unwrap();
    let advisor = Arc::new(
        Advisor::load(store, advisor_options(&settings).unwrap())
            .await
            .unwrap(),
    );
    let kace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&advisor, &kace, &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    advisor
}

/// The cluster: GPU feature discovery's product label, residents drawn deterministically.
fn cluster(workloads: &[String]) -> Arc<ClusterView> {
    let view = ClusterView::new();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let mut uid = 0;
    for n in 0..NODES {
        let node = format!("gpu-node-{n:05}");
        view.set_node(
            &node,
            Some(NodeGpus {
                count: GPUS_PER_NODE,
                gpu_model: Some("Tesla-V100-SXM2-32GB".into()),
                memory_gb: None,
            }),
        );
        for g in 0..GPUS_PER_NODE {
            for _ in 0..next(4) {
                // Skewed: the product of two uniform draws favours the first workloads.
                let w = next(workloads.len()) * next(workloads.len()) / workloads.len();
                uid += 1;
                view.set_pod(
                    &format!("pod-{uid}"),
                    Some(Residency {
                        node: node.clone(),
                        gpus: vec![format!("GPU-{n}-{g}")],
                        workload: workloads[w].clone(),
                        min_job_fraction: None,
                    }),
                );
            }
        }
    }
    Arc::new(view)
}

/// One call to the router: `body` POSTed, or a GET without one; the answer's bytes.
async fn call_on(
    app: &axum::Router,
    path: &'static str,
    body: Option<Vec<u8>>,
) -> axum::body::Bytes {
    let request = match body {
        Some(body) => http::Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap(),
        None => http::Request::get(path).body(Body::empty()).unwrap(),
    };
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap()
}

/// Single-call latency distribution (criterion reports means). Place keeps set
/// predictions across requests, so a repeated call is "warm"; "cold" forgets them first
/// (the first call after a new model or a changed profile, or a resident set never seen).
fn latencies(rt: &tokio::runtime::Runtime, advisor: &Advisor, app: &axum::Router, body: &[u8]) {
    for (name, path, rounds, cold) in [
        ("healthz", "/healthz", 2000usize, false),
        ("prioritize 5000x8 warm", "/prioritize", 200, false),
        ("prioritize 5000x8 cold", "/prioritize", 100, true),
        ("filter 5000x8 cold", "/filter", 100, true),
    ] {
        let mut times: Vec<Duration> = (0..rounds)
            .map(|_| {
                let body = (path != "/healthz").then(|| body.to_vec());
                if cold {
                    advisor.forget_placed_sets();
                }
                let start = std::time::Instant::now();
                rt.block_on(call_on(app, path, body));
                start.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "extender {name}: p50 {:?} p99 {:?} max {:?} over {rounds} calls",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.last().unwrap()
        );
    }
}

/// Cold prioritize under today's rules against the rules before them, calls alternating
/// (so that both see the same machine).
fn compare_rules(
    rt: &tokio::runtime::Runtime,
    advisor: &Advisor,
    app: &axum::Router,
    before: &axum::Router,
    body: &[u8],
) {
    let rounds = 100;
    let (mut now, mut then) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (app, times) in [(app, &mut now), (before, &mut then)] {
            advisor.forget_placed_sets();
            let start = std::time::Instant::now();
            rt.block_on(call_on(app, "/prioritize", Some(body.to_vec())));
            times.push(start.elapsed());
        }
    }
    now.sort();
    then.sort();
    println!(
        "extender prioritize 5000x8 cold, alternating: today's rules p50 {:?} p99 {:?}; the \
         rules before p50 {:?} p99 {:?}; ratio p50 {:.2} p99 {:.2} over {rounds} calls each",
        percentile(&now, 0.5),
        percentile(&now, 0.99),
        percentile(&then, 0.5),
        percentile(&then, 0.99),
        percentile(&now, 0.5).as_secs_f64() / percentile(&then, 0.5).as_secs_f64(),
        percentile(&now, 0.99).as_secs_f64() / percentile(&then, 0.99).as_secs_f64(),
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn extender(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let advisor = rt.block_on(advisor(dir.path()));
    let mut workloads: Vec<String> = rt
        .block_on(advisor.list(1000, "", None))
        .map(|(page, _)| {
            page.into_iter()
                .map(|w| w.name.as_str().to_string())
                .collect()
        })
        .unwrap();
    workloads.sort();
    let job = workloads[workloads.len() / 2].clone();
    let view = cluster(&workloads);
    let router_with = |policy: Policy| {
        router(
            Arc::new(Extender::new(
                Arc::new(AdvisorPlacer::with_policy(advisor.clone(), policy)),
                view.clone(),
            )),
            &ServeOptions {
                url_prefix: String::new(),
                max_request_bytes: 64 << 20,
                tokens: None,
                tls: None,
                extra_routes: None,
            },
        )
    };
    let app = router_with(Policy::default());
    // The baseline of the same run: the rules before 2026-11-24 (THROUGHPUT_SUM gains,
    // floors on the point predictions, no placement rule).
    let before = router_with(Policy::unrestricted(Objective::ThroughputSum));
    let names: Vec<String> = (0..NODES).map(|n| format!("gpu-node-{n:05}")).collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "Pod": {"metadata": {"name": "trainer", "namespace": "ml", "uid": "u1",
                "annotations": {"coloc.io/workload": job}},
                "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}], "schedulerName": "coloc-scheduler"},
                "status": {"phase": "Pending"}},
        "Nodes": null,
        "NodeNames": names,
    }))
    .unwrap();
    let call = |path: &'static str, body: Option<Vec<u8>>| call_on(&app, path, body);
    // One answer checked: every node scored, some above the floor.
    let answer: serde_json::Value =
        serde_json::from_slice(&rt.block_on(call("/prioritize", Some(body.clone())))).unwrap();
    assert_eq!(answer.as_array().unwrap().len(), NODES);
    assert!(answer.as_array().unwrap().iter().any(|p| p["Score"] == 10));

    let mut group = c.benchmark_group("extender");
    group.sample_size(30);
    group.bench_function("healthz", |b| {
        b.iter(|| rt.block_on(call("/healthz", None)))
    });
    group.bench_function("prioritize/5000x8", |b| {
        b.iter(|| rt.block_on(call("/prioritize", Some(body.clone()))))
    });
    group.bench_function("filter/5000x8", |b| {
        b.iter(|| rt.block_on(call("/filter", Some(body.clone()))))
    });
    group.finish();

    latencies(&rt, &advisor, &app, &body);
    compare_rules(&rt, &advisor, &app, &before, &body);
}

criterion_group!(benches, extender);
criterion_main!(benches);

//! The binding webhook and the filter after it, per pod, over a large cluster: 5,000 nodes
//! with 8 GPUs each (40,000 GPUs, each with a UUID in the inventory, as HAMi registers
//! them), 0 to 3 residents per GPU drawn from the KACE V100 workloads as in the extender
//! bench. One pod = the AdmissionReview of its create (`extender.binding = hami`: every GPU
//! judged, the best held in a SQLite store) then kube-scheduler's filter call: over the nodes
//! the webhook's affinity leaves (what kube-scheduler sends once its NodeAffinity plugin
//! ran), and, as the worst case, over all 5,000 nodes. Through the extender's router
//! in-process: JSON in, JSON out.
//!
//! `cargo bench --bench binding`; besides criterion's mean, it prints the p50/p99 of single
//! pods, warm (Place keeps set predictions across requests), cold (forgotten first, with
//! what the webhook keeps of Place's answers) and warm after a change of the view before
//! each pod (one GPU's resident changes, as when a pod binds: the webhook indexes the view
//! again).

use std::{path::Path, sync::Arc, time::Duration};

use axum::body::Body;
use coloc::{
    advisor::Advisor,
    domain::GpuName,
    extender::{
        binding::{inventory::Device, webhook, Chooser, Inventory, Webhook},
        http::{router, ServeOptions},
        node::NodeGpus,
        placer::AdvisorPlacer,
        pod::Residency,
        ClusterView, Extender,
    },
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    settings::{BindingMode, Settings, SettingsSources},
    startup::advisor_options,
    store::{reservations::Reservations, Store},
};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};
use tower::ServiceExt;

/// The allocator the `coloc` binary serves with, so that the bench measures what runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const GPUS_PER_NODE: u32 = 8;

/// A trained advisor on the KACE V100 data, and its store.
async fn advisor(dir: &Path) -> (Arc<Advisor>, Store) {
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
        Advisor::load(store.clone(), advisor_options(&settings).unwrap())
            .await
            .unwrap(),
    );
    let kace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&advisor, &kace, &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    (advisor, store)
}

/// The cluster view and the inventory: every GPU by UUID, residents drawn deterministically.
fn cluster(workloads: &[String]) -> (Arc<ClusterView>, Arc<Inventory>) {
    let view = ClusterView::new();
    let inventory = Inventory::new();
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
        let mut devices = Vec::new();
        for g in 0..GPUS_PER_NODE {
            let id = format!("GPU-{n:05}-{g}");
            devices.push(Device {
                node: node.clone(),
                id: id.clone(),
                model: Some(KACE_GPU.into()),
                memory_gb: Some(32.0),
                hami: None,
                dra: None,
            });
            for _ in 0..next(4) {
                let w = next(workloads.len()) * next(workloads.len()) / workloads.len();
                uid += 1;
                view.set_pod(
                    &format!("pod-{uid}"),
                    Some(Residency {
                        node: node.clone(),
                        gpus: vec![id.clone()],
                        workload: workloads[w].clone(),
                        min_job_fraction: None,
                    }),
                );
            }
        }
        inventory.set_node(&node, devices);
    }
    (Arc::new(view), Arc::new(inventory))
}

async fn post(app: &axum::Router, path: &'static str, body: Vec<u8>) -> Value {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// One pod: the webhook, then filter over the affinity's nodes (or all nodes). The nodes
/// the webhook chose.
async fn one_pod(app: &axum::Router, job: &str, uid: usize, all_nodes: bool) -> usize {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("bench-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml", "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "trainer-", "namespace": "ml",
                    "annotations": {"coloc.io/workload": job}},
                "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}},
            "dryRun": false
        }
    });
    let answer = post(app, "/mutate", serde_json::to_vec(&review).unwrap()).await;
    let patch = answer["response"]["patch"].as_str().expect("a patch");
    let patch: Vec<Value> = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, patch).unwrap(),
    )
    .unwrap();
    let nodes: Vec<String> = patch
        .iter()
        .find_map(|op| {
            op["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"]
                .as_array()
                .cloned()
        })
        .expect("node affinity")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let names: Vec<String> = if all_nodes {
        (0..NODES).map(|n| format!("gpu-node-{n:05}")).collect()
    } else {
        nodes.clone()
    };
    let args = json!({
        "Pod": {"metadata": {"name": format!("trainer-{uid}"), "namespace": "ml",
            "annotations": {"coloc.io/workload": job}}, "spec": {"containers": []}},
        "Nodes": null, "NodeNames": names,
    });
    let filtered = post(app, "/filter", serde_json::to_vec(&args).unwrap()).await;
    assert!(!filtered["NodeNames"].as_array().unwrap().is_empty());
    nodes.len()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn binding(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (advisor, store) = rt.block_on(advisor(dir.path()));
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
    let (view, inventory) = cluster(&workloads);
    let churned = view.clone();
    assert_eq!(inventory.len(), NODES * GPUS_PER_NODE as usize);
    let placer = Arc::new(AdvisorPlacer::new(advisor.clone()));
    let chooser = Chooser::new(
        placer.clone(),
        view.clone(),
        inventory,
        Reservations::Store(store.pool().clone()),
        Duration::from_secs(60),
        3,
    );
    let webhook_routes = webhook::router(
        Arc::new(Webhook::new(BindingMode::Hami, chooser)),
        "",
        64 << 20,
    );
    let app = router(
        Arc::new(Extender::new(placer, view)),
        &ServeOptions {
            url_prefix: String::new(),
            max_request_bytes: 64 << 20,
            tokens: None,
            tls: None,
            extra_routes: Some(webhook_routes),
        },
    );
    let mut uid = 0;
    let mut group = c.benchmark_group("binding");
    group.sample_size(20);
    group.bench_function("webhook+filter/5000x8", |b| {
        b.iter(|| {
            uid += 1;
            rt.block_on(one_pod(&app, &job, uid, false))
        })
    });
    group.finish();

    for (name, cold, all_nodes, churn, rounds) in [
        (
            "warm, filter on the affinity's nodes",
            false,
            false,
            false,
            200usize,
        ),
        (
            "cold, filter on the affinity's nodes",
            true,
            false,
            false,
            100,
        ),
        (
            "warm, the view changed before each pod",
            false,
            false,
            true,
            100,
        ),
        ("warm, filter on all 5000 nodes", false, true, false, 100),
        ("cold, filter on all 5000 nodes", true, true, false, 50),
    ] {
        let mut times: Vec<Duration> = (0..rounds)
            .map(|_| {
                uid += 1;
                if cold {
                    advisor.forget_placed_sets();
                }
                if churn {
                    churned.set_pod(
                        "bench-churn",
                        Some(Residency {
                            node: "gpu-node-00000".into(),
                            gpus: vec!["GPU-00000-0".into()],
                            workload: workloads[uid % workloads.len()].clone(),
                            min_job_fraction: None,
                        }),
                    );
                }
                let start = std::time::Instant::now();
                rt.block_on(one_pod(&app, &job, uid, all_nodes));
                start.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "binding webhook+filter 5000x8 {name}: p50 {:?} p99 {:?} max {:?} over {rounds} pods",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.last().unwrap()
        );
    }
}

criterion_group!(benches, binding);
criterion_main!(benches);

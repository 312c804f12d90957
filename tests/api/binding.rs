//! Advice that binds, over real HTTP: the admission webhook of `extender.binding = hami`
//! writes HAMi's `nvidia.com/use-gpuuuid` with the GPUs the Place RPC accepts, best gain
//! first, and node affinity to their nodes; under `dra` it pins a marked ResourceClaim with
//! a CEL selector; under `node-only` there is no webhook. Two pods decided at once never
//! take one last slot twice (reservations in the service's SQLite store), and two replicas
//! sharing one PostgreSQL database agree. Requests are the AdmissionReview documents the API
//! server sends (tests/fixtures/kubernetes/README.md); patches are applied as the API
//! server applies them (RFC 6902). Every neutral path is in `binding_neutral.rs`.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use base64::Engine;
use coloc::{
    cluster::Source,
    extender::{
        binding::{dra::claim_residency, webhook, Chooser, Inventory, Webhook},
        placer::AdvisorPlacer,
        pod::Residency,
    },
    proto as pb,
    settings::BindingMode,
    store::reservations::Reservations,
};
use k8s_openapi::api::{
    core::v1::Node,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use serde_json::{json, Value};

use crate::{
    extender::post,
    helpers::{slowdown_app_with_config, TestApp, GPU},
    schema::FreshDatabase,
};

pub const JOB: &str = "w03";

pub fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn config(mode: &str, gpus: usize) -> String {
    format!(
        "[extender]\nlisten = \"127.0.0.1:0\"\nurl_prefix = \"/coloc\"\nbinding = \"{mode}\"\nbinding_gpus = {gpus}\n"
    )
}

/// HAMi's registered Node, renamed, with these GPU UUIDs.
pub fn hami_node(name: &str, uuids: &[&str]) -> Node {
    let mut node = fixture("node-hami.json");
    let mut devices: Vec<Value> = serde_json::from_str(
        node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let template = devices[0].clone();
    devices = uuids
        .iter()
        .enumerate()
        .map(|(i, uuid)| {
            let mut device = template.clone();
            device["id"] = json!(uuid);
            device["index"] = json!(i);
            device
        })
        .collect();
    node["metadata"]["name"] = json!(name);
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] =
        json!(serde_json::to_string(&devices).unwrap());
    serde_json::from_value(node).unwrap()
}

/// The pod-create AdmissionReview with this request uid and these pod annotations.
pub fn pod_review(uid: &str, annotations: Value) -> Value {
    let mut review = fixture("admission-review-pod-create.json");
    review["request"]["uid"] = json!(uid);
    review["request"]["object"]["metadata"]["annotations"] = annotations;
    review
}

/// The object after the response's patch, as the API server would store it; `None` when
/// the response carries no patch. Asserts the envelope the API server expects.
pub fn patched(review: &Value, response: &Value) -> Option<Value> {
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1", "{response}");
    assert_eq!(response["kind"], "AdmissionReview", "{response}");
    assert_eq!(
        response["response"]["uid"], review["request"]["uid"],
        "{response}"
    );
    assert_eq!(
        response["response"]["allowed"], true,
        "never blocks: {response}"
    );
    let patch = response["response"].get("patch")?;
    assert_eq!(response["response"]["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    Some(object)
}

fn annotation(object: &Value, key: &str) -> Option<String> {
    object["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// Where each GPU's residents live: (node, uuid) -> workloads.
type Layout = Vec<(&'static str, &'static str, Vec<&'static str>)>;

fn seed(app: &TestApp, layout: &Layout) {
    let mut nodes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, uuid, _) in layout {
        nodes.entry(node).or_default().push(uuid);
    }
    for (node, uuids) in &nodes {
        app.inventory.apply_node(&hami_node(node, uuids));
    }
    let mut uid = 0;
    for (node, uuid, residents) in layout {
        for workload in residents {
            uid += 1;
            app.cluster.set_pod(
                &format!("resident-{uid}"),
                Some(Residency {
                    node: node.to_string(),
                    gpus: vec![uuid.to_string()],
                    workload: workload.to_string(),
                    min_job_fraction: None,
                }),
            );
        }
    }
}

/// The Place RPC's gains for the job on each GPU of the layout (server defaults: the
/// extender's policy), by UUID; GPUs it refuses are absent.
async fn place_gains(
    app: &mut TestApp,
    layout: &Layout,
    job_copies: usize,
) -> BTreeMap<String, f64> {
    let gpus = layout
        .iter()
        .map(|(node, uuid, residents)| pb::GpuState {
            id: uuid.to_string(),
            node: node.to_string(),
            gpu: GPU.into(),
            residents: residents
                .iter()
                .map(|r| r.to_string())
                .chain(std::iter::repeat_n(JOB.to_string(), job_copies))
                .collect(),
            ..Default::default()
        })
        .collect();
    let answer = app
        .client
        .place(pb::PlaceRequest {
            workload: JOB.into(),
            gpus,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    answer
        .placements
        .into_iter()
        .map(|p| (p.gpu_id, p.gain))
        .collect()
}

const A: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";
const B: &str = "GPU-7023a4c2-4128-840d-2b86-ab87d8bf7f47";
const C: &str = "GPU-1a2b3c4d-0000-4000-8000-00000000000c";
const D: &str = "GPU-1a2b3c4d-0000-4000-8000-00000000000d";
const E: &str = "GPU-1a2b3c4d-0000-4000-8000-00000000000e";
const F: &str = "GPU-1a2b3c4d-0000-4000-8000-00000000000f";

fn mixed_layout() -> Layout {
    vec![
        ("gpu-node-1", A, vec!["w01"]),
        ("gpu-node-1", B, vec![]),
        ("gpu-node-2", C, vec!["w05", "w05", "w04"]),
        ("gpu-node-2", D, vec!["w02"]),
        ("gpu-node-3", E, vec!["w01", "w06"]),
        ("gpu-node-3", F, vec!["w04"]),
    ]
}

#[tokio::test]
async fn hami_pods_get_the_gpus_place_accepts_best_first_and_affinity_to_their_nodes() {
    let (mut app, _) = slowdown_app_with_config(7, &config("hami", 16)).await;
    let layout = mixed_layout();
    seed(&app, &layout);
    let gains = place_gains(&mut app, &layout, 0).await;
    assert!(
        gains.len() >= 2 && gains.len() < layout.len(),
        "the layout must have GPUs Place accepts and one it refuses: {gains:?}"
    );
    let addr = app.extender_addr.unwrap();
    let review = pod_review("a1", json!({"coloc.io/workload": JOB, "team": "vision"}));
    let (status, response) = post(addr, "/coloc/mutate", &review, "").await;
    assert_eq!(status, 200, "{response}");
    let pod = patched(&review, &response).expect("a patch");
    let named: Vec<String> = annotation(&pod, "nvidia.com/use-gpuuuid")
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let mut expected: Vec<&String> = gains.keys().collect();
    expected.sort();
    let mut got: Vec<&String> = named.iter().collect();
    got.sort();
    assert_eq!(got, expected, "the GPUs Place accepts, each once");
    let in_order: Vec<f64> = named.iter().map(|id| gains[id]).collect();
    assert!(
        in_order.windows(2).all(|w| w[0] >= w[1]),
        "best gain first: {named:?} {in_order:?}"
    );
    assert_eq!(
        annotation(&pod, "coloc.io/gpu-choice").as_deref(),
        Some(named[0].as_str())
    );
    assert_eq!(annotation(&pod, "coloc.io/workload").as_deref(), Some(JOB));
    assert_eq!(annotation(&pod, "team").as_deref(), Some("vision"), "kept");
    let term = &pod["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(term.as_array().unwrap().len(), 1, "{term}");
    let mut nodes: Vec<&str> = term[0]["matchFields"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    nodes.sort();
    let mut wanted: Vec<&str> = layout
        .iter()
        .filter(|(_, uuid, _)| gains.contains_key(*uuid))
        .map(|(node, _, _)| *node)
        .collect();
    wanted.sort();
    wanted.dedup();
    assert_eq!(nodes, wanted);
    assert_eq!(term[0]["matchFields"][0]["key"], "metadata.name");
    assert_eq!(term[0]["matchFields"][0]["operator"], "In");

    // A pod with node affinity of its own keeps it: coloc's requirement joins each term.
    let mut review = pod_review("a2", json!({"coloc.io/workload": JOB}));
    review["request"]["object"]["spec"]["affinity"] = json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["on"]}]}]}}});
    let (_, response) = post(addr, "/coloc/mutate", &review, "").await;
    let pod = patched(&review, &response).expect("a patch");
    let term = &pod["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
    assert_eq!(term["matchExpressions"][0]["key"], "gpu", "{term}");
    assert_eq!(term["matchFields"][0]["key"], "metadata.name", "{term}");
    app.stop().await;
}

/// HAMi's accounting: a GPU whose memory bound pods' `hami.io/vgpu-devices-allocated` has
/// taken, or that coloc's live holds will take, is not named, though Place accepts it; a pod
/// no GPU has room for is answered neutrally (`binding_neutral.rs` counts the reason).
#[tokio::test]
async fn gpus_hami_has_no_room_on_are_not_named() {
    let (mut app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    // Two GPUs of 16,384 MiB (the fixture's `devmem`); on A a bound pod HAMi allocated
    // 14,000 MiB.
    let layout: Layout = vec![("gpu-node-1", A, vec!["w01"]), ("gpu-node-2", B, vec![])];
    seed(
        &app,
        &vec![("gpu-node-1", A, vec![]), ("gpu-node-2", B, vec![])],
    );
    let mut bound = fixture("pod-pending.json");
    bound["metadata"]["annotations"] = json!({"coloc.io/workload": "w01",
        "hami.io/vgpu-devices-allocated": format!("{A},NVIDIA,14000,0:;")});
    bound["spec"]["nodeName"] = json!("gpu-node-1");
    bound["status"] = json!({"phase": "Running"});
    let watched = coloc::extender::watcher::watched_pod(&serde_json::from_value(bound).unwrap());
    app.cluster.set_watched_pod("ml/bound", watched);
    let gains = place_gains(&mut app, &layout, 0).await;
    assert!(
        gains.contains_key(A) && gains.contains_key(B),
        "Place must accept both GPUs for the test to say anything: {gains:?}"
    );
    let addr = app.extender_addr.unwrap();
    let review = |uid: &str, mem: &str| {
        let mut review = pod_review(uid, json!({"coloc.io/workload": JOB}));
        review["request"]["name"] = json!(uid);
        review["request"]["object"]["spec"]["containers"][0]["resources"] =
            json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem}});
        review
    };
    // 3,000 MiB: A has 2,384 left, so B, whatever Place prefers.
    let first = review("m1", "3000");
    let (_, response) = post(addr, "/coloc/mutate", &first, "").await;
    let pod = patched(&first, &response).expect("a patch");
    assert_eq!(
        annotation(&pod, "nvidia.com/use-gpuuuid").as_deref(),
        Some(B)
    );
    // 14,000 MiB: A is short, and B is short once m1's held 3,000 MiB count.
    let big = review("m2", "14000");
    let (_, response) = post(addr, "/coloc/mutate", &big, "").await;
    assert!(
        patched(&big, &response).is_none(),
        "neutral when no GPU has room: {response}"
    );
    app.stop().await;
}

/// Two pods at once on two empty GPUs: without holds both would pick the first (a tie goes
/// to the first GPU); with them, each gets its own.
#[tokio::test]
async fn two_pods_decided_at_once_get_two_gpus() {
    let (app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    seed(
        &app,
        &vec![("gpu-node-1", A, vec![]), ("gpu-node-2", B, vec![])],
    );
    let addr = app.extender_addr.unwrap();
    let (first, second) = (
        pod_review("p1", json!({"coloc.io/workload": JOB})),
        pod_review("p2", json!({"coloc.io/workload": JOB})),
    );
    let ((_, r1), (_, r2)) = tokio::join!(
        post(addr, "/coloc/mutate", &first, ""),
        post(addr, "/coloc/mutate", &second, "")
    );
    let chosen = |review: &Value, response: &Value| {
        annotation(
            &patched(review, response).expect("a patch"),
            "nvidia.com/use-gpuuuid",
        )
        .unwrap()
    };
    let mut got = vec![chosen(&first, &r1), chosen(&second, &r2)];
    got.sort();
    assert_eq!(got, [A, B], "one GPU each");
    app.stop().await;
}

/// A GPU with room for one more copy of the job but not two (the Place RPC says which), and
/// a second GPU further down: two pods at once never both take the last slot; the second
/// gets the next GPU, and once every slot is held the next pod is answered neutrally.
#[tokio::test]
async fn the_last_slot_of_a_gpu_goes_to_one_pod_and_the_next_pod_gets_the_next_gpu() {
    let (mut app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    // The residents of the contended GPU: the first set Place accepts the job beside once
    // but not twice.
    let names = ["w01", "w02", "w04", "w05", "w06"];
    let mut candidates: Vec<Vec<&'static str>> = vec![vec![]];
    for a in names {
        candidates.push(vec![a]);
        for b in names {
            if a <= b {
                candidates.push(vec![a, b]);
            }
        }
    }
    let mut last_slot = None;
    for residents in candidates {
        let layout: Layout = vec![("gpu-node-1", A, residents.clone())];
        let once = place_gains(&mut app, &layout, 0).await;
        let twice = place_gains(&mut app, &layout, 1).await;
        if once.contains_key(A) && !twice.contains_key(A) {
            last_slot = Some(residents);
            break;
        }
    }
    let residents = last_slot.expect("some resident set leaves room for exactly one more job");
    seed(&app, &vec![("gpu-node-1", A, residents.clone())]);
    let addr = app.extender_addr.unwrap();
    let reviews: Vec<Value> = (0..2)
        .map(|i| pod_review(&format!("last-{i}"), json!({"coloc.io/workload": JOB})))
        .collect();
    let (r0, r1) = tokio::join!(
        post(addr, "/coloc/mutate", &reviews[0], ""),
        post(addr, "/coloc/mutate", &reviews[1], "")
    );
    let patches: Vec<Option<Value>> =
        vec![patched(&reviews[0], &r0.1), patched(&reviews[1], &r1.1)];
    assert_eq!(
        patches.iter().filter(|p| p.is_some()).count(),
        1,
        "exactly one pod holds the last slot of {residents:?}: {r0:?} {r1:?}"
    );
    // Now a second GPU: the next pod goes there.
    app.inventory.apply_node(&hami_node("gpu-node-2", &[B]));
    let review = pod_review("last-2", json!({"coloc.io/workload": JOB}));
    let (_, response) = post(addr, "/coloc/mutate", &review, "").await;
    let pod = patched(&review, &response).expect("the next GPU");
    assert_eq!(
        annotation(&pod, "nvidia.com/use-gpuuuid").as_deref(),
        Some(B)
    );
    app.stop().await;
}

#[tokio::test]
async fn dra_claims_from_a_marked_template_are_pinned_to_the_chosen_gpus() {
    let (app, _) = slowdown_app_with_config(7, &config("dra", 2)).await;
    let slice: ResourceSlice =
        serde_json::from_value(fixture("resourceslice-nvidia.json")).unwrap();
    app.inventory.apply_slice(&slice);
    assert_eq!(app.inventory.len(), 2);
    let addr = app.extender_addr.unwrap();
    let review = fixture("admission-review-claim-create.json");
    let (status, response) = post(addr, "/coloc/mutate", &review, "").await;
    assert_eq!(status, 200, "{response}");
    let claim = patched(&review, &response).expect("a patch");
    let selectors = &claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"];
    let expression = selectors[0]["cel"]["expression"].as_str().unwrap();
    let choice = annotation(&claim, "coloc.io/gpu-choice").unwrap();
    assert!(
        expression.starts_with(r#"device.attributes["gpu.nvidia.com"].uuid in [""#)
            && expression.contains(&format!("{choice:?}")),
        "{expression}"
    );
    for uuid in [
        "GPU-4dc50575-f241-9f14-1e6e-ecb4a93c3299",
        "GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4",
    ] {
        assert!(
            expression.contains(uuid),
            "both empty GPUs are acceptable: {expression}"
        );
    }
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["count"], 1,
        "kept"
    );
    assert_eq!(
        annotation(&claim, "coloc.io/reservation").as_deref(),
        Some("ml/trainer-0"),
        "held for the claim's owner pod, whose landing ends the hold"
    );

    // A Pod is not what DRA mode pins.
    let pod = pod_review("dra-pod", json!({"coloc.io/workload": JOB}));
    let (_, response) = post(addr, "/coloc/mutate", &pod, "").await;
    assert!(patched(&pod, &response).is_none(), "{response}");
    app.stop().await;
}

#[test]
fn an_allocated_dra_claim_places_its_pod_on_the_gpu_its_device_is() {
    let inventory = Inventory::new();
    let slice: ResourceSlice =
        serde_json::from_value(fixture("resourceslice-nvidia.json")).unwrap();
    inventory.apply_slice(&slice);
    let claim: ResourceClaim =
        serde_json::from_value(fixture("resourceclaim-allocated.json")).unwrap();
    let (pod, watched) = claim_residency(&claim, &inventory).expect("allocated and reserved");
    assert_eq!(pod, "ml/trainer-0");
    assert_eq!(watched.node, "gpu-node-2");
    assert_eq!(watched.gpus, ["GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4"]);
    assert_eq!(watched.gpu_source, Source::DraAllocation);
    assert_eq!(watched.workload.as_deref(), Some("w03"));

    // Not yet allocated, or reserved for no pod: nowhere.
    let mut pending = fixture("resourceclaim-allocated.json");
    pending["status"] = json!({});
    let pending: ResourceClaim = serde_json::from_value(pending).unwrap();
    assert!(claim_residency(&pending, &inventory).is_none());
    let mut unreserved = fixture("resourceclaim-allocated.json");
    unreserved["status"]["reservedFor"] = json!([]);
    let unreserved: ResourceClaim = serde_json::from_value(unreserved).unwrap();
    assert!(claim_residency(&unreserved, &inventory).is_none());
    // A device of a pool the inventory does not know: no GPU coloc can name.
    let mut elsewhere = fixture("resourceclaim-allocated.json");
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("gpu-node-9");
    let elsewhere: ResourceClaim = serde_json::from_value(elsewhere).unwrap();
    assert!(claim_residency(&elsewhere, &inventory).is_none());
}

#[tokio::test]
async fn node_only_serves_no_webhook() {
    let (app, _) = slowdown_app_with_config(7, &config("node-only", 3)).await;
    let review = pod_review("n1", json!({"coloc.io/workload": JOB}));
    let (status, _) = post(app.extender_addr.unwrap(), "/coloc/mutate", &review, "").await;
    assert_eq!(status, 404);
    app.stop().await;
}

/// A webhook on its own port, as a replica of the service would serve it.
async fn replica(
    app: &TestApp,
    reservations: Reservations,
    inventory: Arc<Inventory>,
) -> SocketAddr {
    let chooser = Chooser::new(
        Arc::new(AdvisorPlacer::new(app.advisor.clone())),
        app.cluster.clone(),
        inventory,
        reservations,
        std::time::Duration::from_secs(60),
        1,
    );
    let router = webhook::router(
        Arc::new(Webhook::new(BindingMode::Hami, chooser)),
        "",
        1 << 20,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// Two replicas on one PostgreSQL database, asked at once for two pods: the store gives
/// each its own GPU.
#[tokio::test]
async fn two_replicas_sharing_postgres_never_hold_one_slot_twice() {
    let Some(database) = FreshDatabase::create().await else {
        return;
    };
    let url = database.url.clone();
    let checked = tokio::spawn(async move {
        let (app, _) = slowdown_app_with_config(7, "").await;
        let migrate = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::migrate!("migrations/postgres")
            .run(&migrate)
            .await
            .unwrap();
        let inventory = Arc::new(Inventory::new());
        inventory.apply_node(&hami_node("gpu-node-1", &[A]));
        inventory.apply_node(&hami_node("gpu-node-2", &[B]));
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            addrs.push(replica(&app, Reservations::Postgres(pool), inventory.clone()).await);
        }
        let reviews: Vec<Value> = (0..2)
            .map(|i| pod_review(&format!("r{i}"), json!({"coloc.io/workload": JOB})))
            .collect();
        let (r0, r1) = tokio::join!(
            post(addrs[0], "/mutate", &reviews[0], ""),
            post(addrs[1], "/mutate", &reviews[1], "")
        );
        let mut got: Vec<String> = [(&reviews[0], r0.1), (&reviews[1], r1.1)]
            .iter()
            .map(|(review, response)| {
                annotation(
                    &patched(review, response).expect("a patch"),
                    "nvidia.com/use-gpuuuid",
                )
                .unwrap()
            })
            .collect();
        got.sort();
        assert_eq!(got, [A, B], "one GPU each across replicas");
        let holds = Reservations::Postgres(migrate).live(0).await.unwrap();
        assert_eq!(holds.len(), 2, "{holds:?}");
        app.stop().await;
    })
    .await;
    database.drop_now().await;
    if let Err(failed) = checked {
        std::panic::resume_unwind(failed.into_panic());
    }
}

/// The API server calls webhooks over HTTPS only, verifying the server's certificate
/// against the webhook's caBundle: the webhook is served by the extender's TLS listener.
#[tokio::test]
async fn the_webhook_answers_over_https_as_the_api_server_calls_it() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio_rustls::rustls::{self, pki_types::ServerName};

    let certs = tempfile::TempDir::new().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["coloc.coloc.svc".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let write = |name: &str, pem: String| {
        let path = certs.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let settings = format!(
        "{}tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        config("hami", 3),
        write("server.pem", cert.pem()),
        write("server.key", key.serialize_pem()),
    );
    let (app, _) = slowdown_app_with_config(7, &settings).await;
    seed(
        &app,
        &vec![("gpu-node-1", A, vec![]), ("gpu-node-1", B, vec!["w01"])],
    );
    let addr = app.extender_addr.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(
            ServerName::try_from("coloc.coloc.svc").unwrap(),
            tokio::net::TcpStream::connect(addr).await.unwrap(),
        )
        .await
        .unwrap();
    let review = pod_review("tls-1", json!({"coloc.io/workload": JOB}));
    let (status, response) = crate::extender::post_on(tls, addr, "/coloc/mutate", &review, "")
        .await
        .unwrap();
    assert_eq!(status, 200, "{response}");
    let pod = patched(&review, &response).expect("a patch over HTTPS");
    assert!(annotation(&pod, "nvidia.com/use-gpuuuid")
        .unwrap()
        .contains(A));
    // Plain HTTP on the TLS port gets no answer.
    let plain = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        crate::extender::post_on(
            tokio::net::TcpStream::connect(addr).await.unwrap(),
            addr,
            "/coloc/mutate",
            &review,
            "",
        ),
    )
    .await;
    assert!(!matches!(plain, Ok(Ok((200, _)))), "{plain:?}");
    app.stop().await;
}

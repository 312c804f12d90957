//! The ResourceClaim watcher (`extender.binding = "dra"`) against recorded API-server
//! answers (kube-rs's mock-service pattern, tower-test), beside the GPU inventory's
//! ResourceSlice watcher on the same client, feeding a real server's cluster view: ListGpus
//! shows where DRA pods run at each step. The claim list holds an allocated claim whose
//! slice is listed and one whose slice comes later by a watch event; then a MODIFIED
//! deallocates the first, and a DELETED (its status already cleared, as a claim is deleted
//! once deallocated) removes the second. Shapes: `resourceclaim-allocated.json` and
//! `resourceslice-nvidia.json` (tests/fixtures/kubernetes/README.md), renamed.

use std::time::Duration;

use coloc::{extender::binding::claims::ClaimWatcher, proto::ResidentSource};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower_test::mock::{Handle, SendResponse};

use crate::helpers::{spawn_app, TestApp};

const CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// gpu-1 of gpu-node-2 in the recorded slice, the device the recorded claim is allocated.
const GPU_ON_NODE_2: &str = "GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4";
/// gpu-0 of the slice of gpu-node-3, which the inventory learns late.
const GPU_ON_NODE_3: &str = "GPU-3e1f6a2b-7c4d-4e5f-9a0b-1c2d3e4f5a6b";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The recorded slice of gpu-node-2, or the same made for gpu-node-3 (its devices' UUIDs
/// changed).
fn slice(node: &str) -> Value {
    let mut slice = fixture("resourceslice-nvidia.json");
    if node == "gpu-node-3" {
        slice["metadata"]["name"] = json!("gpu-node-3-gpu.nvidia.com-q2m9d");
        slice["metadata"]["ownerReferences"][0]["name"] = json!(node);
        slice["spec"]["nodeName"] = json!(node);
        slice["spec"]["pool"]["name"] = json!(node);
        slice["spec"]["devices"][0]["attributes"]["uuid"] = json!({"string": GPU_ON_NODE_3});
        slice["spec"]["devices"][1]["attributes"]["uuid"] =
            json!({"string": "GPU-3e1f6a2b-7c4d-4e5f-9a0b-1c2d3e4f5a6c"});
    }
    slice
}

/// The recorded claim (trainer-0's, on gpu-node-2's gpu-1), or trainer-1's on gpu-node-3's
/// gpu-0, at `version`.
fn claim(pod: &str, version: &str) -> Value {
    let mut claim = fixture("resourceclaim-allocated.json");
    claim["metadata"]["resourceVersion"] = json!(version);
    if pod == "trainer-1" {
        claim["metadata"]["name"] = json!("trainer-1-gpu-m4n8q");
        claim["metadata"]["uid"] = json!("5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d");
        claim["metadata"]["annotations"]["coloc.io/workload"] = json!("w05");
        claim["metadata"]["ownerReferences"][0]["name"] = json!(pod);
        let status = &mut claim["status"];
        status["allocation"]["devices"]["results"][0]["pool"] = json!("gpu-node-3");
        status["allocation"]["devices"]["results"][0]["device"] = json!("gpu-0");
        status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] =
            json!(["gpu-node-3"]);
        status["reservedFor"][0]["name"] = json!(pod);
        status["reservedFor"][0]["uid"] = json!("uid-trainer-1");
    }
    claim
}

/// `claim` deallocated: no allocation, reserved for nobody.
fn deallocated(mut claim: Value) -> Value {
    claim["status"] = json!({});
    claim
}

fn list(kind: &str, items: Vec<Value>) -> Response<Body> {
    Response::new(Body::from(
        serde_json::to_vec(&json!({
            "kind": kind, "apiVersion": "resource.k8s.io/v1",
            "metadata": {"resourceVersion": "5120000"},
            "items": items,
        }))
        .unwrap(),
    ))
}

fn events(events: Vec<Value>) -> Response<Body> {
    let mut body = Vec::new();
    for event in events {
        body.extend(serde_json::to_vec(&event).unwrap());
        body.push(b'\n');
    }
    Response::new(Body::from(body))
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// The mock API server: hands the test each request it waits for, in whatever order the
/// two watchers ask.
struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    /// Requests not waited for yet: (path, watch?, query, responder).
    early: Vec<(String, bool, String, SendResponse<Response<Body>>)>,
}

impl ApiServer {
    /// The next list (or watch) of `path`: its query and its responder.
    async fn next(&mut self, path: &str, watch: bool) -> (String, SendResponse<Response<Body>>) {
        if let Some(i) = self
            .early
            .iter()
            .position(|(p, w, ..)| p == path && *w == watch)
        {
            let (_, _, query, send) = self.early.remove(i);
            return (query, send);
        }
        loop {
            let (request, send) =
                tokio::time::timeout(Duration::from_secs(20), self.handle.next_request())
                    .await
                    .unwrap_or_else(|_| panic!("no request for {path} (watch {watch})"))
                    .expect("the watchers dropped their client");
            assert_eq!(request.method(), http::Method::GET);
            let query = request.uri().query().unwrap_or("").to_string();
            let is_watch = query_value(&query, "watch") == Some("true");
            if request.uri().path() == path && is_watch == watch {
                return (query, send);
            }
            let other = request.uri().path().to_string();
            assert!([CLAIMS, SLICES].contains(&other.as_str()), "asked {other}");
            self.early.push((other, is_watch, query, send));
        }
    }
}

/// (GPU, node, [(pod, workload, source)]) of every GPU ListGpus shows.
type Listed = Vec<(String, String, Vec<(String, String, ResidentSource)>)>;

async fn listed(app: &mut TestApp) -> Listed {
    crate::fake_kubelet::listed_gpus(app)
        .await
        .into_iter()
        .map(|(g, jobs)| (g.id, g.node, jobs))
        .collect()
}

fn on(gpu: &str, node: &str, pod: &str, workload: &str) -> Listed {
    vec![(
        gpu.into(),
        node.into(),
        vec![(pod.into(), workload.into(), ResidentSource::DraAllocation)],
    )]
}

/// Asks ListGpus until it answers `want` (the watchers run on their own tasks).
async fn until_listed(app: &mut TestApp, want: Listed, step: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = listed(app).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{step}: ListGpus shows {now:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_claim_watcher_shows_where_dra_pods_run_through_allocation_late_slice_and_release() {
    let mut app = spawn_app().await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let stop = CancellationToken::new();
    let inventory = tokio::spawn(
        app.inventory
            .clone()
            .run(client.clone(), true, stop.clone()),
    );
    let claims = tokio::spawn(
        ClaimWatcher::new(client, app.inventory.clone(), app.cluster.clone()).run(stop.clone()),
    );
    let mut server = ApiServer {
        handle,
        early: Vec::new(),
    };

    let (_, send) = server.next(SLICES, false).await;
    send.send_response(list("ResourceSliceList", vec![slice("gpu-node-2")]));
    let (_, late_slice) = server.next(SLICES, true).await;
    let (_, send) = server.next(CLAIMS, false).await;
    send.send_response(list(
        "ResourceClaimList",
        vec![claim("trainer-0", "5120733"), claim("trainer-1", "5120740")],
    ));
    let (query, watch) = server.next(CLAIMS, true).await;
    assert_eq!(query_value(&query, "resourceVersion"), Some("5120000"));
    until_listed(
        &mut app,
        on(GPU_ON_NODE_2, "gpu-node-2", "ml/trainer-0", "w03"),
        "listed: trainer-0 on its slice's GPU, trainer-1's slice not known yet",
    )
    .await;

    // gpu-node-3's slice comes: the claim listed before it is placed now.
    late_slice.send_response(events(vec![
        json!({"type": "ADDED", "object": slice("gpu-node-3")}),
    ]));
    let both = [
        on(GPU_ON_NODE_3, "gpu-node-3", "ml/trainer-1", "w05"),
        on(GPU_ON_NODE_2, "gpu-node-2", "ml/trainer-0", "w03"),
    ]
    .concat();
    until_listed(&mut app, both, "the late slice").await;

    // trainer-0 done: its claim deallocated.
    watch.send_response(events(vec![json!({
        "type": "MODIFIED", "object": deallocated(claim("trainer-0", "5120800"))
    })]));
    let (query, watch) = server.next(CLAIMS, true).await;
    assert_eq!(query_value(&query, "resourceVersion"), Some("5120800"));
    assert_eq!(
        listed(&mut app).await,
        on(GPU_ON_NODE_3, "gpu-node-3", "ml/trainer-1", "w05"),
        "every event of a watch is applied before the next watch"
    );

    // trainer-1's claim deleted, its last state already deallocated: only the claim's
    // name tells which pod it placed.
    watch.send_response(events(vec![json!({
        "type": "DELETED", "object": deallocated(claim("trainer-1", "5120900"))
    })]));
    let (query, _quiet) = server.next(CLAIMS, true).await;
    assert_eq!(query_value(&query, "resourceVersion"), Some("5120900"));
    assert_eq!(listed(&mut app).await, Listed::new());
    assert!(
        app.cluster.is_bound("ml/trainer-1"),
        "seen placed, then gone: a hold for it is done"
    );

    stop.cancel();
    inventory.await.unwrap();
    claims.await.unwrap();
    app.stop().await;
}

//! The cluster watcher against recorded API-server answers (kube-rs's mock-service
//! pattern, tower-test): a pod list, a watch with ADDED/MODIFIED events and a bookmark, a
//! re-watch from the bookmark that the server drops with 410 Gone, the relist that follows
//! — ending with the occupancy the last list describes. No cluster is needed.

use std::{pin::pin, sync::Arc, time::Duration};

use coloc::extender::{ClusterView, ClusterWatcher};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The recorded pod, renamed, with its workload, phase, node and GPU annotations.
fn pod(
    name: &str,
    workload: Option<&str>,
    phase: &str,
    node: Option<&str>,
    gpu: Option<(&str, &str)>,
) -> Value {
    let mut pod = fixture("pod-pending.json");
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove("coloc.io/workload");
    if let Some(workload) = workload {
        annotations.insert("coloc.io/workload".into(), json!(workload));
    }
    if let Some((key, value)) = gpu {
        annotations.insert(key.into(), json!(value));
    }
    pod["spec"]["nodeName"] = json!(node);
    pod["status"]["phase"] = json!(phase);
    pod
}

fn list(kind: &str, resource_version: &str, items: Vec<Value>) -> Body {
    Body::from(
        serde_json::to_vec(&json!({
            "kind": kind, "apiVersion": "v1",
            "metadata": {"resourceVersion": resource_version},
            "items": items,
        }))
        .unwrap(),
    )
}

fn events(events: Vec<Value>) -> Body {
    let mut body = Vec::new();
    for event in events {
        body.extend(serde_json::to_vec(&event).unwrap());
        body.push(b'\n');
    }
    Body::from(body)
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

const HAMI: &str = "hami.io/vgpu-devices-allocated";
const GPU_B: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";

/// The pods of the `n`th pod list: the first, then the one after 410 Gone.
fn pod_list(n: usize) -> Vec<serde_json::Value> {
    match n {
        // A running resident on gpu-node-1, one not yet bound, one without a workload
        // (still a resident of its GPU, which coloc cannot judge).
        1 => vec![
            pod(
                "a",
                Some("w01"),
                "Running",
                Some("gpu-node-1"),
                Some(("coloc.io/gpu", "gpu-0")),
            ),
            pod("b", Some("w02"), "Pending", None, None),
            pod(
                "c",
                None,
                "Running",
                Some("gpu-node-1"),
                Some(("coloc.io/gpu", "gpu-0")),
            ),
        ],
        // After 410 Gone: what the cluster holds now.
        _ => vec![
            pod(
                "b",
                Some("w02"),
                "Running",
                Some("gpu-node-1"),
                Some((HAMI, &format!("{GPU_B},NVIDIA,3000,0:;"))),
            ),
            pod(
                "d",
                Some("w05"),
                "Running",
                Some("gpu-node-2"),
                Some(("coloc.io/gpu", "gpu-7")),
            ),
            pod(
                "e",
                Some("w06"),
                "Succeeded",
                Some("gpu-node-2"),
                Some(("coloc.io/gpu", "gpu-7")),
            ),
        ],
    }
}

/// The first pod watch: b bound, a finished, f added then deleted, then a bookmark.
fn first_watch_events() -> Body {
    events(vec![
        json!({"type": "MODIFIED", "object": pod("b", Some("w02"), "Running", Some("gpu-node-1"),
            Some((HAMI, &format!("{GPU_B},NVIDIA,3000,0:;"))))}),
        json!({"type": "MODIFIED", "object": pod("a", Some("w01"), "Succeeded", Some("gpu-node-1"),
            Some(("coloc.io/gpu", "gpu-0")))}),
        json!({"type": "ADDED", "object": pod("f", Some("w04"), "Running", Some("gpu-node-2"),
            Some(("coloc.io/gpu", "gpu-7")))}),
        json!({"type": "DELETED", "object": pod("f", Some("w04"), "Running", Some("gpu-node-2"),
            Some(("coloc.io/gpu", "gpu-7")))}),
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": "150"}}}),
    ])
}

/// The second pod watch: 410 Gone (the bookmark's version expired).
fn expired_watch() -> Body {
    events(vec![json!({
            "type": "ERROR",
            "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "too old resource version: 150 (180)",
                "reason": "Expired", "code": 410}
    })])
}

#[tokio::test]
async fn the_watcher_follows_list_watch_bookmarks_and_a_410_relist_to_the_right_occupancy() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cluster = Arc::new(ClusterView::new());
    let stop = CancellationToken::new();
    let watcher =
        tokio::spawn(ClusterWatcher::new(client, None, cluster.clone()).run(stop.clone()));
    let mut handle = pin!(handle);
    // Watches the test never answers (kept open, as a quiet API server would).
    let mut quiet = Vec::new();
    let mut pod_lists = 0;
    let mut pod_watch_versions = Vec::new();
    let mut after_first_watch = None;
    loop {
        let (request, send) = tokio::time::timeout(Duration::from_secs(20), handle.next_request())
            .await
            .expect("the watcher stopped asking the API server")
            .expect("the watcher dropped its client");
        assert_eq!(request.method(), http::Method::GET);
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let watch = query_value(&query, "watch") == Some("true");
        match (path.as_str(), watch) {
            ("/api/v1/nodes", false) => {
                let node = fixture("node-gpu.json");
                send.send_response(Response::new(list("NodeList", "90", vec![node])));
            }
            ("/api/v1/nodes", true) => quiet.push(send),
            ("/api/v1/pods", false) => {
                pod_lists += 1;
                let items = pod_list(pod_lists);
                let version = if pod_lists == 1 { "100" } else { "200" };
                send.send_response(Response::new(list("PodList", version, items)));
            }
            ("/api/v1/pods", true) => {
                let version = query_value(&query, "resourceVersion")
                    .unwrap_or("")
                    .to_string();
                assert_eq!(
                    query_value(&query, "allowWatchBookmarks"),
                    Some("true"),
                    "{query}"
                );
                pod_watch_versions.push(version);
                match pod_watch_versions.len() {
                    1 => send.send_response(Response::new(first_watch_events())),
                    2 => {
                        // Every event of the first watch is applied before the next watch.
                        after_first_watch = Some(cluster.occupancy());
                        send.send_response(Response::new(expired_watch()));
                    }
                    _ => {
                        quiet.push(send);
                        break;
                    }
                }
            }
            other => panic!("unexpected request {other:?}: {}", request.uri()),
        }
    }
    assert_eq!(
        pod_watch_versions,
        ["100", "150", "200"],
        "the bookmark is resumed from"
    );
    assert_eq!(pod_lists, 2, "410 Gone makes the watcher relist");
    let key = |node: &str, gpu: &str| (node.to_string(), gpu.to_string());
    assert_eq!(
        after_first_watch.unwrap(),
        [
            (key("gpu-node-1", GPU_B), vec!["w02".to_string()]),
            // c names no workload but holds gpu-0: a resident coloc cannot judge.
            (
                key("gpu-node-1", "gpu-0"),
                vec!["unknown pod ml/c".to_string()]
            ),
        ]
        .into(),
        "b bound and running, a finished, f added then deleted"
    );
    assert_eq!(
        cluster.occupancy(),
        [
            (key("gpu-node-1", GPU_B), vec!["w02".to_string()]),
            (key("gpu-node-2", "gpu-7"), vec!["w05".to_string()]),
        ]
        .into()
    );
    let node = cluster.node("gpu-node-1").expect("nodes are listed too");
    assert_eq!(
        (node.count, node.gpu_model.as_deref()),
        (8, Some("Test-GPU-16GB"))
    );
    stop.cancel();
    watcher.await.unwrap();
}

//! The extender reads the one cluster view: residents AssignJob recorded (no watcher, no
//! annotation) shape its answer; `extender.prefer = "pack"` puts a node with an acceptable
//! occupied GPU above an empty one; and the endpoint's calls, latencies and neutral
//! answers are counted in the Prometheus registry, read here by scraping the real metrics
//! endpoint.

use std::collections::BTreeMap;

use coloc::proto as pb;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    extender::{pod, post},
    helpers::{set_test_node, slowdown_app_with_config, GPU},
};

const PACK: &str =
    "[extender]\nlisten = \"127.0.0.1:0\"\nurl_prefix = \"/coloc\"\nprefer = \"pack\"\n";

pub async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: coloc\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

/// The value of the sample `name` whose labels include every one of `labels`.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn pack_prefers_a_gpu_assign_job_filled_and_the_calls_are_counted_in_metrics() {
    let (mut app, _) = slowdown_app_with_config(8, PACK).await;
    let addr = app.extender_addr.expect("extender on");
    for node in ["busy", "empty"] {
        set_test_node(&app, node, 1);
    }
    // The only resident comes from AssignJob: no pod, no annotation.
    app.client
        .assign_job(pb::AssignJobRequest {
            job_id: "j1".into(),
            gpu_id: "gpu-0".into(),
            node: "busy".into(),
            gpu: GPU.into(),
            workload: "w01".into(),
            lease_secs: 0,
        })
        .await
        .unwrap();
    // Place against the stored view: the job may go beside j1 (policy defaults).
    let placed = app
        .client
        .place(pb::PlaceRequest {
            workload: "w03".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        placed.placements.iter().any(|p| p.gpu_id == "gpu-0"),
        "the job is acceptable beside w01: {placed:?}"
    );
    let args = json!({
        "Pod": pod(json!({"coloc.io/workload": "w03"})),
        "Nodes": null,
        "NodeNames": ["empty", "busy"],
    });
    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200, "{body}");
    let scores: BTreeMap<String, i64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["Host"].as_str().unwrap().into(),
                p["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        scores,
        [("busy".to_string(), 10), ("empty".to_string(), 5)].into(),
        "pack: the occupied GPU first"
    );
    let (status, _) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200);
    // A pod coloc was not told about: neutral, counted by reason.
    let plain = json!({"Pod": pod(json!({})), "Nodes": null, "NodeNames": ["busy"]});
    let (status, body) = post(addr, "/coloc/prioritize", &plain, "").await;
    assert_eq!((status, body), (200, json!([{"Host": "busy", "Score": 0}])));
    let (status, _) = post(addr, "/coloc/filter", &json!("not extender JSON"), "").await;
    assert_eq!(status, 422);

    let text = scrape(app.metrics_addr.expect("metrics on")).await;
    let calls = |verb: &str, code: &str| {
        sample(
            &text,
            "coloc_extender_requests_total",
            &[&format!("verb=\"{verb}\""), &format!("code=\"{code}\"")],
        )
    };
    assert_eq!(calls("prioritize", "200"), Some(2.0), "{text}");
    assert_eq!(calls("filter", "200"), Some(1.0));
    assert_eq!(calls("filter", "422"), Some(1.0));
    assert_eq!(
        sample(
            &text,
            "coloc_extender_request_duration_seconds_count",
            &["verb=\"prioritize\""]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "coloc_extender_neutral_answers_total",
            &["verb=\"prioritize\"", "reason=\"no_workload\""]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "coloc_extender_neutral_answers_total",
            &["verb=\"filter\""]
        ),
        None,
        "the filter call with a workload was judged"
    );
    app.stop().await;
}

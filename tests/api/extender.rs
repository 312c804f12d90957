//! The kube-scheduler extender over real HTTP: documents shaped as kube-scheduler sends
//! them (a real Pod and real Nodes as the API serves them, `NodeNames` and `Nodes`
//! forms), answered from the trained advisor and the residents the cluster view holds.
//! The expected gains come from the Place RPC; a resident's own floor protects it from the
//! pods placed beside it; pods coloc knows nothing about, unknown workloads and failures
//! must leave scheduling unharmed.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use coloc::{
    domain::GpuName,
    extender::{node::NodeGpus, pod::Residency},
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    proto as pb,
};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{kace_dir, slowdown_app_with_config, spawn_app_with_config, TestApp};

pub const EXTENDER_ON: &str = "[extender]\nlisten = \"127.0.0.1:0\"\nurl_prefix = \"/coloc\"\n";
const JOB: &str = "w03";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The pending pod, with its annotations replaced.
pub fn pod(annotations: Value) -> Value {
    let mut pod = fixture("pod-pending.json");
    pod["metadata"]["annotations"] = annotations;
    pod
}

/// POSTs `body` over a fresh HTTP/1.1 connection; the status and the body as JSON (or
/// as a string when it is not JSON).
pub async fn post(addr: SocketAddr, path: &str, body: &Value, headers: &str) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    post_on(stream, addr, path, body, headers).await.unwrap()
}

/// [`post`] over an open stream (plain or TLS); `Err` when the connection fails.
pub async fn post_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: S,
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &str,
) -> std::io::Result<(u16, Value)> {
    post_with_head(stream, addr, path, body, headers)
        .await
        .map(|(status, _, body)| (status, body))
}

/// [`post_on`], with the answer's head (status line and headers) too.
async fn post_with_head<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &str,
) -> std::io::Result<(u16, String, Value)> {
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.flush().await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8(response).unwrap();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("no HTTP answer: {text:?}")));
    };
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    Ok((status, head.to_string(), body))
}

/// The value of the answer head's `x-coloc-policy` header (the policy applied), if any.
fn policy_header(head: &str) -> Option<&str> {
    head.lines()
        .find_map(|line| line.strip_prefix("x-coloc-policy: "))
}

fn gpus(count: u32, model: &str) -> Option<NodeGpus> {
    Some(NodeGpus {
        count,
        gpu_model: Some(model.into()),
        memory_gb: None,
    })
}

/// A small cluster: GPU model as GPU feature discovery writes the test GPU's name.
fn seed_cluster(app: &TestApp) -> BTreeMap<&'static str, Vec<Vec<&'static str>>> {
    let model = "Test-GPU-16GB";
    // node -> the residents of each of its occupied GPUs
    let layout: BTreeMap<&str, (u32, Vec<Vec<&str>>)> = [
        ("empty", (2, vec![])),
        ("one-busy", (1, vec![vec!["w01"]])),
        ("two-busy", (1, vec![vec!["w01", "w06"]])),
        ("mixed", (2, vec![vec!["w02"], vec!["w04"]])),
        ("no-memory", (1, vec![vec!["w05", "w05", "w04"]])),
    ]
    .into();
    let mut uid = 0;
    for (node, (count, occupied)) in &layout {
        app.cluster.set_node(node, gpus(*count, model));
        for (g, residents) in occupied.iter().enumerate() {
            for workload in residents {
                uid += 1;
                app.cluster.set_pod(
                    &format!("pod-{uid}"),
                    Some(Residency {
                        node: node.to_string(),
                        gpus: vec![format!("gpu-{g}")],
                        workload: workload.to_string(),
                        min_job_fraction: None,
                    }),
                );
            }
        }
    }
    app.cluster
        .set_node("other-model", gpus(1, "Some-Other-GPU"));
    layout
        .into_iter()
        .map(|(node, (count, mut occupied))| {
            if (occupied.len() as u32) < count {
                occupied.push(vec![]);
            }
            (node, occupied)
        })
        .collect()
}

/// What the Place RPC says about the job on every GPU of the layout: per node, the best
/// gain among its GPUs where the job may go (`None`: it may go on none of them), under the
/// extender's default rules.
async fn place_expectations(
    app: &mut TestApp,
    layout: &BTreeMap<&'static str, Vec<Vec<&'static str>>>,
    floor: Option<f64>,
) -> BTreeMap<&'static str, Option<f64>> {
    let gpus = layout
        .iter()
        .flat_map(|(node, gpus)| {
            gpus.iter()
                .enumerate()
                .map(move |(i, residents)| pb::GpuState {
                    id: format!("{node}/{i}"),
                    node: node.to_string(),
                    residents: residents.iter().map(|r| r.to_string()).collect(),
                    ..Default::default()
                })
        })
        .collect();
    // The extender's default rules: NORMALIZED_SUM, floors on the low ends, fair share.
    let answer = app
        .client
        .place(pb::PlaceRequest {
            workload: JOB.into(),
            gpus,
            min_job_fraction: floor.unwrap_or(0.0),
            objective: Some(pb::Objective::NormalizedSum as i32),
            cautious: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut best: BTreeMap<&'static str, Option<f64>> = layout.keys().map(|n| (*n, None)).collect();
    for placement in answer.placements {
        let k = placement.members.len() as f64;
        if placement
            .members
            .iter()
            .any(|m| m.predicted_speed_fraction.unwrap() < 1.0 / k)
        {
            continue; // a member below its fair share of the GPU
        }
        let node = layout.keys().find(|n| **n == placement.node).unwrap();
        let entry = best.get_mut(node).unwrap();
        *entry = Some(entry.map_or(placement.gain, |g: f64| g.max(placement.gain)));
    }
    best
}

/// Filter passes every candidate with no failure and no error (an error would fail the
/// pod's scheduling cycle), and prioritize scores every one 0.
pub async fn assert_neutral(addr: SocketAddr, pod: Value, candidates: &[&str], case: &str) {
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": names(candidates)});
    let (status, body) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{case}: {body}");
    assert_eq!(
        body["NodeNames"],
        names(candidates),
        "{case}: every node passes"
    );
    assert_eq!(body["FailedNodes"], json!({}), "{case}");
    assert_eq!(body["Error"], "", "{case}");
    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200, "{case}");
    let scores: Vec<i64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Score"].as_i64().unwrap())
        .collect();
    assert_eq!(scores, vec![0; candidates.len()], "{case}: neutral scores");
}

fn names(nodes: &[&str]) -> Value {
    json!(nodes)
}

#[tokio::test]
async fn prioritize_scores_each_node_by_its_best_gpus_gain_monotonically_from_one_to_ten() {
    let (mut app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.expect("extender on");
    let layout = seed_cluster(&app);
    let candidates = [
        "empty",
        "one-busy",
        "two-busy",
        "mixed",
        "no-memory",
        "other-model",
        "unknown",
    ];
    let args = json!({
        "Pod": pod(json!({"coloc.io/workload": JOB})),
        "Nodes": null,
        "NodeNames": names(&candidates),
    });
    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200, "{body}");
    let scores: BTreeMap<String, i64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["Host"].as_str().unwrap().to_string(),
                p["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(scores.len(), candidates.len(), "{body}");
    // The best GPU of each node where the job may go, by the Place RPC.
    let best: BTreeMap<&str, f64> = place_expectations(&mut app, &layout, None)
        .await
        .into_iter()
        .filter_map(|(node, gain)| Some((node, gain?)))
        .collect();
    assert!(
        !best.contains_key("no-memory"),
        "17 GB + the job never fits 16 GB"
    );
    assert_eq!(scores["no-memory"], 0);
    assert_eq!(
        scores["other-model"], 0,
        "no model for that GPU model: neutral"
    );
    assert_eq!(
        scores["unknown"], 0,
        "a node coloc knows nothing of: neutral"
    );
    let top = best.values().cloned().fold(f64::NEG_INFINITY, f64::max);
    let bottom = best.values().cloned().fold(f64::INFINITY, f64::min);
    for (node, gain) in &best {
        let score = scores[*node];
        assert!((1..=10).contains(&score), "{node}: {score}");
        if *gain == top {
            assert_eq!(score, 10, "{node} has the best gain");
        }
        if *gain == bottom {
            assert_eq!(score, 1, "{node} has the lowest gain");
        }
        for (other, other_gain) in &best {
            if gain > other_gain {
                assert!(
                    score >= scores[*other],
                    "{node} ({gain}) vs {other} ({other_gain}): {scores:?}"
                );
            }
        }
    }
    assert_eq!(
        best.iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(n, _)| *n),
        Some("empty"),
        "an empty GPU keeps the job's whole throughput: {best:?}"
    );
}

#[tokio::test]
async fn filter_drops_nodes_whose_every_gpu_breaks_the_jobs_floor_or_memory_with_reasons() {
    let (mut app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.unwrap();
    let layout = seed_cluster(&app);
    let floor = 0.9;
    let candidates = [
        "empty",
        "one-busy",
        "two-busy",
        "mixed",
        "no-memory",
        "other-model",
        "unknown",
    ];
    let args = json!({
        "Pod": pod(json!({"coloc.io/workload": JOB, "coloc.io/min-job-fraction": floor.to_string()})),
        "Nodes": null,
        "NodeNames": names(&candidates),
    });
    let (status, body) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["Error"], "");
    assert_eq!(body["Nodes"], Value::Null);
    let passed: Vec<&str> = body["NodeNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let failed = body["FailedNodes"].as_object().unwrap();
    let expected = place_expectations(&mut app, &layout, Some(floor)).await;
    assert!(
        expected.values().any(Option::is_none),
        "the floor refuses some node: {expected:?}"
    );
    for node in layout.keys() {
        let any_fits = expected[node].is_some();
        assert_eq!(passed.contains(node), any_fits, "{node}: {body}");
        assert_eq!(failed.contains_key(*node), !any_fits, "{node}: {body}");
    }
    let reason = failed["no-memory"].as_str().unwrap();
    assert!(
        reason.starts_with("coloc: no GPU on this node fits") && reason.contains("GB"),
        "{reason}"
    );
    assert!(
        passed.contains(&"empty") && passed.contains(&"other-model") && passed.contains(&"unknown")
    );
    assert_eq!(passed.len() + failed.len(), candidates.len());
    assert_eq!(body["FailedAndUnresolvableNodes"], json!({}));
}

#[tokio::test]
async fn a_residents_own_floor_refuses_the_gpus_where_the_new_pod_would_push_it_below() {
    let (mut app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.unwrap();
    // What resident w01 keeps beside the job, by the Place RPC; the pair is above break-even.
    let answer = app
        .client
        .place(pb::PlaceRequest {
            workload: JOB.into(),
            gpus: vec![pb::GpuState {
                id: "g".into(),
                residents: vec!["w01".into()],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // The extender reads floors on the low end of the member's interval (`cautious`).
    let kept = answer.placements[0].members[1]
        .predicted_speed_fraction_low
        .unwrap();
    assert!((0.1..0.9).contains(&kept), "{kept}");
    // Three nodes of one GPU, each running w01 as a real running pod: its floor above what
    // it would keep, below it, or none.
    let floors = [
        ("strict", Some(kept + 0.05)),
        ("lenient", Some(kept - 0.05)),
        ("unguarded", None),
    ];
    for (node, floor) in floors {
        app.cluster.set_node(node, gpus(1, "Test-GPU-16GB"));
        let mut resident = pod(match floor {
            Some(floor) => json!({"coloc.io/workload": "w01", "coloc.io/gpu": "gpu-0",
                "coloc.io/min-job-fraction": floor.to_string()}),
            None => json!({"coloc.io/workload": "w01", "coloc.io/gpu": "gpu-0"}),
        });
        resident["spec"]["nodeName"] = json!(node);
        resident["status"] = json!({"phase": "Running"});
        let residency = coloc::extender::pod::residency(&serde_json::from_value(resident).unwrap())
            .expect("a running pod with its GPU is a resident");
        assert_eq!(residency.min_job_fraction, floor);
        app.cluster
            .set_pod(&format!("resident-{node}"), Some(residency));
    }
    let candidates = ["strict", "lenient", "unguarded"];
    let args = json!({
        "Pod": pod(json!({"coloc.io/workload": JOB})),
        "Nodes": null,
        "NodeNames": names(&candidates),
    });
    let (status, body) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["NodeNames"], json!(["lenient", "unguarded"]), "{body}");
    let reason = body["FailedNodes"]["strict"].as_str().unwrap();
    assert!(
        reason.contains("resident w01") && reason.contains("coloc.io/min-job-fraction"),
        "{reason}"
    );
    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!([
            {"Host": "strict", "Score": 0},
            {"Host": "lenient", "Score": 10},
            {"Host": "unguarded", "Score": 10}
        ])
    );
}

/// One job of the KACE data and three residents it may join, by the Place RPC's shares:
/// `below` (together less than one job's work), `unfair` (more than one job's work, but a
/// member below half its speed) and `fair` (both above half).
async fn rule_cases(app: &mut TestApp) -> (String, [String; 3]) {
    let workloads: Vec<String> =
        crate::helpers::all_workloads(&mut app.client, pb::WorkloadState::Profiled as i32)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
    for job in &workloads {
        let answer = app
            .client
            .place(pb::PlaceRequest {
                workload: job.clone(),
                gpus: workloads
                    .iter()
                    .enumerate()
                    .map(|(i, resident)| pb::GpuState {
                        id: i.to_string(),
                        residents: vec![resident.clone()],
                        ..Default::default()
                    })
                    .collect(),
                objective: Some(pb::Objective::NormalizedSum as i32),
                policy: Some(crate::helpers::open_policy()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let find = |wanted: &dyn Fn(f64, f64) -> bool| {
            answer.placements.iter().find_map(|p| {
                let shares: Vec<f64> = p
                    .members
                    .iter()
                    .map(|m| m.predicted_speed_fraction.unwrap())
                    .collect();
                let (sum, least) = (
                    shares.iter().sum(),
                    shares.iter().cloned().fold(1.0, f64::min),
                );
                wanted(sum, least).then(|| workloads[p.gpu_id.parse::<usize>().unwrap()].clone())
            })
        };
        if let (Some(below), Some(unfair), Some(fair)) = (
            find(&|sum, _| sum < 0.95),
            find(&|sum, least| sum > 1.05 && least < 0.45),
            find(&|_, least| least > 0.55),
        ) {
            return (job.clone(), [below, unfair, fair]);
        }
    }
    panic!("no KACE job with all three kinds of partner");
}

#[tokio::test]
async fn a_gpu_refuses_the_pod_by_the_rule_the_operator_chose_fair_share_by_default() {
    // The published KACE measurements, where some pairs lose and others gain.
    for (rule, passes) in [
        ("", vec!["fair"]),
        ("rule = \"break-even\"\n", vec!["unfair", "fair"]),
        ("rule = \"none\"\n", vec!["unfair", "fair"]),
        (
            "rule = \"none\"\ninclude_losses = true\n",
            vec!["below", "unfair", "fair"],
        ),
    ] {
        let config = format!("{EXTENDER_ON}\n[policy]\n{rule}");
        let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await;
        let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
        import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
            .await
            .unwrap();
        let addr = app.extender_addr.unwrap();
        let (job, residents) = rule_cases(&mut app).await;
        let label = KACE_GPU.replace(' ', "-");
        let nodes = ["below", "unfair", "fair"];
        for (node, resident) in nodes.iter().zip(&residents) {
            app.cluster.set_node(node, gpus(1, &label));
            app.cluster.set_pod(
                &format!("{node}-0"),
                Some(Residency {
                    node: node.to_string(),
                    gpus: vec!["gpu-0".into()],
                    workload: resident.clone(),
                    min_job_fraction: None,
                }),
            );
        }
        let args = json!({
            "Pod": pod(json!({"coloc.io/workload": job})),
            "Nodes": null,
            "NodeNames": names(&nodes),
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (status, head, body) = post_with_head(stream, addr, "/coloc/filter", &args, "")
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["NodeNames"],
            json!(passes),
            "{rule:?} {job} {residents:?}: {body}"
        );
        // The answer echoes the policy it applied, as Rank's and Place's do; prioritize too.
        let policy = policy_header(&head).unwrap_or_else(|| panic!("no policy header: {head}"));
        let expected = match rule {
            "" => "objective normalized-sum, rule fair-share, cautious, job floor none, partner floor none",
            r if r.contains("break-even") => "objective normalized-sum, rule break-even, cautious, job floor none, partner floor none",
            r if r.contains("include_losses") => "objective normalized-sum, rule none, cautious, job floor none, partner floor none, losses listed",
            _ => "objective normalized-sum, rule none, cautious, job floor none, partner floor none",
        };
        assert_eq!(policy, expected, "{head}");
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_, head, _) = post_with_head(stream, addr, "/coloc/prioritize", &args, "")
            .await
            .unwrap();
        assert_eq!(policy_header(&head), Some(expected), "{head}");
        let failed = &body["FailedNodes"];
        match rule {
            "" => {
                for node in ["below", "unfair"] {
                    let reason = failed[node].as_str().unwrap();
                    assert!(reason.contains("below its fair share"), "{reason}");
                }
            }
            r if r.contains("break-even") => {
                let reason = failed["below"].as_str().unwrap();
                assert!(reason.contains("below break-even"), "{reason}");
            }
            r if !r.contains("include_losses") => {
                // No rule, but the default policy lists no predicted loss.
                let reason = failed["below"].as_str().unwrap();
                assert!(reason.contains("a predicted loss"), "{reason}");
            }
            _ => assert_eq!(failed, &json!({})),
        }
    }
}

#[tokio::test]
async fn the_nodes_form_reads_gpus_from_the_node_objects_and_returns_the_passing_nodes() {
    let (app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.unwrap();
    // gpu-node-1 as the API serves it (8 time-sliced GPUs, GFD labels); a copy of it whose
    // one GPU is full (the watcher's residents), and a CPU node.
    let free = fixture("node-gpu.json");
    let mut full = free.clone();
    full["metadata"]["name"] = json!("gpu-node-2");
    full["metadata"]["labels"]["nvidia.com/gpu.count"] = json!("1");
    let mut cpu = free.clone();
    cpu["metadata"]["name"] = json!("cpu-node-1");
    for key in [
        "nvidia.com/gpu.count",
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.replicas",
    ] {
        cpu["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(key);
    }
    cpu["status"]["capacity"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    cpu["status"]["allocatable"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    for (i, workload) in ["w05", "w05", "w04"].iter().enumerate() {
        app.cluster.set_pod(
            &format!("resident-{i}"),
            Some(Residency {
                node: "gpu-node-2".into(),
                gpus: vec!["GPU-1".into()],
                workload: workload.to_string(),
                min_job_fraction: None,
            }),
        );
    }
    let args = json!({
        "Pod": pod(json!({"coloc.io/workload": JOB})),
        "Nodes": {"metadata": {}, "items": [free, full, cpu]},
        "NodeNames": null,
    });
    let (status, body) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["NodeNames"], Value::Null);
    let items = body["Nodes"]["items"].as_array().unwrap();
    let passed: Vec<&str> = items
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(passed, ["gpu-node-1", "cpu-node-1"], "{body}");
    // The nodes come back whole, as kube-scheduler sent them.
    assert_eq!(items[0]["status"]["nodeInfo"]["kubeletVersion"], "v1.33.4");
    assert!(body["FailedNodes"]["gpu-node-2"]
        .as_str()
        .unwrap()
        .contains("GB"));

    let (status, body) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!([
            {"Host": "gpu-node-1", "Score": 10},
            {"Host": "gpu-node-2", "Score": 0},
            {"Host": "cpu-node-1", "Score": 0}
        ])
    );
}

#[tokio::test]
async fn pods_coloc_knows_nothing_about_and_coloc_failures_leave_scheduling_unharmed() {
    let (app, _) = slowdown_app_with_config(8, EXTENDER_ON).await;
    let addr = app.extender_addr.unwrap();
    seed_cluster(&app);
    let candidates = [
        "empty",
        "one-busy",
        "two-busy",
        "mixed",
        "no-memory",
        "unknown",
    ];
    let cases = [
        (
            "no annotation",
            json!({"kubectl.kubernetes.io/restartedAt": "2026-11-23T17:40:11Z"}),
        ),
        (
            "unknown workload",
            json!({"coloc.io/workload": "never-registered"}),
        ),
        (
            "malformed floor",
            json!({"coloc.io/workload": JOB, "coloc.io/min-job-fraction": "most"}),
        ),
    ];
    for (case, annotations) in cases {
        assert_neutral(addr, pod(annotations), &candidates, case).await;
    }
    // Not the extender's JSON at all: refused, and kube-scheduler (ignorable) goes on.
    let (status, _) = post(addr, "/coloc/filter", &json!({"Pod": "a string"}), "").await;
    assert_eq!(status, 422);
}

/// A coloc whose placement always fails, as an internal error would.
struct FailingPlacer;

impl coloc::extender::Placer for FailingPlacer {
    fn place<'a>(
        &'a self,
        _ask: &'a coloc::extender::PlacementAsk,
    ) -> coloc::extender::decide::PlaceFuture<'a> {
        Box::pin(async {
            Err(coloc::extender::PlacementError::Unavailable(
                "internal error".into(),
            ))
        })
    }
}

#[tokio::test]
async fn a_coloc_that_fails_answers_neutrally_over_real_http() {
    let view = std::sync::Arc::new(coloc::extender::ClusterView::new());
    for node in ["a", "b"] {
        view.set_node(node, gpus(2, "Test-GPU-16GB"));
    }
    view.set_pod(
        "pod-1",
        Some(Residency {
            node: "a".into(),
            gpus: vec!["gpu-0".into()],
            workload: "w01".into(),
            min_job_fraction: None,
        }),
    );
    let extender = std::sync::Arc::new(coloc::extender::Extender::new(
        std::sync::Arc::new(FailingPlacer),
        view,
    ));
    let router = coloc::extender::http::router(
        extender,
        &coloc::extender::http::ServeOptions {
            url_prefix: "/coloc".into(),
            max_request_bytes: 1 << 20,
            tokens: None,
            tls: None,
            extra_routes: None,
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let job = pod(json!({"coloc.io/workload": JOB}));
    assert_neutral(addr, job, &["a", "b"], "a failing placement").await;
    server.abort();
}

#[tokio::test]
async fn with_require_token_the_extender_asks_for_a_reader_token() {
    let dir = std::sync::Arc::new(tempfile::TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "reader reader-token-0123456789\n").unwrap();
    let config = format!(
        "[auth]\ntokens_file = \"{}\"\n{EXTENDER_ON}require_token = true\n",
        tokens.display()
    );
    let app = crate::helpers::spawn_app_with_config(dir, &config).await;
    let addr = app.extender_addr.unwrap();
    let args = json!({"Pod": pod(json!({})), "Nodes": null, "NodeNames": ["a"]});
    let (status, _) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 401);
    let (status, _) = post(
        addr,
        "/coloc/filter",
        &args,
        "Authorization: Bearer wrong-token-0123456789\r\n",
    )
    .await;
    assert_eq!(status, 401);
    let (status, body) = post(
        addr,
        "/coloc/filter",
        &args,
        "Authorization: Bearer reader-token-0123456789\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["NodeNames"], json!(["a"]));
}

#[tokio::test]
async fn over_https_the_extender_asks_kube_scheduler_for_a_client_certificate() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio_rustls::rustls::{self, pki_types::ServerName};

    let dir = std::sync::Arc::new(tempfile::TempDir::new().unwrap());
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert, key)
    };
    let (server_cert, server_key) = leaf("localhost");
    let (client_cert, client_key) = leaf("coloc-scheduler");
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let config = format!(
        "{EXTENDER_ON}tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_client_ca_file = \"{}\"\n",
        write("server.pem", server_cert.pem()),
        write("server.key", server_key.serialize_pem()),
        write("ca.pem", ca.pem()),
    );
    let app = crate::helpers::spawn_app_with_config(dir.clone(), &config).await;
    let addr = app.extender_addr.unwrap();

    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let with_certificate = builder
        .clone()
        .with_client_auth_cert(
            vec![client_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
        )
        .unwrap();
    let without_certificate = builder.with_no_client_auth();
    let args = json!({"Pod": pod(json!({})), "Nodes": null, "NodeNames": ["a"]});
    let call = |config: rustls::ClientConfig| {
        let args = args.clone();
        async move {
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            match connector.connect(name, tcp).await {
                Ok(tls) => post_on(tls, addr, "/coloc/filter", &args, "").await,
                Err(error) => Err(error),
            }
        }
    };
    let (status, body) = call(with_certificate).await.unwrap();
    assert_eq!((status, &body["NodeNames"]), (200, &json!(["a"])));
    assert!(
        call(without_certificate).await.is_err(),
        "a caller without a client certificate is refused"
    );
}

/// One verdict for one question: for every pair of the KACE workloads, asked as (the job,
/// its GPU's only resident), Rank (the resident as the only candidate), Place (a GPU with
/// that resident) and the extender's filter over real HTTP (a node with one GPU that
/// resident runs on) admit or refuse alike under the default policy.
#[tokio::test]
async fn rank_place_and_the_extender_give_the_same_verdict_on_every_kace_pair() {
    let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), EXTENDER_ON).await;
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    let addr = app.extender_addr.unwrap();
    let workloads: Vec<String> =
        crate::helpers::all_workloads(&mut app.client, pb::WorkloadState::Profiled as i32)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
    assert_eq!(workloads.len(), 29);
    // Node i: one GPU, resident workloads[i].
    let label = KACE_GPU.replace(' ', "-");
    let nodes: Vec<String> = (0..workloads.len()).map(|i| format!("n{i}")).collect();
    for (node, resident) in nodes.iter().zip(&workloads) {
        app.cluster.set_node(node, gpus(1, &label));
        app.cluster.set_pod(
            &format!("{node}-0"),
            Some(Residency {
                node: node.clone(),
                gpus: vec!["gpu-0".into()],
                workload: resident.clone(),
                min_job_fraction: None,
            }),
        );
    }
    let node_names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let (mut admitted, mut refused) = (0, 0);
    for job in &workloads {
        let ranked = app
            .client
            .rank(pb::RankRequest {
                target: job.clone(),
                candidates: workloads.clone(),
                top_k: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let placed = app
            .client
            .place(pb::PlaceRequest {
                workload: job.clone(),
                gpus: workloads
                    .iter()
                    .enumerate()
                    .map(|(i, resident)| pb::GpuState {
                        id: i.to_string(),
                        residents: vec![resident.clone()],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let args = json!({
            "Pod": pod(json!({"coloc.io/workload": job})),
            "Nodes": null,
            "NodeNames": names(&node_names),
        });
        let (status, filtered) = post(addr, "/coloc/filter", &args, "").await;
        assert_eq!(status, 200, "{filtered}");
        let passed: Vec<&str> = filtered["NodeNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for (i, resident) in workloads.iter().enumerate() {
            let by_rank = ranked.ranked.iter().any(|c| &c.workload == resident);
            let by_place = placed.placements.iter().any(|p| p.gpu_id == i.to_string());
            let by_extender = passed.contains(&nodes[i].as_str());
            assert_eq!(
                (by_rank, by_place),
                (by_place, by_extender),
                "{job} beside {resident}: Rank {by_rank}, Place {by_place}, extender \
                 {by_extender} ({:?})",
                filtered["FailedNodes"][&nodes[i]]
            );
            if by_place {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
    }
    // Both verdicts occur: the test compares something.
    assert!(
        admitted > 50 && refused > 50,
        "{admitted} admitted, {refused} refused"
    );
}

//! `extender.binding = node-only` under NVIDIA's device plugin with time-slicing: each GPU
//! is advertised as [`REPLICAS`] devices `UUID::N` (`NewAnnotatedID`, k8s-device-plugin
//! internal/rm/devices.go). kube-scheduler keeps the nodes with a free replica
//! (NodeResourcesFit), calls coloc's filter and prioritize, and takes the best-scoring node
//! (the harness's nodes are alike to its own plugins; ties at random, `selectHost` in
//! pkg/scheduler/schedule_one.go). The node's kubelet then picks the replica as its device
//! manager does (kubernetes pkg/kubelet/cm/devicemanager/manager.go, `devicesToAllocate`):
//! the device plugin's `GetPreferredAllocation` first, which NVIDIA's plugin answers for
//! replicas with `distributedAlloc` (internal/rm/allocate.go: a replica of the GPU with the
//! fewest replicas allocated; among equals, the order of a Go map), else
//! `allocateRemainingFrom` over the available set (a Go map: any order). Each node's kubelet
//! serves the PodResources v1 proto on its own Unix socket (the List shape of the kubelet's
//! server_v1_test.go, as in `pod_devices.rs`), and `coloc agent`'s reader
//! (`PodDevicesReporter`) reports it to the service after every change; the cluster watcher
//! gives the pod's workload (`watched_pod`).
//!
//! coloc cannot choose the GPU here. What is measured: how often the kubelet's replica is on
//! the GPU coloc prefers on that node (Place over the node's GPUs with the residents ListGpus
//! shows, the largest gain), and that ListGpus shows every running pod on its GPU, with its
//! workload, source `pod-resources`, and nothing else.

use std::collections::BTreeMap;

use coloc::{
    extender::watcher::watched_pod,
    proto::{
        self as pb,
        podresources::{
            ContainerDevices, ContainerResources, ListPodResourcesResponse, NumaNode, PodResources,
            TopologyInfo,
        },
    },
};
use serde_json::json;

use super::{events, node_name, trace, uuid, Chance, Outcome, TracePod};
use crate::{
    binding::{config, pod_review},
    extender::post,
    fake_kubelet::{listed_gpus, reporter, FakeKubelet},
    helpers::{set_test_node, slowdown_app_with_config, TestApp, GPU},
};

const NODES: usize = 8;
const GPUS: usize = 8;
/// Time-slicing replicas per GPU (the plugin's `sharing.timeSlicing.resources[].replicas`).
const REPLICAS: usize = 4;
const PODS: usize = 80;

/// One node's kubelet: which container holds which replica, served as List answers by the
/// shared fake, republished after every change.
#[derive(Default)]
struct Kubelet {
    /// pod name -> the replica its container was given.
    assigned: BTreeMap<String, String>,
    served: FakeKubelet,
}

impl Kubelet {
    fn assign(&mut self, pod: &str, replica: String) {
        self.assigned.insert(pod.to_string(), replica);
        self.publish();
    }

    fn release(&mut self, pod: &str) {
        self.assigned.remove(pod);
        self.publish();
    }

    /// The List answer: each pod's one container with its replica.
    fn publish(&self) {
        let pod_resources = self
            .assigned
            .iter()
            .map(|(pod, replica)| PodResources {
                name: pod.clone(),
                namespace: "ml".into(),
                containers: vec![ContainerResources {
                    name: "trainer".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![replica.clone()],
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 0 }],
                        }),
                    }],
                    cpu_ids: Vec::new(),
                    memory: Vec::new(),
                    dynamic_resources: Vec::new(),
                }],
            })
            .collect();
        self.served
            .set_answer(ListPodResourcesResponse { pod_resources });
    }
}

/// The replica the kubelet gives a container on a node: NVIDIA's preferred allocation when
/// `preferred` (a replica of the GPU with the fewest taken), else any available one.
fn devices_to_allocate(
    taken: &BTreeMap<String, String>,
    node: usize,
    preferred: bool,
    chance: &mut Chance,
) -> Option<String> {
    let in_use: Vec<&String> = taken.values().collect();
    // The available set, in the order a Go map gives it (any).
    let mut available: Vec<String> = (0..GPUS)
        .flat_map(|g| (0..REPLICAS).map(move |r| format!("{}::{r}", uuid(node, g))))
        .filter(|replica| !in_use.contains(&replica))
        .collect();
    if available.is_empty() {
        return None;
    }
    let first = chance.below(available.len());
    available.rotate_left(first);
    if !preferred {
        return available.into_iter().next();
    }
    let used = |replica: &String| {
        let gpu = replica.split("::").next().unwrap();
        in_use.iter().filter(|r| r.starts_with(gpu)).count()
    };
    available.into_iter().min_by_key(used)
}

/// Scores nodes through coloc's filter and prioritize; the node kube-scheduler takes.
async fn schedule(
    app: &TestApp,
    pod: &serde_json::Value,
    free: &[String],
    chance: &mut Chance,
) -> Option<String> {
    let addr = app.extender_addr.unwrap();
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": free});
    let (status, kept) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{kept}");
    let kept = kept["NodeNames"].clone();
    if kept.as_array().is_none_or(Vec::is_empty) {
        return None;
    }
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": kept});
    let (status, scores) = post(addr, "/coloc/prioritize", &args, "").await;
    assert_eq!(status, 200, "{scores}");
    let scores: Vec<(String, i64)> = scores
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["Host"].as_str().unwrap().into(),
                s["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    let best = scores.iter().map(|(_, s)| *s).max()?;
    let top: Vec<&String> = scores
        .iter()
        .filter(|(_, s)| *s == best)
        .map(|(n, _)| n)
        .collect();
    Some(top[chance.below(top.len())].clone())
}

/// What ListGpus shows: GPU -> [(job id, workload, source)].
async fn listed(app: &mut TestApp) -> BTreeMap<String, Vec<(String, String, pb::ResidentSource)>> {
    listed_gpus(app)
        .await
        .into_iter()
        .filter(|(_, jobs)| !jobs.is_empty())
        .map(|(g, mut jobs)| {
            jobs.sort();
            (g.id, jobs)
        })
        .collect()
}

/// coloc's preferred GPU on `node`: Place over its GPUs with the residents ListGpus shows,
/// the largest gain, the first GPU on ties; `None` when Place accepts none.
async fn preferred_gpu(app: &mut TestApp, node: usize, workload: &str) -> Option<String> {
    let residents = listed(app).await;
    let gpus: Vec<pb::GpuState> = (0..GPUS)
        .map(|g| pb::GpuState {
            id: uuid(node, g),
            node: node_name(node),
            gpu: GPU.into(),
            residents: residents
                .get(&uuid(node, g))
                .into_iter()
                .flatten()
                .map(|(_, w, _)| w.clone())
                .collect(),
            ..Default::default()
        })
        .collect();
    let answer = app
        .client
        .place(pb::PlaceRequest {
            workload: workload.into(),
            gpus,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut best: Option<(usize, f64)> = None;
    for p in &answer.placements {
        let at = (0..GPUS).position(|g| uuid(node, g) == p.gpu_id)?;
        if best.is_none_or(|(b, gain)| p.gain > gain || (p.gain == gain && at < b)) {
            best = Some((at, p.gain));
        }
    }
    best.map(|(at, _)| uuid(node, at))
}

/// Every running pod on its GPU with its workload and source `pod-resources`, nothing else.
fn expected_listing(
    kubelets: &[Kubelet],
    pods: &BTreeMap<String, &TracePod>,
) -> BTreeMap<String, Vec<(String, String, pb::ResidentSource)>> {
    let mut expected: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for kubelet in kubelets {
        for (pod, replica) in &kubelet.assigned {
            let gpu = replica.split("::").next().unwrap().to_string();
            expected.entry(gpu).or_default().push((
                format!("ml/{pod}"),
                pods[pod].workload.clone(),
                pb::ResidentSource::PodResources,
            ));
        }
    }
    expected.values_mut().for_each(|jobs| jobs.sort());
    expected
}

async fn run(app: &mut TestApp, preferred: bool) -> Outcome {
    let dir = tempfile::TempDir::new().unwrap();
    let mut kubelets = Vec::new();
    let mut reporters = Vec::new();
    for n in 0..NODES {
        set_test_node(app, &node_name(n), GPUS);
        let kubelet = Kubelet::default();
        let socket = kubelet
            .served
            .serve(dir.path().join(format!("kubelet-{n}.sock")));
        reporters.push(
            reporter(
                app,
                &socket,
                &format!("{}-agent", node_name(n)),
                &node_name(n),
            )
            .await,
        );
        kubelets.push(kubelet);
    }
    let pods = trace(PODS);
    let by_name: BTreeMap<String, &TracePod> = pods.iter().map(|p| (p.name.clone(), p)).collect();
    let mut running: BTreeMap<String, usize> = BTreeMap::new();
    let mut chance = Chance::new(40);
    let mut outcome = Outcome::default();
    for (departure, i) in events(&pods) {
        let pod = &pods[i];
        if departure {
            if let Some(n) = running.remove(&pod.name) {
                kubelets[n].release(&pod.name);
                reporters[n].report_once().await.unwrap();
                app.cluster
                    .set_watched_pod(&format!("ml/{}", pod.name), None);
            }
            continue;
        }
        outcome.pods += 1;
        let mut object = pod_review(&pod.name, json!({"coloc.io/workload": pod.workload}))
            ["request"]["object"]
            .clone();
        object["metadata"]["name"] = json!(pod.name);
        object["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        // NodeResourcesFit: nodes with a free replica.
        let free: Vec<String> = (0..NODES)
            .filter(|n| kubelets[*n].assigned.len() < GPUS * REPLICAS)
            .map(node_name)
            .collect();
        let Some(node) = schedule(app, &object, &free, &mut chance).await else {
            outcome.miss(
                &pod.name,
                "unschedulable",
                format!("{} nodes with a free replica, none kept", free.len()),
            );
            continue;
        };
        let n: usize = node[5..].parse().unwrap();
        let choice = preferred_gpu(app, n, &pod.workload).await;
        outcome.chosen += usize::from(choice.is_some());
        let replica =
            devices_to_allocate(&kubelets[n].assigned, n, preferred, &mut chance).unwrap();
        kubelets[n].assign(&pod.name, replica.clone());
        running.insert(pod.name.clone(), n);
        outcome.bound += 1;
        // The watcher sees the bound pod (no GPU annotation: only its workload), the agent
        // reports the kubelet's List.
        object["spec"]["nodeName"] = json!(node);
        object["status"] = json!({"phase": "Running"});
        let watched = watched_pod(&serde_json::from_value(object).unwrap());
        app.cluster
            .set_watched_pod(&format!("ml/{}", pod.name), watched);
        reporters[n].report_once().await.unwrap();
        let gpu = replica.split("::").next().unwrap().to_string();
        match choice {
            Some(c) if c == gpu => outcome.landed_on_choice += 1,
            Some(c) => outcome.miss(
                &pod.name,
                "the kubelet took another GPU",
                format!("coloc prefers {c} on {node}, the kubelet gave {replica}"),
            ),
            None => outcome.miss(
                &pod.name,
                "coloc prefers no GPU of the node",
                format!("the kubelet gave {replica}"),
            ),
        }
        assert_eq!(
            listed(app).await,
            expected_listing(&kubelets, &by_name),
            "after {}",
            pod.name
        );
    }
    outcome
}

#[tokio::test]
async fn node_only_residents_come_from_the_kubelet_and_the_gpu_is_the_kubelets() {
    let (mut app, _) = slowdown_app_with_config(7, &config("node-only", 1)).await;
    let with_plugin = run(&mut app, true).await;
    with_plugin.report("node-only, NVIDIA's preferred allocation, 8 nodes x 8 GPUs x 4 replicas");
    app.stop().await;
    let (mut app, _) = slowdown_app_with_config(7, &config("node-only", 1)).await;
    let any = run(&mut app, false).await;
    any.report("node-only, the kubelet's own pick, 8 nodes x 8 GPUs x 4 replicas");
    app.stop().await;
    // No target for the share: the kubelet does not know coloc. Every pod is placed (the
    // cluster has room) and was listed where it runs (checked after every arrival).
    for outcome in [&with_plugin, &any] {
        assert_eq!((outcome.pods, outcome.bound), (PODS, PODS), "{outcome:#?}");
    }
}

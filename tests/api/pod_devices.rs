//! Where pods really run, end to end: a fake kubelet serves the real PodResources v1 proto
//! (coloc's vendored copy) over a real Unix socket in a temp dir; `coloc agent`'s reporter
//! lists it and reports to a real coloc server (ReportPodDevices); ListGpus then shows
//! each pod as a resident of its GPU with the source that placed it, beside AssignJob's
//! jobs, by the cluster view's precedence.
//!
//! The List answer has the kubelet's own shape, from kubernetes/kubernetes
//! `pkg/kubelet/apis/podresources/server_v1_test.go` (`TestListPodResourcesV1`, the cases
//! "pod with devices" and "pod without devices": containers with `devices` carrying a
//! NUMA topology, `cpu_ids`, `memory` with hugepages, empty `dynamic_resources`), with the
//! device ids NVIDIA's device plugin gives time-sliced replicas (`UUID::N`,
//! `NewAnnotatedID` in k8s-device-plugin's `internal/rm/devices.go`).

use crate::fake_kubelet::{listed_gpus, reporter, FakeKubelet};
use crate::helpers::{
    expect_code, profile, register_request, set_test_node, spawn_app, TestApp, GPU,
};
use coloc::{
    cluster::{Source, WatchedPod},
    proto::{
        self as pb,
        podresources::{
            ContainerDevices, ContainerMemory, ContainerResources, ListPodResourcesResponse,
            NumaNode, PodResources, TopologyInfo,
        },
        profiling_agents_client::ProfilingAgentsClient,
    },
};

const NODE: &str = "gpu-node-1";
/// The agent reporting for `NODE`.
const AGENT: &str = "gpu-node-1-gpu0";
const UUID: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";

fn topology() -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: 1 }],
    })
}

/// A container as the kubelet lists it: its devices, CPUs 12, 23, 30, memory and
/// hugepages on NUMA node 1, no DRA claims.
fn container(name: &str, devices: Vec<(&str, Vec<String>)>) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices: devices
            .into_iter()
            .map(|(resource, ids)| ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids,
                topology: topology(),
            })
            .collect(),
        cpu_ids: vec![12, 23, 30],
        memory: ["memory", "hugepages-1Gi"]
            .into_iter()
            .map(|kind| ContainerMemory {
                memory_type: kind.into(),
                size: 1_073_741_824,
                topology: topology(),
            })
            .collect(),
        dynamic_resources: Vec::new(),
    }
}

fn pod(namespace: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers,
    }
}

/// Two pods time-slicing one GPU (replicas 1 and 3), one of them with a NIC too, and a
/// pod without devices.
fn two_pods_on_one_gpu() -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "ml",
                "train-a",
                vec![container(
                    "trainer",
                    vec![("nvidia.com/gpu", vec![format!("{UUID}::1")])],
                )],
            ),
            pod(
                "ml",
                "infer-b",
                vec![
                    container(
                        "server",
                        vec![("nvidia.com/gpu", vec![format!("{UUID}::3")])],
                    ),
                    container("sidecar", vec![("example.com/nic", vec!["nic-0".into()])]),
                ],
            ),
            pod("kube-system", "coredns", vec![container("coredns", vec![])]),
        ],
    }
}

/// Every GPU of the view: (id, node, GPU model, [(job id, workload, source)]).
async fn listed(
    app: &mut TestApp,
) -> Vec<(
    String,
    String,
    String,
    Vec<(String, String, pb::ResidentSource)>,
)> {
    listed_gpus(app)
        .await
        .into_iter()
        .map(|(g, jobs)| (g.id, g.node, g.gpu, jobs))
        .collect()
}

fn row(
    id: &str,
    gpu: &str,
    jobs: &[(&str, &str, pb::ResidentSource)],
) -> (
    String,
    String,
    String,
    Vec<(String, String, pb::ResidentSource)>,
) {
    (
        id.into(),
        NODE.into(),
        gpu.into(),
        jobs.iter()
            .map(|(j, w, s)| (j.to_string(), w.to_string(), *s))
            .collect(),
    )
}

#[tokio::test]
async fn the_agent_reports_the_kubelets_pods_and_list_gpus_shows_them_as_residents_by_source() {
    use pb::ResidentSource::{AssignJob, PodResources};
    let mut app = spawn_app().await;
    app.client
        .register_workload(register_request("w01", Some(profile(1, 4.0))))
        .await
        .unwrap();
    set_test_node(&app, NODE, 2);
    let kubelet = FakeKubelet::answering(two_pods_on_one_gpu());
    let dir = tempfile::TempDir::new().unwrap();
    let socket = kubelet.serve(dir.path().join("kubelet.sock"));
    let reporter = reporter(&app, &socket, AGENT, NODE).await;

    let answer = reporter.report_once().await.unwrap();
    assert_eq!(
        (answer.pods, answer.gpus),
        (2, 1),
        "the pod without devices is left out"
    );
    assert_eq!(
        listed(&mut app).await,
        [row(
            UUID,
            "Test-GPU-16GB",
            &[
                ("ml/infer-b", "", PodResources),
                ("ml/train-a", "", PodResources)
            ]
        )],
        "two replicas of one GPU are one GPU; workloads unknown without the watcher"
    );
    // The same snapshot again changes nothing.
    reporter.report_once().await.unwrap();
    assert_eq!(listed(&mut app).await.len(), 1);

    // The watcher knows train-a's workload (no GPU annotation): the view joins them.
    app.cluster.set_watched_pod(
        "ml/train-a",
        Some(WatchedPod {
            node: NODE.into(),
            gpus: Vec::new(),
            gpu_source: Source::GpuAnnotation,
            workload: Some("w01".into()),
            uid: None,
            min_job_fraction: None,
            throughput_query: None,
            hami_allocated: Vec::new(),
        }),
    );
    // A scheduler assigns the same pod elsewhere, and another job beside it.
    for (job, gpu_id) in [("ml/train-a", "gpu-9"), ("batch-7", "gpu-9")] {
        app.client
            .assign_job(pb::AssignJobRequest {
                job_id: job.into(),
                gpu_id: gpu_id.into(),
                node: NODE.into(),
                gpu: GPU.into(),
                workload: "w01".into(),
                lease_secs: 0,
            })
            .await
            .unwrap();
    }
    assert_eq!(
        listed(&mut app).await,
        [
            row(
                UUID,
                "Test-GPU-16GB",
                &[
                    ("ml/infer-b", "", PodResources),
                    ("ml/train-a", "w01", PodResources)
                ]
            ),
            row("gpu-9", GPU, &[("batch-7", "w01", AssignJob)]),
        ],
        "the kubelet's word wins over the assignment of the same pod"
    );

    // train-a ends: the next snapshot does not list it, and only the assignment is left.
    let mut after = two_pods_on_one_gpu();
    after.pod_resources.remove(0);
    kubelet.set_answer(after);
    let answer = reporter.report_once().await.unwrap();
    assert_eq!((answer.pods, answer.gpus), (1, 1));
    assert_eq!(
        listed(&mut app).await,
        [
            row(UUID, "Test-GPU-16GB", &[("ml/infer-b", "", PodResources)]),
            row(
                "gpu-9",
                GPU,
                &[
                    ("batch-7", "w01", AssignJob),
                    ("ml/train-a", "w01", AssignJob)
                ]
            ),
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_report_is_refused_with_invalid_argument_and_changes_nothing() {
    let mut app = spawn_app().await;
    let mut agents = ProfilingAgentsClient::new(app.channel().await);
    let good = pb::PodDevices {
        namespace: "ml".into(),
        name: "a".into(),
        gpu_ids: vec![UUID.into()],
    };
    agents
        .report_pod_devices(pb::ReportPodDevicesRequest {
            agent_id: "a".into(),
            node: NODE.into(),
            pods: vec![good.clone()],
        })
        .await
        .unwrap();
    let before = listed(&mut app).await;
    let cases = [
        ("", vec![good.clone()]),
        (
            NODE,
            vec![pb::PodDevices {
                gpu_ids: Vec::new(),
                ..good.clone()
            }],
        ),
        (
            NODE,
            vec![pb::PodDevices {
                name: "a/b".into(),
                ..good.clone()
            }],
        ),
    ];
    for (node, pods) in cases {
        let message = expect_code(
            agents
                .report_pod_devices(pb::ReportPodDevicesRequest {
                    agent_id: "a".into(),
                    node: node.into(),
                    pods,
                })
                .await,
            tonic::Code::InvalidArgument,
        );
        assert!(!message.is_empty());
    }
    assert_eq!(listed(&mut app).await, before, "nothing changed");
    app.stop().await;
}

#[tokio::test]
async fn a_kubelet_that_cannot_be_reached_sends_no_report() {
    let app = spawn_app().await;
    let dir = tempfile::TempDir::new().unwrap();
    let reporter = reporter(&app, &dir.path().join("missing.sock"), AGENT, NODE).await;
    let error = reporter.report_once().await.unwrap_err();
    assert!(error.to_string().contains("missing.sock"), "{error}");
    assert!(
        app.cluster.gpus().is_empty(),
        "an empty snapshot was never sent"
    );
    app.stop().await;
}

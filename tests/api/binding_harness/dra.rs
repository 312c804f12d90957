//! `extender.binding = dra`: each pod of the trace uses a claim from a coloc-marked
//! ResourceClaimTemplate. The resource claim controller creates the claim (the AdmissionReview
//! of `admission-review-claim-create.json`: owner the pod, the template's
//! `coloc.io/workload`), coloc's webhook pins it with a CEL selector on the GPU's UUID, and
//! the scheduler's DynamicResources plugin allocates it on every node by its structured
//! allocator, then kube-scheduler picks a node among those that fit. coloc learns where the
//! pod runs from the allocated claim (`binding::dra::claim_residency`, recorded as its claim
//! watcher records it, `ClusterView::set_claim_residency`), and the share of pods whose
//! device is the GPU coloc chose is measured.
//!
//! The allocator follows kubernetes staging/src/k8s.io/dynamic-resource-allocation/
//! structured (`allocator.go`, `Allocate` for one node): the node's pools and devices in
//! order, the first device that the DeviceClass's selectors and the claim's selectors
//! admit and that is not in use by another claim (`allocateDevice`: `deviceInUse`, a device
//! without `allowMultipleAllocations` goes to one claim at a time, as the NVIDIA driver
//! publishes its GPUs). The DeviceClass is the NVIDIA driver's `gpu.nvidia.com`
//! (`device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type ==
//! "gpu"`, its chart's deviceclass-gpu.yaml). The claim's CEL is evaluated for the one form
//! coloc writes (`... .uuid in [..]`). No score plugin tells the nodes apart here, so
//! kube-scheduler's `selectHost` (pkg/scheduler/schedule_one.go) takes one of the feasible
//! nodes at random.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{json, Value};

use coloc::{
    cluster::Source,
    extender::binding::{dra::claim_residency, webhook::DRA_UUID_ATTRIBUTE},
};

use super::{events, node_name, trace, uuid, Chance, Outcome, TracePod};
use crate::{
    binding::{config, fixture, patched},
    extender::post,
    helpers::{set_test_node, slowdown_app_with_config, TestApp},
};

const NODES: usize = 16;
const GPUS: usize = 8;
const PODS: usize = 150;

/// One device of the harness's ResourceSlices.
struct SliceDevice {
    name: String,
    uuid: String,
}

/// The NVIDIA driver's ResourceSlice for a node, from the fixture's, with [`GPUS`] GPUs.
fn slice(node: usize) -> Value {
    let mut slice = fixture("resourceslice-nvidia.json");
    let template = slice["spec"]["devices"][0].clone();
    let name = node_name(node);
    slice["metadata"]["name"] = json!(format!("{name}-gpu.nvidia.com-8xl6c"));
    slice["metadata"]["ownerReferences"][0]["name"] = json!(name);
    slice["spec"]["nodeName"] = json!(name);
    slice["spec"]["pool"]["name"] = json!(name);
    slice["spec"]["devices"] = (0..GPUS)
        .map(|g| {
            let mut device = template.clone();
            device["name"] = json!(format!("gpu-{g}"));
            device["attributes"]["index"] = json!({"int": g});
            device["attributes"]["minor"] = json!({"int": g});
            device["attributes"]["uuid"] = json!({"string": uuid(node, g)});
            device
        })
        .collect();
    slice
}

/// The claim's CEL selector as coloc writes it: the UUIDs it admits.
fn selector_uuids(expression: &str) -> Vec<String> {
    let list = expression
        .strip_prefix(&format!("{DRA_UUID_ATTRIBUTE} in ["))
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("a CEL form the harness does not evaluate: {expression}"));
    list.split(", ")
        .map(|quoted| quoted.trim_matches('"').to_string())
        .collect()
}

/// The DeviceClass's and the claim's selectors on one device of the harness's slices.
fn admits(claim: &Value, slice: &Value, device: &Value) -> bool {
    let class = slice["spec"]["driver"] == "gpu.nvidia.com"
        && device["attributes"]["type"]["string"] == "gpu";
    let uuid = device["attributes"]["uuid"]["string"].as_str().unwrap();
    let selectors = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    class
        && selectors.iter().all(|s| {
            selector_uuids(s["cel"]["expression"].as_str().unwrap()).contains(&uuid.to_string())
        })
}

/// The allocator on one node: the first admitted device not in use.
fn allocate_on(
    claim: &Value,
    slice: &Value,
    in_use: &BTreeMap<String, usize>,
) -> Option<SliceDevice> {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|device| admits(claim, slice, device))
        .map(|device| SliceDevice {
            name: device["name"].as_str().unwrap().to_string(),
            uuid: device["attributes"]["uuid"]["string"]
                .as_str()
                .unwrap()
                .to_string(),
        })
        .find(|device| !in_use.contains_key(&device.uuid))
}

/// The resource claim controller's create, through coloc's webhook: the claim as stored.
async fn create_claim(addr: std::net::SocketAddr, pod: &TracePod) -> Value {
    let mut review = fixture("admission-review-claim-create.json");
    review["request"]["uid"] = json!(format!("claim-{}", pod.name));
    let object = &mut review["request"]["object"];
    object["metadata"]["generateName"] = json!(format!("{}-gpu-", pod.name));
    object["metadata"]["annotations"]["coloc.io/workload"] = json!(pod.workload);
    object["metadata"]["ownerReferences"][0]["name"] = json!(pod.name);
    object["metadata"]["ownerReferences"][0]["uid"] = json!(format!("uid-{}", pod.name));
    let (status, response) = post(addr, "/coloc/mutate", &review, "").await;
    assert_eq!(status, 200, "{response}");
    let mut claim = patched(&review, &response).unwrap_or(review["request"]["object"].clone());
    // The API server names it from generateName.
    claim["metadata"]["name"] = json!(format!("{}-gpu-x7k2p", pod.name));
    claim
}

/// The claim as the scheduler writes it back: allocated on `node` to `device`, reserved
/// for the pod.
fn allocated(mut claim: Value, pod: &TracePod, node: &str, device: &SliceDevice) -> ResourceClaim {
    claim["status"] = json!({
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                      "pool": node, "device": device.name}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod.name, "uid": format!("uid-{}", pod.name)}]
    });
    serde_json::from_value(claim).unwrap()
}

async fn run(app: &TestApp) -> Outcome {
    let addr = app.extender_addr.unwrap();
    let slices: Vec<Value> = (0..NODES).map(slice).collect();
    for (n, slice) in slices.iter().enumerate() {
        let typed: ResourceSlice = serde_json::from_value(slice.clone()).unwrap();
        app.inventory.apply_slice(&typed);
        set_test_node(app, &node_name(n), GPUS);
    }
    let pods = trace(PODS);
    let mut in_use: BTreeMap<String, usize> = BTreeMap::new();
    let mut chance = Chance::new(40);
    let mut outcome = Outcome::default();
    for (departure, i) in events(&pods) {
        let pod = &pods[i];
        let key = format!("ml/{}", pod.name);
        if departure {
            in_use.retain(|_, holder| *holder != i);
            // The claim deallocated once its pod is gone.
            app.cluster.set_claim_residency(&key, None);
            continue;
        }
        outcome.pods += 1;
        let claim = create_claim(addr, pod).await;
        let choice = claim["metadata"]["annotations"]["coloc.io/gpu-choice"]
            .as_str()
            .map(str::to_string);
        outcome.chosen += usize::from(choice.is_some());
        // The DynamicResources plugin's Filter on every node, then selectHost.
        let feasible: Vec<(usize, SliceDevice)> = slices
            .iter()
            .enumerate()
            .filter_map(|(n, slice)| allocate_on(&claim, slice, &in_use).map(|d| (n, d)))
            .collect();
        if feasible.is_empty() {
            let why = match &choice {
                Some(c) => format!("no node can allocate the claim pinned to {c}"),
                None => format!("every device is in use ({} claims)", in_use.len()),
            };
            outcome.miss(&pod.name, "unschedulable", why);
            continue;
        }
        let pick = chance.below(feasible.len());
        let (node, device) = feasible.into_iter().nth(pick).unwrap();
        let node = node_name(node);
        in_use.insert(device.uuid.clone(), i);
        outcome.bound += 1;
        // coloc's claim watcher reads the allocated claim (`binding::claims`).
        let (pod_key, watched) =
            claim_residency(&allocated(claim, pod, &node, &device), &app.inventory)
                .expect("an allocated claim reserved for a pod places it");
        assert_eq!(pod_key, key);
        assert_eq!(
            (
                watched.node.as_str(),
                watched.gpus.clone(),
                watched.gpu_source
            ),
            (
                node.as_str(),
                vec![device.uuid.clone()],
                Source::DraAllocation
            )
        );
        app.cluster.set_claim_residency(&key, Some(watched));
        match choice {
            Some(chosen) if chosen == device.uuid => outcome.landed_on_choice += 1,
            Some(chosen) => outcome.miss(
                &pod.name,
                "the allocator took another device",
                format!("coloc chose {chosen}, the allocator took {}", device.uuid),
            ),
            None => outcome.miss(
                &pod.name,
                "coloc chose no GPU (neutral)",
                format!(
                    "{} devices in use; allocated {}",
                    in_use.len() - 1,
                    device.uuid
                ),
            ),
        }
    }
    outcome
}

#[tokio::test]
async fn dra_claims_of_the_trace_are_allocated_the_gpu_coloc_chose() {
    let (app, _) = slowdown_app_with_config(7, &config("dra", 1)).await;
    let outcome = run(&app).await;
    let share = outcome.report("dra, binding_gpus = 1, 16 nodes x 8 GPUs");
    assert_eq!(outcome.pods, PODS);
    assert!(share >= 0.99, "{outcome:#?}");
    app.stop().await;
}

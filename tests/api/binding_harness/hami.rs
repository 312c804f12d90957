//! `extender.binding = hami`: the API server calls coloc's webhook; kube-scheduler keeps
//! the nodes the pod's node affinity allows, then calls the extenders in order (coloc's
//! filter, then HAMi's); HAMi's filter picks the node and GPU and binds, writing
//! `hami.io/vgpu-devices-allocated`, from which coloc's cluster view learns the resident (the
//! watcher's own parser, `watched_pod`). The share of pods landing on the GPU coloc chose
//! (`coloc.io/gpu-choice`) is measured.
//!
//! HAMi's side follows HAMi's code, simplified to one container with one GPU: its NVIDIA
//! `Fit` (Project-HAMi/HAMi pkg/device/nvidia/device.go) skips a device whose UUID
//! `device.CheckUUID` does not find in `nvidia.com/use-gpuuuid`, one whose `Count` is used up
//! (time-slicing exhausted), whose free memory or cores are short of the request, a whole
//! card (cores 100) already in use, or a card whose cores are all taken for a core-less
//! request; its node choice (pkg/scheduler/scheduler.go `Filter` over
//! pkg/scheduler/score.go's node scores) takes the best-scoring node, here its default
//! `binpack` node policy (the most used node first) and `spread` GPU policy (the least used
//! fitting GPU first). HAMi's scheduler keeps its usage under one lock, so two pods' filters
//! and binds are taken one after the other even when their admissions overlap.

use std::collections::BTreeMap;

use serde_json::json;
use tokio::sync::Mutex;

use coloc::extender::watcher::watched_pod;

use super::{events, node_name, node_of, trace, uuid, Outcome, TracePod};
use crate::{
    binding::{config, hami_node, patched, pod_review},
    extender::post,
    helpers::{slowdown_app_with_config, TestApp},
};

pub const NODES: usize = 32;
pub const GPUS: usize = 8;
pub const PODS: usize = 300;
/// HAMi's registered device: split count, memory (MiB), cores.
pub const SPLIT: u32 = 10;
pub const DEVMEM: u32 = 16_384;

/// HAMi's view of one GPU: what is allocated on it, and the workloads of its pods.
#[derive(Default, Clone, Debug)]
pub struct Usage {
    pub used: u32,
    pub mem: u32,
    pub cores: u32,
    pub workloads: Vec<String>,
}

impl Usage {
    fn add(&mut self, pod: &TracePod) {
        self.used += 1;
        self.mem += pod.mem;
        self.cores += pod.cores;
        self.workloads.push(pod.workload.clone());
    }

    fn remove(&mut self, pod: &TracePod) {
        self.used -= 1;
        self.mem -= pod.mem;
        self.cores -= pod.cores;
        let at = self.workloads.iter().position(|w| *w == pod.workload);
        self.workloads.remove(at.unwrap());
    }

    /// Whether HAMi's registered capacity holds what is allocated.
    pub fn within_capacity(&self) -> bool {
        self.used <= SPLIT && self.mem <= DEVMEM && self.cores <= 100
    }
}

/// Why HAMi's NVIDIA `Fit` refuses a device for the pod, in its order of checks (device.go:
/// `CardTimeSlicingExhausted`, `CardInsufficientMemory`, `CardInsufficientCore`,
/// `ExclusiveDeviceAllocateConflict`, `CardComputeUnitsExhausted`); `None`: it fits.
pub fn refusal(u: &Usage, pod: &TracePod) -> Option<&'static str> {
    if SPLIT <= u.used {
        Some("the split count is used up")
    } else if DEVMEM - u.mem < pod.mem {
        Some("HAMi's memory is taken (nvidia.com/gpumem)")
    } else if 100 - u.cores < pod.cores {
        Some("HAMi's cores are taken (nvidia.com/gpucores)")
    } else if pod.cores == 100 && u.used > 0 {
        Some("a whole-card request on a card in use")
    } else if u.cores == 100 && pod.cores == 0 {
        Some("the card's cores are all taken")
    } else {
        None
    }
}

/// HAMi's filter: the fitting devices of each kept node, the most used node first (binpack),
/// the least used fitting GPU in it (spread); `Err` names why no device fits.
fn hami_filter(
    usage: &BTreeMap<String, Usage>,
    kept: &[String],
    allowed: Option<&[String]>,
    pod: &TracePod,
    choice: Option<&str>,
) -> Result<(String, String), String> {
    let fits = |id: &String, u: &Usage| {
        allowed.is_none_or(|a| a.contains(id)) && refusal(u, pod).is_none()
    };
    let node_score = |node: &str| -> u32 {
        usage
            .iter()
            .filter(|(id, _)| node_of(id) == node)
            .map(|(_, u)| u.mem * 100 / DEVMEM + u.cores)
            .sum()
    };
    let best_node = kept
        .iter()
        .filter(|node| {
            usage
                .iter()
                .any(|(id, u)| node_of(id) == **node && fits(id, u))
        })
        .max_by_key(|node| (node_score(node), std::cmp::Reverse((*node).clone())));
    let Some(node) = best_node else {
        return Err(match choice {
            Some(c) => format!(
                "unschedulable: HAMi refused coloc's GPU {c}: {}",
                refusal(&usage[c], pod).unwrap_or("its node was filtered out")
            ),
            None => "unschedulable: no GPU of the kept nodes fits".to_string(),
        });
    };
    let gpu = usage
        .iter()
        .filter(|(id, u)| node_of(id) == *node && fits(id, u))
        .min_by_key(|(id, u)| (u.used, u.mem, (*id).clone()))
        .map(|(id, _)| id.clone())
        .unwrap();
    Ok((node.clone(), gpu))
}

/// What admission and the extender filter made of a pod.
pub struct Admitted {
    pub object: serde_json::Value,
    pub allowed: Option<Vec<String>>,
    pub choice: Option<String>,
    pub kept: Vec<String>,
}

/// The API server's call to coloc's webhook, then kube-scheduler (NodeAffinity, then coloc's
/// filter): the pod as created, the GPUs it names, coloc's choice, the nodes kept.
pub async fn admit(addr: std::net::SocketAddr, pod: &TracePod, nodes: usize) -> Admitted {
    let mut review = pod_review(&pod.name, json!({"coloc.io/workload": pod.workload}));
    review["request"]["name"] = json!(pod.name);
    review["request"]["object"]["metadata"]["name"] = json!(pod.name);
    review["request"]["object"]["spec"]["containers"][0]["resources"] = json!({
            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": pod.mem.to_string(),
                       "nvidia.com/gpucores": pod.cores.to_string()}});
    let (status, response) = post(addr, "/coloc/mutate", &review, "").await;
    assert_eq!(status, 200, "{response}");
    let object = patched(&review, &response).unwrap_or(review["request"]["object"].clone());
    let annotations = &object["metadata"]["annotations"];
    let allowed: Option<Vec<String>> = annotations["nvidia.com/use-gpuuuid"]
        .as_str()
        .map(|s| s.split(',').map(str::to_string).collect());
    let choice = annotations["coloc.io/gpu-choice"]
        .as_str()
        .map(str::to_string);
    // kube-scheduler: NodeAffinity, then the extenders in order.
    let affinity: Option<Vec<String>> = object["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
        [0]["values"]
        .as_array()
        .map(|v| v.iter().map(|n| n.as_str().unwrap().to_string()).collect());
    let candidates: Vec<String> = (0..nodes)
        .map(node_name)
        .filter(|n| affinity.as_ref().is_none_or(|a| a.contains(n)))
        .collect();
    let args = json!({"Pod": object, "Nodes": null, "NodeNames": candidates});
    let (status, kept) = post(addr, "/coloc/filter", &args, "").await;
    assert_eq!(status, 200, "{kept}");
    let kept: Vec<String> = kept["NodeNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    Admitted {
        object,
        allowed,
        choice,
        kept,
    }
}

/// The cluster as HAMi accounts it, and where each pod went.
pub struct Cluster {
    pub nodes: usize,
    pub usage: BTreeMap<String, Usage>,
    /// pod index -> its GPU.
    pub placed: BTreeMap<usize, String>,
    /// pod index -> coloc's choice, for pods bound while coloc had chosen.
    pub chosen: BTreeMap<usize, String>,
}

/// Registers `nodes` HAMi nodes of [`GPUS`] GPUs with coloc (its inventory and view).
pub fn register(app: &TestApp, nodes: usize) -> Cluster {
    for n in 0..nodes {
        let ids: Vec<String> = (0..GPUS).map(|g| uuid(n, g)).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let node = hami_node(&node_name(n), &refs);
        app.inventory.apply_node(&node);
        app.cluster
            .set_node(&node_name(n), coloc::extender::node::node_gpus(&node));
    }
    Cluster {
        nodes,
        usage: (0..nodes)
            .flat_map(|n| (0..GPUS).map(move |g| (uuid(n, g), Usage::default())))
            .collect(),
        placed: BTreeMap::new(),
        chosen: BTreeMap::new(),
    }
}

/// A pod leaves: HAMi frees its device, the watcher forgets it.
pub fn depart(app: &TestApp, cluster: &mut Cluster, pods: &[TracePod], i: usize) {
    if let Some(id) = cluster.placed.remove(&i) {
        cluster.usage.get_mut(&id).unwrap().remove(&pods[i]);
        cluster.chosen.remove(&i);
        app.cluster
            .set_watched_pod(&format!("ml/{}", pods[i].name), None);
    }
}

/// HAMi's filter and bind for an admitted pod, under HAMi's lock; the miss, if any.
pub fn bind(
    app: &TestApp,
    cluster: &mut Cluster,
    pods: &[TracePod],
    i: usize,
    admitted: Admitted,
    outcome: &mut Outcome,
) {
    let pod = &pods[i];
    let Admitted {
        object,
        allowed,
        choice,
        kept,
    } = admitted;
    outcome.pods += 1;
    outcome.chosen += usize::from(choice.is_some());
    let filtered = hami_filter(
        &cluster.usage,
        &kept,
        allowed.as_deref(),
        pod,
        choice.as_deref(),
    );
    let (node, gpu) = match filtered {
        Ok(found) => found,
        Err(why) => {
            // HAMi does not see coloc's holds: a pod coloc left unpinned may take the slot
            // held for this one between its admission and its bind.
            let unpinned_on_choice = choice.as_ref().is_some_and(|c| {
                cluster
                    .placed
                    .iter()
                    .any(|(j, g)| g == c && !cluster.chosen.contains_key(j))
            });
            let cause = if unpinned_on_choice {
                "an unpinned pod took the held slot"
            } else {
                "unschedulable"
            };
            return outcome.miss(&pod.name, cause, why);
        }
    };
    let room = cluster
        .usage
        .values()
        .filter(|u| refusal(u, pod).is_none())
        .count();
    cluster.usage.get_mut(&gpu).unwrap().add(pod);
    cluster.placed.insert(i, gpu.clone());
    outcome.bound += 1;
    // The bind: HAMi's allocation annotation, read back by the watcher's own parser.
    let mut bound = object;
    bound["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] =
        json!(format!("{gpu},NVIDIA,{},{}:;", pod.mem, pod.cores));
    bound["spec"]["nodeName"] = json!(node);
    bound["status"] = json!({"phase": "Running"});
    let watched = watched_pod(&serde_json::from_value(bound).unwrap());
    assert_eq!(
        watched.as_ref().map(|w| w.gpus.clone()),
        Some(vec![gpu.clone()])
    );
    // The watcher's key: namespace/name (the review's namespace is `ml`).
    app.cluster
        .set_watched_pod(&format!("ml/{}", pod.name), watched);
    match &choice {
        Some(chosen) => {
            cluster.chosen.insert(i, chosen.clone());
            if *chosen == gpu {
                outcome.landed_on_choice += 1;
            } else {
                outcome.miss(
                    &pod.name,
                    "HAMi took another listed GPU",
                    format!("coloc chose {chosen}, HAMi's node and GPU policy took {gpu}"),
                )
            }
        }
        // Neutral: explained when HAMi's own accounting had no room on any GPU coloc would
        // accept, which the harness can only judge for room.
        None => outcome.miss(
            &pod.name,
            "coloc chose no GPU (neutral)",
            format!("{room} GPUs had room in HAMi's accounting; HAMi bound it to {gpu}"),
        ),
    }
}

/// The trace's first `n` pods, one at a time.
pub async fn run(app: &TestApp, n: usize) -> Outcome {
    let addr = app.extender_addr.unwrap();
    let cluster = Mutex::new(register(app, NODES));
    let pods = trace(n);
    let mut outcome = Outcome::default();
    for (departure, i) in events(&pods) {
        let mut cluster = cluster.lock().await;
        if departure {
            depart(app, &mut cluster, &pods, i);
            continue;
        }
        let admitted = admit(addr, &pods[i], cluster.nodes).await;
        bind(app, &mut cluster, &pods, i, admitted, &mut outcome);
    }
    outcome
}

/// Whether any miss is HAMi refusing the GPU coloc chose for a cause coloc's holds should
/// have kept away (coloc names only GPUs HAMi accepts, holds included).
pub fn refused_choice(outcome: &Outcome) -> bool {
    outcome
        .explained
        .iter()
        .any(|m| m.contains("refused coloc's GPU") && !m.contains("an unpinned pod took"))
}

#[tokio::test]
async fn hami_pods_of_the_trace_land_on_the_gpu_coloc_chose() {
    let (app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    let outcome = run(&app, PODS).await;
    let share = outcome.report("hami, binding_gpus = 1");
    assert_eq!(outcome.pods, PODS);
    assert!(!refused_choice(&outcome), "{:#?}", outcome.explained);
    assert!(share >= 0.99, "{outcome:#?}");
    app.stop().await;

    let (app, _) = slowdown_app_with_config(7, &config("hami", 3)).await;
    let outcome = run(&app, PODS).await;
    outcome.report("hami, binding_gpus = 3");
    assert_eq!(outcome.pods, PODS);
    assert!(!refused_choice(&outcome), "{:#?}", outcome.explained);
    app.stop().await;
}

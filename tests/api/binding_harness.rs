//! A scheduler in a box, over real HTTP: pods of the Alibaba GPU trace (v2023, "openb", the
//! first one-GPU pods by creation time; ../shared/data/alibaba-gpu-v2023) arrive and leave on
//! a cluster of HAMi-registered nodes, and each is admitted and scheduled as HAMi's stack does
//! it: the API server calls coloc's webhook (`extender.binding = hami`); kube-scheduler keeps
//! the nodes the pod's node affinity allows, then calls the extenders in order (coloc's
//! filter, then HAMi's); HAMi's filter picks the node and GPU and binds, writing
//! `hami.io/vgpu-devices-allocated`, from which coloc's cluster view learns the resident (the
//! watcher's own parser, `pod::residency`). The share of pods landing on the GPU coloc chose
//! (`coloc.io/gpu-choice`) is measured; every miss is counted by cause and printed with its
//! reason.
//!
//! HAMi's side follows HAMi's code, simplified to one container with one GPU: its NVIDIA
//! `Fit` (Project-HAMi/HAMi pkg/device/nvidia/device.go) skips a device whose UUID
//! `device.CheckUUID` does not find in `nvidia.com/use-gpuuuid`, one whose `Count` is used up
//! (time-slicing exhausted), whose free memory or cores are short of the request, a whole
//! card (cores 100) already in use, or a card whose cores are all taken for a core-less
//! request; its node
//! choice (pkg/scheduler/scheduler.go `Filter` over pkg/scheduler/score.go's node scores)
//! takes the best-scoring node, here its default `binpack` node policy (the most used node
//! first) and `spread` GPU policy (the least used fitting GPU first).

use std::collections::BTreeMap;

use serde_json::json;

use coloc::extender::watcher::watched_pod;

use crate::{
    binding::{config, hami_node, patched, pod_review},
    extender::post,
    helpers::{slowdown_app_with_config, TestApp},
};

const NODES: usize = 32;
const GPUS: usize = 8;
const PODS: usize = 300;
/// HAMi's registered device: split count, memory (MiB), cores.
const SPLIT: u32 = 10;
const DEVMEM: u32 = 16_384;

/// One pod of the trace.
struct TracePod {
    name: String,
    created: u64,
    deleted: u64,
    /// HAMi's request: nvidia.com/gpucores (gpu_milli / 10) and nvidia.com/gpumem (MiB).
    cores: u32,
    mem: u32,
    workload: String,
}

fn trace() -> Vec<TracePod> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv"
    );
    let mut reader = csv::Reader::from_path(path).unwrap();
    let mut pods: Vec<TracePod> = reader
        .records()
        .map(|r| r.unwrap())
        .filter(|r| &r[3] == "1")
        .map(|r| {
            let i: usize = r[0].rsplit('-').next().unwrap().parse().unwrap();
            // The test app's workloads w00..w06; memory 1 + (i % 6) GB, as it profiles them.
            let w = i % 7;
            TracePod {
                name: r[0].to_string(),
                created: r[8].parse().unwrap(),
                deleted: r[9].parse().unwrap(),
                cores: r[4].parse::<u32>().unwrap() / 10,
                mem: 1024 * (1 + (w % 6) as u32),
                workload: format!("w{w:02}"),
            }
        })
        .collect();
    pods.sort_by_key(|p| (p.created, p.name.clone()));
    pods.truncate(PODS);
    pods
}

/// HAMi's view of one GPU: what is allocated on it.
#[derive(Default, Clone)]
struct Usage {
    used: u32,
    mem: u32,
    cores: u32,
}

/// Where each outcome went, for the report.
#[derive(Default, Debug)]
pub struct Outcome {
    pub pods: usize,
    pub landed_on_choice: usize,
    pub chosen: usize,
    /// Pods HAMi bound (to any GPU).
    pub bound: usize,
    /// Misses by cause.
    pub misses: BTreeMap<&'static str, usize>,
    /// Each miss: the pod and why.
    pub explained: Vec<String>,
}

impl Outcome {
    fn miss(&mut self, pod: &str, cause: &'static str, why: String) {
        *self.misses.entry(cause).or_default() += 1;
        self.explained.push(format!("{pod}: {cause}: {why}"));
    }
}

fn uuid(node: usize, gpu: usize) -> String {
    format!("GPU-{node:04}{gpu:04}-0000-4000-8000-000000000000")
}

fn node_of(id: &str) -> String {
    format!("node-{:02}", id[4..8].parse::<usize>().unwrap())
}

/// Why HAMi's NVIDIA `Fit` refuses a device for the pod, in its order of checks (device.go:
/// `CardTimeSlicingExhausted`, `CardInsufficientMemory`, `CardInsufficientCore`,
/// `ExclusiveDeviceAllocateConflict`, `CardComputeUnitsExhausted`); `None`: it fits.
fn refusal(u: &Usage, pod: &TracePod) -> Option<&'static str> {
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

/// The API server's call to coloc's webhook, then kube-scheduler (NodeAffinity, then coloc's
/// filter): the pod as created, the GPUs it names, coloc's choice, the nodes kept.
async fn admit(
    addr: std::net::SocketAddr,
    pod: &TracePod,
) -> (
    serde_json::Value,
    Option<Vec<String>>,
    Option<String>,
    Vec<String>,
) {
    // The API server: coloc's webhook.
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
    let candidates: Vec<String> = (0..NODES)
        .map(|n| format!("node-{n:02}"))
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
    (object, allowed, choice, kept)
}

async fn run(app: &TestApp) -> Outcome {
    let addr = app.extender_addr.unwrap();
    for n in 0..NODES {
        let ids: Vec<String> = (0..GPUS).map(|g| uuid(n, g)).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let node = hami_node(&format!("node-{n:02}"), &refs);
        app.inventory.apply_node(&node);
        app.cluster.set_node(
            &format!("node-{n:02}"),
            coloc::extender::node::node_gpus(&node),
        );
    }
    let mut usage: BTreeMap<String, Usage> = (0..NODES)
        .flat_map(|n| (0..GPUS).map(move |g| (uuid(n, g), Usage::default())))
        .collect();
    let pods = trace();
    // (time, departure?, pod index): departures first at equal times.
    let mut events: Vec<(u64, bool, usize)> = pods
        .iter()
        .enumerate()
        .flat_map(|(i, p)| [(p.created, false, i), (p.deleted, true, i)])
        .collect();
    events.sort_by_key(|(t, arrival, i)| (*t, !*arrival, *i));
    let mut placed: BTreeMap<usize, String> = BTreeMap::new();
    let mut outcome = Outcome::default();
    for (_, departure, i) in events {
        let pod = &pods[i];
        if departure {
            if let Some(id) = placed.remove(&i) {
                let u = usage.get_mut(&id).unwrap();
                u.used -= 1;
                u.mem -= pod.mem;
                u.cores -= pod.cores;
                app.cluster
                    .set_watched_pod(&format!("ml/{}", pod.name), None);
            }
            continue;
        }
        outcome.pods += 1;
        let (object, allowed, choice, kept) = admit(addr, pod).await;
        outcome.chosen += usize::from(choice.is_some());
        let usage_before = usage.clone();
        let (node, gpu) =
            match hami_filter(&usage, &kept, allowed.as_deref(), pod, choice.as_deref()) {
                Ok(found) => found,
                Err(why) => {
                    outcome.miss(&pod.name, "unschedulable", why);
                    continue;
                }
            };
        let node = &node;
        let u = usage.get_mut(&gpu).unwrap();
        u.used += 1;
        u.mem += pod.mem;
        u.cores += pod.cores;
        placed.insert(i, gpu.clone());
        outcome.bound += 1;
        // The bind: HAMi's allocation annotation, read back by the watcher's own parser.
        let mut bound = object.clone();
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
            Some(chosen) if *chosen == gpu => outcome.landed_on_choice += 1,
            Some(chosen) => outcome.miss(
                &pod.name,
                "HAMi took another listed GPU",
                format!("coloc chose {chosen}, HAMi's node and GPU policy took {gpu}"),
            ),
            None => {
                // Neutral: explained when HAMi's own accounting had no room on any GPU
                // coloc would accept, which the harness can only judge for room.
                let room = usage_before
                    .iter()
                    .filter(|(_, u)| refusal(u, pod).is_none())
                    .count();
                outcome.miss(
                    &pod.name,
                    "coloc chose no GPU (neutral)",
                    format!("{room} GPUs had room in HAMi's accounting; HAMi bound it to {gpu}"),
                )
            }
        }
    }
    outcome
}

fn report(gpus: usize, outcome: &Outcome) -> f64 {
    let share = outcome.landed_on_choice as f64 / outcome.pods as f64;
    println!(
        "harness, binding_gpus = {gpus}: {} of {} pods ({:.1} %) landed on coloc's GPU; \
         coloc chose for {}, HAMi bound {}; misses {:?}",
        outcome.landed_on_choice,
        outcome.pods,
        100.0 * share,
        outcome.chosen,
        outcome.bound,
        outcome.misses
    );
    for miss in &outcome.explained {
        println!("  miss: {miss}");
    }
    share
}

#[tokio::test]
async fn hami_pods_of_the_trace_land_on_the_gpu_coloc_chose() {
    let (app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    let outcome = run(&app).await;
    let share = report(1, &outcome);
    assert_eq!(outcome.pods, PODS);
    // Coloc names only GPUs HAMi accepts: HAMi never refuses its choice.
    assert!(
        outcome
            .explained
            .iter()
            .all(|m| !m.contains("refused coloc's GPU")),
        "{:#?}",
        outcome.explained
    );
    assert!(share >= 0.99, "{outcome:#?}");
    app.stop().await;

    let (app, _) = slowdown_app_with_config(7, &config("hami", 3)).await;
    let outcome = run(&app).await;
    report(3, &outcome);
    assert_eq!(outcome.pods, PODS);
    assert!(
        outcome
            .explained
            .iter()
            .all(|m| !m.contains("refused coloc's GPU")),
        "{:#?}",
        outcome.explained
    );
    app.stop().await;
}

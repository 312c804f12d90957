//! A scheduler in a box, over real HTTP: pods of the Alibaba GPU trace (v2023, "openb", the
//! first one-GPU pods by creation time; ../shared/data/alibaba-gpu-v2023) arrive and leave on
//! a cluster of recorded Node JSON, and each is admitted and scheduled as the stack it runs
//! on does it, by the stack's own rules (each module names the files it follows):
//! - `hami`: the API server calls coloc's webhook, kube-scheduler calls the extenders in
//!   order (coloc's filter, then HAMi's), HAMi's filter picks node and GPU and binds; also
//!   with two schedulers at once (`concurrent`) and against the simulation's Place
//!   (`equal`);
//! - `dra`: the resource claim controller creates each pod's claim from a coloc-marked
//!   template, coloc's webhook pins it, the scheduler's DynamicResources plugin allocates a
//!   device by its structured allocator, and coloc learns where the pod runs from the
//!   claim's allocation;
//! - `kubelet`: `node-only`, NVIDIA's device plugin with time-sliced replicas: the kubelet's
//!   device manager picks the replica, a fake kubelet serves the PodResources v1 proto on a
//!   Unix socket, and `coloc agent`'s reader reports it to the service.
//!
//! The share of pods landing on the GPU coloc chose is measured; every miss is counted by
//! cause and printed with its reason.

mod concurrent;
mod dra;
mod equal;
mod hami;
mod kubelet;

use std::collections::BTreeMap;

/// One pod of the trace.
#[derive(Debug, Clone)]
pub struct TracePod {
    pub name: String,
    pub created: u64,
    pub deleted: u64,
    /// HAMi's request: nvidia.com/gpucores (gpu_milli / 10) and nvidia.com/gpumem (MiB).
    pub cores: u32,
    pub mem: u32,
    pub workload: String,
}

/// The first `n` one-GPU pods of the trace by creation time.
pub fn trace(n: usize) -> Vec<TracePod> {
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
    pods.truncate(n);
    pods
}

/// The trace's arrivals and departures in time order: (departure?, pod index), departures
/// first at equal times.
pub fn events(pods: &[TracePod]) -> Vec<(bool, usize)> {
    let mut events: Vec<(u64, bool, usize)> = pods
        .iter()
        .enumerate()
        .flat_map(|(i, p)| [(p.created, false, i), (p.deleted, true, i)])
        .collect();
    events.sort_by_key(|(t, arrival, i)| (*t, !*arrival, *i));
    events.into_iter().map(|(_, d, i)| (d, i)).collect()
}

pub fn uuid(node: usize, gpu: usize) -> String {
    format!("GPU-{node:04}{gpu:04}-0000-4000-8000-000000000000")
}

pub fn node_name(node: usize) -> String {
    format!("node-{node:02}")
}

/// The node of a harness GPU UUID.
pub fn node_of(id: &str) -> String {
    node_name(id[4..8].parse::<usize>().unwrap())
}

/// Where each outcome went, for the report.
#[derive(Default, Debug)]
pub struct Outcome {
    pub pods: usize,
    pub landed_on_choice: usize,
    pub chosen: usize,
    /// Pods bound (to any GPU).
    pub bound: usize,
    /// Misses by cause.
    pub misses: BTreeMap<&'static str, usize>,
    /// Each miss: the pod and why.
    pub explained: Vec<String>,
}

impl Outcome {
    pub fn miss(&mut self, pod: &str, cause: &'static str, why: String) {
        *self.misses.entry(cause).or_default() += 1;
        self.explained.push(format!("{pod}: {cause}: {why}"));
    }

    /// Prints the outcome and every miss; the share landed on coloc's GPU.
    pub fn report(&self, label: &str) -> f64 {
        let share = self.landed_on_choice as f64 / self.pods as f64;
        println!(
            "harness, {label}: {} of {} pods ({:.1} %) landed on coloc's GPU; coloc chose \
             for {}, {} bound; misses {:?}",
            self.landed_on_choice,
            self.pods,
            100.0 * share,
            self.chosen,
            self.bound,
            self.misses
        );
        for miss in &self.explained {
            println!("  miss: {miss}");
        }
        share
    }
}

/// A small deterministic generator (SplitMix64) standing in for the choices Go leaves to
/// chance (map iteration order, kube-scheduler's pick among equal scores).
pub struct Chance(u64);

impl Chance {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

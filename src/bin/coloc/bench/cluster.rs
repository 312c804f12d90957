//! The cluster `coloc bench`'s Place scenarios work on: N GPUs running 0 to 3 jobs each,
//! whose resident sets come from a pool of 64 distinct sets (real clusters repeat the same
//! sets on many GPUs), and the requests that place a job on it.

use bytes::Bytes;
use prost::Message;
use rand::{rngs::StdRng, Rng, SeedableRng};

use coloc::proto as pb;

use super::{GPU, REQUEST_POOL};

/// Distinct resident sets in a cluster.
const DISTINCT_SETS: usize = 64;
/// How many GPUs a Place answer carries: a scheduler wants the best few.
pub(super) const PLACE_TOP_K: i32 = 10;

/// `n` GPUs, 8 per node, each running one of the pool's resident sets.
pub(super) fn cluster(names: &[String], n: usize, seed: u64) -> Vec<pb::GpuState> {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool: Vec<Vec<String>> = (0..DISTINCT_SETS)
        .map(|_| {
            let size = rng.random_range(0..4);
            (0..size)
                .map(|_| names[rng.random_range(0..names.len())].clone())
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| pb::GpuState {
            id: format!("gpu-{i:05}"),
            node: format!("node-{:04}", i / 8),
            gpu: GPU.into(),
            memory_gb: 0.0,
            residents: pool[rng.random_range(0..pool.len())].clone(),
            resident_min_fractions: Vec::new(),
        })
        .collect()
}

/// Encoded Place requests: a random job each, against `gpus` (empty = the stored
/// occupancy).
pub(super) fn place_pool(names: &[String], gpus: &[pb::GpuState], seed: u64) -> Vec<Bytes> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..REQUEST_POOL)
        .map(|_| pb::PlaceRequest {
            workload: names[rng.random_range(0..names.len())].clone(),
            gpus: gpus.to_vec(),
            // Against the stored occupancy: only the cluster's GPU model.
            gpu: if gpus.is_empty() {
                GPU.into()
            } else {
                String::new()
            },
            top_k: PLACE_TOP_K,
            ..Default::default()
        })
        .map(|request| Bytes::from(request.encode_to_vec()))
        .collect()
}

/// The AssignJob requests that put `gpus` into the server's occupancy.
pub(super) fn assignments(gpus: &[pb::GpuState]) -> Vec<pb::AssignJobRequest> {
    gpus.iter()
        .flat_map(|gpu| {
            gpu.residents
                .iter()
                .enumerate()
                .map(|(j, workload)| pb::AssignJobRequest {
                    job_id: format!("{}-job-{j}", gpu.id),
                    gpu_id: gpu.id.clone(),
                    node: gpu.node.clone(),
                    gpu: gpu.gpu.clone(),
                    workload: workload.clone(),
                    lease_secs: 0,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_repeats_a_few_resident_sets_of_zero_to_three_jobs() {
        let names: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
        let gpus = cluster(&names, 1_000, 1);
        assert_eq!(gpus.len(), 1_000);
        let distinct: std::collections::HashSet<&Vec<String>> =
            gpus.iter().map(|g| &g.residents).collect();
        assert!(distinct.len() <= DISTINCT_SETS);
        assert!(gpus.iter().all(|g| g.residents.len() <= 3));
        assert!(gpus.iter().any(|g| g.residents.is_empty()));
        let jobs = assignments(&gpus);
        assert_eq!(
            jobs.len(),
            gpus.iter().map(|g| g.residents.len()).sum::<usize>()
        );
        let request = pb::PlaceRequest::decode(place_pool(&names, &gpus, 1)[0].clone()).unwrap();
        assert_eq!((request.gpus.len(), request.top_k), (1_000, PLACE_TOP_K));
    }
}

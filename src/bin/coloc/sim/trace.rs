//! The jobs: one-GPU pods of the Alibaba GPU trace v2023 (`openb_pod_list_default.csv`),
//! each given a KACE workload by a seeded, documented rule.
//!
//! Which pods: `num_gpu == 1` and scheduled in the trace (`scheduled_time` present) with a
//! positive run time. Arrival = `creation_time`; lifetime = `deletion_time -
//! scheduled_time` (how long it ran in the real cluster). A job's work is its lifetime at
//! exclusive speed: alone on a GPU it finishes in its trace lifetime.
//!
//! The assignment rule (docs/simulation.md): a pod that asked for a whole GPU
//! (`gpu_milli == 1000`) runs one of the training workloads; a GPU-sharing pod runs an
//! inference workload, batch 2 when it asked for at most half a GPU (`gpu_milli <= 500`),
//! batch 8 above. Within its class the workload is drawn uniformly by a hash of (seed, pod
//! name), so a seed fixes the whole assignment and one pod's draw does not depend on the
//! others. Latency-sensitive pods (`qos == LS`) carry the cap `min_job_fraction`.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::truth::{draw, Truth};

/// One simulated job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub name: String,
    pub arrival: f64,
    /// Seconds at exclusive speed.
    pub work: f64,
    pub workload: u8,
    /// Thousandths of a GPU the pod asked for.
    pub gpu_milli: u32,
    /// The least share of its exclusive speed the job may be placed to run at.
    pub cap: Option<f64>,
}

/// A one-GPU pod as the trace gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub name: String,
    pub arrival: f64,
    pub lifetime: f64,
    pub gpu_milli: u32,
    pub latency_sensitive: bool,
}

#[derive(Deserialize)]
struct Row {
    name: String,
    num_gpu: u32,
    gpu_milli: u32,
    qos: String,
    creation_time: f64,
    deletion_time: f64,
    scheduled_time: Option<f64>,
}

/// Reads the one-GPU pods that ran, ordered by arrival (then name).
pub fn read_pods(path: &Path) -> anyhow::Result<Vec<Pod>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut pods = Vec::new();
    for row in reader.deserialize::<Row>() {
        let row = row.with_context(|| format!("a malformed row in {}", path.display()))?;
        let Some(scheduled) = row.scheduled_time else {
            continue;
        };
        let lifetime = row.deletion_time - scheduled;
        if row.num_gpu != 1 || lifetime <= 0.0 {
            continue;
        }
        pods.push(Pod {
            name: row.name,
            arrival: row.creation_time,
            lifetime,
            gpu_milli: row.gpu_milli.clamp(1, 1000),
            latency_sensitive: row.qos == "LS",
        });
    }
    pods.sort_by(|a, b| a.arrival.total_cmp(&b.arrival).then(a.name.cmp(&b.name)));
    Ok(pods)
}

/// The class a pod's request puts it in.
fn candidates(truth: &Truth, gpu_milli: u32) -> Vec<u8> {
    let fits = |inference: bool, small_batch: Option<bool>| {
        truth
            .workloads
            .iter()
            .enumerate()
            .filter(move |(_, w)| {
                w.inference == inference && small_batch.is_none_or(|s| (w.batch_size <= 2) == s)
            })
            .map(|(i, _)| i as u8)
            .collect::<Vec<_>>()
    };
    let pool = match gpu_milli {
        1000.. => fits(false, None),
        501..=999 => fits(true, Some(false)),
        _ => fits(true, Some(true)),
    };
    if pool.is_empty() {
        // A hand-made truth may lack a class: any workload then.
        (0..truth.workloads.len() as u8).collect()
    } else {
        pool
    }
}

/// Gives each pod its workload for `seed`.
pub fn assign(pods: &[Pod], truth: &Truth, seed: u64, ls_cap: f64) -> Vec<Job> {
    pods.iter()
        .map(|pod| {
            let pool = candidates(truth, pod.gpu_milli);
            let workload = pool[(draw(seed, &pod.name) % pool.len() as u64) as usize];
            Job {
                name: pod.name.clone(),
                arrival: pod.arrival,
                work: pod.lifetime,
                workload,
                gpu_milli: pod.gpu_milli,
                cap: (pod.latency_sensitive && ls_cap > 0.0).then_some(ls_cap),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "../shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv";

    #[test]
    fn the_trace_holds_6129_one_gpu_pods_that_ran() {
        let pods = read_pods(Path::new(TRACE)).unwrap();
        // 6 989 one-GPU pods, 860 of them never scheduled (the data's README and a count
        // with Python's csv module).
        assert_eq!(pods.len(), 6129);
        assert!(pods.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        assert!(pods.iter().all(|p| p.lifetime > 0.0));
    }

    #[test]
    fn the_assignment_follows_the_request_and_the_seed() {
        let truth = Truth::shared_data();
        let pods = read_pods(Path::new(TRACE)).unwrap();
        let jobs = assign(&pods, &truth, 7, 0.5);
        for (pod, job) in pods.iter().zip(&jobs) {
            let w = &truth.workloads[job.workload as usize];
            match pod.gpu_milli {
                1000 => assert!(!w.inference, "{} got {}", pod.name, w.name),
                501..=999 => assert!(w.inference && w.batch_size == 8, "{}", w.name),
                _ => assert!(w.inference && w.batch_size == 2, "{}", w.name),
            }
            assert_eq!(job.cap.is_some(), pod.latency_sensitive);
            assert_eq!(job.work, pod.lifetime);
        }
        assert_eq!(jobs, assign(&pods, &truth, 7, 0.5));
        let other = assign(&pods, &truth, 8, 0.5);
        let differ = jobs
            .iter()
            .zip(&other)
            .filter(|(a, b)| a.workload != b.workload)
            .count();
        assert!(
            differ > pods.len() / 2,
            "only {differ} pods changed workload"
        );
    }
}

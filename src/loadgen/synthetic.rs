//! The synthetic store `coloc bench` serves: W workloads with profiles drawn from the
//! KACE V100 metric ranges, and runs of random pairs under a known interference law.

use rand::{rngs::StdRng, Rng, SeedableRng};

use coloc::{
    domain::{
        ColocatedMember, GpuName, KernelMetrics, NewWorkload, Observation, Profile, ProfileSource,
        SystemMetrics, WorkloadMode, WorkloadName,
    },
    store::{ObservationSource, Store},
};

use super::{GPU, GPU_MEMORY_GB};

/// The synthetic store's content, kept to train the peer on the same data.
pub(super) struct Synthetic {
    pub(super) names: Vec<WorkloadName>,
    pub(super) profiles: Vec<Profile>,
    pub(super) runs: Vec<Observation>,
}

/// Per metric: (min, max, log scale) over the KACE V100 workloads.
const METRIC_RANGES: [(f64, f64, bool); 10] = [
    (3.6e4, 1.16e7, true), // threads
    (15.6, 80.6, false),   // compute_throughput_pct
    (9.0, 84.6, false),    // dram_throughput_pct
    (40.2, 85.0, false),   // memory_throughput_pct
    (3.1e6, 1.98e8, true), // registers
    (180.0, 7.4e4, true),  // static_shared_memory_bytes
    (1.7, 126.2, true),    // exclusive_throughput
    (17.5, 97.5, false),   // sm_busy_pct
    (3.4, 47.9, false),    // mem_busy_pct
    (1.2, 21.5, false),    // memory_gb
];

fn draw(rng: &mut StdRng, (lo, hi, log): (f64, f64, bool)) -> f64 {
    if log {
        (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
    } else {
        lo + rng.random::<f64>() * (hi - lo)
    }
}

pub(super) fn synthetic(workloads: usize, runs: usize, seed: u64) -> anyhow::Result<Synthetic> {
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = GpuName::parse("gpu", GPU)?;
    let names: Vec<WorkloadName> = (0..workloads)
        .map(|i| WorkloadName::parse("name", &format!("w{i:06}")))
        .collect::<Result<_, _>>()?;
    let profiles: Vec<Profile> = (0..workloads)
        .map(|_| {
            let m: Vec<f64> = METRIC_RANGES.iter().map(|&r| draw(&mut rng, r)).collect();
            Profile {
                gpu: gpu.clone(),
                kernel: KernelMetrics {
                    threads: m[0],
                    compute_throughput_pct: m[1],
                    dram_throughput_pct: m[2],
                    memory_throughput_pct: m[3],
                    registers: m[4],
                    static_shared_memory_bytes: m[5],
                },
                system: SystemMetrics {
                    exclusive_throughput: m[6],
                    throughput_unit: "samples/s".into(),
                    sm_busy_pct: m[7],
                    mem_busy_pct: m[8],
                    memory_gb: m[9],
                },
                source: ProfileSource::ClientSupplied,
                gpu_memory_gb: Some(GPU_MEMORY_GB),
                measured_at_ms: 0,
                kernel_missing: false,
            }
        })
        .collect();
    // Each member keeps less of its throughput the busier the pair keeps the SMs and the
    // memory system, with 3 % noise.
    let kept = |own: &Profile, other: &Profile, rng: &mut StdRng| {
        let sm = (own.system.sm_busy_pct + other.system.sm_busy_pct) / 100.0;
        let mem = (own.system.mem_busy_pct + other.system.mem_busy_pct) / 100.0;
        (1.15 - 0.35 * sm - 0.3 * mem + 0.03 * (rng.random::<f64>() - 0.5)).clamp(0.15, 1.0)
    };
    let runs = (0..runs)
        .map(|i| {
            let (a, b) = (
                rng.random_range(0..workloads),
                rng.random_range(0..workloads),
            );
            let (pa, pb) = (&profiles[a], &profiles[b]);
            let members = vec![
                ColocatedMember {
                    workload: names[a].clone(),
                    throughput: pa.system.exclusive_throughput * kept(pa, pb, &mut rng),
                    job_id: String::new(),
                },
                ColocatedMember {
                    workload: names[b].clone(),
                    throughput: pb.system.exclusive_throughput * kept(pb, pa, &mut rng),
                    job_id: String::new(),
                },
            ];
            Ok(Observation::new(gpu.clone(), members, 1 + i as i64)?)
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Synthetic {
        names,
        profiles,
        runs,
    })
}

pub(super) async fn seed_store(store: &Store, data: &Synthetic) -> anyhow::Result<()> {
    let workloads: Vec<NewWorkload> = data
        .names
        .iter()
        .zip(&data.profiles)
        .map(|(name, profile)| NewWorkload {
            name: name.clone(),
            mode: WorkloadMode::Training,
            model: String::new(),
            batch_size: 0,
            labels: Default::default(),
            profile: Some(profile.clone()),
            launch: None,
            profile_on: Vec::new(),
        })
        .collect();
    store.register_workloads(&workloads, 0).await?;
    for chunk in data.runs.chunks(20_000) {
        store
            .insert_observations(chunk, ObservationSource::Reported, 0)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_store_and_another_seed_another() {
        let a = synthetic(20, 50, 7).unwrap();
        let b = synthetic(20, 50, 7).unwrap();
        let c = synthetic(20, 50, 8).unwrap();
        assert_eq!(a.profiles, b.profiles);
        assert_eq!(a.runs, b.runs);
        assert_ne!(a.profiles, c.profiles);
    }

    #[test]
    fn profiles_stay_in_the_kace_ranges_and_runs_follow_the_interference_law() {
        let data = synthetic(200, 500, 1).unwrap();
        assert_eq!(data.names.len(), 200);
        assert_eq!(data.runs.len(), 500);
        for p in &data.profiles {
            let values = [
                p.kernel.threads,
                p.kernel.compute_throughput_pct,
                p.kernel.dram_throughput_pct,
                p.kernel.memory_throughput_pct,
                p.kernel.registers,
                p.kernel.static_shared_memory_bytes,
                p.system.exclusive_throughput,
                p.system.sm_busy_pct,
                p.system.mem_busy_pct,
                p.system.memory_gb,
            ];
            for (value, (lo, hi, _)) in values.iter().zip(METRIC_RANGES) {
                assert!((lo..=hi).contains(value), "{value} outside {lo}..{hi}");
            }
        }
        let by_name: std::collections::HashMap<_, _> =
            data.names.iter().zip(&data.profiles).collect();
        for run in &data.runs {
            assert_eq!(run.members.len(), 2);
            for member in &run.members {
                // Each member keeps 15 % to 100 % of its exclusive throughput.
                let alone = by_name[&member.workload].system.exclusive_throughput;
                let kept = member.throughput / alone;
                assert!((0.15 - 1e-12..=1.0 + 1e-12).contains(&kept), "{kept}");
            }
        }
    }
}

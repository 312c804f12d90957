//! The synthetic store `coloc bench` serves: W workloads with profiles drawn from the
//! KACE V100 metric ranges, and runs of random pairs under a known interference law; with
//! `--crowded-share F`, a share F of the runs are sets of three or four members instead.
//!
//! The law, for a run of any size: each member keeps
//! `1.15 - 0.35 SM - 0.3 MEM + 0.03 (u - 1/2)` of its exclusive throughput, clamped to
//! [0.15, 1], where SM and MEM are the run's summed `sm_busy_pct` and `mem_busy_pct` over
//! 100 (every member's, its own included) and u is uniform on [0, 1), drawn per member.
//! For a pair it is the law the store has always had, to the bit; a larger set presses
//! harder on the SMs and the memory system, so its members keep less (a typical triple's
//! members about a third, a typical quadruple's the floor of 0.15).
//!
//! Draws, in order from one RNG seeded with `--seed`: every profile; then per run, only
//! when the crowded share is above 0, whether it is crowded (u < F) and, if so, its size (3
//! or 4, even odds); its members (uniform over the workloads, independently, so a workload
//! may run beside itself, as in the pairs); each member's noise. With F = 0 nothing is drawn
//! for the first two, so the store is the pairs-only one run for run.

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

/// The largest set the crowded runs hold.
const MAX_CROWDED_MEMBERS: usize = 4;

pub(super) fn synthetic(
    workloads: usize,
    runs: usize,
    crowded_share: f64,
    seed: u64,
) -> anyhow::Result<Synthetic> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&crowded_share),
        "the crowded share is between 0 and 1, got {crowded_share}"
    );
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
    let runs = (0..runs)
        .map(|i| {
            let size = if crowded_share > 0.0 && rng.random::<f64>() < crowded_share {
                rng.random_range(3..=MAX_CROWDED_MEMBERS)
            } else {
                2
            };
            let set: Vec<usize> = (0..size).map(|_| rng.random_range(0..workloads)).collect();
            let members = (0..size)
                .map(|k| {
                    let own = &profiles[set[k]];
                    let others = set
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != k)
                        .map(|(_, &w)| &profiles[w]);
                    ColocatedMember {
                        workload: names[set[k]].clone(),
                        throughput: own.system.exclusive_throughput * kept(own, others, &mut rng),
                        job_id: String::new(),
                    }
                })
                .collect();
            Ok(Observation::new(gpu.clone(), members, 1 + i as i64)?)
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Synthetic {
        names,
        profiles,
        runs,
    })
}

/// The share of its exclusive throughput a member keeps beside `others` (the module's law):
/// less the busier the whole set keeps the SMs and the memory system, with 3 % noise. The
/// others' load is summed first, so a pair's figure is the same float as before sets
/// existed.
fn kept<'a>(own: &Profile, others: impl Iterator<Item = &'a Profile>, rng: &mut StdRng) -> f64 {
    let (others_sm, others_mem) = others.fold((0.0, 0.0), |(sm, mem), p| {
        (sm + p.system.sm_busy_pct, mem + p.system.mem_busy_pct)
    });
    let sm = (own.system.sm_busy_pct + others_sm) / 100.0;
    let mem = (own.system.mem_busy_pct + others_mem) / 100.0;
    (1.15 - 0.35 * sm - 0.3 * mem + 0.03 * (rng.random::<f64>() - 0.5)).clamp(0.15, 1.0)
}

/// Puts the synthetic store's workloads (through the store) and runs into the store at
/// `url`; returns how the runs went in: "store" (the store's own `insert_observations`, in
/// transactions of 20 000 runs) on SQLite, "bulk" on PostgreSQL ([`bulk_insert_runs`]).
pub(super) async fn seed_store(
    store: &Store,
    url: &str,
    data: &Synthetic,
) -> anyhow::Result<&'static str> {
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
    if url.starts_with("postgres") {
        bulk_insert_runs(url, &data.runs).await?;
        return Ok("bulk");
    }
    for chunk in data.runs.chunks(20_000) {
        store
            .insert_observations(chunk, ObservationSource::Reported, 0)
            .await?;
    }
    Ok("store")
}

/// The bench's bulk path into PostgreSQL: the rows `insert_observations` writes
/// (source `reported`, recorded at 0, no prediction; each member at its position), 10 000
/// runs per pair of statements (arrays unnested) instead of two statements per run, one
/// transaction for all. A run already stored (same fingerprint) is left as it is.
async fn bulk_insert_runs(url: &str, runs: &[Observation]) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(url).await?;
    let mut tx = db.begin().await?;
    for chunk in runs.chunks(10_000) {
        let fingerprints: Vec<String> = chunk.iter().map(Observation::fingerprint).collect();
        let inserted: Vec<(i64, String)> = sqlx::query_as(
            "INSERT INTO observations (gpu, observed_at_ms, recorded_at_ms, source, \
             fingerprint, gpu_id) \
             SELECT gpu, at, 0, 'reported', fingerprint, gpu_id \
             FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[]) \
             AS r(gpu, at, fingerprint, gpu_id) \
             ON CONFLICT (fingerprint) DO NOTHING RETURNING id, fingerprint",
        )
        .bind(
            chunk
                .iter()
                .map(|r| r.gpu.as_str().to_owned())
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|r| r.observed_at_ms).collect::<Vec<_>>())
        .bind(&fingerprints)
        .bind(chunk.iter().map(|r| r.gpu_id.clone()).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await?;
        let ids: std::collections::HashMap<String, i64> =
            inserted.into_iter().map(|(id, f)| (f, id)).collect();
        let (mut run_ids, mut positions, mut workloads, mut throughputs, mut jobs) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (run, fingerprint) in chunk.iter().zip(&fingerprints) {
            let Some(&id) = ids.get(fingerprint) else {
                continue;
            };
            for (position, member) in run.members.iter().enumerate() {
                run_ids.push(id);
                positions.push(position as i64);
                workloads.push(member.workload.as_str().to_owned());
                throughputs.push(member.throughput);
                jobs.push(member.job_id.clone());
            }
        }
        sqlx::query(
            "INSERT INTO observation_members (observation_id, position, workload, throughput, \
             job_id) SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], \
             $4::float8[], $5::text[])",
        )
        .bind(run_ids)
        .bind(positions)
        .bind(workloads)
        .bind(throughputs)
        .bind(jobs)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_store_and_another_seed_another() {
        let a = synthetic(20, 50, 0.0, 7).unwrap();
        let b = synthetic(20, 50, 0.0, 7).unwrap();
        let c = synthetic(20, 50, 0.0, 8).unwrap();
        assert_eq!(a.profiles, b.profiles);
        assert_eq!(a.runs, b.runs);
        assert_ne!(a.profiles, c.profiles);
    }

    #[test]
    fn profiles_stay_in_the_kace_ranges_and_runs_follow_the_interference_law() {
        let data = synthetic(200, 500, 0.0, 1).unwrap();
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

    #[test]
    fn without_a_crowded_share_the_runs_are_the_pairs_drawn_before_sets_existed() {
        let (workloads, seed) = (50, 3);
        let data = synthetic(workloads, 400, 0.0, seed).unwrap();
        // The pairs generator as it was, replayed on the same RNG after the profiles' draws.
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..workloads {
            for range in METRIC_RANGES {
                draw(&mut rng, range);
            }
        }
        let kept_before = |own: &Profile, other: &Profile, rng: &mut StdRng| {
            let sm = (own.system.sm_busy_pct + other.system.sm_busy_pct) / 100.0;
            let mem = (own.system.mem_busy_pct + other.system.mem_busy_pct) / 100.0;
            (1.15 - 0.35 * sm - 0.3 * mem + 0.03 * (rng.random::<f64>() - 0.5)).clamp(0.15, 1.0)
        };
        for run in &data.runs {
            let (a, b) = (
                rng.random_range(0..workloads),
                rng.random_range(0..workloads),
            );
            let (pa, pb) = (&data.profiles[a], &data.profiles[b]);
            let expected = [
                (
                    a,
                    pa.system.exclusive_throughput * kept_before(pa, pb, &mut rng),
                ),
                (
                    b,
                    pb.system.exclusive_throughput * kept_before(pb, pa, &mut rng),
                ),
            ];
            assert_eq!(run.members.len(), 2);
            for (member, (w, throughput)) in run.members.iter().zip(expected) {
                assert_eq!(member.workload, data.names[w]);
                assert_eq!(member.throughput.to_bits(), throughput.to_bits());
            }
        }
    }

    #[test]
    fn a_crowded_share_makes_that_share_of_runs_sets_of_three_and_four_under_the_law() {
        let runs = 20_000;
        let data = synthetic(300, runs, 0.3, 5).unwrap();
        let again = synthetic(300, runs, 0.3, 5).unwrap();
        assert_eq!((&data.profiles, &data.runs), (&again.profiles, &again.runs));
        assert_ne!(data.runs, synthetic(300, runs, 0.3, 6).unwrap().runs);
        let mut by_size = [0usize; 5];
        for run in &data.runs {
            by_size[run.members.len()] += 1;
        }
        assert_eq!(by_size[2] + by_size[3] + by_size[4], runs, "{by_size:?}");
        // Binomial: a standard deviation of the share is 0.0032 here, of the halves 0.006.
        let crowded = (by_size[3] + by_size[4]) as f64;
        assert!((crowded / runs as f64 - 0.3).abs() < 0.015, "{by_size:?}");
        assert!(
            (by_size[3] as f64 / crowded - 0.5).abs() < 0.03,
            "{by_size:?}"
        );

        let by_name: std::collections::HashMap<_, _> =
            data.names.iter().zip(&data.profiles).collect();
        for run in data.runs.iter().filter(|r| r.members.len() >= 3) {
            let profiles: Vec<&Profile> =
                run.members.iter().map(|m| by_name[&m.workload]).collect();
            let sm: f64 = profiles.iter().map(|p| p.system.sm_busy_pct).sum::<f64>() / 100.0;
            let mem: f64 = profiles.iter().map(|p| p.system.mem_busy_pct).sum::<f64>() / 100.0;
            let law = 1.15 - 0.35 * sm - 0.3 * mem;
            for (member, profile) in run.members.iter().zip(&profiles) {
                let kept = member.throughput / profile.system.exclusive_throughput;
                let (lo, hi) = (
                    (law - 0.015).clamp(0.15, 1.0),
                    (law + 0.015).clamp(0.15, 1.0),
                );
                assert!(
                    (lo - 1e-9..=hi + 1e-9).contains(&kept),
                    "{kept} vs law {law}"
                );
            }
        }
        assert!(synthetic(300, 100, 1.0, 5)
            .unwrap()
            .runs
            .iter()
            .all(|r| r.members.len() >= 3));
        assert!(synthetic(10, 10, 1.5, 5).is_err());
    }
}

//! Place over a cluster: one job against N GPUs running 0 to 3 jobs each, with the default
//! model fitted on the published KACE V100 pairs. The work Place does per request once it
//! is decoded (catalog lookups, one prediction per distinct set, caps, ordering).
//!
//! Real clusters repeat the same resident sets on many GPUs; `repeated` draws each GPU's
//! residents from 64 distinct sets, `distinct` gives (almost) every GPU a set of its own,
//! the worst case for the per-request set cache.
//!
//! `place_composition` sets the default model against the same model without decision 041's
//! composition of crowded members from pair answers, in one run: what composing costs Place.
//!
//! `cargo bench --bench place`

use std::{collections::HashMap, path::Path, sync::Arc};

use coloc::{
    advisor::{place_in, Catalog, GpuState, PlaceQuery},
    dataset::KaceDataset,
    domain::{GpuName, Profile, ProfileSource, WorkloadName},
    model::{fit_with_options, MemberOptions, ModelKind, TrainingRow},
    store::StoredModel,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const V100: &str = "Tesla V100-SXM2-32GB";

/// The KACE catalog and the default model fitted on its pairs with `options`.
fn kace(options: MemberOptions) -> (Catalog, HashMap<GpuName, Arc<StoredModel>>, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
    let dataset = KaceDataset::read(&dir).expect("the KACE data beside the repository");
    let features = dataset.features();
    let rows: Vec<TrainingRow> = dataset
        .pairs
        .iter()
        .filter_map(|p| {
            Some(TrainingRow {
                members: vec![*features.get(&p.workload1)?, *features.get(&p.workload2)?],
                throughputs: vec![p.throughput1, p.throughput2],
            })
        })
        .collect();
    let (params, metrics) =
        fit_with_options(ModelKind::MemberRidgeGbt, &rows, options).expect("the KACE data fits");
    let gpu = GpuName::parse("gpu", V100).unwrap();
    let model = Arc::new(StoredModel::fitted_in_process(
        gpu.clone(),
        params,
        metrics,
        String::new(),
    ));
    let mut catalog = Catalog::default();
    let mut names = Vec::new();
    for w in &dataset.workloads {
        let profile = Profile {
            gpu: gpu.clone(),
            kernel: w.kernel,
            system: w.system.clone(),
            source: ProfileSource::Imported,
            gpu_memory_gb: Some(32.0),
            measured_at_ms: 0,
            kernel_missing: false,
        };
        catalog.put_workload(&w.name, &[profile]);
        names.push(w.name.to_string());
    }
    catalog.set_scoring_model(model.clone());
    (catalog, HashMap::from([(gpu, model)]), names)
}

/// A deterministic pseudo-random sequence (SplitMix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// `n` GPUs with 0-3 residents each; the sets come from a pool of `sets` distinct ones.
fn cluster(names: &[String], n: usize, sets: usize) -> Vec<GpuState> {
    let mut rng = Rng(7);
    let pool: Vec<Vec<String>> = (0..sets)
        .map(|_| {
            let size = rng.below(4);
            (0..size)
                .map(|_| names[rng.below(names.len())].clone())
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| GpuState {
            id: format!("gpu-{i:05}"),
            node: format!("node-{:04}", i / 8),
            gpu: Some(GpuName::parse("gpu", V100).unwrap()),
            memory_gb: None,
            residents: pool[rng.below(pool.len())].clone(),
            resident_floors: Vec::new(),
        })
        .collect()
}

fn place(c: &mut Criterion) {
    let (catalog, models, names) = kace(MemberOptions::CHOSEN);
    let job = WorkloadName::parse("workload", "bert-base-cased_batch8-train").unwrap();
    let mut group = c.benchmark_group("place");
    for (label, n, sets) in [
        ("repeated", 1_000, 64),
        ("repeated", 10_000, 64),
        ("distinct", 1_000, 1_000),
    ] {
        let gpus = cluster(&names, n, sets);
        group.throughput(Throughput::Elements(n as u64));
        group.sample_size(20);
        group.bench_with_input(BenchmarkId::new(label, n), &gpus, |b, gpus| {
            b.iter(|| {
                let mut query = PlaceQuery::new(job.clone(), gpus.clone());
                query.top_k = 10;
                place_in(&catalog, &models, None, query).unwrap()
            })
        });
    }
    group.finish();
}

/// The worst case for composing: 1 000 GPUs of distinct resident sets, each crowded set
/// answered afresh, with and without the composition (w = 0), in one run.
fn place_composition(c: &mut Criterion) {
    let job = WorkloadName::parse("workload", "bert-base-cased_batch8-train").unwrap();
    let mut group = c.benchmark_group("place_composition");
    group.sample_size(20);
    for w in [0, MemberOptions::CHOSEN.pair_composition] {
        let (catalog, models, names) = kace(MemberOptions {
            pair_composition: w,
            ..MemberOptions::CHOSEN
        });
        let gpus = cluster(&names, 1_000, 1_000);
        group.throughput(Throughput::Elements(1_000));
        group.bench_with_input(BenchmarkId::new("distinct_1000_w", w), &gpus, |b, gpus| {
            b.iter(|| {
                let mut query = PlaceQuery::new(job.clone(), gpus.clone());
                query.top_k = 10;
                place_in(&catalog, &models, None, query).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, place, place_composition);
criterion_main!(benches);

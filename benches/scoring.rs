//! Batch scoring of one target against N candidates, for each model kind: the work Rank
//! does per request once the candidates are chosen. Models are fitted on the published
//! KACE V100 data; candidates are drawn around its metric ranges.
//!
//! `cargo bench --bench scoring`; criterion reports time per batch, and per candidate
//! through its throughput figures.

use std::path::Path;

use coloc::{
    dataset::KaceDataset,
    model::{fit, Features, ModelKind, TrainingRow},
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn kace_rows() -> (Vec<TrainingRow>, Vec<Features>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
    let dataset = KaceDataset::read(&dir).expect("the KACE data beside the repository");
    let features = dataset.features();
    let rows = dataset
        .pairs
        .iter()
        .filter_map(|p| {
            Some(TrainingRow {
                members: vec![*features.get(&p.workload1)?, *features.get(&p.workload2)?],
                throughputs: vec![p.throughput1, p.throughput2],
            })
        })
        .collect();
    (rows, features.into_values().collect())
}

/// `n` candidates: the real workloads, scaled by a deterministic factor in [0.8, 1.2).
fn candidates(base: &[Features], n: usize) -> Vec<Features> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            let mut f = base[i % base.len()];
            for v in f.0.iter_mut() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = 0.8 + 0.4 * ((state >> 11) as f64 / (1u64 << 53) as f64);
                *v *= jitter;
            }
            for pct in [1, 2, 3, 7, 8] {
                f.0[pct] = f.0[pct].min(100.0);
            }
            f
        })
        .collect()
}

fn scoring(c: &mut Criterion) {
    let (rows, workloads) = kace_rows();
    let target = workloads[0];
    for kind in ModelKind::ALL {
        let (params, _) = fit(kind, &rows).expect("the KACE data fits");
        let mut group = c.benchmark_group(format!("score/{}", kind.as_str()));
        for n in [10usize, 100, 1_000, 10_000, 100_000] {
            let pool = candidates(&workloads, n);
            let refs: Vec<&Features> = pool.iter().collect();
            group.throughput(Throughput::Elements(n as u64));
            if n >= 10_000 {
                group.sample_size(10);
            }
            group.bench_with_input(BenchmarkId::from_parameter(n), &refs, |b, refs| {
                b.iter(|| params.predict_pairs(&target, refs))
            });
        }
        group.finish();
    }

    // The default kind's three paths: walking every tree (the reference: the pairs as sets
    // of two through the general path, in chunks on the rayon threads above 512), the pair scorer
    // with profile codes computed per call, and with codes precomputed as Rank keeps them.
    let (params, _) = fit(ModelKind::MemberRidgeGbt, &rows).expect("the KACE data fits");
    let scorer = params.pair_scorer().expect("depth-2 trees compile");
    let mut group = c.benchmark_group("score/member-ridge-gbt-paths");
    for n in [10usize, 100, 1_000, 10_000, 100_000] {
        let pool = candidates(&workloads, n);
        let refs: Vec<&Features> = pool.iter().collect();
        let codes: Vec<_> = pool.iter().map(|f| scorer.code(f)).collect();
        group.throughput(Throughput::Elements(n as u64));
        if n >= 10_000 {
            group.sample_size(10);
        }
        if n <= 10_000 {
            let pairs: Vec<[&Features; 2]> = refs.iter().map(|c| [&target, *c]).collect();
            group.bench_with_input(BenchmarkId::new("reference", n), &pairs, |b, pairs| {
                b.iter(|| params.predict(pairs))
            });
        }
        group.bench_with_input(BenchmarkId::new("codes-per-call", n), &refs, |b, refs| {
            b.iter(|| scorer.predict_pairs(&target, refs))
        });
        group.bench_with_input(BenchmarkId::new("codes-kept", n), &pool, |b, pool| {
            b.iter(|| {
                let tables = scorer.target(&target);
                pool.iter()
                    .zip(&codes)
                    .map(|(c, code)| {
                        let [a, b] = scorer.score(&tables, c, code);
                        a + b
                    })
                    .fold(f64::NEG_INFINITY, f64::max)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, scoring);
criterion_main!(benches);

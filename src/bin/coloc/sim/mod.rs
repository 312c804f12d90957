//! `coloc simulate`: the cluster simulation. It replays the one-GPU pods of the Alibaba GPU
//! trace v2023 on G simulated V100 32 GB GPUs under each placement policy and reports what
//! operators decide on (makespan, job completion time, GPU-hours, jobs hurt), with the
//! measured KACE colocations as the only truth.
//!
//! A tool beside the service, not part of it: a module of the `coloc` binary that the
//! service's library never compiles. Its parts, in the order data flows: `truth` (measured
//! sets and the conservative bound), `trace` (pods and the workload-assignment rule),
//! `policy` (the rule policies and the oracle), `online` (the service in process, which
//! `coloc-online` asks and reports to), `place` (the model policies, through the Place
//! adapter), `engine` (the event-driven cluster), `report` (table, JSON), `plot`
//! (PNG); beside them `audit`, which sets `coloc`'s intervals against the truth once per
//! run.

#[cfg(test)]
mod agreement;
mod audit;
mod engine;
mod observed;
mod online;
mod place;
mod plot;
mod policy;
mod report;
mod retraining;
mod trace;
mod truth;

use crate::data_sources::{require, DataSet};
use std::{collections::BTreeMap, path::Path, sync::Arc, time::Instant};

use anyhow::{bail, Context};
use serde_json::json;

use crate::args::SimulateArgs;
use coloc::{
    dataset::KaceDataset,
    model::{
        fit, fit_with_options,
        intervals::{self, SeenBands},
        Features, FitMetrics, MemberOptions, ModelKind, ModelParams, TrainingRow,
    },
};

use engine::{simulate, Cluster, Outcome, Queue};
use online::{LearningService, SeededStore};
use place::{CapCheck, PlacePolicy, ServicePlacer};
use policy::{FractionPack, OnePerGpu, Oracle, PlaceRule, Policy, SmallestMemory};
use report::{Report, RunSummary};
use retraining::Probe;
use trace::{assign, read_pods, Pod};
use truth::{NamedRun, Truth};

/// Every policy `--policies` may name.
pub const POLICIES: [&str; 8] = [
    "one-per-gpu",
    "fraction-pack",
    "smallest-memory",
    "kace-linear",
    "coloc",
    "coloc-online",
    "oracle",
    "oracle-pairs",
];

/// The policies run when `--policies` names none: all but `coloc-online`, whose
/// retraining alone takes longer than the others together (README, "Learning from its own
/// placements").
pub const DEFAULT_POLICIES: [&str; 7] = [
    "one-per-gpu",
    "fraction-pack",
    "smallest-memory",
    "kace-linear",
    "coloc",
    "oracle",
    "oracle-pairs",
];

/// The cluster size that puts the offered load of one job per GPU at `load`: total work
/// (seconds at exclusive speed) / (GPUs x the span from the first to the last arrival).
pub fn gpus_for_load(pods: &[Pod], load: f64) -> usize {
    let work: f64 = pods.iter().map(|p| p.lifetime).sum();
    let span = pods.last().map_or(0.0, |p| p.arrival) - pods.first().map_or(0.0, |p| p.arrival);
    if span <= 0.0 || load <= 0.0 {
        return 1;
    }
    ((work / (span * load)).round() as usize).max(1)
}

/// The model policies' training data: the measured pairs (see `place.rs`), and with
/// `--train-on pairs+runs` the training half's runs of three and four (`runs`).
pub(crate) fn training_rows(
    dataset: &KaceDataset,
    runs: &[NamedRun],
) -> anyhow::Result<Vec<TrainingRow>> {
    let features = dataset.features();
    let f = |name: &str| -> anyhow::Result<Features> {
        features
            .get(name)
            .copied()
            .with_context(|| format!("{name} has no profile"))
    };
    let pairs = dataset.pairs.iter().map(|p| {
        Ok(TrainingRow {
            members: vec![f(&p.workload1)?, f(&p.workload2)?],
            throughputs: vec![p.throughput1, p.throughput2],
        })
    });
    let crowded = runs.iter().map(|(members, throughputs)| {
        Ok(TrainingRow {
            members: members
                .iter()
                .map(|m| f(m))
                .collect::<anyhow::Result<_>>()?,
            throughputs: throughputs.clone(),
        })
    });
    pairs.chain(crowded).collect()
}

/// Everything a run needs besides the jobs.
pub struct World {
    pub truth: Truth,
    /// The profiles Place's catalog is built from.
    pub dataset: KaceDataset,
    pub kace_linear: (ModelParams, FitMetrics),
    pub coloc: (ModelParams, FitMetrics),
    /// How the model policies read the LS caps.
    pub caps: CapCheck,
    /// What the oracle and the model policies ask of a shared GPU.
    pub rule: PlaceRule,
    /// Which admitted GPU the model policies take (`--prefer`).
    pub prefer: coloc::extender::Prefer,
    /// The store `coloc-online` starts from; `None` when it does not run.
    pub seeded: Option<SeededStore>,
    /// The sets `coloc-online`'s retraining trace asks (`--trace-retraining`).
    pub probe: Option<Arc<Probe>>,
    /// What the model policies were trained on (the interval audit's what-if refits them).
    pub training_rows: Vec<TrainingRow>,
}

impl World {
    pub fn load(args: &SimulateArgs) -> anyhow::Result<Self> {
        let with_runs = match args.train_on.as_str() {
            "pairs" => false,
            "pairs+runs" => true,
            other => bail!("unknown --train-on {other:?}; known: pairs, pairs+runs"),
        };
        if with_runs && !args.split_runs {
            bail!(
                "--train-on pairs+runs needs --split-runs: a model may not be judged on the \
                 runs it was trained on"
            );
        }
        let (truth, training_half) = Truth::read_split(
            &args.kace_v100,
            &args.kace_3way,
            &args.kace_4way,
            args.split_runs,
            match args.truth_exclusive.as_str() {
                "recorded" => false,
                "corrected" => true,
                other => bail!("unknown --truth-exclusive {other:?}; known: recorded, corrected"),
            },
        )?;
        let dataset = KaceDataset::read(&args.kace_v100)?;
        let rows = training_rows(&dataset, if with_runs { &training_half } else { &[] })?;
        let law_blend_always = match args.law_blend.as_str() {
            "always" => true,
            "crowded-fits" => false,
            other => bail!("unknown --law-blend {other:?}; known: always, crowded-fits"),
        };
        let options = MemberOptions {
            law_blend_always,
            ..MemberOptions::CHOSEN
        };
        let mut coloc = fit_with_options(ModelKind::DEFAULT, &rows, options)?;
        let levels = match args.bands.as_str() {
            "profiles" => None,
            "held-out-runs" => Some((intervals::LOWER, intervals::UPPER)),
            "held-out-runs-95" => Some((0.025, 0.975)),
            other => {
                bail!("unknown --bands {other:?}; known: profiles, held-out-runs, held-out-runs-95")
            }
        };
        match (args.seen_bands.as_str(), &mut coloc.0) {
            ("on", _) => {}
            ("crowded", ModelParams::MemberRidgeGbt(model)) => {
                model.seen = model.seen.take().and_then(SeenBands::crowded_only)
            }
            ("off", ModelParams::MemberRidgeGbt(model)) => model.seen = None,
            ("crowded" | "off", _) => {}
            (other, _) => bail!("unknown --seen-bands {other:?}; known: on, crowded, off"),
        }
        if let Some(levels) = levels {
            coloc.0 = audit::calibrated_on_held_out_runs_at(&coloc.0, &rows, levels)?
                .with_context(|| format!("--bands {}: too few runs to calibrate on", args.bands))?;
        }
        let probe = match args.trace_retraining {
            Some(_) => Some(Arc::new(Probe::new(&truth, args.ls_cap)?)),
            None => None,
        };
        Ok(Self {
            truth,
            dataset,
            kace_linear: fit(ModelKind::KaceLinear, &rows)?,
            coloc,
            caps: match args.caps.as_str() {
                "cautious" => CapCheck::Cautious,
                "point" => CapCheck::Point,
                other => bail!("unknown --caps {other:?}; known: cautious, point"),
            },
            rule: PlaceRule::parse(&args.rule)
                .with_context(|| format!("unknown --rule {:?}", args.rule))?,
            prefer: match args.prefer.as_str() {
                "gain" => coloc::extender::Prefer::Gain,
                "pack" => coloc::extender::Prefer::Pack,
                "spread" => coloc::extender::Prefer::Spread,
                other => bail!("unknown --prefer {other:?}; known: gain, pack, spread"),
            },
            seeded: if args.policies.iter().any(|p| p == "coloc-online") {
                Some(SeededStore::build(&args.kace_v100)?)
            } else {
                None
            },
            probe,
            training_rows: rows,
        })
    }
}

/// Runs one policy on one assignment; returns the outcome and its summary.
pub fn run_policy(
    world: &World,
    name: &str,
    jobs: &[trace::Job],
    cluster: &Cluster,
    seed: u64,
) -> anyhow::Result<(Outcome, RunSummary)> {
    let started = Instant::now();
    let mut place_stats = None;
    let mut learning = None;
    let mut summary_explored = 0;
    let mut retrainings = None;
    let run = |policy: &mut dyn Policy| {
        let outcome = simulate(jobs, &world.truth, cluster, policy);
        let summary = RunSummary::of(policy.name(), seed, &outcome);
        (outcome, summary)
    };
    let (outcome, mut summary) = match name {
        "one-per-gpu" => run(&mut OnePerGpu),
        "fraction-pack" => run(&mut FractionPack),
        "smallest-memory" => run(&mut SmallestMemory),
        "oracle" => run(&mut Oracle::new(&world.truth, world.rule)),
        "oracle-pairs" => run(&mut Oracle::pairs(&world.truth, world.rule)),
        "kace-linear" | "coloc" | "coloc-online" => {
            let placer = if name == "coloc-online" {
                let seeded = world
                    .seeded
                    .as_ref()
                    .context("coloc-online runs without its seeded store")?;
                ServicePlacer::learning(
                    LearningService::start(seeded)?,
                    &world.truth.workloads,
                    world.caps,
                    world.rule,
                )?
            } else {
                let (params, metrics) = if name == "coloc" {
                    world.coloc.clone()
                } else {
                    world.kace_linear.clone()
                };
                ServicePlacer::new(
                    &world.dataset,
                    &world.truth.workloads,
                    params,
                    metrics,
                    world.caps,
                    world.rule,
                )?
            };
            let mut placer = placer;
            placer.prefer = world.prefer;
            if let Some(probe) = &world.probe {
                placer.trace_retraining(probe.clone())?;
            }
            let mut policy = PlacePolicy::new(name, placer);
            let result = run(&mut policy);
            place_stats = Some((policy.placer.calls, policy.placer.nanos));
            summary_explored = policy.placer.explored;
            learning = policy.placer.learning_counts();
            retrainings = policy.placer.retraining.take().map(|log| log.traces);
            result
        }
        other => bail!("unknown policy {other:?}; known: {}", POLICIES.join(", ")),
    };
    if let Some((calls, nanos)) = place_stats {
        summary.place_calls = calls;
        summary.place_us_per_call = nanos as f64 / 1000.0 / calls.max(1) as f64;
    }
    if let Some((reports, trainings, promotions)) = learning {
        summary.reports = reports;
        summary.trainings = trainings;
        summary.promotions = promotions;
    }
    summary.explored = summary_explored;
    summary.retrainings = retrainings.unwrap_or_default();
    for traced in &mut summary.retrainings {
        traced.seed = seed;
    }
    summary.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok((outcome, summary))
}

/// The policies `--policies` names (default `DEFAULT_POLICIES`), once the flags are
/// checked.
fn checked_policies(args: &SimulateArgs) -> anyhow::Result<Vec<String>> {
    let policies: Vec<String> = if args.policies.is_empty() {
        DEFAULT_POLICIES.iter().map(|p| p.to_string()).collect()
    } else {
        args.policies.clone()
    };
    if let Some(unknown) = policies.iter().find(|p| !POLICIES.contains(&p.as_str())) {
        bail!("unknown policy {unknown:?}; known: {}", POLICIES.join(", "));
    }
    if args.seeds.is_empty() {
        bail!("--seeds names no seed");
    }
    if args.split_runs && policies.iter().any(|p| p == "coloc-online") {
        bail!("coloc-online does not run under --split-runs (its store is seeded with the pairs alone)");
    }
    if !(0.0..=1.0).contains(&args.ls_cap) {
        bail!("--ls-cap must lie in [0, 1], got {}", args.ls_cap);
    }
    Ok(policies)
}

/// The first seed's outcome of each policy, by name.
type FirstSeed = Vec<(String, Outcome)>;

/// Every seed's simulation of every policy (the policies of one seed in parallel): their
/// summaries, and the first seed's outcomes by policy (for the plots).
fn simulate_seeds(
    args: &SimulateArgs,
    policies: &[String],
    world: &World,
    pods: &[Pod],
    cluster: &Cluster,
) -> anyhow::Result<(Vec<RunSummary>, FirstSeed)> {
    let mut runs = Vec::new();
    let mut first_seed: FirstSeed = Vec::new();
    if args.json {
        coloc::progress::hide();
    }
    let progress = coloc::progress::bar((args.seeds.len() * policies.len()) as u64, "simulations");
    for &seed in &args.seeds {
        let jobs = assign(pods, &world.truth, seed, args.ls_cap);
        // The policies are independent: one thread each, on every core there is.
        let results: Vec<anyhow::Result<(Outcome, RunSummary)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = policies
                .iter()
                .map(|name| {
                    let (jobs, progress) = (&jobs, &progress);
                    scope.spawn(move || {
                        let result = run_policy(world, name, jobs, cluster, seed);
                        progress.inc(1);
                        result
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a policy's simulation panicked"))
                .collect()
        });
        for (name, result) in policies.iter().zip(results) {
            let (outcome, summary) = result?;
            runs.push(summary);
            if seed == args.seeds[0] {
                first_seed.push((name.clone(), outcome));
            }
        }
    }
    progress.finish_and_clear();
    Ok((runs, first_seed))
}

/// Every run's retraining trace, one JSON object a line, in the order of the runs.
fn write_retraining_trace(file: &Path, runs: &[RunSummary]) -> anyhow::Result<()> {
    let mut lines = String::new();
    for traced in runs.iter().flat_map(|r| &r.retrainings) {
        lines.push_str(&serde_json::to_string(traced)?);
        lines.push('\n');
    }
    std::fs::write(file, lines).with_context(|| format!("cannot write {}", file.display()))
}

/// What the model policies were trained on, in words (the report's setup).
fn training_data(train_on: &str) -> &'static str {
    if train_on == "pairs+runs" {
        "kace-v100/pairs.csv (181 measured pairs) and the training half of the 3-way and \
         4-way runs (--split-runs); judged on the pairs and the other half"
    } else {
        "kace-v100/pairs.csv (181 measured pairs), no 3-way or 4-way run; coloc-online \
         starts from the same and learns from the runs of its own placements"
    }
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    require(&args.trace, DataSet::AlibabaTrace)?;
    require(&args.kace_v100, DataSet::KaceV100)?;
    require(&args.kace_3way, DataSet::KaceNway)?;
    require(&args.kace_4way, DataSet::KaceNway)?;
    let policies = checked_policies(&args)?;
    let mut pods = read_pods(&args.trace)?;
    if let Some(n) = args.max_pods {
        pods.truncate(n);
    }
    if pods.is_empty() {
        bail!("{} holds no one-GPU pod that ran", args.trace.display());
    }
    let world = World::load(&args)?;
    let features = world.dataset.features();
    let interval_audit =
        audit::intervals_on_truth(&world.coloc.0, &world.truth, &features, args.ls_cap)?;
    let audit_if_on_runs =
        match audit::calibrated_on_held_out_runs(&world.coloc.0, &world.training_rows)? {
            Some(model) => Some(audit::intervals_on_truth(
                &model,
                &world.truth,
                &features,
                args.ls_cap,
            )?),
            None => None,
        };
    let loaded = started.elapsed();
    let gpus = args.gpus.unwrap_or_else(|| gpus_for_load(&pods, args.load));
    if gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let queue =
        Queue::parse(&args.queue).with_context(|| format!("unknown --queue {:?}", args.queue))?;
    let cluster = Cluster::new(gpus, args.retry_delay, queue);
    let work: f64 = pods.iter().map(|p| p.lifetime).sum();
    let span = pods.last().expect("pods").arrival - pods[0].arrival;

    let simulating = Instant::now();
    let (runs, first_seed) = simulate_seeds(&args, &policies, &world, &pods, &cluster)?;
    let simulated = simulating.elapsed();
    if let Some(file) = &args.trace_retraining {
        write_retraining_trace(file, &runs)?;
    }

    let mut setup = BTreeMap::new();
    let mut put = |k: &str, v: serde_json::Value| {
        setup.insert(k.to_string(), v);
    };
    put("trace", json!(args.trace.display().to_string()));
    put("jobs", json!(pods.len()));
    put("gpus", json!(gpus));
    put(
        "offered_load",
        json!((work / (span * gpus as f64) * 1000.0).round() / 1000.0),
    );
    put(
        "arrival_span_days",
        json!((span / 86_400.0 * 10.0).round() / 10.0),
    );
    put("exclusive_work_gpu_hours", json!((work / 3600.0).round()));
    put("ls_cap", json!(args.ls_cap));
    put(
        "model_policy_caps",
        json!(match world.caps {
            CapCheck::Point => "point prediction",
            CapCheck::Cautious => "low end of the 80 % interval (point without one)",
        }),
    );
    put("place_rule", json!(world.rule.name()));
    put("prefer", json!(args.prefer));
    put("queue", json!(queue.name()));
    put("retry_delay_s", json!(args.retry_delay));
    put("seeds", json!(args.seeds));
    put("measured_sets", json!(world.truth.measured_sets()));
    put("coloc_bands", json!(args.bands));
    put("coloc_law_blend", json!(args.law_blend));
    put("coloc_seen_bands", json!(args.seen_bands));
    put("coloc_intervals_on_the_truth", json!(interval_audit));
    put(
        "coloc_intervals_on_the_truth_if_calibrated_on_held_out_runs",
        json!(audit_if_on_runs),
    );
    put("split_runs", json!(args.split_runs));
    let truth = world
        .truth
        .exclusive_json(&world.dataset, &args.truth_exclusive);
    put("truth_exclusive", truth);
    put("model_training_data", json!(training_data(&args.train_on)));
    put(
        "load_s",
        json!((loaded.as_secs_f64() * 1000.0).round() / 1000.0),
    );
    put(
        "simulation_s",
        json!((simulated.as_secs_f64() * 1000.0).round() / 1000.0),
    );
    let report = Report::new(setup, runs);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print_table();
    }
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let refs: Vec<(String, &Outcome)> =
            first_seed.iter().map(|(n, o)| (n.clone(), o)).collect();
        plot::jct_cdf(&dir.join("sim_jct_cdf.png"), args.seeds[0], &refs)?;
        plot::busy_gpus(&dir.join("sim_busy_gpus.png"), args.seeds[0], gpus, &refs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn args(max_pods: usize) -> SimulateArgs {
        let data = PathBuf::from("../shared/data");
        SimulateArgs {
            trace: data.join("alibaba-gpu-v2023/openb_pod_list_default.csv"),
            kace_v100: data.join("kace-v100"),
            kace_3way: data.join("kace-3way/runs.csv"),
            kace_4way: data.join("kace-4way/runs.csv"),
            gpus: None,
            load: 1.2,
            seeds: vec![1],
            policies: POLICIES.iter().map(|p| p.to_string()).collect(),
            ls_cap: 0.5,
            caps: "point".into(),
            rule: "gain".into(),
            prefer: "gain".into(),
            queue: "k8s".into(),
            retry_delay: 60.0,
            split_runs: false,
            truth_exclusive: "corrected".into(),
            train_on: "pairs".into(),
            bands: "profiles".into(),
            law_blend: "always".into(),
            seen_bands: "on".into(),
            max_pods: Some(max_pods),
            json: false,
            plots: None,
            trace_retraining: None,
        }
    }

    #[test]
    fn the_interval_audit_counts_every_measured_set_by_size_and_reads_the_low_end_below_the_point()
    {
        let args = args(10);
        let world = World::load(&args).unwrap();
        // First the model's own bands (--seen-bands off); its seen bands below.
        let off = World::load(&SimulateArgs {
            seen_bands: "off".into(),
            ..args.clone()
        })
        .unwrap();
        let audit =
            audit::intervals_on_truth(&off.coloc.0, &off.truth, &off.dataset.features(), 0.5)
                .unwrap();
        // The measured sets: 91 pairs, 400 runs of three and 1,107 of four, each distinct.
        let sizes: Vec<(usize, usize)> = audit.iter().map(|a| (a.size, a.sets)).collect();
        assert_eq!(sizes, vec![(2, 91), (3, 400), (4, 1107)]);
        for a in &audit {
            assert!(a.members >= a.sets && a.members <= a.sets * a.size, "{a:?}");
            assert!(a.admitted_on_low_end <= a.admitted_on_point, "{a:?}");
            assert!(
                a.admitted_on_low_end_below_cap <= a.admitted_on_point_below_cap,
                "{a:?}"
            );
            assert!(a.below_low_end < a.members, "{a:?}");
        }
        // The model is trained on these very pairs: their members lie above the low end.
        assert!(
            audit[0].below_low_end * 20 < audit[0].members,
            "{:?}",
            audit[0]
        );
        // The 4-sets are new to it: some of their members fall below the low end.
        assert!(audit[2].below_low_end > 0, "{:?}", audit[2]);

        // The what-if: the same model with bands from runs held out at random, whose
        // workloads the folds' models saw, so narrower bands: a cap check on the low end
        // admits more pair members, and the pairs' band, lent to the 4-sets the model never
        // saw, leaves more of them below its low end.
        let what_if = audit::calibrated_on_held_out_runs(&world.coloc.0, &world.training_rows)
            .unwrap()
            .expect("a member-ridge-gbt model, 181 pairs");
        let if_on_runs =
            audit::intervals_on_truth(&what_if, &world.truth, &world.dataset.features(), 0.5)
                .unwrap();
        // The same points (only the bands differ): the same members admitted on the point.
        for (a, b) in audit.iter().zip(&if_on_runs) {
            assert_eq!(
                (a.size, a.sets, a.members, a.admitted_on_point),
                (b.size, b.sets, b.members, b.admitted_on_point)
            );
        }
        assert!(
            if_on_runs[0].admitted_on_low_end > audit[0].admitted_on_low_end,
            "{if_on_runs:?}"
        );
        assert!(
            if_on_runs[2].below_low_end > audit[2].below_low_end,
            "{if_on_runs:?}"
        );
        // The default keeps its seen band of two (this model knows every workload of the
        // pairs): more pair members admitted on the low end, still fewer than one in ten
        // below it; it has no crowded seen band (trained on pairs), so crowded sets read
        // the model's bands as before.
        let seen =
            audit::intervals_on_truth(&world.coloc.0, &world.truth, &world.dataset.features(), 0.5)
                .unwrap();
        assert!(
            seen[0].admitted_on_low_end > audit[0].admitted_on_low_end,
            "{seen:?}"
        );
        assert!(seen[0].below_low_end * 10 < seen[0].members, "{seen:?}");
        assert_eq!(seen[1..], audit[1..]);
        // --bands held-out-runs places coloc with exactly that model.
        let banded = World::load(&SimulateArgs {
            bands: "held-out-runs".into(),
            ..args.clone()
        })
        .unwrap();
        assert!(banded.coloc.0 == what_if);
        assert!(banded.coloc.0 != world.coloc.0);
        // kace-linear has no intervals to recalibrate.
        assert!(
            audit::calibrated_on_held_out_runs(&world.kace_linear.0, &world.training_rows)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_seed_gives_the_same_simulation_every_time_and_another_seed_another() {
        let args = args(120);
        let world = World::load(&args).unwrap();
        let pods = read_pods(&args.trace).unwrap()[..120].to_vec();
        let cluster = Cluster::new(gpus_for_load(&pods, args.load), 60.0, Queue::K8s);
        let jobs = assign(&pods, &world.truth, 1, 0.5);
        let other = assign(&pods, &world.truth, 2, 0.5);
        for name in POLICIES {
            let (a, _) = run_policy(&world, name, &jobs, &cluster, 1).unwrap();
            let (b, _) = run_policy(&world, name, &jobs, &cluster, 1).unwrap();
            assert_eq!(a, b, "{name}");
            assert_eq!(a.jobs.len(), 120);
            // One job per GPU ignores what a job runs; every other policy sees it.
            if name != "one-per-gpu" {
                let (c, _) = run_policy(&world, name, &other, &cluster, 2).unwrap();
                assert_ne!(a.jobs, c.jobs, "{name}");
            }
        }
    }

    #[test]
    fn passing_over_jobs_whose_inputs_were_refused_changes_no_decision() {
        // A slice of the trace with more jobs than the cluster runs at once, every policy:
        // the k8s queue with the shortcut and without it (every waiting job offered at every
        // event) give the same outcome, job by job.
        let args = args(160);
        let world = World::load(&args).unwrap();
        let pods = read_pods(&args.trace).unwrap()[..160].to_vec();
        let gpus = gpus_for_load(&pods, 2.0);
        let jobs = assign(&pods, &world.truth, 1, 0.5);
        let keyed = Cluster::new(gpus, 60.0, Queue::K8s);
        let mut plain = keyed.clone();
        plain.skip_known_refusals = false;
        for name in POLICIES {
            let (a, summary) = run_policy(&world, name, &jobs, &keyed, 1).unwrap();
            let (b, _) = run_policy(&world, name, &jobs, &plain, 1).unwrap();
            assert!(a == b, "{name}: the shortcut changed the outcome");
            // Jobs did wait: the shortcut had something to pass over.
            assert!(summary.mean_queueing_h > 0.0, "{name}");
        }
        // One job per GPU takes any job on an empty GPU and nothing else: when the head
        // waits no job fits, so both queues give the same run.
        let fifo = Cluster::new(gpus, 60.0, Queue::Fifo);
        let (a, _) = run_policy(&world, "one-per-gpu", &jobs, &keyed, 1).unwrap();
        let (b, _) = run_policy(&world, "one-per-gpu", &jobs, &fifo, 1).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn the_model_policies_train_on_runs_only_beside_the_split_that_hides_them() {
        let mut args = args(10);
        args.train_on = "pairs+runs".into();
        let refused = World::load(&args).err().expect("refused").to_string();
        assert!(refused.contains("--split-runs"), "{refused}");
        let pairs_only = World::load(&SimulateArgs {
            split_runs: true,
            train_on: "pairs".into(),
            ..args.clone()
        })
        .unwrap();
        args.split_runs = true;
        let world = World::load(&args).unwrap();
        // The 181 pairs, and with the runs about half of the 1 507 crowded sets more.
        assert_eq!(pairs_only.coloc.1.observations, 181);
        assert_eq!(pairs_only.kace_linear.1.observations, 181);
        let with_runs = world.coloc.1.observations;
        assert!((181 + 650..=181 + 860).contains(&with_runs), "{with_runs}");
        assert_eq!(world.kace_linear.1.observations, with_runs);
        // Trained on crowded runs, the default has its set-level part and crowded bands.
        match (&world.coloc.0, &pairs_only.coloc.0) {
            (ModelParams::MemberRidgeGbt(runs), ModelParams::MemberRidgeGbt(pairs)) => {
                assert!(runs.set_linear.is_some() && runs.options.time_share_crowded);
                assert!(pairs.set_linear.is_none() && !pairs.options.time_share_crowded);
            }
            other => panic!("{other:?}"),
        }
        // The default (--law-blend always): the model on pairs alone blends its crowded
        // answers too; --law-blend crowded-fits does not. Their pairs are the same.
        let always = pairs_only;
        let pairs_only = World::load(&SimulateArgs {
            split_runs: true,
            train_on: "pairs".into(),
            law_blend: "crowded-fits".into(),
            ..args.clone()
        })
        .unwrap();
        let features = always.dataset.features();
        let names: Vec<&String> = features.keys().collect();
        let set =
            |n: usize| -> Vec<&Features> { names[..n].iter().map(|k| &features[*k]).collect() };
        let (a, p) = (&always.coloc.0, &pairs_only.coloc.0);
        assert_eq!(a.predict(&[set(2)]), p.predict(&[set(2)]));
        assert_ne!(
            a.predict(&[set(4)])[0].prediction.sum,
            p.predict(&[set(4)])[0].prediction.sum
        );
        // Seen bands: the model on runs has them (--seen-bands on, the default), and its
        // crowded sets of the simulation's workloads are banded by them: narrower than
        // with --seen-bands off.
        let off = World::load(&SimulateArgs {
            seen_bands: "off".into(),
            ..args.clone()
        })
        .unwrap();
        let (ModelParams::MemberRidgeGbt(on), ModelParams::MemberRidgeGbt(without)) =
            (&world.coloc.0, &off.coloc.0)
        else {
            panic!("the default kind");
        };
        assert!(on.seen.is_some() && without.seen.is_none());
        // The model on pairs alone has a seen band of two only.
        let ModelParams::MemberRidgeGbt(pairs) = a else {
            panic!("the default kind");
        };
        let pair_bands = pairs.seen.as_ref().expect("pairs of known workloads");
        assert!(pair_bands.intervals.bands[0].is_some());
        assert!(pair_bands.intervals.bands[1..].iter().all(Option::is_none));
        let simulated: Vec<&Features> = world
            .truth
            .workloads
            .iter()
            .take(4)
            .map(|w| &features[&w.name])
            .collect();
        let width = |model: &ModelParams| {
            let predicted = model.predict(&[&simulated]).remove(0);
            let interval = model.interval(&simulated, &predicted.prediction, predicted.difficulty);
            let (low, high) = interval.unwrap().sum;
            high / low
        };
        assert_eq!(
            world.coloc.0.predict(&[&simulated]),
            off.coloc.0.predict(&[&simulated])
        );
        assert!(width(&world.coloc.0) < width(&off.coloc.0));
    }

    #[test]
    fn the_cluster_size_follows_the_offered_load() {
        let pod = |arrival: f64, lifetime: f64| Pod {
            name: format!("p{arrival}"),
            arrival,
            lifetime,
            gpu_milli: 1000,
            latency_sensitive: false,
        };
        // 4 000 s of work over a 1 000 s span: 4 GPUs at load 1, 2 at load 2.
        let pods = [pod(0.0, 2000.0), pod(1000.0, 2000.0)];
        assert_eq!(gpus_for_load(&pods, 1.0), 4);
        assert_eq!(gpus_for_load(&pods, 2.0), 2);
    }
}

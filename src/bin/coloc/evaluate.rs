//! `coloc eval kace|objectives|nway`: the evaluation protocols of `eval` run on published
//! data, their tables printed (or JSON) and, on request, predictions and a plot written.

use crate::data_sources::{require, DataSet};
use std::{collections::BTreeSet, path::PathBuf};

use anyhow::Context;

use coloc::model::{self, ModelKind};

use crate::{
    args::{EvalKaceArgs, EvalNwayArgs, EvalObjectivesArgs, NestedCandidates, NestedTrain},
    eval,
};

fn parse_model_kind(flag: &str, raw: &str) -> anyhow::Result<ModelKind> {
    ModelKind::parse(raw).with_context(|| {
        let known: Vec<&str> = ModelKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("{flag} {raw:?} is not one of {known:?}")
    })
}

/// `coloc eval nway`: every run-set file scored in turn (locally, and with `--through-api`
/// the model kinds by fresh servers), then one table (or JSON) of them all.
pub async fn nway(args: EvalNwayArgs) -> anyhow::Result<()> {
    for runs in &args.runs {
        require(runs, DataSet::KaceNway)?;
    }
    require(&args.profiles, DataSet::KaceV100)?;
    if args.json {
        coloc::progress::hide();
    }
    if args.nested {
        return nested(&args).await;
    }
    if args.nested_calibration {
        return nested_calibration(&args).await;
    }
    let (predictions_policy, policies) = nway_policies(&args)?;
    let mut writer = match &args.predictions_out {
        Some(path) => Some(eval::nway_predictions_writer(path)?),
        None => None,
    };
    let mut scores = NwayScores::default();
    let mut targets_found = BTreeSet::new();
    for (k, path) in args.runs.iter().enumerate() {
        let (data, cases, mut results, run_coverage, seen_coverage) =
            score_file(&args, k, path.clone(), policies.clone()).await?;
        if args.through_api {
            let api = eval::nway_api::evaluate(
                &data,
                &cases,
                &policies
                    .iter()
                    .filter_map(|p| match p {
                        eval::Policy::Model(kind) => Some(*kind),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                args.server_config.as_deref(),
            )
            .await?;
            results.extend(api.results);
            scores.api_trainings.extend(api.trainings);
            scores.api_servers += api.servers;
        }
        targets_found.extend(cases.iter().map(|c| c.target.clone()));
        scores.coverage_rows.extend(run_coverage);
        scores.seen_rows.extend(seen_coverage);
        if let Some(writer) = writer.as_mut() {
            eval::write_nway_predictions(writer, &data, &cases, &results, predictions_policy)?;
        }
        scores
            .rows
            .extend(eval::nway::summarize(&data, &cases, &policies, &results));
    }
    if let Some(mut writer) = writer {
        writer.flush()?;
    }
    if let Some(missing) = args.targets.iter().find(|t| !targets_found.contains(*t)) {
        anyhow::bail!("--target {missing:?} is in no run of the files");
    }
    print_nway(&args, &policies, &scores)
}

/// `coloc eval nway --nested`: each run file under decision 020's nested protocol.
async fn nested(args: &EvalNwayArgs) -> anyhow::Result<()> {
    let set = match args.nested_candidates {
        NestedCandidates::Law => eval::candidates::NestedSet::Law,
        NestedCandidates::Weighted => eval::candidates::NestedSet::Weighted,
        NestedCandidates::Stacked => eval::candidates::NestedSet::Stacked,
        NestedCandidates::Composition => eval::candidates::NestedSet::Composition,
    };
    match args.nested_train {
        NestedTrain::Runs => {
            each_run_file(args, "nested", move |data| {
                eval::nested::evaluate(data, set)
            })
            .await
        }
        NestedTrain::Pairs => {
            each_run_file(args, "nested", move |data| {
                eval::nested_pairs_trained::evaluate(data, set)
            })
            .await
        }
    }
}

/// `coloc eval nway --nested-calibration`: each run file under decision 038's protocol.
async fn nested_calibration(args: &EvalNwayArgs) -> anyhow::Result<()> {
    each_run_file(
        args,
        "nested_calibration",
        eval::nested_calibration::evaluate,
    )
    .await
}

/// Runs `evaluate` on each run file of `args` (its profiles withheld to NVML's with
/// `--nvml-only`), printing each report as it comes, or all of them as JSON under `key`.
async fn each_run_file<R>(
    args: &EvalNwayArgs,
    key: &str,
    evaluate: impl Fn(&eval::nway::NwayData) -> anyhow::Result<R> + Copy + Send + 'static,
) -> anyhow::Result<()>
where
    R: std::fmt::Display + serde::Serialize + Send + 'static,
{
    let mut reports = Vec::new();
    for path in &args.runs {
        let (path, profiles, nvml_only) = (path.clone(), args.profiles.clone(), args.nvml_only);
        let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let runs = eval::nway::read_runs(&path)?;
            let size = runs.first().map_or(0, |r| r.members.len());
            let mut data = eval::nway::NwayData::read(&format!("{size}-way"), &path, &profiles)?;
            if nvml_only {
                data.withhold_kernel_metrics();
            }
            evaluate(&data)
        })
        .await??;
        if !args.json {
            print!("{report}");
        }
        reports.push(report);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ key: reports }))?
        );
    }
    Ok(())
}

/// The policies `eval nway` scores, and the one whose predictions `--predictions-out`
/// writes: a model kind, or with --candidates one of them as `cand:NAME` (the name
/// --candidates prints), for tracing what a candidate predicts.
fn nway_policies(args: &EvalNwayArgs) -> anyhow::Result<(eval::Policy, Vec<eval::Policy>)> {
    let predictions_policy = match &args.predictions_model {
        None => eval::Policy::Model(ModelKind::DEFAULT),
        Some(raw) => match raw.strip_prefix("cand:") {
            Some(name) => {
                let i = eval::candidates::MEMBER_CANDIDATES
                    .iter()
                    .position(|(n, _)| *n == name)
                    .ok_or_else(|| {
                        anyhow::anyhow!("--predictions-model {raw:?} names no candidate")
                    })?;
                if !args.candidates {
                    anyhow::bail!("--predictions-model {raw:?} needs --candidates");
                }
                eval::Policy::Candidate(i)
            }
            None => eval::Policy::Model(parse_model_kind("--predictions-model", raw)?),
        },
    };
    let kinds: Vec<ModelKind> = if args.models.is_empty() {
        ModelKind::ALL.to_vec()
    } else {
        args.models
            .iter()
            .map(|raw| parse_model_kind("--model", raw))
            .collect::<anyhow::Result<_>>()?
    };
    if let eval::Policy::Model(kind) = predictions_policy {
        if args.predictions_out.is_some() && !kinds.contains(&kind) {
            anyhow::bail!(
                "--predictions-out writes {}, which --model leaves out",
                kind.as_str()
            );
        }
    }
    let mut policies: Vec<eval::Policy> = kinds.into_iter().map(eval::Policy::Model).collect();
    if args.candidates {
        policies.extend(eval::Policy::candidates());
    }
    policies.extend([
        eval::Policy::Random,
        eval::Policy::SmallestMemory,
        eval::Policy::LargestExclusive,
    ]);
    Ok((predictions_policy, policies))
}

/// What `eval nway` gathers over the run-set files.
#[derive(Default)]
struct NwayScores {
    rows: Vec<eval::nway::NwayRow>,
    coverage_rows: Vec<eval::nway::Coverage>,
    seen_rows: Vec<eval::nway::SeenCoverage>,
    api_trainings: Vec<eval::nway_api::ApiTraining>,
    api_servers: usize,
}

/// What one run-set file gives: its data and cases, the results of the policies scored
/// locally, and the interval coverage of its runs and by seen bands.
type FileScores = (
    eval::nway::NwayData,
    Vec<eval::nway::NwayCase>,
    Vec<eval::nway::NwayResult>,
    Vec<eval::nway::Coverage>,
    Vec<eval::nway::SeenCoverage>,
);

/// One run-set file (the `k`-th) read and scored off the async threads: its data, cases
/// (`--target` kept), the local policies' results, and with `--coverage` the interval
/// coverage (the pairs' only with the first file: they are the same for every file).
async fn score_file(
    args: &EvalNwayArgs,
    k: usize,
    path: PathBuf,
    run_policies: Vec<eval::Policy>,
) -> anyhow::Result<FileScores> {
    let profiles = args.profiles.clone();
    let (with_coverage, with_calibrations) = (args.coverage, args.calibrations);
    let through_api = args.through_api;
    let targets = args.targets.clone();
    let nvml_only = args.nvml_only;
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let runs = eval::nway::read_runs(&path)?;
        let size = runs.first().map_or(0, |r| r.members.len());
        let mut data = eval::nway::NwayData::read(&format!("{size}-way"), &path, &profiles)?;
        if nvml_only {
            data.withhold_kernel_metrics();
        }
        let mut cases = data.cases();
        if !targets.is_empty() {
            cases.retain(|c| targets.contains(&c.target));
        }
        // Through the API only the baselines are scored here; the model kinds are
        // judged by the servers below.
        let local_policies: Vec<eval::Policy> = run_policies
            .iter()
            .copied()
            .filter(|p| !(through_api && matches!(p, eval::Policy::Model(_))))
            .collect();
        let results = eval::nway::evaluate(&data, &cases, &local_policies)?;
        let mut run_coverage = Vec::new();
        let mut seen_coverage = Vec::new();
        if with_coverage {
            // The chosen calibration, or with --calibrations every one compared.
            let calibrations: &[(&str, model::intervals::Calibration)] = if with_calibrations {
                &eval::candidates::CALIBRATION_CANDIDATES
            } else {
                &[("chosen", model::intervals::Calibration::at(data.level))]
            };
            // The pairs are the same for every file: measured once.
            if k == 0 {
                run_coverage.extend(eval::nway::pair_coverage(&data, calibrations)?);
            }
            run_coverage.extend(eval::nway::coverage(&data, &cases, calibrations)?);
            seen_coverage.extend(eval::nway::seen_coverage(&data, k == 0)?);
        }
        Ok((data, cases, results, run_coverage, seen_coverage))
    })
    .await?
}

/// The `eval nway` table (or JSON) of every file's rows and coverage.
fn print_nway(
    args: &EvalNwayArgs,
    policies: &[eval::Policy],
    scores: &NwayScores,
) -> anyhow::Result<()> {
    let NwayScores {
        rows,
        coverage_rows,
        seen_rows,
        api_trainings,
        api_servers,
    } = scores;
    if args.json {
        let mut summary = serde_json::json!({
            "rows": rows,
            "coverage": coverage_rows,
            "seen_coverage": seen_rows,
        });
        if args.through_api {
            summary["api"] =
                serde_json::json!({ "servers": api_servers, "trainings": api_trainings });
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eval::print_nway_table(rows, policies, &mut std::io::stdout().lock())?;
        if args.through_api {
            print_api_trainings(*api_servers, api_trainings);
        }
        for c in coverage_rows {
            println!("80 % interval coverage, {c}");
        }
        for row in seen_rows {
            println!(
                "80 % interval coverage, {}; {} of the sets by seen bands",
                row.coverage, row.by_seen_bands
            );
        }
    }
    Ok(())
}

/// What the servers of `eval nway --through-api` decided, per model kind: how many
/// challengers the champion comparison rejected (pinned to answer anyway) and how many runs
/// were left out as outliers.
fn print_api_trainings(servers: usize, trainings: &[eval::nway_api::ApiTraining]) {
    println!(
        "through the API: {servers} servers, one per case; each kind's version pinned to answer"
    );
    let kinds: std::collections::BTreeSet<&str> = trainings.iter().map(|t| t.kind).collect();
    for kind in kinds {
        let of_kind: Vec<_> = trainings.iter().filter(|t| t.kind == kind).collect();
        let rejected = of_kind.iter().filter(|t| !t.promoted).count();
        let with_outliers = of_kind.iter().filter(|t| t.excluded_outliers > 0).count();
        let outliers: u64 = of_kind.iter().map(|t| t.excluded_outliers).sum();
        let reported: usize = of_kind.iter().map(|t| t.reported).sum();
        let fitted: u64 = of_kind.iter().map(|t| t.observations).sum();
        println!(
            "  {kind}: {} trainings, {rejected} rejected by the champion comparison; \
             {reported} runs reported, {fitted} fitted, {outliers} left out as outliers \
             (in {with_outliers} trainings)",
            of_kind.len()
        );
    }
}

/// `coloc eval kace`.
pub async fn kace(args: EvalKaceArgs) -> anyhow::Result<()> {
    require(&args.dir, DataSet::KaceV100)?;
    if args.json {
        coloc::progress::hide();
    }
    let predictions_kind = match &args.predictions_model {
        None => ModelKind::DEFAULT,
        Some(raw) => parse_model_kind("--predictions-model", raw)?,
    };
    let mut policies: Vec<eval::Policy> = vec![eval::Policy::Model(ModelKind::DEFAULT)];
    policies.extend(
        ModelKind::ALL
            .into_iter()
            .filter(|k| *k != ModelKind::DEFAULT)
            .map(eval::Policy::Model),
    );
    if args.candidates {
        policies.extend(eval::Policy::candidates());
    }
    policies.extend([
        eval::Policy::Random,
        eval::Policy::SmallestMemory,
        eval::Policy::LargestExclusive,
    ]);
    let dir = args.dir.clone();
    let (with_coverage, nvml_only) = (args.coverage, args.nvml_only);
    if args.nested {
        let dir = args.dir.clone();
        let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut data = eval::EvalData::read(&dir)?;
            if nvml_only {
                data.withhold_kernel_metrics();
            }
            eval::nested_pairs::evaluate(&data)
        })
        .await??;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{report}");
        }
        return Ok(());
    }
    let (data, results, summary) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut data = eval::EvalData::read(&dir)?;
        if nvml_only {
            data.withhold_kernel_metrics();
        }
        let results = eval::evaluate(&data, &policies)?;
        let mut summary = eval::summarize(&data, &policies, &results);
        if with_coverage {
            summary.coverage = eval::pair_protocol_coverage(&data)?;
        }
        Ok((data, results, summary))
    })
    .await??;
    if let Some(path) = &args.predictions_out {
        eval::write_predictions(path, &data, &results, eval::Policy::Model(predictions_kind))?;
    }
    if let Some(path) = &args.plot {
        let models: Vec<eval::Policy> = ModelKind::ALL
            .into_iter()
            .map(eval::Policy::Model)
            .collect();
        eval::draw(path, &data, &summary, &results, &models)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eval::print_table(&summary, &mut std::io::stdout().lock())?;
        for c in &summary.coverage {
            println!("80 % interval coverage, {c}");
        }
    }
    Ok(())
}

/// `coloc eval objectives`.
pub async fn objectives(args: EvalObjectivesArgs) -> anyhow::Result<()> {
    require(&args.dir, DataSet::KaceV100)?;
    if args.json {
        coloc::progress::hide();
    }
    let kind = match &args.kind {
        None => ModelKind::DEFAULT,
        Some(raw) => ModelKind::parse(raw).with_context(|| {
            let known: Vec<&str> = ModelKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("--kind {raw:?} is not one of {known:?}")
        })?,
    };
    let dir = args.dir.clone();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let data = eval::EvalData::read(&dir)?;
        eval::evaluate_objectives(&dir, &data, kind)
    })
    .await??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eval::print_objectives(&report, &mut std::io::stdout().lock())?;
    }
    Ok(())
}

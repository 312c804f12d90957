//! `coloc eval kace` and `coloc eval nway` on the published data, and independent
//! re-scorings of the predictions they write: the figures must be checkable without
//! trusting coloc's scorer.

use std::{
    collections::{BTreeMap, HashMap},
    process::Command,
};

use crate::helpers::kace_dir;

/// The paper's protocol, written again from its description in the data README.
fn rescore(predictions: &str, pairs_csv: &str) -> BTreeMap<(String, String), Vec<f64>> {
    let mut actual: HashMap<(String, String), f64> = HashMap::new();
    let mut reader = csv::Reader::from_path(pairs_csv).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (w1, w2, t1, t2) = (
        col("workload1"),
        col("workload2"),
        col("w1throughput"),
        col("w2throughput"),
    );
    for record in reader.records() {
        let r = record.unwrap();
        let sum = r[t1].parse::<f64>().unwrap() + r[t2].parse::<f64>().unwrap();
        actual.insert((r[w1].to_string(), r[w2].to_string()), sum);
    }

    // case (protocol, n_occur, seed, holdout) -> target -> [(predicted, partner, actual)]
    type Case = (String, String, String, String);
    type Candidates = Vec<(f64, String, f64)>;
    let mut cases: BTreeMap<Case, BTreeMap<String, Candidates>> = BTreeMap::new();
    let mut reader = csv::Reader::from_path(predictions).unwrap();
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        [
            "protocol",
            "n_occur",
            "seed",
            "holdout",
            "workload1",
            "workload2",
            "predicted_sum"
        ]
    );
    for record in reader.records() {
        let r = record.unwrap();
        let case = (
            r[0].to_string(),
            r[1].to_string(),
            r[2].to_string(),
            r[3].to_string(),
        );
        let (a, b) = (r[4].to_string(), r[5].to_string());
        let predicted: f64 = r[6].parse().unwrap();
        let sum = actual[&(a.clone(), b.clone())];
        let targets = cases.entry(case).or_default();
        targets
            .entry(a.clone())
            .or_default()
            .push((predicted, b.clone(), sum));
        if a != b {
            targets.entry(b).or_default().push((predicted, a, sum));
        }
    }

    // (protocol, n_occur) -> per-case means
    let mut means: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for ((protocol, n_occur, _seed, holdout), targets) in cases {
        let scores: Vec<f64> = targets
            .iter()
            .filter(|(t, _)| holdout.is_empty() || **t == holdout)
            .map(|(_, candidates)| {
                let oracle = candidates.iter().map(|c| c.2).fold(f64::MIN, f64::max);
                let mut best = &candidates[0];
                for c in candidates {
                    if c.0 > best.0 || (c.0 == best.0 && c.1 < best.1) {
                        best = c;
                    }
                }
                best.2 / oracle
            })
            .collect();
        means
            .entry((protocol, n_occur))
            .or_default()
            .push(scores.iter().sum::<f64>() / scores.len() as f64);
    }
    means
}

#[test]
fn eval_reproduces_the_kace_baseline_and_its_predictions_rescore_to_the_same_figures() {
    let dir = tempfile::TempDir::new().unwrap();
    let predictions = dir.path().join("predictions.csv");
    let plot = dir.path().join("eval.png");
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["eval", "kace"])
        .arg(kace_dir())
        .arg("--json")
        .arg("--predictions-out")
        .arg(&predictions)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let row = |label: &str| {
        summary["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["row"] == label)
            .unwrap_or_else(|| panic!("no row {label}"))["scores"]
            .clone()
    };

    // The KACE linear baseline reproduces the paper (0.906) within 0.01 at n_occur=2.
    let kace_2 = row("n_occur=2")["kace-linear"].as_f64().unwrap();
    assert!((kace_2 - 0.906).abs() <= 0.01, "{kace_2}");
    // The default model meets the targets coloc promises (docs/model.md, "Model quality").
    let default = "member-ridge-gbt";
    let targets = [("n_occur=2", 0.93), ("mean", 0.97), ("unseen", 0.975)];
    for (label, target) in targets {
        let score = row(label)[default].as_f64().unwrap();
        assert!(score >= target, "{label}: {score} < {target}");
        assert!(
            score > row(label)["kace-linear"].as_f64().unwrap(),
            "{label}: no better than KACE"
        );
    }
    // Random picks score far lower (the paper: 54 %).
    let random_2 = row("n_occur=2")["random"].as_f64().unwrap();
    assert!((0.45..0.65).contains(&random_2), "{random_2}");

    // An independent scorer gets the same figures from the predictions file.
    let pairs_csv = kace_dir().join("pairs.csv");
    let rescored = rescore(predictions.to_str().unwrap(), pairs_csv.to_str().unwrap());
    let mut split_means = Vec::new();
    for n in 2..=10 {
        let cases = &rescored[&("split".to_string(), n.to_string())];
        assert_eq!(cases.len(), 5, "five seeds per n_occur");
        let mean = cases.iter().sum::<f64>() / 5.0;
        let reported = row(&format!("n_occur={n}"))[default].as_f64().unwrap();
        assert!(
            (mean - reported).abs() < 1e-12,
            "n_occur={n}: {mean} vs {reported}"
        );
        split_means.extend(cases);
    }
    let mean = split_means.iter().sum::<f64>() / split_means.len() as f64;
    assert!((mean - row("mean")[default].as_f64().unwrap()).abs() < 1e-12);
    let unseen = &rescored[&("unseen".to_string(), String::new())];
    assert_eq!(unseen.len(), 21, "one case per workload");
    let unseen_mean = unseen.iter().sum::<f64>() / unseen.len() as f64;
    assert!((unseen_mean - row("unseen")[default].as_f64().unwrap()).abs() < 1e-12);

    // The sums' MAPE, recomputed from the predictions file: |predicted - actual| / actual.
    for (protocol, label) in [("split", "n_occur=2"), ("unseen", "unseen")] {
        let errors = sum_errors(&predictions, &pairs_csv, protocol, "2");
        let mean = 100.0 * errors.iter().sum::<f64>() / errors.len() as f64;
        let rows = summary["rows"].as_array().unwrap();
        let reported = &rows.iter().find(|r| r["row"] == label).unwrap()["mape"][default];
        assert_eq!(reported["sums"].as_u64().unwrap() as usize, errors.len());
        let sum_mean = reported["sum_mean"].as_f64().unwrap();
        assert!(
            (mean - sum_mean).abs() < 1e-9,
            "{label}: {mean} vs {sum_mean}"
        );
    }

    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// Each written prediction's |predicted - actual| / actual of the set's sum, for the rows of
/// `protocol` (splits: only n_occur `n_occur`).
fn sum_errors(
    predictions: &std::path::Path,
    pairs_csv: &std::path::Path,
    protocol: &str,
    n_occur: &str,
) -> Vec<f64> {
    let mut actual: HashMap<(String, String), f64> = HashMap::new();
    let mut reader = csv::Reader::from_path(pairs_csv).unwrap();
    for record in reader.deserialize::<HashMap<String, String>>() {
        let r = record.unwrap();
        let sum =
            r["w1throughput"].parse::<f64>().unwrap() + r["w2throughput"].parse::<f64>().unwrap();
        actual.insert((r["workload1"].clone(), r["workload2"].clone()), sum);
    }
    let mut reader = csv::Reader::from_path(predictions).unwrap();
    reader
        .records()
        .map(Result::unwrap)
        .filter(|r| &r[0] == protocol && (protocol != "split" || &r[1] == n_occur))
        .map(|r| {
            let sum = actual[&(r[4].to_string(), r[5].to_string())];
            (r[6].parse::<f64>().unwrap() - sum).abs() / sum
        })
        .collect()
}

fn kace_runs(set: &str) -> std::path::PathBuf {
    kace_dir().join(format!("../{set}/runs.csv"))
}

/// The artifact's N-way protocol re-scored from its description in the 4-way README: per
/// (set, scope, training, target), the candidate with the highest predicted sum (ties: the
/// lower run id) against the best actual sum; means per (set, scope, training).
fn rescore_nway(predictions: &std::path::Path) -> BTreeMap<(String, String, String), f64> {
    // set -> run id -> (members, actual sum, in the recorded subset)
    type Runs = HashMap<String, (Vec<String>, f64, bool)>;
    let mut runs: HashMap<String, Runs> = HashMap::new();
    for set in ["3-way", "4-way"] {
        let dir = if set == "3-way" {
            "kace-3way"
        } else {
            "kace-4way"
        };
        let mut reader = csv::Reader::from_path(kace_runs(dir)).unwrap();
        let headers = reader.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name);
        let n = if set == "3-way" { 3 } else { 4 };
        let table = runs.entry(set.to_string()).or_default();
        for record in reader.records() {
            let r = record.unwrap();
            let members: Vec<String> = (1..=n)
                .map(|k| r[col(&format!("workload{k}")).unwrap()].to_string())
                .collect();
            let sum: f64 = (1..=n)
                .map(|k| {
                    r[col(&format!("w{k}throughput")).unwrap()]
                        .parse::<f64>()
                        .unwrap()
                })
                .sum();
            let subset = col("in_recorded_eval_subset").is_some_and(|c| &r[c] == "1");
            table.insert(
                r[col("run_id").unwrap()].to_string(),
                (members, sum, subset),
            );
        }
    }
    type Group = (String, String, String, String);
    let mut groups: BTreeMap<Group, Vec<(f64, u64, f64)>> = BTreeMap::new();
    let mut reader = csv::Reader::from_path(predictions).unwrap();
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        [
            "set",
            "scope",
            "training",
            "target",
            "run_id",
            "predicted_sum"
        ]
    );
    for record in reader.records() {
        let r = record.unwrap();
        let (members, sum, subset) = &runs[&r[0]][&r[4]];
        assert!(
            members.contains(&r[3].to_string()),
            "a candidate holds its target"
        );
        assert!(
            &r[1] == "all" || *subset,
            "subset candidates are flagged runs"
        );
        groups
            .entry((r[0].into(), r[1].into(), r[2].into(), r[3].into()))
            .or_default()
            .push((r[5].parse().unwrap(), r[4].parse().unwrap(), *sum));
    }
    let mut scores: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for ((set, scope, training, target), candidates) in groups {
        // Every run of the scope that holds the target is a candidate.
        let expected = runs[&set]
            .values()
            .filter(|(m, _, s)| m.contains(&target) && (scope == "all" || *s))
            .count();
        assert_eq!(candidates.len(), expected, "{set} {scope} {target}");
        let oracle = candidates.iter().map(|c| c.2).fold(f64::MIN, f64::max);
        let mut best = candidates[0];
        for c in &candidates {
            if c.0 > best.0 || (c.0 == best.0 && c.1 < best.1) {
                best = *c;
            }
        }
        scores
            .entry((set, scope, training))
            .or_default()
            .push(best.2 / oracle);
    }
    scores
        .into_iter()
        .map(|(k, v)| (k, v.iter().sum::<f64>() / v.len() as f64))
        .collect()
}

fn eval_nway(args: &[&str], runs: &[&str], predictions: &std::path::Path) -> serde_json::Value {
    let predictions = predictions.to_str().unwrap();
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--predictions-out", predictions])
        .collect();
    eval_nway_json(&args, runs)
}

/// `coloc eval nway RUNS... --profiles kace-v100 ARGS --json`, which must succeed.
fn eval_nway_json(args: &[&str], runs: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["eval", "nway"])
        .args(runs.iter().map(|r| kace_runs(r)))
        .arg("--profiles")
        .arg(kace_dir())
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn nway_row<'a>(
    summary: &'a serde_json::Value,
    set: &str,
    scope: &str,
    training: &str,
) -> &'a serde_json::Value {
    summary["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["set"] == set && r["scope"] == scope && r["training"] == training)
        .unwrap_or_else(|| panic!("no row {set} {scope} {training}"))
}

#[test]
fn eval_nway_reproduces_the_artifacts_kace_figures_and_its_predictions_rescore_to_them() {
    let dir = tempfile::TempDir::new().unwrap();
    let predictions = dir.path().join("nway.csv");
    let summary = eval_nway(
        &[
            "--model",
            "kace-linear",
            "--predictions-model",
            "kace-linear",
        ],
        &["kace-4way", "kace-3way"],
        &predictions,
    );
    // The artifact: KACE LR 0.914 on the 505 scored 4-way runs (0.9148 here: one of the
    // artifact's 506 runs is not in the published file), 0.958 on 3-way; random 0.404.
    let mean = |set, scope, training, policy: &str| {
        nway_row(&summary, set, scope, training)["mean"][policy]
            .as_f64()
            .unwrap()
    };
    let kace_4 = mean("4-way", "subset", "runs", "kace-linear");
    assert!((kace_4 - 0.914).abs() < 0.002, "{kace_4}");
    let kace_3 = mean("3-way", "all", "runs", "kace-linear");
    assert!((kace_3 - 0.958).abs() < 0.001, "{kace_3}");
    let random_4 = mean("4-way", "subset", "runs", "random");
    assert!((random_4 - 0.404).abs() < 0.002, "{random_4}");
    let rescored = rescore_nway(&predictions);
    assert_eq!(rescored.len(), 6, "{rescored:?}");
    for ((set, scope, training), value) in &rescored {
        let reported = mean(set, scope, training, "kace-linear");
        assert!(
            (value - reported).abs() < 1e-12,
            "{set} {scope} {training}: {value} vs {reported}"
        );
    }
}

#[test]
fn eval_nway_scores_the_default_model_and_an_independent_scorer_agrees() {
    let dir = tempfile::TempDir::new().unwrap();
    let predictions = dir.path().join("nway.csv");
    let summary = eval_nway(&[], &["kace-4way", "kace-3way"], &predictions);
    let rescored = rescore_nway(&predictions);
    assert_eq!(rescored.len(), 6, "{rescored:?}");
    for ((set, scope, training), value) in &rescored {
        let row = nway_row(&summary, set, scope, training);
        let reported = row["mean"]["member-ridge-gbt"].as_f64().unwrap();
        assert!((value - reported).abs() < 1e-12, "{value} vs {reported}");
        // Far above a random pick on every protocol.
        assert!(reported > row["mean"]["random"].as_f64().unwrap() + 0.3);
        // The N-way issue's targets, which README's figures meet on every row: 4-way >= 0.95
        // (0.9942 and 0.9912 on runs alone and with pairs + runs), 3-way >=
        // 0.97 (0.9784 both).
        let floor = if set == "4-way" { 0.95 } else { 0.97 };
        assert!(
            reported >= floor,
            "{set} {scope} {training}: {reported} < {floor}"
        );
        // The worst 4-way target >= 0.80 on every row (README: 0.940, whisper-large-v2 b8
        // inference; 0.754 on the 505 runs with runs alone before the law blend).
        if set == "4-way" {
            let worst = row["worst"]["member-ridge-gbt"].as_f64().unwrap();
            assert!(
                worst >= 0.80,
                "{set} {scope} {training}: worst target {worst}"
            );
        }
        // Never below kace-linear, the paper's model, on any target of any row.
        let per_target = &row["per_target"];
        for (target, score) in per_target["member-ridge-gbt"].as_object().unwrap() {
            let kace = per_target["kace-linear"][target].as_f64().unwrap();
            assert!(
                score.as_f64().unwrap() >= kace,
                "{set} {scope} {training} {target}: {score} < kace-linear's {kace}"
            );
        }
    }
}

/// The 80 % intervals `Train` calibrates cover 75-85 % of held-out runs: members and sums,
/// pairs (unseen workload) and 4-way runs (unseen family, every target), the N-way issue's
/// line; and 70-90 % of the members on 3-way runs too (issue 38's line, every protocol:
/// the pair protocols are `eval_kace_coverage_...`). Counts as `--coverage` prints them;
/// the bounds are the issues'.
#[test]
fn eval_nway_coverage_of_the_chosen_intervals_lies_within_75_to_85_percent() {
    let summary = nway_coverage_within_70_to_90(&[]);
    // A row of `key`'s list, named by its protocol, with at least `at_least` members and
    // sums, each 75-85 % inside.
    let within = |key: &str, protocol: &str, at_least: f64| {
        let rows = summary[key].as_array().unwrap();
        let row = rows
            .iter()
            .find(|r| r["protocol"] == protocol)
            .unwrap_or_else(|| panic!("no {key} row {protocol:?}: {rows:?}"));
        for (inside, of) in [("members_inside", "members"), ("sums_inside", "sums")] {
            let (inside, of) = (row[inside].as_f64().unwrap(), row[of].as_f64().unwrap());
            assert!(of >= at_least, "{protocol}: {row}");
            let share = inside / of;
            assert!(
                (0.75..=0.85).contains(&share),
                "{protocol}: {share:.3} inside ({row})"
            );
        }
        row.clone()
    };
    for protocol in ["pairs, unseen workload", "4-way all, runs, unseen family"] {
        within("coverage", protocol, 300.0);
    }
    // Sets of known workloads: runs held out at random from a model fitted as Train fits
    // it, answered by its seen bands (docs/nway.md, "Seen bands").
    let row = within(
        "seen_coverage",
        "4-way all, runs held out at random, seen workloads",
        1000.0,
    );
    assert_eq!(row["by_seen_bands"], row["sums"], "{row}");
}

/// The same line for the NVML-only twin on crowded sets: with every kernel metric withheld
/// (`--nvml-only`, fitted and calibrated as `Train` fits the twin), 70-90 % of the 4-way
/// and 3-way members held out by family lie inside their 80 % interval. Candidate 6 held
/// 0.695 / 0.710; decision 040's nested rule chose the twin's own calibration.
#[test]
fn eval_nway_coverage_of_the_nvml_only_twin_lies_within_70_to_90_percent() {
    nway_coverage_within_70_to_90(&["--nvml-only"]);
}

/// `eval nway --coverage` of the default model on both run files, with `extra`: the members
/// of pairs (unseen workload), 4-way and 3-way runs (unseen family) 70-90 % inside. The
/// summary, for more checks.
fn nway_coverage_within_70_to_90(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::TempDir::new().unwrap();
    let args: Vec<&str> = ["--coverage", "--model", "member-ridge-gbt"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let summary = eval_nway(
        &args,
        &["kace-4way", "kace-3way"],
        &dir.path().join("nway.csv"),
    );
    for protocol in [
        "pairs, unseen workload",
        "4-way all, runs, unseen family",
        "3-way all, runs, unseen family",
    ] {
        member_coverage_within_70_to_90(&summary, protocol, 300.0);
    }
    summary
}

/// The row of `summary["coverage"]` named `protocol`: at least `at_least` members, and
/// 70-90 % of them inside their 80 % interval (issue 38).
fn member_coverage_within_70_to_90(summary: &serde_json::Value, protocol: &str, at_least: f64) {
    let rows = summary["coverage"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["protocol"] == protocol)
        .unwrap_or_else(|| panic!("no coverage row {protocol:?}: {rows:?}"));
    let (inside, of) = (
        row["members_inside"].as_f64().unwrap(),
        row["members"].as_f64().unwrap(),
    );
    assert!(of >= at_least, "{protocol}: {row}");
    let share = inside / of;
    assert!(
        (0.70..=0.90).contains(&share),
        "{protocol}: {share:.3} of members inside ({row})"
    );
}

/// Every pair protocol of `eval kace --coverage` (the paper's splits at n_occur=2, unseen
/// workload, unseen family): the default model's 80 % intervals, calibrated on each case's
/// training alone, hold 70-90 % of the held-out members (issue 38).
#[test]
fn eval_kace_coverage_of_the_chosen_intervals_lies_within_70_to_90_percent() {
    kace_coverage_within_70_to_90(&[]);
}

/// The same for the NVML-only twin: with every kernel metric withheld (`--nvml-only`, what
/// the twin is fitted and calibrated on), its 80 % intervals, calibrated on each case's
/// training alone, hold 70-90 % of the held-out members on every pair protocol.
#[test]
fn eval_kace_coverage_of_the_nvml_only_twin_lies_within_70_to_90_percent() {
    kace_coverage_within_70_to_90(&["--nvml-only"]);
}

/// `eval kace --coverage` with `extra`: every pair protocol's members 70-90 % inside.
fn kace_coverage_within_70_to_90(extra: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["eval", "kace"])
        .arg(kace_dir())
        .args(["--coverage", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for (protocol, at_least) in [
        ("pairs, n_occur=2 splits", 1000.0),
        ("pairs, unseen workload", 600.0),
        ("pairs, unseen family", 600.0),
    ] {
        member_coverage_within_70_to_90(&summary, protocol, at_least);
    }
}

/// `--predictions-model cand:NAME` writes a candidate's predictions (for tracing what one
/// predicts), only beside `--candidates`; a name that is no candidate is refused.
#[test]
fn eval_nway_writes_a_candidate_s_predictions_when_asked_by_name() {
    let dir = tempfile::TempDir::new().unwrap();
    let run = |extra: &[&str], out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_coloc"))
            .args(["eval", "nway"])
            .arg(kace_runs("kace-3way"))
            .arg("--profiles")
            .arg(kace_dir())
            .args([
                "--target",
                "vit_h_14_batch8-train",
                "--json",
                "--predictions-out",
            ])
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    let default_csv = dir.path().join("default.csv");
    let plain_csv = dir.path().join("plain.csv");
    assert!(run(&["--candidates"], &default_csv).status.success());
    let output = run(
        &["--candidates", "--predictions-model", "cand:plain"],
        &plain_csv,
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (default, plain) = (nway_predictions(&default_csv), nway_predictions(&plain_csv));
    // The same cases and runs, other predictions: the plain candidate has neither the
    // crowding features, the time-share law nor the set-level model.
    assert_eq!(
        default.keys().collect::<Vec<_>>(),
        plain.keys().collect::<Vec<_>>()
    );
    assert!(!default.is_empty());
    assert!(default.iter().any(|(k, v)| plain[k] != *v));
    for (extra, why) in [
        (
            &["--predictions-model", "cand:plain"][..],
            "needs --candidates",
        ),
        (
            &["--candidates", "--predictions-model", "cand:nothing"][..],
            "names no candidate",
        ),
    ] {
        let output = run(extra, &dir.path().join("refused.csv"));
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(why), "{stderr}");
    }
}

/// `coloc eval objectives`: the figures README gives for choosing Rank's default objective.
#[test]
fn eval_objectives_default_picks_rest_on_no_member_predicted_above_its_exclusive_throughput() {
    let objectives = |dir: &std::path::Path| -> serde_json::Value {
        let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
            .args(["eval", "objectives"])
            .arg(dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let h100 = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/h100");
    for (dir, targets, suspect) in [
        (kace_dir(), 21, "wav2vec2-base-960h_batch2-inf"),
        (h100, 6, "gpt-decoder_batch4-inf"),
    ] {
        let report = objectives(&dir);
        assert_eq!(report["kind"], "member-ridge-gbt");
        assert!(
            report["suspect_profiles"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.as_str().unwrap().starts_with(suspect)),
            "{report}"
        );
        let (name, default) = (&report["policies"][0][0], &report["policies"][0][1]);
        assert!(name.as_str().unwrap().starts_with("default"), "{name}");
        assert_eq!(default["targets"], targets);
        // No default pick rests on a member predicted above its exclusive throughput
        // beyond the noise margin.
        assert_eq!(default["above_exclusive"], 0, "{report}");
        assert!(
            default["mean_normalized_sum"].as_f64().unwrap()
                <= default["oracle_normalized_sum"].as_f64().unwrap(),
            "{report}"
        );
        if targets == 21 {
            // On the V100 data no default pick is a measured loss or leaves its target below
            // half its speed where a measured pair of it is neither.
            assert_eq!(default["avoidable"], 0, "{report}");
            // With the target held out every pair gets one band, so the cautious order
            // differs from the point order only through the low ends an overshoot widens
            // (docs/decisions/025-cautious-low-ends.md): fewer picks of
            // partners no run ever measured than on the point predictions.
            let point = &report["policies"][1][1];
            assert!(report["policies"][1][0]
                .as_str()
                .unwrap()
                .contains("fair-share, point"));
            assert!(
                default["never_measured"].as_u64().unwrap()
                    < point["never_measured"].as_u64().unwrap(),
                "{report}"
            );
        }
    }
}

/// Every prediction of an N-way predictions file, by (set, scope, training, target, run id).
fn nway_predictions(path: &std::path::Path) -> BTreeMap<[String; 5], f64> {
    let mut reader = csv::Reader::from_path(path).unwrap();
    reader
        .records()
        .map(|record| {
            let r = record.unwrap();
            (
                [0, 1, 2, 3, 4].map(|k| r[k].to_string()),
                r[5].parse().unwrap(),
            )
        })
        .collect()
}

/// `coloc eval nway --through-api`: a fresh real server per case, the profiles registered,
/// the training runs reported, Train, PinModel and Predict over the generated client. For
/// one target of the 4-way and 3-way files (both scopes, runs and pairs + runs), the API predicts
/// what the in-process fit predicts, and the independent re-scorer gets the figures both
/// print. kace-linear is trained second, as a challenger of the default: whatever the
/// verdict, its own version must answer, and its scores must be the in-process ones.
#[test]
fn eval_nway_through_the_api_predicts_what_the_in_process_fit_predicts() {
    let dir = tempfile::TempDir::new().unwrap();
    // One target, in both files: four 4-way cases (2 scopes x 2 trainings), two 3-way.
    let args = ["--target", "vit_h_14_batch8-train"];
    let sets = ["kace-4way", "kace-3way"];
    let in_process_csv = dir.path().join("in-process.csv");
    let api_csv = dir.path().join("api.csv");
    let in_process = eval_nway(&args, &sets, &in_process_csv);
    let api = eval_nway(&[&args[..], &["--through-api"]].concat(), &sets, &api_csv);

    let expected = nway_predictions(&in_process_csv);
    let answered = nway_predictions(&api_csv);
    // 4-way: 2 scopes x 2 trainings x at most 110 candidates; 3-way: 2 trainings x 48.
    assert!(expected.len() > 2 * 48, "{}", expected.len());
    assert_eq!(
        answered.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the same candidates"
    );
    // The API answers the one prediction: each member bounded by its exclusive throughput
    // (the lowest over the set's subsets), so never above the model's own figure, and equal
    // to it wherever the bound does not bind (162 of these 404 when this was written).
    let mut equal = 0;
    for (key, want) in &expected {
        let got = answered[key];
        let tolerance = 1e-9 * want.abs().max(1.0);
        assert!(
            got <= want + tolerance,
            "{key:?}: the API predicted {got}, in-process {want}"
        );
        equal += usize::from((got - want).abs() <= tolerance);
    }
    assert!(equal > 0, "{equal} of {} equal", expected.len());

    let rescored = rescore_nway(&api_csv);
    assert_eq!(rescored.len(), 6, "{rescored:?}");
    for ((set, scope, training), value) in &rescored {
        for summary in [&api, &in_process] {
            let row = nway_row(summary, set, scope, training);
            let reported = row["mean"]["member-ridge-gbt"].as_f64().unwrap();
            assert!(
                (value - reported).abs() < 1e-12,
                "{set} {scope} {training}: re-scored {value}, printed {reported}"
            );
        }
        // kace-linear, target by target.
        let targets =
            |summary| nway_row(summary, set, scope, training)["per_target"]["kace-linear"].clone();
        assert_eq!(
            targets(&api),
            targets(&in_process),
            "{set} {scope} {training}"
        );
    }

    // One server per case, each kind fitted on every run reported to it.
    assert_eq!(api["api"]["servers"], 6);
    let trainings = api["api"]["trainings"].as_array().unwrap();
    assert_eq!(trainings.len(), 12, "two kinds per case");
    for t in trainings {
        assert_eq!(t["observations"], t["reported"], "{t}");
    }
}

/// Decision 041's protocol end to end: models fitted on the KACE pairs alone, judged on
/// the 3-way runs of families the outer training never saw, choosing inside it. Every
/// outer target is reported with what its inner folds chose, and crowded members composed
/// halfway from the model's own pair answers (the served w) pick crowded sets better on
/// the outer folds than the trees alone (0.948 against 0.902 when measured).
#[test]
fn eval_nway_nested_on_pairs_reports_every_outer_target_and_composition_picks_better() {
    let summary = eval_nway_json(
        &[
            "--nested",
            "--nested-candidates",
            "composition",
            "--nested-train",
            "pairs",
        ],
        &["kace-3way"],
    );
    let report = &summary["nested"][0];
    assert_eq!(report["training"], "pairs", "{report}");
    let names = ["composition 0 %", "composition 50 %", "composition 100 %"];
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 14, "{report}");
    for t in targets {
        assert!(names.iter().any(|n| t["chosen"] == *n), "{t}");
        assert_eq!(t["inner"].as_array().unwrap().len(), 3, "{t}");
    }
    let fixed = |name: &str| report["fixed_mean"][name].as_f64().unwrap();
    assert!(
        fixed("composition 50 %") >= fixed("composition 0 %") + 0.02,
        "{}",
        report["fixed_mean"]
    );
    assert!(
        names.iter().any(|n| report["served_choice"] == *n),
        "{report}"
    );
}

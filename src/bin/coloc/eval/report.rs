//! The evaluation's outputs: the table, and the predictions file an independent scorer can
//! check.

use std::{io::Write, path::Path};

use anyhow::Context;

use super::{
    nway::{NwayCase, NwayData, NwayResult, NwayRow},
    CaseResult, EvalData, Policy, Summary,
};

/// Prints the summary as an aligned text table.
pub fn print_table(summary: &Summary, out: &mut impl Write) -> std::io::Result<()> {
    let label_width = summary
        .rows
        .iter()
        .map(|r| r.row.len())
        .max()
        .unwrap_or(0)
        .max(6);
    write!(out, "{:label_width$}", "")?;
    for name in &summary.policies {
        write!(out, "  {name:>17}")?;
    }
    writeln!(out)?;
    for row in &summary.rows {
        write!(out, "{:label_width$}", row.row)?;
        for name in &summary.policies {
            write!(out, "  {:>17.4}", row.scores[name])?;
        }
        writeln!(out)?;
    }
    // The field's absolute error beside the ranking score: the model policies' MAPE on the
    // rows the protocols report.
    for row in summary.rows.iter().filter(|r| {
        r.row == "n_occur=2" || r.row == "mean" || r.row == "unseen" || r.row == "family unseen"
    }) {
        for (name, mape) in &row.mape {
            writeln!(out, "pairs, {}, {name}: {mape}", row.row)?;
        }
    }
    Ok(())
}

/// Writes every prediction `policy` scored, one row per test pair and case:
/// `protocol,n_occur,seed,holdout,workload1,workload2,predicted_sum`.
pub fn write_predictions(
    path: &Path,
    data: &EvalData,
    results: &[CaseResult],
    policy: Policy,
) -> anyhow::Result<()> {
    let mut writer =
        csv::Writer::from_path(path).with_context(|| format!("cannot write {}", path.display()))?;
    writer.write_record([
        "protocol",
        "n_occur",
        "seed",
        "holdout",
        "workload1",
        "workload2",
        "predicted_sum",
    ])?;
    for result in results.iter().filter(|r| r.policy == policy) {
        let case = &data.cases[result.case];
        let protocol = match case.protocol {
            super::Protocol::Split => "split",
            super::Protocol::Unseen => "unseen",
            // Family cases score pairs the unseen cases already wrote; left out so that
            // the file keeps one prediction per (case, pair) an independent scorer reads.
            super::Protocol::Family => continue,
        };
        let n_occur = case.n_occur.map(|n| n.to_string()).unwrap_or_default();
        let seed = case.seed.map(|s| s.to_string()).unwrap_or_default();
        let holdout = case.holdout.clone().unwrap_or_default();
        for (&i, score) in case.test.iter().zip(&result.pair_scores) {
            let pair = &data.pairs[i];
            writer.write_record([
                protocol,
                &n_occur,
                &seed,
                &holdout,
                &pair.workload1,
                &pair.workload2,
                // Shortest text that parses back to the same f64.
                &format!("{score:?}"),
            ])?;
        }
    }
    writer.flush()?;
    Ok(())
}

/// Prints the N-way summary: per set, scope and training, each policy's mean over targets
/// and, below it, its worst target.
pub fn print_nway_table(
    rows: &[NwayRow],
    policies: &[Policy],
    out: &mut impl Write,
) -> std::io::Result<()> {
    let labels: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {} ({} runs), {}",
                r.set,
                r.scope.as_str(),
                r.candidates,
                r.training.as_str()
            )
        })
        .collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0).max(6);
    write!(out, "{:width$}", "")?;
    for policy in policies {
        write!(out, "  {:>17}", policy.name())?;
    }
    writeln!(out)?;
    for (row, label) in rows.iter().zip(&labels) {
        for (what, values) in [
            (label.as_str(), &row.mean),
            ("  worst target", &row.worst),
            ("  selection targets (even)", &row.selection),
            ("  report targets (odd)", &row.report),
        ] {
            write!(out, "{what:width$}")?;
            for policy in policies {
                write!(out, "  {:>17.4}", values[&policy.name()])?;
            }
            writeln!(out)?;
        }
    }
    for (row, label) in rows.iter().zip(&labels) {
        for (name, mape) in &row.mape {
            writeln!(out, "{label}, {name}: {mape}")?;
        }
    }
    Ok(())
}

/// Writes every N-way prediction `policy` scored, one row per candidate run and case:
/// `set,scope,training,target,run_id,predicted_sum`.
pub fn write_nway_predictions(
    writer: &mut csv::Writer<std::fs::File>,
    data: &NwayData,
    cases: &[NwayCase],
    results: &[NwayResult],
    policy: Policy,
) -> anyhow::Result<()> {
    for result in results.iter().filter(|r| r.policy == policy) {
        let case = &cases[result.case];
        for (&i, score) in case.candidates.iter().zip(&result.run_scores) {
            writer.write_record([
                data.label.as_str(),
                case.scope.as_str(),
                case.training.as_str(),
                &case.target,
                &data.runs[i].id.to_string(),
                &format!("{score:?}"),
            ])?;
        }
    }
    Ok(())
}

/// Opens an N-way predictions file and writes its header.
pub fn nway_predictions_writer(path: &Path) -> anyhow::Result<csv::Writer<std::fs::File>> {
    let mut writer =
        csv::Writer::from_path(path).with_context(|| format!("cannot write {}", path.display()))?;
    writer.write_record([
        "set",
        "scope",
        "training",
        "target",
        "run_id",
        "predicted_sum",
    ])?;
    Ok(writer)
}

//! The evaluation's outputs: the table, and the predictions file an independent scorer can
//! check.

use std::{io::Write, path::Path};

use anyhow::Context;

use super::{CaseResult, EvalData, Policy, Summary};

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

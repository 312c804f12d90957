//! Coverage of the default model's 80 % intervals on the pair protocols of `coloc eval
//! kace --coverage`: the paper's splits at n_occur=2, the unseen workload and the unseen
//! family. Each case's model is fitted exactly as `Train` fits it (its intervals and seen
//! bands calibrated on the case's training pairs alone: outer folds only, no held-out pair
//! reaches the calibration), and judged on its test pairs. In the splits every test pair's
//! workloads were seen in training, so the seen bands answer there.

use coloc::model::{self, ModelKind, TrainingRow};

use super::{nway::Coverage, EvalData, Protocol};

/// Which cases a protocol takes.
type CaseFilter = dyn Fn(&super::Case) -> bool;

/// One row per protocol: "pairs, n_occur=2 splits", "pairs, unseen workload", "pairs,
/// unseen family".
pub fn pair_protocol_coverage(data: &EvalData) -> anyhow::Result<Vec<Coverage>> {
    let protocols: [(&str, &CaseFilter); 3] = [
        ("pairs, n_occur=2 splits", &|c| c.n_occur == Some(2)),
        ("pairs, unseen workload", &|c| {
            c.protocol == Protocol::Unseen
        }),
        ("pairs, unseen family", &|c| c.protocol == Protocol::Family),
    ];
    let mut rows = Vec::new();
    for (protocol, wanted) in protocols {
        let mut coverage = Coverage::new(protocol.to_string(), "chosen as Train fits it");
        for case in data.cases.iter().filter(|c| wanted(c)) {
            let rows_of =
                |idx: &[usize]| -> Vec<TrainingRow> { idx.iter().map(|&i| data.row(i)).collect() };
            let (fitted, _) = model::fit(ModelKind::DEFAULT, &rows_of(&case.train))?;
            let params = super::nway::at_level(fitted, data.level)?;
            coverage.add(&params, &rows_of(&case.test))?;
        }
        rows.push(coverage);
    }
    Ok(rows)
}

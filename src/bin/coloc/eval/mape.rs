//! The field's absolute-error metric beside the ranking score: the absolute percentage
//! error of predicted throughput, |predicted - actual| / actual x 100, of each member and of
//! each set's sum, summarised as mean (MAPE) and median over the held-out runs of a
//! protocol. Models that predict only the sum (`kace-linear`) have their members estimated
//! as Predict estimates them (the sum split by exclusive throughput).

use serde::Serialize;

use coloc::model::{Features, SetPrediction};

/// The absolute percentage errors gathered over held-out runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ape {
    pub members: Vec<f64>,
    pub sums: Vec<f64>,
}

/// |predicted - actual| / actual in percent; none for an actual of zero.
fn ape(predicted: f64, actual: f64) -> Option<f64> {
    (actual > 0.0).then(|| 100.0 * (predicted - actual).abs() / actual)
}

impl Ape {
    /// Adds one run: its members' profiles, what was predicted and what each member did.
    pub fn add(&mut self, members: &[Features], predicted: &SetPrediction, actual: &[f64]) {
        let exclusive: Vec<f64> = members.iter().map(Features::exclusive_throughput).collect();
        let (each, _) = predicted.members_or_estimated(&exclusive);
        self.members
            .extend(each.iter().zip(actual).filter_map(|(p, a)| ape(*p, *a)));
        self.sums
            .extend(ape(predicted.sum, actual.iter().sum::<f64>()));
    }

    pub fn extend(&mut self, other: &Ape) {
        self.members.extend_from_slice(&other.members);
        self.sums.extend_from_slice(&other.sums);
    }

    pub fn summary(&self) -> Mape {
        Mape {
            members: self.members.len(),
            member_mean: mean(&self.members),
            member_median: median(&self.members),
            sums: self.sums.len(),
            sum_mean: mean(&self.sums),
            sum_median: median(&self.sums),
        }
    }
}

/// One protocol's figures, in percent (NaN where nothing was scored).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mape {
    pub members: usize,
    pub member_mean: f64,
    pub member_median: f64,
    pub sums: usize,
    pub sum_mean: f64,
    pub sum_median: f64,
}

impl std::fmt::Display for Mape {
    /// "members 12.3 % (median 8.1 %, 100), sums ..."
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "member MAPE {:.1} % (median {:.1} %, {} members), sum MAPE {:.1} % (median {:.1} %, {} sets)",
            self.member_mean,
            self.member_median,
            self.members,
            self.sum_mean,
            self.sum_median,
            self.sums
        )
    }
}

pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(exclusive: f64) -> Features {
        let mut f = Features::default();
        f.0[6] = exclusive;
        f
    }

    #[test]
    fn errors_are_percent_of_the_actual_value_for_members_and_sums() {
        let mut ape = Ape::default();
        // Members predicted 9 and 6 against 10 and 5: 10 % and 20 %; the sum 15 against 15.
        ape.add(
            &[member(20.0), member(10.0)],
            &SetPrediction {
                sum: 15.0,
                members: Some(vec![9.0, 6.0]),
            },
            &[10.0, 5.0],
        );
        // A sum-only prediction of 30 split 2:1 by exclusive throughput (20 and 10) against
        // 10 and 10: 100 % and 0 %; the sum 30 against 20: 50 %.
        ape.add(
            &[member(20.0), member(10.0)],
            &SetPrediction::sum_only(30.0),
            &[10.0, 10.0],
        );
        let m = ape.summary();
        assert_eq!((m.members, m.sums), (4, 2));
        assert!((m.member_mean - 32.5).abs() < 1e-9, "{m}");
        assert!((m.member_median - 15.0).abs() < 1e-9, "{m}");
        assert!((m.sum_mean - 25.0).abs() < 1e-9, "{m}");
        assert!((m.sum_median - 25.0).abs() < 1e-9, "{m}");
    }
}

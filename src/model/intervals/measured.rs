//! Measured sets: what a model's training runs measured of each distinct set, so that the
//! interval of a set the model was trained on never has a low end above what that set was
//! measured at (docs/decisions/035-measured-low-ends.md). The point stays the model's
//! (decision 014); only the low ends are bounded.

use serde::{Deserialize, Serialize};

use super::SetInterval;
use crate::model::{Features, TrainingRow};

/// Distinct sets kept at most, those with most runs first (ties by key): a store of
/// KACE's or the simulation's size holds a few hundred.
pub(crate) const MAX_MEASURED_SETS: usize = 20_000;

/// Every distinct set of a model's training runs, sorted by key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredSets {
    pub sets: Vec<MeasuredSet>,
}

/// One distinct set: its members' profile fingerprints ([`Features::fingerprint`]), sorted,
/// and at each place the mean measured throughput of the member there over the set's runs
/// (a workload twice in a set: the mean over both places, the same at each), with the mean
/// sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredSet {
    pub key: Vec<u64>,
    pub members: Vec<f64>,
    pub sum: f64,
    pub runs: u32,
}

/// The fingerprints of `members` with each member's index, sorted by fingerprint (then
/// index, so that equal profiles keep their order).
fn keyed<'a>(members: impl Iterator<Item = &'a Features>) -> Vec<(u64, usize)> {
    let mut keyed: Vec<(u64, usize)> = members
        .enumerate()
        .map(|(i, m)| (m.fingerprint(), i))
        .collect();
    keyed.sort_unstable();
    keyed
}

impl MeasuredSets {
    /// The measured sets of `rows` (runs of two or more members with a throughput each);
    /// `None` without any.
    pub(crate) fn of(rows: &[TrainingRow]) -> Option<Self> {
        let mut by_key: std::collections::HashMap<Vec<u64>, MeasuredSet> =
            std::collections::HashMap::new();
        for row in rows
            .iter()
            .filter(|r| r.members.len() >= 2 && r.members.len() == r.throughputs.len())
        {
            let keyed = keyed(row.members.iter());
            let key: Vec<u64> = keyed.iter().map(|(f, _)| *f).collect();
            let mut places: Vec<f64> = keyed.iter().map(|(_, i)| row.throughputs[*i]).collect();
            // Equal profiles are one workload: each of its places reads their mean.
            let mut start = 0;
            while start < key.len() {
                let end = start
                    + key[start..]
                        .iter()
                        .take_while(|f| **f == key[start])
                        .count();
                let mean = places[start..end].iter().sum::<f64>() / (end - start) as f64;
                places[start..end].fill(mean);
                start = end;
            }
            let set = by_key.entry(key.clone()).or_insert_with(|| MeasuredSet {
                key,
                members: vec![0.0; places.len()],
                sum: 0.0,
                runs: 0,
            });
            for (total, place) in set.members.iter_mut().zip(&places) {
                *total += place;
            }
            set.sum += row.throughput_sum();
            set.runs += 1;
        }
        let mut sets: Vec<MeasuredSet> = by_key
            .into_values()
            .map(|mut set| {
                let runs = f64::from(set.runs);
                set.members.iter_mut().for_each(|m| *m /= runs);
                set.sum /= runs;
                set
            })
            .collect();
        sets.sort_unstable_by(|a, b| b.runs.cmp(&a.runs).then_with(|| a.key.cmp(&b.key)));
        sets.truncate(MAX_MEASURED_SETS);
        sets.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        (!sets.is_empty()).then_some(Self { sets })
    }

    /// The measurement of the set `members`, if it was measured: each member's mean
    /// throughput in `members`' order, and the mean sum.
    pub fn measured(&self, members: &[&Features]) -> Option<(Vec<f64>, f64)> {
        let keyed = keyed(members.iter().copied());
        let key: Vec<u64> = keyed.iter().map(|(f, _)| *f).collect();
        let set = &self.sets[self.sets.binary_search_by(|s| s.key.cmp(&key)).ok()?];
        let mut by_member = vec![0.0; members.len()];
        for ((_, i), value) in keyed.iter().zip(&set.members) {
            by_member[*i] = *value;
        }
        Some((by_member, set.sum))
    }

    /// `interval` of the set `members` with every low end at most what the set was
    /// measured at (unchanged for a set never measured).
    pub fn bound(&self, members: &[&Features], interval: &mut SetInterval) {
        let Some((measured, sum)) = self.measured(members) else {
            return;
        };
        interval.sum.0 = interval.sum.0.min(sum);
        if let Some(bounds) = interval.members.as_mut() {
            for (bound, value) in bounds.iter_mut().zip(measured) {
                bound.0 = bound.0.min(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NUM_FEATURES;

    fn profile(v: f64) -> Features {
        Features([v; NUM_FEATURES])
    }

    fn row(members: &[Features], throughputs: &[f64]) -> TrainingRow {
        TrainingRow {
            members: members.to_vec(),
            throughputs: throughputs.to_vec(),
        }
    }

    fn interval(members: &[(f64, f64)], sum: (f64, f64)) -> SetInterval {
        SetInterval {
            sum,
            members: Some(members.to_vec()),
        }
    }

    #[test]
    fn a_measured_sets_low_ends_are_at_most_its_mean_measurement_in_any_member_order() {
        let (a, b, c) = (profile(1.0), profile(2.0), profile(3.0));
        let measured = MeasuredSets::of(&[
            row(&[a, b], &[10.0, 20.0]),
            row(&[b, a], &[24.0, 14.0]),
            row(&[a, c, a], &[6.0, 30.0, 8.0]),
            row(&[c], &[50.0]),
        ])
        .expect("two sets measured");
        assert_eq!(measured.sets.len(), 2, "a run of one is no set");
        // (a, b): a's mean 12, b's 22, the sum's 34; asked the other way round.
        let mut high = interval(&[(30.0, 40.0), (15.0, 18.0)], (45.0, 58.0));
        measured.bound(&[&b, &a], &mut high);
        assert_eq!(high, interval(&[(22.0, 40.0), (12.0, 18.0)], (34.0, 58.0)));
        // Low ends already below the measurement stay; the high ends never move.
        let mut low = interval(&[(9.0, 11.0), (15.0, 16.0)], (30.0, 33.0));
        measured.bound(&[&a, &b], &mut low);
        assert_eq!(low, interval(&[(9.0, 11.0), (15.0, 16.0)], (30.0, 33.0)));
        // a twice beside c: each of a's places reads the mean of both, 7.
        let mut crowded = interval(&[(40.0, 60.0), (9.0, 12.0), (8.0, 9.0)], (60.0, 70.0));
        measured.bound(&[&c, &a, &a], &mut crowded);
        assert_eq!(
            crowded,
            interval(&[(30.0, 60.0), (7.0, 12.0), (7.0, 9.0)], (44.0, 70.0))
        );
        // A set never measured, or one member short, is unchanged.
        for set in [vec![&a, &c], vec![&a, &c, &b], vec![&a, &a]] {
            let mut other = interval(&vec![(50.0, 60.0); set.len()], (90.0, 99.0));
            let before = other.clone();
            measured.bound(&set, &mut other);
            assert_eq!(other, before);
        }
        assert_eq!(MeasuredSets::of(&[row(&[a], &[1.0])]), None);
    }

    #[test]
    fn at_most_the_most_run_sets_are_kept() {
        let first = profile(0.5);
        let mut rows: Vec<TrainingRow> = (0..=MAX_MEASURED_SETS)
            .map(|i| row(&[first, profile(1.0 + i as f64)], &[1.0, 1.0]))
            .collect();
        // The last set, run twice, is kept before sets of one run.
        let last = profile(1.0 + MAX_MEASURED_SETS as f64);
        rows.push(row(&[last, first], &[3.0, 3.0]));
        let measured = MeasuredSets::of(&rows).unwrap();
        assert_eq!(measured.sets.len(), MAX_MEASURED_SETS);
        assert!(measured.sets.windows(2).all(|w| w[0].key < w[1].key));
        assert_eq!(
            measured.measured(&[&first, &last]),
            Some((vec![2.0, 2.0], 4.0))
        );
    }
}

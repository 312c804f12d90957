//! The options `coloc eval` experiments compare: `member-ridge-gbt`'s fit options and the
//! ways of calibrating its intervals, each by the name the evaluation prints. What is served
//! is not read from these lists by position: the model names it
//! ([`MemberOptions::CHOSEN`], [`Calibration::CHOSEN`]), and the tests here keep each
//! served option equal to its row, so reordering a list cannot change what `Train` fits.

use coloc::model::{
    intervals::{Calibration, Folds, Scale},
    MemberOptions, ProfileLevel,
};

/// Named candidates a nested run chooses among, in the rule's tie order.
pub type Candidates = Vec<(String, MemberOptions)>;

/// Which candidates `coloc eval nway --nested` chooses among (`--nested-candidates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NestedSet {
    /// Decision 020: the set-level ridge model off or on x the law blend weight 0, 0.1 or
    /// 0.25 ([`NESTED_CANDIDATES`]).
    Law,
    /// Decision 037: the served options of the profiles' level without and with the
    /// trees' row weights (`weighted`).
    Weighted,
    /// Decision 037: the served options of the profiles' level without and with stacking
    /// (`stacked`).
    Stacked,
    /// Decision 041: the served options of the profiles' level with crowded members
    /// composed from the model's pair answers at w = 0, 50 and 100 % (`pair_composition`).
    Composition,
}

impl NestedSet {
    /// The candidates for profiles of `level`.
    pub fn candidates(self, level: ProfileLevel) -> Candidates {
        let served = MemberOptions::at(level);
        let named = |name: &str, options| (name.to_string(), options);
        match self {
            Self::Law => NESTED_CANDIDATES
                .iter()
                .map(|(name, options)| named(name, *options))
                .collect(),
            Self::Weighted => vec![
                named(
                    "weights off",
                    MemberOptions {
                        weighted: false,
                        ..served
                    },
                ),
                named(
                    "weights on",
                    MemberOptions {
                        weighted: true,
                        ..served
                    },
                ),
            ],
            Self::Stacked => vec![
                named(
                    "stacking off",
                    MemberOptions {
                        stacked: false,
                        ..served
                    },
                ),
                named(
                    "stacking on",
                    MemberOptions {
                        stacked: true,
                        ..served
                    },
                ),
            ],
            Self::Composition => [0, 50, 100]
                .into_iter()
                .map(|w| {
                    named(
                        &format!("composition {w} %"),
                        MemberOptions {
                            pair_composition: w,
                            ..served
                        },
                    )
                })
                .collect(),
        }
    }
}

/// Candidates compared by `coloc eval nway --candidates` (docs/nway.md).
pub const MEMBER_CANDIDATES: [(&str, MemberOptions); 26] = {
    const fn o(crowding: bool, stacked: bool, weighted: bool) -> MemberOptions {
        MemberOptions {
            crowding,
            stacked,
            weighted,
            weighted_crowded: false,
            set_linear: false,
            set_linear_bounded: false,
            set_linear_shrink: 0,
            members_capped: false,
            time_share: false,
            time_share_crowded: false,
            set_linear_ratio: false,
            law_blend: 0,
            law_blend_always: false,
            pair_composition: 0,
        }
    }
    const fn c(crowding: bool, weighted_crowded: bool, set_linear: bool) -> MemberOptions {
        MemberOptions {
            crowding,
            stacked: false,
            weighted: false,
            weighted_crowded,
            set_linear,
            set_linear_bounded: false,
            set_linear_shrink: 0,
            members_capped: false,
            time_share: false,
            time_share_crowded: false,
            set_linear_ratio: false,
            law_blend: 0,
            law_blend_always: false,
            pair_composition: 0,
        }
    }
    const fn linear(shrink: u8, members_capped: bool) -> MemberOptions {
        MemberOptions {
            set_linear_shrink: shrink,
            members_capped,
            ..c(true, false, true)
        }
    }
    [
        ("plain", o(false, false, false)),
        ("crowding", o(true, false, false)),
        ("stacked", o(false, true, false)),
        ("weighted", o(false, false, true)),
        ("crowding+stacked", o(true, true, false)),
        ("crowding+weighted", o(true, false, true)),
        ("crowding+stacked+weighted", o(true, true, true)),
        ("crowding+weighted-crowded", c(true, true, false)),
        ("set-linear", c(false, false, true)),
        ("crowding+set-linear", c(true, false, true)),
        ("crowding+weighted-crowded+set-linear", c(true, true, true)),
        (
            "crowding+set-linear-bounded",
            MemberOptions {
                set_linear_bounded: true,
                ..c(true, false, true)
            },
        ),
        ("crowding+set-linear+capped", linear(0, true)),
        ("crowding+set-ridge-0.1", linear(1, false)),
        ("crowding+set-ridge-1", linear(10, false)),
        ("crowding+set-ridge-0.1+capped", linear(1, true)),
        ("crowding+set-ridge-1+capped", linear(10, true)),
        (
            "crowding+set-linear+capped+time-share",
            MemberOptions {
                time_share: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+set-linear+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..o(true, false, false)
            },
        ),
        (
            "crowding+set-linear-bounded+capped+time-share-crowded",
            MemberOptions {
                set_linear_bounded: true,
                time_share_crowded: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ratio-ridge-0.1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                set_linear_ratio: true,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ratio-ridge-1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                set_linear_ratio: true,
                ..linear(10, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded+law-0.1",
            MemberOptions {
                time_share_crowded: true,
                law_blend: 10,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded+law-0.25",
            MemberOptions {
                time_share_crowded: true,
                law_blend: 25,
                ..linear(1, true)
            },
        ),
    ]
};

/// The candidates `coloc eval nway --nested` chooses among inside each training set
/// (decision 020): the set-level ridge model off or on x the law blend weight 0, 0.1 or
/// 0.25, every other option as served; in the rule's tie order (simpler first).
pub const NESTED_CANDIDATES: [(&str, MemberOptions); 6] = {
    const fn n(set_ridge: bool, law_blend: u8) -> MemberOptions {
        MemberOptions {
            set_linear: set_ridge,
            set_linear_shrink: if set_ridge { 1 } else { 0 },
            members_capped: set_ridge,
            law_blend,
            ..MemberOptions::CHOSEN
        }
    }
    [
        ("law-0", n(false, 0)),
        ("law-0.1", n(false, 10)),
        ("law-0.25", n(false, 25)),
        ("set-ridge+law-0", n(true, 0)),
        ("set-ridge+law-0.1", n(true, 10)),
        ("set-ridge+law-0.25", n(true, 25)),
    ]
};

/// The calibrations `coloc eval nway --coverage --candidates` compares (docs/nway.md).
pub const CALIBRATION_CANDIDATES: [(&str, Calibration); 6] = [
    (
        "profile-folds",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Plain,
            sums: None,
        },
    ),
    (
        "profile-folds, scaled 0.1",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Fixed(0.1),
            sums: None,
        },
    ),
    (
        "profile-folds, scaled median",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Median,
            sums: None,
        },
    ),
    (
        "profile-out",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Plain,
            sums: None,
        },
    ),
    (
        "profile-out, scaled 0.1",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Fixed(0.1),
            sums: None,
        },
    ),
    (
        "profile-out members, profile-folds sums",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Plain,
            sums: Some(Folds::Profiles),
        },
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The row of `table` named `name`.
    fn row<T: Copy>(table: &[(&str, T)], name: &str) -> T {
        table
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no candidate {name:?}"))
            .1
    }

    #[test]
    fn the_served_calibration_is_its_candidate_row() {
        assert_eq!(
            Calibration::CHOSEN,
            row(
                &CALIBRATION_CANDIDATES,
                "profile-out members, profile-folds sums"
            )
        );
        // The NVML-only twin's, chosen by decision 040.
        assert_eq!(
            Calibration::TWIN,
            row(&CALIBRATION_CANDIDATES, "profile-folds, scaled 0.1")
        );
    }

    #[test]
    fn the_served_options_are_the_law_blend_candidate_blended_in_every_crowded_set() {
        // The options `coloc eval nway --candidates` chose, with the law blended also where
        // the fitted model learned no crowded set (chosen by the simulation, README,
        // "Cluster simulation"; `coloc simulate --law-blend crowded-fits` serves the row
        // itself), the trees' row weights nested CV chose (decision 037), and crowded
        // members composed halfway from pair answers (decision 041).
        let chosen = row(
            &MEMBER_CANDIDATES,
            "crowding+set-ridge-0.1+capped+time-share-crowded+law-0.1",
        );
        assert!(!chosen.law_blend_always && !chosen.weighted);
        assert_eq!(
            MemberOptions::CHOSEN,
            MemberOptions {
                law_blend_always: true,
                pair_composition: 50,
                weighted: true,
                ..chosen
            }
        );
        // The twin keeps the options served before decision 037: the NVML-only pairs
        // chose stacking, which its crowded sets did not, and never the weights.
        assert_eq!(
            MemberOptions::TWIN,
            MemberOptions {
                law_blend_always: true,
                pair_composition: 50,
                ..chosen
            }
        );
    }

    #[test]
    fn the_served_options_are_the_nested_candidate_with_set_ridge_and_law_0_1() {
        // Decision 020: every nested inner fold chose the set ridge; the rule picks law 0
        // on the 4-way file, not served (the decision says why). Its candidates take every
        // other option as served, the row weights of decision 037 among them.
        assert_eq!(
            MemberOptions::CHOSEN,
            row(&NESTED_CANDIDATES, "set-ridge+law-0.1")
        );
        assert!(NESTED_CANDIDATES
            .iter()
            .all(|(_, o)| o.time_share_crowded && o.crowding));
    }

    #[test]
    fn decision_037s_lists_are_the_served_options_without_and_with_one_flag() {
        type Flag = (
            fn(MemberOptions) -> bool,
            fn(MemberOptions) -> MemberOptions,
        );
        let weighted: Flag = (
            |o| o.weighted,
            |o| MemberOptions {
                weighted: false,
                ..o
            },
        );
        let stacked: Flag = (
            |o| o.stacked,
            |o| MemberOptions {
                stacked: false,
                ..o
            },
        );
        for level in [ProfileLevel::Full, ProfileLevel::NvmlOnly] {
            let served = MemberOptions::at(level);
            for (set, (get, clear)) in [
                (NestedSet::Weighted, weighted),
                (NestedSet::Stacked, stacked),
            ] {
                let list = set.candidates(level);
                assert_eq!(list.len(), 2);
                let (off, on) = (list[0].1, list[1].1);
                assert!(!get(off) && get(on));
                assert_eq!(off, clear(on), "the two differ in the flag alone");
                assert_eq!(off, clear(served), "every other option as served");
            }
        }
        // Served since decision 037: the weights for full profiles, neither for the twin.
        assert!(MemberOptions::at(ProfileLevel::Full).weighted);
        let twin = MemberOptions::at(ProfileLevel::NvmlOnly);
        assert!(!twin.weighted && !twin.stacked);
        let law = NestedSet::Law.candidates(ProfileLevel::Full);
        assert_eq!(law.len(), NESTED_CANDIDATES.len());
        assert!(law
            .iter()
            .zip(&NESTED_CANDIDATES)
            .all(|(a, b)| a.0 == b.0 && a.1 == b.1));
    }

    #[test]
    fn every_candidate_has_a_distinct_name_and_distinct_options() {
        for (i, (name, options)) in MEMBER_CANDIDATES.iter().enumerate() {
            for (other, other_options) in &MEMBER_CANDIDATES[i + 1..] {
                assert_ne!(name, other);
                assert_ne!(options, other_options, "{name} and {other}");
            }
        }
        for (i, (name, options)) in NESTED_CANDIDATES.iter().enumerate() {
            for (other, other_options) in &NESTED_CANDIDATES[i + 1..] {
                assert_ne!(name, other);
                assert_ne!(options, other_options, "{name} and {other}");
            }
        }
        for (i, (name, calibration)) in CALIBRATION_CANDIDATES.iter().enumerate() {
            for (other, other_calibration) in &CALIBRATION_CANDIDATES[i + 1..] {
                assert_ne!(name, other);
                assert_ne!(calibration, other_calibration, "{name} and {other}");
            }
        }
    }
}

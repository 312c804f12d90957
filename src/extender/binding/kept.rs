//! What the webhook's chooser keeps between decisions so that a warm decision asks Place
//! only about what changed: ids for resident sets and GPU kinds that stay the same while the
//! view changes around them ([`Interner`]), and Place's outcome for each plain slot (a
//! resident set on a GPU kind, no holds) of each ask ([`Verdicts`]), kept while the
//! placer's answers generation and the ids hold.

use std::{collections::HashMap, sync::Arc};

use crate::{domain::SharingMode, extender::decide::SlotOutcome};

/// A GPU's residents: each workload with its own floor.
pub(super) type Residents = Vec<(String, Option<f64>)>;

/// A resident set's key: its members (name, floor's bits), sorted.
pub(super) type SetKey = Vec<(String, Option<u64>)>;

/// Asks whose verdicts are kept at most (each a map of a few thousand outcomes); past it,
/// all are dropped.
const ASKS_KEPT: usize = 32;

/// Sets the interner keeps beyond those of the last index before it starts over.
const STALE_SETS: usize = 4_096;

/// Stable ids: set 0 is the empty set; a set or kind keeps its id until the interner starts
/// over, which moves the epoch on (and so drops every kept verdict).
pub(super) struct Interner {
    pub epoch: u64,
    set_ids: HashMap<SetKey, usize>,
    /// Sets by id, members sorted, each with its version (`resident_version`).
    pub sets: Arc<Vec<(Residents, String)>>,
    kind_ids: HashMap<(Option<String>, Option<u64>), usize>,
    /// GPU models and memories by id.
    pub kinds: Arc<Vec<(Option<String>, Option<f64>)>>,
}

impl Interner {
    pub fn new() -> Self {
        Self::starting(0)
    }

    fn starting(epoch: u64) -> Self {
        let empty: SetKey = Vec::new();
        Self {
            epoch,
            set_ids: HashMap::from([(empty, 0)]),
            sets: Arc::new(vec![(Vec::new(), super::choose::resident_version(&[]))]),
            kind_ids: HashMap::new(),
            kinds: Arc::new(Vec::new()),
        }
    }

    /// Starts over when the interner keeps many more sets than the last index used
    /// (`used`): sets of residents long gone.
    pub fn trim(&mut self, used: usize) {
        if self.sets.len() > 2 * used + STALE_SETS {
            *self = Self::starting(self.epoch + 1);
        }
    }

    /// The id of the set `key` (members sorted).
    pub fn set_id(&mut self, key: SetKey) -> usize {
        if let Some(&id) = self.set_ids.get(&key) {
            return id;
        }
        let members = members_of(&key);
        let version = super::choose::resident_version(&members);
        let sets = Arc::make_mut(&mut self.sets);
        sets.push((members, version));
        self.set_ids.insert(key, sets.len() - 1);
        sets.len() - 1
    }

    /// The id of a GPU kind (model, memory).
    pub fn kind_id(&mut self, model: Option<String>, memory_gb: Option<f64>) -> usize {
        let key = (model, memory_gb.map(f64::to_bits));
        if let Some(&id) = self.kind_ids.get(&key) {
            return id;
        }
        let kinds = Arc::make_mut(&mut self.kinds);
        kinds.push((key.0.clone(), memory_gb));
        self.kind_ids.insert(key, kinds.len() - 1);
        kinds.len() - 1
    }
}

/// The members of the set `key`, each with its floor.
pub(super) fn members_of(key: &SetKey) -> Residents {
    key.iter()
        .map(|(w, bits)| (w.clone(), bits.map(f64::from_bits)))
        .collect()
}

/// What an ask's outcome on a plain slot depends on besides the slot: the job, its floor
/// and its sharing mode (HAMi's requests only decide which GPUs are offered).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct AskKey {
    workload: String,
    min_job_fraction: Option<u64>,
    sharing_mode: Option<SharingMode>,
}

impl AskKey {
    pub fn of(ask: &super::Ask) -> Self {
        Self {
            workload: ask.workload.clone(),
            min_job_fraction: ask.min_job_fraction.map(f64::to_bits),
            sharing_mode: ask.sharing_mode,
        }
    }
}

/// Outcomes of plain slots by (set id, kind id).
pub(super) type Known = foldhash::HashMap<(usize, usize), SlotOutcome>;

/// Place's outcomes on plain slots, per ask, under one (interner epoch, answers
/// generation).
#[derive(Default)]
pub(super) struct Verdicts {
    at: (u64, u64),
    by_ask: HashMap<AskKey, Arc<Known>>,
}

impl Verdicts {
    /// The outcomes kept for `key` under `at`.
    pub fn known(&self, key: &AskKey, at: (u64, u64)) -> Option<Arc<Known>> {
        (self.at == at)
            .then(|| self.by_ask.get(key).cloned())
            .flatten()
    }

    /// Keeps `learned` for `key`, answered under `at` (the generation read before Place
    /// was asked). Under an older `at` than the kept ones they are dropped; under a newer
    /// one they replace them all.
    pub fn learn(
        &mut self,
        key: AskKey,
        at: (u64, u64),
        learned: impl IntoIterator<Item = ((usize, usize), SlotOutcome)>,
    ) {
        if at < self.at {
            return;
        }
        if at > self.at {
            self.at = at;
            self.by_ask.clear();
        }
        if self.by_ask.len() >= ASKS_KEPT && !self.by_ask.contains_key(&key) {
            self.by_ask.clear();
        }
        Arc::make_mut(self.by_ask.entry(key).or_default()).extend(learned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(workload: &str) -> AskKey {
        AskKey {
            workload: workload.into(),
            min_job_fraction: None,
            sharing_mode: None,
        }
    }

    fn fits(gain: f64) -> SlotOutcome {
        SlotOutcome::Fits { gain }
    }

    #[test]
    fn verdicts_hold_only_under_the_generation_they_were_answered_under() {
        let mut verdicts = Verdicts::default();
        verdicts.learn(key("a"), (0, 5), [((1, 0), fits(1.0))]);
        assert_eq!(
            verdicts.known(&key("a"), (0, 5)).unwrap()[&(1, 0)],
            fits(1.0)
        );
        assert!(verdicts.known(&key("b"), (0, 5)).is_none());
        assert!(verdicts.known(&key("a"), (0, 6)).is_none());
        assert!(verdicts.known(&key("a"), (1, 5)).is_none());
        // An answer read under an older generation is not kept over newer ones.
        verdicts.learn(key("a"), (0, 6), [((2, 0), fits(2.0))]);
        verdicts.learn(key("a"), (0, 5), [((3, 0), fits(3.0))]);
        let known = verdicts.known(&key("a"), (0, 6)).unwrap();
        assert_eq!(known.len(), 1);
        assert_eq!(known[&(2, 0)], fits(2.0));
    }

    #[test]
    fn a_set_keeps_its_id_until_the_interner_starts_over() {
        let mut interner = Interner::new();
        let set = vec![
            ("bert".to_string(), None),
            ("vit".to_string(), Some(0.5f64.to_bits())),
        ];
        let id = interner.set_id(set.clone());
        assert_eq!(id, 1);
        assert_eq!(interner.set_id(vec![]), 0);
        assert_eq!(interner.set_id(set.clone()), id);
        assert_eq!(interner.sets[id].0[1], ("vit".to_string(), Some(0.5)));
        interner.trim(1);
        assert_eq!((interner.epoch, interner.set_id(set.clone())), (0, id));
        for n in 0..STALE_SETS + 8 {
            interner.set_id(vec![(format!("w{n}"), None)]);
        }
        interner.trim(1);
        assert_eq!(interner.epoch, 1);
        assert_eq!(interner.sets.len(), 1);
        assert_eq!(interner.kind_id(Some("V100".into()), Some(32.0)), 0);
        assert_eq!(interner.kind_id(Some("V100".into()), None), 1);
        assert_eq!(interner.kind_id(Some("V100".into()), Some(32.0)), 0);
    }
}

//! The push source: a workload's own loop posts its throughput every N steps to
//! `POST /observer/throughput` on the metrics endpoint, as JSON
//! `{"pod_uid": "<the pod's UID>", "throughput": <units per second over the last N steps>}`;
//! the server stamps each value with its own clock. Values are kept in memory, a bounded
//! number per pod (a restart forgets them: windows still open then lose their start). A bad
//! body gets 400 (413 when too large, 429 when too many pods) with the reason, and changes
//! nothing.

use std::collections::{HashMap, VecDeque};

use serde::Deserialize;

use super::{
    source::{Sample, SeriesFuture, Span, ThroughputSource},
    timeline::Pod,
};
use crate::{domain::MAX_THROUGHPUT, settings::PushSettings, sync::Unpoisoned};

/// The path of the push endpoint on the metrics listener.
pub const PUSH_PATH: &str = "/observer/throughput";
/// Bodies larger than this are refused.
pub const MAX_PUSH_BYTES: usize = 4096;
const MAX_UID_CHARS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PushBody {
    pod_uid: String,
    throughput: f64,
}

/// Why a push was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PushError {
    #[error(
        "the body must be JSON {{\"pod_uid\": \"<the pod's UID>\", \"throughput\": <number>}}: \
         {0}"
    )]
    Malformed(String),
    #[error("pod_uid must be 1 to {MAX_UID_CHARS} characters")]
    BadUid,
    #[error("throughput must be a finite number >= 0 and at most {MAX_THROUGHPUT:e}, got {0}")]
    BadThroughput(f64),
    #[error("the body is larger than {MAX_PUSH_BYTES} bytes")]
    TooLarge,
    #[error("{0} pods already push values (observer.push.max_pods); this one is not kept")]
    TooManyPods(usize),
}

impl PushError {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> u16 {
        match self {
            Self::TooLarge => 413,
            Self::TooManyPods(_) => 429,
            _ => 400,
        }
    }
}

/// Pushed values per pod UID.
pub struct PushSource {
    settings: PushSettings,
    values: std::sync::Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl PushSource {
    pub fn new(settings: PushSettings) -> Self {
        Self {
            settings,
            values: Default::default(),
        }
    }

    /// Takes one push received at `now_ms`; on error nothing is kept.
    pub fn accept(&self, body: &[u8], now_ms: i64) -> Result<(), PushError> {
        if body.len() > MAX_PUSH_BYTES {
            return Err(PushError::TooLarge);
        }
        let push: PushBody =
            serde_json::from_slice(body).map_err(|e| PushError::Malformed(e.to_string()))?;
        let uid = push.pod_uid.trim();
        if uid.is_empty() || uid.chars().count() > MAX_UID_CHARS {
            return Err(PushError::BadUid);
        }
        if !push.throughput.is_finite() || push.throughput < 0.0 || push.throughput > MAX_THROUGHPUT
        {
            return Err(PushError::BadThroughput(push.throughput));
        }
        let mut values = self.values.lock().unpoisoned();
        if !values.contains_key(uid) && values.len() >= self.settings.max_pods {
            return Err(PushError::TooManyPods(values.len()));
        }
        let series = values.entry(uid.to_string()).or_default();
        if series.len() >= self.settings.max_points_per_pod.max(1) {
            series.pop_front();
        }
        series.push_back((now_ms, push.throughput));
        Ok(())
    }

    /// How many values are kept for a pod.
    pub fn len(&self, uid: &str) -> usize {
        self.values
            .lock()
            .unpoisoned()
            .get(uid)
            .map_or(0, VecDeque::len)
    }

    /// Whether no pod pushed anything.
    pub fn is_empty(&self) -> bool {
        self.values.lock().unpoisoned().is_empty()
    }

    /// The HTTP answer to a push: (status, body text).
    pub fn answer(&self, body: &[u8], now_ms: i64) -> (u16, String) {
        match self.accept(body, now_ms) {
            Ok(()) => (204, String::new()),
            Err(error) => (error.status(), format!("{error}\n")),
        }
    }
}

impl ThroughputSource for PushSource {
    fn name(&self) -> &'static str {
        "push"
    }

    fn series<'a>(&'a self, pod: &'a Pod, span: Span) -> SeriesFuture<'a> {
        let values: Vec<Sample> = self
            .values
            .lock()
            .unpoisoned()
            .get(&pod.uid)
            .map(|series| {
                series
                    .iter()
                    .filter(|(at, _)| *at >= span.start_ms && *at <= span.end_ms)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        Box::pin(async move { Ok(values) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> PushSource {
        PushSource::new(PushSettings {
            max_points_per_pod: 2,
            max_pods: 1,
        })
    }

    #[test]
    fn a_good_push_is_kept_and_the_oldest_values_go_first() {
        let push = source();
        for (at, value) in [(1, "1.5"), (2, "2"), (3, "3")] {
            let body = format!(r#"{{"pod_uid": "u1", "throughput": {value}}}"#);
            assert_eq!(push.answer(body.as_bytes(), at).0, 204);
        }
        assert_eq!(push.len("u1"), 2);
    }

    #[test]
    fn bad_pushes_get_their_reason_and_change_nothing() {
        let push = source();
        let cases: [(&str, u16, &str); 7] = [
            ("not json", 400, "must be JSON"),
            (r#"{"pod_uid": "u1"}"#, 400, "missing field `throughput`"),
            (
                r#"{"pod_uid": "u1", "throughput": 1, "x": 2}"#,
                400,
                "unknown field",
            ),
            (
                r#"{"pod_uid": " ", "throughput": 1}"#,
                400,
                "pod_uid must be",
            ),
            (
                r#"{"pod_uid": "u1", "throughput": -1}"#,
                400,
                "throughput must be",
            ),
            (
                r#"{"pod_uid": "u1", "throughput": 1e13}"#,
                400,
                "throughput must be",
            ),
            (
                r#"{"pod_uid": "u1", "throughput": "fast"}"#,
                400,
                "must be JSON",
            ),
        ];
        for (body, status, reason) in cases {
            let (got, text) = push.answer(body.as_bytes(), 1);
            assert_eq!(got, status, "{body}: {text}");
            assert!(text.contains(reason), "{body}: {text}");
        }
        assert!(push.is_empty());
        assert_eq!(push.answer(&[b' '; MAX_PUSH_BYTES + 1], 1).0, 413);
        push.accept(br#"{"pod_uid": "u1", "throughput": 1}"#, 1)
            .unwrap();
        let (status, text) = push.answer(br#"{"pod_uid": "u2", "throughput": 1}"#, 1);
        assert_eq!((status, push.len("u2")), (429, 0), "{text}");
    }
}

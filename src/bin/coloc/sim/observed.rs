//! What the simulated cluster shows the service's observer: each run's timeline (a GPU's set
//! of pods, constant over a window) and each pod's throughput series, Prometheus-shaped (one
//! value every [`STEP_S`] over the window), emitted from the measured truth. `coloc-online`
//! learns only from the runs the observer makes of them.

use std::{collections::HashMap, sync::Mutex};

use coloc::observer::{
    source::{Sample, SeriesFuture},
    Pod, Segment, Span, ThroughputSource, Timeline,
};

/// The series' step, as a Prometheus scrape interval and query step would give it.
pub const STEP_S: i64 = 15;

/// The windows emitted and not yet read: every call hands out (and forgets) the pending
/// ones that closed by then, in the order they closed.
#[derive(Default)]
pub struct EmittedTimeline {
    pending: Mutex<Vec<Segment>>,
}

impl EmittedTimeline {
    pub fn emit(&self, segment: Segment) {
        self.pending.lock().expect("not poisoned").push(segment);
    }
}

impl Timeline for EmittedTimeline {
    fn closed_segments(&self, _after_end_ms: i64, until_ms: i64) -> Vec<Segment> {
        let mut pending = self.pending.lock().expect("not poisoned");
        let (mut ready, later): (Vec<Segment>, Vec<Segment>) =
            pending.drain(..).partition(|s| s.end_ms <= until_ms);
        *pending = later;
        ready.sort_by_key(|s| s.end_ms);
        ready
    }
}

/// Each pod's series by UID.
#[derive(Default)]
pub struct EmittedSeries {
    series: Mutex<HashMap<String, Vec<Sample>>>,
}

impl EmittedSeries {
    /// A constant throughput from `start_ms` to `end_ms`, one value per step.
    pub fn emit(&self, uid: &str, start_ms: i64, end_ms: i64, throughput: f64) {
        let samples = (0..)
            .map(|k| start_ms + k * STEP_S * 1000)
            .take_while(|at| *at <= end_ms)
            .map(|at| (at, throughput))
            .collect();
        self.series
            .lock()
            .expect("not poisoned")
            .insert(uid.to_string(), samples);
    }
}

impl ThroughputSource for EmittedSeries {
    fn name(&self) -> &'static str {
        "simulation"
    }

    fn series<'a>(&'a self, pod: &'a Pod, span: Span) -> SeriesFuture<'a> {
        let values = self
            .series
            .lock()
            .expect("not poisoned")
            .get(&pod.uid)
            .map(|s| {
                s.iter()
                    .filter(|(at, _)| *at >= span.start_ms && *at <= span.end_ms)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        Box::pin(async move { Ok(values) })
    }
}

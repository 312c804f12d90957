//! The observer's counts, as Prometheus collectors the metrics endpoint registers: windows
//! by what they became, skipped series by reason, and how far each workload's measured
//! exclusive throughput has drifted from the one its profile gives.

use prometheus::{core::Collector, GaugeVec, IntCounterVec, Opts};

use super::source::SkipReason;

/// What a window became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// A colocated run, stored.
    Colocated,
    /// A pod alone on its GPU: its exclusive throughput measured.
    Solo,
    /// Formed before (a restart, another replica): nothing stored.
    Known,
    /// Shorter than `observer.min_window_secs`.
    Short,
    /// Skipped: see the skip counter's reason.
    Skipped,
    /// A source could not be read: the window is tried again at a later turn.
    Deferred,
}

impl WindowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Colocated => "colocated",
            Self::Solo => "solo",
            Self::Known => "known",
            Self::Short => "short",
            Self::Skipped => "skipped",
            Self::Deferred => "deferred",
        }
    }
}

pub struct ObserverStats {
    windows: IntCounterVec,
    skipped: IntCounterVec,
    drift: GaugeVec,
}

impl Default for ObserverStats {
    fn default() -> Self {
        Self::new()
    }
}

impl ObserverStats {
    pub fn new() -> Self {
        let windows = IntCounterVec::new(
            Opts::new(
                "coloc_observer_windows_total",
                "Windows of the cluster's timeline the observer looked at, by what they became",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let skipped = IntCounterVec::new(
            Opts::new(
                "coloc_observer_skipped_total",
                "Windows skipped because a member's throughput series was not usable, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let drift = GaugeVec::new(
            Opts::new(
                "coloc_observer_exclusive_drift_ratio",
                "A workload's exclusive throughput measured alone on a GPU (latest solo window) \
                 over the one its profile gives",
            ),
            &["gpu", "workload"],
        )
        .expect("valid metric");
        for reason in SkipReason::ALL {
            skipped.with_label_values(&[reason.as_str()]);
        }
        Self {
            windows,
            skipped,
            drift,
        }
    }

    pub fn window(&self, kind: WindowKind) {
        self.windows.with_label_values(&[kind.as_str()]).inc();
    }

    pub fn skip(&self, reason: SkipReason) {
        self.window(WindowKind::Skipped);
        self.skipped.with_label_values(&[reason.as_str()]).inc();
    }

    pub fn set_drift(&self, gpu: &str, workload: &str, ratio: f64) {
        self.drift.with_label_values(&[gpu, workload]).set(ratio);
    }

    pub fn windows(&self, kind: WindowKind) -> u64 {
        self.windows.with_label_values(&[kind.as_str()]).get()
    }

    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.skipped.with_label_values(&[reason.as_str()]).get()
    }

    pub fn drift(&self, gpu: &str, workload: &str) -> f64 {
        self.drift.with_label_values(&[gpu, workload]).get()
    }

    /// For the metrics endpoint's registry.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.windows.clone()),
            Box::new(self.skipped.clone()),
            Box::new(self.drift.clone()),
        ]
    }
}

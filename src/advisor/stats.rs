//! Counts of what the advisor did since the process started: reports by outcome, trainings
//! by outcome, profiling jobs by outcome. Plain atomics, read by the metrics endpoint when
//! it is scraped, so that the advisor needs nothing of the metrics layer.

use std::sync::atomic::{AtomicU64, Ordering};

/// What became of a ReportColocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    /// A new run was stored.
    Stored,
    /// The same run was stored before; nothing changed.
    Duplicate,
    /// The request was refused (invalid, or it names an unknown workload).
    Rejected,
}

/// What became of a training attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainingOutcome {
    Promoted,
    /// Fitted, judged worse than the champion and kept as a rejected version.
    Rejected,
    /// No model could be fitted (too few usable runs, degenerate data).
    Failed,
}

/// What became of one profiling attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    Profiled,
    WillRetry,
    Failed,
    Waiting,
    Cancelled,
    Interrupted,
}

#[derive(Debug, Default)]
pub struct Stats {
    reports: [AtomicU64; 3],
    trainings: [AtomicU64; 3],
    jobs: [AtomicU64; 6],
}

impl ReportOutcome {
    pub const ALL: [Self; 3] = [Self::Stored, Self::Duplicate, Self::Rejected];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Duplicate => "duplicate",
            Self::Rejected => "rejected",
        }
    }
}

impl TrainingOutcome {
    pub const ALL: [Self; 3] = [Self::Promoted, Self::Rejected, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Promoted => "promoted",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
        }
    }
}

impl JobOutcome {
    pub const ALL: [Self; 6] = [
        Self::Profiled,
        Self::WillRetry,
        Self::Failed,
        Self::Waiting,
        Self::Cancelled,
        Self::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Profiled => "profiled",
            Self::WillRetry => "will_retry",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
        }
    }
}

impl Stats {
    pub fn report(&self, outcome: ReportOutcome) {
        self.reports[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn training(&self, outcome: TrainingOutcome) {
        self.trainings[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn job(&self, outcome: JobOutcome) {
        self.jobs[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn reports(&self, outcome: ReportOutcome) -> u64 {
        self.reports[outcome as usize].load(Ordering::Relaxed)
    }

    pub fn trainings(&self, outcome: TrainingOutcome) -> u64 {
        self.trainings[outcome as usize].load(Ordering::Relaxed)
    }

    pub fn jobs(&self, outcome: JobOutcome) -> u64 {
        self.jobs[outcome as usize].load(Ordering::Relaxed)
    }
}

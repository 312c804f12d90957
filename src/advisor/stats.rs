//! Counts of what the advisor did since the process started: reports by outcome, trainings
//! by outcome, profiling jobs by outcome (in all, and per profiling agent). Plain atomics, read by the metrics endpoint when
//! it is scraped, so that the advisor needs nothing of the metrics layer.

use crate::sync::Unpoisoned;
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
    /// The holder's lease expired (or the job was claimed again) before it finished.
    LeaseLost,
}

#[derive(Debug, Default)]
pub struct Stats {
    reports: [AtomicU64; 3],
    trainings: [AtomicU64; 3],
    jobs: [AtomicU64; 7],
    /// Outcomes submitted by each agent, by agent id.
    agent_jobs: std::sync::Mutex<std::collections::BTreeMap<String, [u64; 7]>>,
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
    pub const ALL: [Self; 7] = [
        Self::Profiled,
        Self::WillRetry,
        Self::Failed,
        Self::Waiting,
        Self::Cancelled,
        Self::Interrupted,
        Self::LeaseLost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Profiled => "profiled",
            Self::WillRetry => "will_retry",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
            Self::LeaseLost => "lease_lost",
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

    /// An outcome an agent submitted (counted in [`jobs`](Self::jobs) too).
    pub fn agent_job(&self, agent: &str, outcome: JobOutcome) {
        self.job(outcome);
        let mut agents = self.agent_jobs.lock().unpoisoned();
        agents.entry(agent.to_string()).or_default()[outcome as usize] += 1;
    }

    /// Each agent's submitted outcomes, by agent id, in [`JobOutcome::ALL`]'s order.
    pub fn agent_jobs(&self) -> Vec<(String, [u64; 7])> {
        let agents = self.agent_jobs.lock().unpoisoned();
        agents
            .iter()
            .map(|(id, counts)| (id.clone(), *counts))
            .collect()
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

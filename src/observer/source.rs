//! Throughput sources: where each pod's throughput over a window comes from
//! ([`ThroughputSource`]: Prometheus, pushes), and the one rule that turns a series into a
//! mean or a counted reason to skip it ([`window_mean`]). A series that is missing, stale
//! or absurd is never stored.

use std::{future::Future, pin::Pin};

use super::timeline::Pod;
use crate::domain::MAX_THROUGHPUT;

/// The part of a window a mean is taken over: from `start_ms` (the window's start plus the
/// guard) to `end_ms` (its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start_ms: i64,
    pub end_ms: i64,
}

/// One value of a series: (milliseconds since the epoch, throughput).
pub type Sample = (i64, f64);

/// Why a pod's series gave no mean: the label of the skip counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// No value in the span (no series, or no source knows the pod or its workload).
    Missing,
    /// The last value is older than `observer.stale_secs` before the span's end.
    Stale,
    /// A value that cannot be a throughput (not finite, negative, above the physical bound)
    /// or a mean of zero.
    Absurd,
    /// The query matched several series: which one is the pod's is unknown.
    Ambiguous,
    /// The source could not be read (unreachable, an error answer).
    SourceFailed,
    /// The GPU model of the run is unknown to coloc, or a member's workload is not
    /// registered.
    Unknown,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Stale => "stale",
            Self::Absurd => "absurd",
            Self::Ambiguous => "ambiguous",
            Self::SourceFailed => "source_failed",
            Self::Unknown => "unknown",
        }
    }

    pub const ALL: [SkipReason; 6] = [
        Self::Missing,
        Self::Stale,
        Self::Absurd,
        Self::Ambiguous,
        Self::SourceFailed,
        Self::Unknown,
    ];
}

/// A source's answer for one pod: its values in the span (empty when it has none), or why
/// it could not say.
pub type SeriesResult = Result<Vec<Sample>, SkipReason>;

pub type SeriesFuture<'a> = Pin<Box<dyn Future<Output = SeriesResult> + Send + 'a>>;

/// Where throughputs come from.
pub trait ThroughputSource: Send + Sync {
    /// For logs and metrics.
    fn name(&self) -> &'static str;
    /// The pod's throughput values in `span`, in time order.
    fn series<'a>(&'a self, pod: &'a Pod, span: Span) -> SeriesFuture<'a>;
}

/// The mean throughput over `span`: the arithmetic mean of the values the source holds in
/// it (for Prometheus, the query's value at each step; for pushes, each pushed value).
/// Skipped when there is none, when the last is older than `stale_ms` before the end, or
/// when a value is absurd.
pub fn window_mean(samples: &[Sample], span: Span, stale_ms: i64) -> Result<f64, SkipReason> {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|(at, _)| *at >= span.start_ms && *at <= span.end_ms)
        .collect();
    let Some(last) = inside.last() else {
        return Err(SkipReason::Missing);
    };
    if inside
        .iter()
        .any(|(_, v)| !v.is_finite() || *v < 0.0 || *v > MAX_THROUGHPUT)
    {
        return Err(SkipReason::Absurd);
    }
    if last.0 < span.end_ms - stale_ms {
        return Err(SkipReason::Stale);
    }
    let mean = inside.iter().map(|(_, v)| v).sum::<f64>() / inside.len() as f64;
    if mean <= 0.0 {
        return Err(SkipReason::Absurd);
    }
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: Span = Span {
        start_ms: 1_000,
        end_ms: 5_000,
    };

    #[test]
    fn the_mean_is_over_the_values_inside_the_span() {
        let samples = [
            (0, 99.0),
            (1_000, 2.0),
            (3_000, 4.0),
            (5_000, 6.0),
            (6_000, 99.0),
        ];
        assert_eq!(window_mean(&samples, SPAN, 1_000), Ok(4.0));
    }

    #[test]
    fn missing_stale_and_absurd_series_are_skipped_with_their_reason() {
        assert_eq!(window_mean(&[], SPAN, 1_000), Err(SkipReason::Missing));
        assert_eq!(
            window_mean(&[(500, 1.0), (7_000, 1.0)], SPAN, 1_000),
            Err(SkipReason::Missing)
        );
        assert_eq!(
            window_mean(&[(1_000, 1.0), (3_000, 1.0)], SPAN, 1_000),
            Err(SkipReason::Stale)
        );
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
            assert_eq!(
                window_mean(&[(1_000, 1.0), (5_000, bad)], SPAN, 1_000),
                Err(SkipReason::Absurd)
            );
        }
        assert_eq!(
            window_mean(&[(1_000, 0.0), (5_000, 0.0)], SPAN, 1_000),
            Err(SkipReason::Absurd)
        );
    }
}

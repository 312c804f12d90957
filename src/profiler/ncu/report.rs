//! From the kernels of one profiled step to the KACE kernel metrics: which of the eight
//! metrics the output holds, their duration-weighted means, and the six kernel metrics of a
//! profile — only when every counted kernel has all eight.
//!
//! Choices:
//! - A kernel whose duration ncu printed as `n/a` carries no weight and is left out (and
//!   counted in [`NcuSummary::kernels_without_duration`]). Every other gap — a metric absent
//!   for some or all kernels, or `n/a` — makes the profile incomplete: inventing a 0 would
//!   bias the weighted means the models are trained on, so [`NcuTable::kernel_metrics`]
//!   refuses with [`NcuError::MissingMetrics`], naming each missing metric and how many
//!   kernels were read.
//! - The six kernel metrics: threads, compute, DRAM and memory throughput are the
//!   duration-weighted means of their metric; registers = mean of threads x registers per
//!   thread; static shared memory = mean of grid size x static shared memory per block.

use serde::Serialize;

use super::{
    metric::{Metric, NumberFormat},
    parse::{Kernel, Layout, NcuTable, Reading},
    NcuError,
};
use crate::domain::KernelMetrics;

/// A metric of the method that not every counted kernel has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingMetric {
    pub metric: Metric,
    /// Counted kernels that have a value for it.
    pub found_in: usize,
    pub kernels: usize,
}

impl std::fmt::Display for MissingMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.found_in == 0 {
            write!(f, "{}", self.metric)
        } else {
            write!(
                f,
                "{} (in {} of {} kernels)",
                self.metric, self.found_in, self.kernels
            )
        }
    }
}

/// What the output holds of one metric.
#[derive(Debug, Clone, Serialize)]
pub struct MetricSummary {
    pub metric: Metric,
    pub raw_name: &'static str,
    pub section_name: &'static str,
    /// The unit of `weighted_mean` (coloc's unit for the metric).
    pub unit: &'static str,
    /// The names under which the output holds it.
    pub found_as: Vec<&'static str>,
    /// Counted kernels with a value, and with `n/a`.
    pub kernels_with_value: usize,
    pub kernels_not_available: usize,
    /// The duration-weighted mean over the counted kernels, when every one of them has
    /// the metric and a duration (never for the duration itself: it is the weight).
    pub weighted_mean: Option<f64>,
}

/// Everything `coloc ncu` says about one output.
#[derive(Debug, Clone, Serialize)]
pub struct NcuSummary {
    pub layout: Layout,
    pub ncu_version: Option<String>,
    pub columns: usize,
    pub number_format: NumberFormat,
    /// Kernels read (distinct IDs of each process).
    pub kernels: usize,
    /// Kernels whose duration is `n/a`, left out of everything else.
    pub kernels_without_duration: usize,
    /// Sum of the counted kernels' durations, when all of them have one.
    pub total_duration_ns: Option<f64>,
    /// Percentages a little above 100 (ncu's rounding) read as 100.
    pub clamped_percentages: usize,
    /// Lines inside the table too short to be rows (program output, a cut line).
    pub skipped_rows: usize,
    pub metrics: Vec<MetricSummary>,
}

impl NcuTable {
    /// The kernels that carry weight: all but those whose duration is `n/a`.
    fn counted(&self) -> impl Iterator<Item = &Kernel> + Clone {
        self.kernels
            .iter()
            .filter(|k| k.reading(Metric::Duration) != Reading::NotAvailable)
    }

    /// The metrics that not every counted kernel has, in the order of [`Metric::ALL`].
    pub fn missing_metrics(&self) -> Vec<MissingMetric> {
        let counted = self.counted().count();
        Metric::ALL
            .into_iter()
            .filter_map(|metric| {
                let found_in = self.counted().filter(|k| k.value(metric).is_some()).count();
                (counted == 0 || found_in < counted).then_some(MissingMetric {
                    metric,
                    found_in,
                    kernels: counted,
                })
            })
            .collect()
    }

    /// Σ duration x value(kernel) / Σ duration over the counted kernels; `None` when a
    /// counted kernel lacks the duration or a value, or there is nothing to weigh.
    fn weighted_mean(&self, value: impl Fn(&Kernel) -> Option<f64>) -> Option<f64> {
        let mut weighted = 0.0;
        let mut total = 0.0;
        let mut any = false;
        for kernel in self.counted() {
            let duration = kernel.value(Metric::Duration)?;
            weighted += duration * value(kernel)?;
            total += duration;
            any = true;
        }
        (any && total > 0.0).then(|| weighted / total)
    }

    fn total_duration_ns(&self) -> Option<f64> {
        self.counted()
            .map(|k| k.value(Metric::Duration))
            .sum::<Option<f64>>()
            .filter(|_| self.counted().next().is_some())
    }

    /// The six kernel metrics of a profile, or why they cannot be built.
    pub fn kernel_metrics(&self) -> Result<KernelMetrics, NcuError> {
        if self.kernels.is_empty() {
            return Err(NcuError::NoKernels);
        }
        let missing = self.missing_metrics();
        if !missing.is_empty() {
            return Err(NcuError::MissingMetrics {
                kernels: self.kernels.len(),
                missing,
            });
        }
        let total = self.total_duration_ns().unwrap_or(0.0);
        if total.is_nan() || total <= 0.0 {
            return Err(NcuError::ZeroTotalDuration);
        }
        let mean = |value: fn(&Kernel) -> Option<f64>| {
            self.weighted_mean(value)
                .filter(|mean| mean.is_finite())
                .ok_or(NcuError::NotFinite)
        };
        let metrics = KernelMetrics {
            threads: mean(|k| k.value(Metric::Threads))?,
            compute_throughput_pct: mean(|k| k.value(Metric::SmThroughput))?,
            dram_throughput_pct: mean(|k| k.value(Metric::DramThroughput))?,
            memory_throughput_pct: mean(|k| k.value(Metric::MemoryThroughput))?,
            registers: mean(|k| {
                Some(k.value(Metric::Threads)? * k.value(Metric::RegistersPerThread)?)
            })?,
            static_shared_memory_bytes: mean(|k| {
                Some(k.value(Metric::GridSize)? * k.value(Metric::StaticSharedPerBlock)?)
            })?,
        };
        metrics.validate().map_err(NcuError::Implausible)?;
        Ok(metrics)
    }

    pub fn summary(&self) -> NcuSummary {
        let metrics = Metric::ALL
            .into_iter()
            .map(|metric| MetricSummary {
                metric,
                raw_name: metric.raw_name(),
                section_name: metric.section_name(),
                unit: metric.unit(),
                found_as: self.found_as(metric),
                kernels_with_value: self.counted().filter(|k| k.value(metric).is_some()).count(),
                kernels_not_available: self
                    .counted()
                    .filter(|k| k.reading(metric) == Reading::NotAvailable)
                    .count(),
                weighted_mean: if metric == Metric::Duration {
                    None
                } else {
                    self.weighted_mean(|k| k.value(metric))
                },
            })
            .collect();
        NcuSummary {
            layout: self.layout,
            ncu_version: self.ncu_version.clone(),
            columns: self.columns,
            number_format: self.number_format,
            kernels: self.kernels.len(),
            kernels_without_duration: self.kernels.len() - self.counted().count(),
            total_duration_ns: self.total_duration_ns(),
            clamped_percentages: self.clamped_percentages,
            skipped_rows: self.skipped_rows,
            metrics,
        }
    }
}

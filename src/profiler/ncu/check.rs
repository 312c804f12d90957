//! `coloc ncu FILE`: an operator's check of an Nsight Compute CSV before registering
//! workloads — what the parser read (layout, ncu version if named, kernels, which of the
//! eight metrics were found and under which names, their duration-weighted means), the
//! kernel metrics a profile would get, or the error that says what is missing. As text for
//! people, `--json` for scripts; the exit status is 0 only for a complete kernel profile.

use std::{io::Write, path::Path};

use serde::Serialize;

use super::{metric::NumberFormat, report::NcuSummary};
use crate::domain::KernelMetrics;

/// Prints the check of `file` (as JSON with `json`); an error (exit status 1) unless a
/// complete kernel profile can be built from it.
pub fn run_check(file: &Path, json: bool) -> anyhow::Result<()> {
    let label = file.display().to_string();
    let check = match super::read_output_file(file) {
        Ok(text) => NcuCheck::of(&label, &text),
        Err(error) => NcuCheck::unreadable(&label, &error),
    };
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &check)?;
        writeln!(out)?;
    } else {
        check.write_text(&mut out)?;
    }
    out.flush()?;
    match check.error {
        None => Ok(()),
        Some(error) => Err(anyhow::anyhow!("{label}: {error}")),
    }
}

/// The six kernel metrics, as `coloc ncu --json` prints them.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct KernelMetricsJson {
    pub threads: f64,
    pub compute_throughput_pct: f64,
    pub dram_throughput_pct: f64,
    pub memory_throughput_pct: f64,
    pub registers: f64,
    pub static_shared_memory_bytes: f64,
}

impl From<KernelMetrics> for KernelMetricsJson {
    fn from(m: KernelMetrics) -> Self {
        Self {
            threads: m.threads,
            compute_throughput_pct: m.compute_throughput_pct,
            dram_throughput_pct: m.dram_throughput_pct,
            memory_throughput_pct: m.memory_throughput_pct,
            registers: m.registers,
            static_shared_memory_bytes: m.static_shared_memory_bytes,
        }
    }
}

/// An operator's check of one ncu output: what was read, and whether a complete kernel
/// profile can be built from it.
#[derive(Debug, Clone, Serialize)]
pub struct NcuCheck {
    pub file: String,
    /// True only when `kernel_metrics` is there.
    pub complete: bool,
    /// Why no complete profile can be built.
    pub error: Option<String>,
    /// What was read; absent when the output holds no readable table.
    pub summary: Option<NcuSummary>,
    pub kernel_metrics: Option<KernelMetricsJson>,
}

impl NcuCheck {
    fn unreadable(file: &str, error: &super::NcuError) -> Self {
        Self {
            file: file.to_string(),
            complete: false,
            error: Some(error.to_string()),
            summary: None,
            kernel_metrics: None,
        }
    }

    pub fn of(file: &str, text: &str) -> Self {
        let table = match super::parse(text) {
            Ok(table) => table,
            Err(error) => return Self::unreadable(file, &error),
        };
        let built = table.kernel_metrics();
        Self {
            file: file.to_string(),
            complete: built.is_ok(),
            error: built.as_ref().err().map(ToString::to_string),
            summary: Some(table.summary()),
            kernel_metrics: built.ok().map(KernelMetricsJson::from),
        }
    }

    /// The check for people.
    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "file: {}", self.file)?;
        if let Some(summary) = &self.summary {
            writeln!(
                out,
                "layout: {}, {} columns, numbers written {}",
                summary.layout.describe(),
                summary.columns,
                match summary.number_format {
                    NumberFormat::DecimalPoint => "1,234.5",
                    NumberFormat::DecimalComma => "1.234,5",
                }
            )?;
            writeln!(
                out,
                "ncu version: {}",
                summary
                    .ncu_version
                    .as_deref()
                    .unwrap_or("not named in the output")
            )?;
            write!(out, "kernels: {}", summary.kernels)?;
            if summary.kernels_without_duration > 0 {
                write!(
                    out,
                    " ({} with duration n/a, left out)",
                    summary.kernels_without_duration
                )?;
            }
            match summary.total_duration_ns {
                Some(total) => writeln!(out, ", total duration {total} ns")?,
                None => writeln!(out)?,
            }
            if summary.clamped_percentages > 0 {
                writeln!(
                    out,
                    "percentages up to {}% read as 100%: {}",
                    100.0 + super::PERCENT_ROUNDING_MARGIN,
                    summary.clamped_percentages
                )?;
            }
            if summary.skipped_rows > 0 {
                writeln!(
                    out,
                    "lines inside the table too short to be rows, left out: {}",
                    summary.skipped_rows
                )?;
            }
            let counted = summary.kernels - summary.kernels_without_duration;
            writeln!(out, "the eight metrics of the method:")?;
            for m in &summary.metrics {
                let found = if m.found_as.is_empty() {
                    "absent".to_string()
                } else {
                    format!(
                        "in {} of {} kernels as {}{}",
                        m.kernels_with_value,
                        counted,
                        m.found_as.join(", "),
                        if m.kernels_not_available > 0 {
                            format!(" (n/a in {})", m.kernels_not_available)
                        } else {
                            String::new()
                        }
                    )
                };
                let mean = match m.weighted_mean {
                    Some(mean) => format!("; duration-weighted mean {mean} {}", m.unit),
                    None => String::new(),
                };
                writeln!(out, "  {:<32} {found}{mean}", m.section_name)?;
            }
        }
        match (&self.kernel_metrics, &self.error) {
            (Some(k), _) => {
                writeln!(
                    out,
                    "kernel metrics of the profile (duration-weighted means):"
                )?;
                writeln!(out, "  threads                    {}", k.threads)?;
                writeln!(
                    out,
                    "  compute_throughput_pct     {}",
                    k.compute_throughput_pct
                )?;
                writeln!(
                    out,
                    "  dram_throughput_pct        {}",
                    k.dram_throughput_pct
                )?;
                writeln!(
                    out,
                    "  memory_throughput_pct      {}",
                    k.memory_throughput_pct
                )?;
                writeln!(out, "  registers                  {}", k.registers)?;
                writeln!(
                    out,
                    "  static_shared_memory_bytes {}",
                    k.static_shared_memory_bytes
                )?;
                writeln!(out, "complete: a kernel profile can be built")
            }
            (None, Some(error)) => writeln!(out, "incomplete: {error}"),
            (None, None) => writeln!(out, "incomplete"),
        }
    }
}

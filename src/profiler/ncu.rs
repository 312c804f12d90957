//! Nsight Compute (`ncu`) for one profiled step: the command-line arguments coloc asks for,
//! the parser for `ncu --csv --page raw` output, and the KACE aggregation of the kernels of
//! that step into the six kernel metrics (duration-weighted means, weight =
//! `gpu__time_duration.sum` of each kernel).
//!
//! The raw page is one table: a header row of quoted column names (`"ID"`, `"Process ID"`,
//! `"Process Name"`, `"Host Name"`, `"Kernel Name"`, `"Context"`, `"Stream"`, `"Block Size"`,
//! `"Grid Size"`, `"Device"`, `"CC"`, then one column per metric), a second row holding each
//! column's unit (empty for the fixed columns; `"nsecond"`, `"usecond"`, `"%"`,
//! `"register/thread"`, `"byte/block"`, `"Kbyte/block"` ... for metrics), then one row per
//! kernel launch. Every field is quoted and numbers may carry thousands separators
//! (`"1,024"`). When ncu writes to stdout the workload's own output and ncu's `==PROF==` /
//! `==WARNING==` / `==ERROR==` lines share the stream, so the parser looks for the header
//! instead of assuming it is the first line, and ignores every line that is not a kernel row.
//!
//! Choices:
//! - A kernel whose duration is `n/a` (or empty) carries no weight and is skipped.
//! - Any other needed metric that is `n/a` (or empty) is an error: inventing a 0 would bias
//!   the weighted means that the model is trained on, so the profile is refused instead.
//! - Values are converted to nanoseconds and bytes using the units row (ncu scales units to
//!   the magnitude unless told `--print-units base`; [`ncu_args`] asks for base units but the
//!   parser converts either way). SI prefixes are decimal: ncu's `Kbyte` is 1,000 bytes.
//! - Error rows are named by their line number in the text handed to [`parse_raw_csv`].

use crate::domain::KernelMetrics;

/// The metrics coloc asks ncu for, in `--metrics` order.
pub const NCU_METRICS: [&str; 8] = [
    DURATION,
    THREAD_COUNT,
    SM_THROUGHPUT,
    DRAM_THROUGHPUT,
    MEMORY_THROUGHPUT,
    REGISTERS_PER_THREAD,
    GRID_SIZE,
    STATIC_SHARED_PER_BLOCK,
];

const DURATION: &str = "gpu__time_duration.sum";
const THREAD_COUNT: &str = "launch__thread_count";
const SM_THROUGHPUT: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
const DRAM_THROUGHPUT: &str = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed";
/// Older ncu versions and some GPUs name the DRAM throughput this way.
const DRAM_THROUGHPUT_ALTERNATIVE: &str = "dram__throughput.avg.pct_of_peak_sustained_elapsed";
const MEMORY_THROUGHPUT: &str = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed";
const REGISTERS_PER_THREAD: &str = "launch__registers_per_thread";
const GRID_SIZE: &str = "launch__grid_size";
const STATIC_SHARED_PER_BLOCK: &str = "launch__shared_mem_per_block_static";

const ID_COLUMN: &str = "ID";
const KERNEL_NAME_COLUMN: &str = "Kernel Name";

/// One kernel launch as ncu reported it, in nanoseconds and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelLaunch {
    pub name: String,
    pub duration_ns: f64,
    pub threads: f64,
    pub sm_pct: f64,
    pub dram_pct: f64,
    pub memory_pct: f64,
    pub registers_per_thread: f64,
    pub grid_size: f64,
    pub static_shared_per_block_bytes: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum NcuError {
    #[error("no ncu CSV header (a row starting with \"ID\") found in the output")]
    NoHeader,
    #[error("the ncu output has no column {column}")]
    MissingColumn { column: String },
    #[error("bad number {value:?} in row {row} column {column}")]
    BadNumber {
        row: usize,
        column: String,
        value: String,
    },
    #[error("ncu reported n/a in row {row} column {column}")]
    NotAvailable { row: usize, column: String },
    #[error("unknown unit {unit:?} in column {column}")]
    UnknownUnit { column: String, unit: String },
    #[error("ncu profiled no kernels (check the NVTX range or the launch filter)")]
    NoKernels,
    #[error("the profiled kernels have a total duration of zero")]
    ZeroTotalDuration,
    #[error("unreadable ncu CSV: {0}")]
    Csv(#[from] csv::Error),
}

/// Which launches of the workload make up the one profiled step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepSelector {
    /// Kernels launched inside the NVTX push/pop range of this name (default domain).
    Nvtx { range: String },
    /// Skip this many kernel launches, then profile this many.
    Launches { skip: u64, count: u64 },
}

/// The ncu arguments for one profiled step: `--csv --page raw --print-units base --metrics ...`
/// plus either the NVTX filter (`--nvtx --nvtx-include <range>/`) or
/// `--launch-skip N --launch-count M`. The workload's program and arguments follow them.
pub fn ncu_args(step: &StepSelector) -> Vec<String> {
    let mut args: Vec<String> = [
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--metrics",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    args.push(NCU_METRICS.join(","));
    match step {
        StepSelector::Nvtx { range } => {
            // ncu matches push/pop ranges by their stack path, which ends with a '/'.
            let include = if range.ends_with('/') {
                range.clone()
            } else {
                format!("{range}/")
            };
            args.extend(["--nvtx".to_string(), "--nvtx-include".to_string(), include]);
        }
        StepSelector::Launches { skip, count } => {
            args.extend([
                "--launch-skip".to_string(),
                skip.to_string(),
                "--launch-count".to_string(),
                count.to_string(),
            ]);
        }
    }
    args
}

/// Parses `ncu --csv --page raw` output (stdout may hold other lines before the header).
///
/// Returns the kernel launches in the order ncu listed them; kernels whose duration is n/a
/// are left out. Output in which ncu says it profiled no kernels is [`NcuError::NoKernels`].
pub fn parse_raw_csv(text: &str) -> Result<Vec<KernelLaunch>, NcuError> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(header_index) = lines.iter().position(|line| is_header_line(line)) else {
        if text.contains("No kernels were profiled") {
            return Err(NcuError::NoKernels);
        }
        return Err(NcuError::NoHeader);
    };

    // The table from the header on, without ncu's own messages; keep each line's number in
    // the original text so errors can point at it.
    let mut table = String::new();
    let mut line_numbers = Vec::new();
    for (index, line) in lines.iter().enumerate().skip(header_index) {
        if line.starts_with("==") {
            continue;
        }
        table.push_str(line);
        table.push('\n');
        line_numbers.push(index + 1);
    }

    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(table.as_bytes());
    let mut records = reader.records();
    let header = match records.next() {
        Some(record) => record?,
        None => return Err(NcuError::NoHeader),
    };
    let columns = Columns::locate(&header)?;

    let mut units: Option<csv::StringRecord> = None;
    let mut launches = Vec::new();
    for (record_index, record) in records.enumerate() {
        let record = record?;
        // +1: the header was the first record of the table.
        let row = line_numbers
            .get(record_index + 1)
            .copied()
            .unwrap_or(header_index + 1);
        if record.len() != header.len() {
            // Workload output printed inside the table, not a kernel row.
            continue;
        }
        let id = record.get(columns.id).unwrap_or("").trim();
        if id.is_empty() {
            // The units row (only the first such row counts).
            if units.is_none() && launches.is_empty() {
                units = Some(record);
            }
            continue;
        }
        if parse_number(id).is_none() {
            continue;
        }
        let unit_of = |column: usize| units.as_ref().and_then(|u| u.get(column)).unwrap_or("");
        let Some(duration_ns) = columns.duration.read_optional(&record, row, unit_of)? else {
            continue;
        };
        launches.push(KernelLaunch {
            name: columns
                .kernel_name
                .and_then(|column| record.get(column))
                .unwrap_or("")
                .to_string(),
            duration_ns,
            threads: columns.threads.read(&record, row, unit_of)?,
            sm_pct: columns.sm.read(&record, row, unit_of)?,
            dram_pct: columns.dram.read(&record, row, unit_of)?,
            memory_pct: columns.memory.read(&record, row, unit_of)?,
            registers_per_thread: columns.registers.read(&record, row, unit_of)?,
            grid_size: columns.grid.read(&record, row, unit_of)?,
            static_shared_per_block_bytes: columns.shared.read(&record, row, unit_of)?,
        });
    }
    Ok(launches)
}

/// Duration-weighted means over the kernels, as the KACE method defines them.
pub fn aggregate(kernels: &[KernelLaunch]) -> Result<KernelMetrics, NcuError> {
    if kernels.is_empty() {
        return Err(NcuError::NoKernels);
    }
    let total_ns: f64 = kernels.iter().map(|k| k.duration_ns).sum();
    if total_ns.is_nan() || total_ns <= 0.0 {
        return Err(NcuError::ZeroTotalDuration);
    }
    let weighted_mean = |value: fn(&KernelLaunch) -> f64| -> f64 {
        kernels
            .iter()
            .map(|k| k.duration_ns * value(k))
            .sum::<f64>()
            / total_ns
    };
    Ok(KernelMetrics {
        threads: weighted_mean(|k| k.threads),
        compute_throughput_pct: weighted_mean(|k| k.sm_pct),
        dram_throughput_pct: weighted_mean(|k| k.dram_pct),
        memory_throughput_pct: weighted_mean(|k| k.memory_pct),
        registers: weighted_mean(|k| k.threads * k.registers_per_thread),
        static_shared_memory_bytes: weighted_mean(|k| {
            k.grid_size * k.static_shared_per_block_bytes
        }),
    })
}

fn is_header_line(line: &str) -> bool {
    let trimmed = line.trim_start_matches('\u{feff}').trim_start();
    trimmed.starts_with("\"ID\",") || trimmed.starts_with("ID,")
}

/// How a metric's unit converts to coloc's unit.
#[derive(Debug, Clone, Copy)]
enum UnitKind {
    /// To nanoseconds.
    Time,
    /// To bytes (a `/block` suffix is allowed).
    Bytes,
    /// Percent of peak; no conversion.
    Percent,
    /// Threads, registers, blocks: only an SI prefix (`Kthread`) scales them.
    Count,
}

#[derive(Debug, Clone)]
struct MetricColumn {
    index: usize,
    name: &'static str,
    kind: UnitKind,
}

impl MetricColumn {
    fn read<'u>(
        &self,
        record: &csv::StringRecord,
        row: usize,
        unit_of: impl Fn(usize) -> &'u str,
    ) -> Result<f64, NcuError> {
        self.read_optional(record, row, unit_of)?
            .ok_or_else(|| NcuError::NotAvailable {
                row,
                column: self.name.to_string(),
            })
    }

    /// `None` when ncu reported n/a or nothing.
    fn read_optional<'u>(
        &self,
        record: &csv::StringRecord,
        row: usize,
        unit_of: impl Fn(usize) -> &'u str,
    ) -> Result<Option<f64>, NcuError> {
        let raw = record.get(self.index).unwrap_or("").trim();
        if raw.is_empty() || raw.eq_ignore_ascii_case("n/a") {
            return Ok(None);
        }
        let value = parse_number(raw).ok_or_else(|| NcuError::BadNumber {
            row,
            column: self.name.to_string(),
            value: raw.to_string(),
        })?;
        let unit = unit_of(self.index).trim();
        let scale = unit_scale(self.kind, unit).ok_or_else(|| NcuError::UnknownUnit {
            column: self.name.to_string(),
            unit: unit.to_string(),
        })?;
        Ok(Some(value * scale))
    }
}

struct Columns {
    id: usize,
    kernel_name: Option<usize>,
    duration: MetricColumn,
    threads: MetricColumn,
    sm: MetricColumn,
    dram: MetricColumn,
    memory: MetricColumn,
    registers: MetricColumn,
    grid: MetricColumn,
    shared: MetricColumn,
}

impl Columns {
    fn locate(header: &csv::StringRecord) -> Result<Self, NcuError> {
        let find = |name: &str| header.iter().position(|column| column.trim() == name);
        let metric = |name: &'static str, kind: UnitKind| -> Result<MetricColumn, NcuError> {
            let index = find(name).ok_or_else(|| NcuError::MissingColumn {
                column: name.to_string(),
            })?;
            Ok(MetricColumn { index, name, kind })
        };
        let dram = match find(DRAM_THROUGHPUT) {
            Some(index) => MetricColumn {
                index,
                name: DRAM_THROUGHPUT,
                kind: UnitKind::Percent,
            },
            None => match find(DRAM_THROUGHPUT_ALTERNATIVE) {
                Some(index) => MetricColumn {
                    index,
                    name: DRAM_THROUGHPUT_ALTERNATIVE,
                    kind: UnitKind::Percent,
                },
                None => {
                    return Err(NcuError::MissingColumn {
                        column: format!("{DRAM_THROUGHPUT} (or {DRAM_THROUGHPUT_ALTERNATIVE})"),
                    });
                }
            },
        };
        Ok(Self {
            id: find(ID_COLUMN).ok_or(NcuError::NoHeader)?,
            kernel_name: find(KERNEL_NAME_COLUMN),
            duration: metric(DURATION, UnitKind::Time)?,
            threads: metric(THREAD_COUNT, UnitKind::Count)?,
            sm: metric(SM_THROUGHPUT, UnitKind::Percent)?,
            dram,
            memory: metric(MEMORY_THROUGHPUT, UnitKind::Percent)?,
            registers: metric(REGISTERS_PER_THREAD, UnitKind::Count)?,
            grid: metric(GRID_SIZE, UnitKind::Count)?,
            shared: metric(STATIC_SHARED_PER_BLOCK, UnitKind::Bytes)?,
        })
    }
}

/// A number as ncu prints it: maybe with thousands separators (`1,024.5`).
fn parse_number(raw: &str) -> Option<f64> {
    let cleaned: String = raw.chars().filter(|c| *c != ',').collect();
    cleaned.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The factor from a value in `unit` to coloc's unit; `None` for a unit we do not know.
/// An empty unit (no units row, or none printed) means the base unit.
fn unit_scale(kind: UnitKind, unit: &str) -> Option<f64> {
    match kind {
        UnitKind::Time => match unit {
            "" | "nsecond" | "ns" => Some(1.0),
            "usecond" | "us" => Some(1e3),
            "msecond" | "ms" => Some(1e6),
            "second" | "s" => Some(1e9),
            _ => None,
        },
        UnitKind::Bytes => {
            let per_item = unit.split('/').next().unwrap_or("");
            match per_item {
                "" | "byte" => Some(1.0),
                "Kbyte" => Some(1e3),
                "Mbyte" => Some(1e6),
                "Gbyte" => Some(1e9),
                "Tbyte" => Some(1e12),
                _ => None,
            }
        }
        UnitKind::Percent => match unit {
            "" | "%" => Some(1.0),
            _ => None,
        },
        UnitKind::Count => {
            let mut chars = unit.chars();
            let prefix = chars.next();
            let next_is_lowercase = chars.next().is_some_and(|c| c.is_ascii_lowercase());
            let factor = match prefix {
                Some('K') if next_is_lowercase => 1e3,
                Some('M') if next_is_lowercase => 1e6,
                Some('G') if next_is_lowercase => 1e9,
                _ => 1.0,
            };
            Some(factor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_THREE_KERNELS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ncu/raw_page_three_kernels.csv"
    ));
    const FIXTURE_REAL_NO_KERNELS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ncu/real_no_kernels_profiled.csv"
    ));

    /// Header and units row in the raw-page layout, metric columns in any order.
    fn table(metric_columns: &[(&str, &str)], rows: &[&[&str]]) -> String {
        let fixed = [
            "ID",
            "Process ID",
            "Process Name",
            "Host Name",
            "Kernel Name",
            "Context",
            "Stream",
            "Block Size",
            "Grid Size",
            "Device",
            "CC",
        ];
        let quote = |cells: Vec<String>| {
            cells
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = String::new();
        let header: Vec<String> = fixed
            .iter()
            .map(|s| s.to_string())
            .chain(metric_columns.iter().map(|(name, _)| name.to_string()))
            .collect();
        out.push_str(&quote(header));
        out.push('\n');
        let units: Vec<String> = fixed
            .iter()
            .map(|_| String::new())
            .chain(metric_columns.iter().map(|(_, unit)| unit.to_string()))
            .collect();
        out.push_str(&quote(units));
        out.push('\n');
        for (id, values) in rows.iter().enumerate() {
            let cells: Vec<String> = [
                id.to_string(),
                "100".into(),
                "python3".into(),
                "127.0.0.1".into(),
                format!("kernel_{id}(float *, int)"),
                "1".into(),
                "7".into(),
                "(256, 1, 1)".into(),
                "(4, 1, 1)".into(),
                "0".into(),
                "9.0".into(),
            ]
            .into_iter()
            .chain(values.iter().map(|v| v.to_string()))
            .collect();
            out.push_str(&quote(cells));
            out.push('\n');
        }
        out
    }

    const BASE_UNITS: [(&str, &str); 8] = [
        (DURATION, "nsecond"),
        (THREAD_COUNT, "thread"),
        (SM_THROUGHPUT, "%"),
        (DRAM_THROUGHPUT, "%"),
        (MEMORY_THROUGHPUT, "%"),
        (REGISTERS_PER_THREAD, "register/thread"),
        (GRID_SIZE, ""),
        (STATIC_SHARED_PER_BLOCK, "byte/block"),
    ];

    fn assert_close(actual: f64, expected: f64) {
        let tolerance = 1e-9 * expected.abs().max(1.0);
        assert!(
            (actual - expected).abs() <= tolerance,
            "expected {expected}, got {actual}"
        );
    }

    #[test]
    fn ncu_metrics_lists_the_eight_kace_metrics() {
        assert_eq!(NCU_METRICS[0], "gpu__time_duration.sum");
        assert!(NCU_METRICS.contains(&"launch__shared_mem_per_block_static"));
        assert!(NCU_METRICS
            .contains(&"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"));
    }

    #[test]
    fn parse_reads_every_kernel_of_the_fixture_in_bytes_and_nanoseconds() {
        let kernels = parse_raw_csv(FIXTURE_THREE_KERNELS).unwrap();
        assert_eq!(kernels.len(), 3);
        assert!(kernels[0]
            .name
            .starts_with("void at::native::vectorized_elementwise_kernel<4,"));
        // "4.48" usecond, "262,144" threads, "2,048" blocks.
        assert_close(kernels[0].duration_ns, 4480.0);
        assert_close(kernels[0].threads, 262_144.0);
        assert_close(kernels[0].grid_size, 2048.0);
        assert_close(kernels[0].static_shared_per_block_bytes, 0.0);
        // "16.38" Kbyte/block is 16,380 bytes; the columns are read by name, not position.
        let gemm = &kernels[1];
        assert!(gemm.name.starts_with("sm90_xmma_gemm_f32f32"));
        assert_close(gemm.duration_ns, 120_160.0);
        assert_close(gemm.threads, 50_688.0);
        assert_close(gemm.sm_pct, 71.30);
        assert_close(gemm.dram_pct, 20.10);
        assert_close(gemm.memory_pct, 45.60);
        assert_close(gemm.registers_per_thread, 168.0);
        assert_close(gemm.grid_size, 132.0);
        assert_close(gemm.static_shared_per_block_bytes, 16_380.0);
    }

    #[test]
    fn aggregate_of_the_fixture_matches_the_hand_computed_weighted_means() {
        let metrics = aggregate(&parse_raw_csv(FIXTURE_THREE_KERNELS).unwrap()).unwrap();
        // Weights 4,480 + 120,160 + 15,360 = 140,000 ns.
        // threads = (4480*262144 + 120160*50688 + 15360*32768) / 140000
        //         = (1,174,405,120 + 6,090,670,080 + 503,316,480) / 140000 = 55,488.512
        assert_close(metrics.threads, 55_488.512);
        // memory = (4480*81.30 + 120160*45.60 + 15360*62.75) / 140000
        //        = (364,224 + 5,479,296 + 963,840) / 140000 = 48.624
        assert_close(metrics.memory_throughput_pct, 48.624);
        // shared = (4480*2048*0 + 120160*132*16380 + 15360*64*2050) / 140000
        //        = (259,805,145,600 + 2,015,232,000) / 140000 = 1,870,145.5542857...
        assert_close(
            metrics.static_shared_memory_bytes,
            261_820_377_600.0 / 140_000.0,
        );
    }

    #[test]
    fn aggregate_weights_each_kernel_by_its_duration() {
        // Kernel A: 100 ns, 1000 threads, 32 regs/thread, grid 4, 1024 B static shared/block.
        // Kernel B: 300 ns, 2000 threads, 64 regs/thread, grid 8, no static shared memory.
        let kernels = [
            KernelLaunch {
                name: "a".into(),
                duration_ns: 100.0,
                threads: 1000.0,
                sm_pct: 40.0,
                dram_pct: 10.0,
                memory_pct: 20.0,
                registers_per_thread: 32.0,
                grid_size: 4.0,
                static_shared_per_block_bytes: 1024.0,
            },
            KernelLaunch {
                name: "b".into(),
                duration_ns: 300.0,
                threads: 2000.0,
                sm_pct: 80.0,
                dram_pct: 50.0,
                memory_pct: 60.0,
                registers_per_thread: 64.0,
                grid_size: 8.0,
                static_shared_per_block_bytes: 0.0,
            },
        ];
        let metrics = aggregate(&kernels).unwrap();
        assert_close(metrics.threads, 1750.0); // (100*1000 + 300*2000) / 400
        assert_close(metrics.compute_throughput_pct, 70.0); // (100*40 + 300*80) / 400
        assert_close(metrics.dram_throughput_pct, 40.0); // (100*10 + 300*50) / 400
        assert_close(metrics.memory_throughput_pct, 50.0); // (100*20 + 300*60) / 400
        assert_close(metrics.registers, 104_000.0); // (100*32,000 + 300*128,000) / 400
        assert_close(metrics.static_shared_memory_bytes, 1024.0); // (100*4096 + 0) / 400
    }

    #[test]
    fn parse_skips_profiler_and_program_lines_before_and_inside_the_table() {
        let body = table(
            &BASE_UNITS,
            &[&["1000", "256", "50", "10", "20", "32", "4", "0"]],
        );
        let text = format!(
            "==PROF== Connected to process 100 (/usr/bin/python3)\n\
             epoch 0 loss 2.31\n\
             COLOC_THROUGHPUT 812.4 samples/s\n\
             ==WARNING== Found outstanding GPU clock reset, trying to revert...\n\
             {body}\
             a line the workload printed late\n\
             ==PROF== Disconnected from process 100\n"
        );
        let kernels = parse_raw_csv(&text).unwrap();
        assert_eq!(kernels.len(), 1);
        assert_eq!(kernels[0].name, "kernel_0(float *, int)");
        assert_close(kernels[0].duration_ns, 1000.0);
    }

    #[test]
    fn parse_reads_numbers_with_thousands_separators() {
        let text = table(
            &BASE_UNITS,
            &[&[
                "1,234,567.5",
                "1,048,576",
                "50",
                "10",
                "20",
                "32",
                "4,096",
                "1,024",
            ]],
        );
        let kernel = &parse_raw_csv(&text).unwrap()[0];
        assert_close(kernel.duration_ns, 1_234_567.5);
        assert_close(kernel.threads, 1_048_576.0);
        assert_close(kernel.grid_size, 4096.0);
        assert_close(kernel.static_shared_per_block_bytes, 1024.0);
    }

    #[test]
    fn parse_converts_scaled_units_to_bytes_and_nanoseconds() {
        let units = [
            (DURATION, "msecond"),
            (THREAD_COUNT, "Kthread"),
            (SM_THROUGHPUT, "%"),
            (DRAM_THROUGHPUT, "%"),
            (MEMORY_THROUGHPUT, "%"),
            (REGISTERS_PER_THREAD, "register/thread"),
            (GRID_SIZE, ""),
            (STATIC_SHARED_PER_BLOCK, "Kbyte/block"),
        ];
        let text = table(
            &units,
            &[&["1.5", "2.5", "50", "10", "20", "32", "4", "16.38"]],
        );
        let kernel = &parse_raw_csv(&text).unwrap()[0];
        assert_close(kernel.duration_ns, 1_500_000.0);
        assert_close(kernel.threads, 2500.0);
        assert_close(kernel.registers_per_thread, 32.0);
        assert_close(kernel.static_shared_per_block_bytes, 16_380.0);
    }

    #[test]
    fn parse_rejects_a_unit_it_does_not_know() {
        let mut units = BASE_UNITS;
        units[0] = (DURATION, "cycle");
        let text = table(&units, &[&["1", "256", "50", "10", "20", "32", "4", "0"]]);
        let error = parse_raw_csv(&text).unwrap_err();
        assert!(matches!(error, NcuError::UnknownUnit { ref unit, .. } if unit == "cycle"));
    }

    #[test]
    fn parse_accepts_the_dram_throughput_alternative_column_name() {
        let mut units = BASE_UNITS;
        units[3] = (DRAM_THROUGHPUT_ALTERNATIVE, "%");
        let text = table(
            &units,
            &[&["1000", "256", "50", "12.5", "20", "32", "4", "0"]],
        );
        assert_close(parse_raw_csv(&text).unwrap()[0].dram_pct, 12.5);
    }

    #[test]
    fn parse_reports_a_missing_metric_column_by_name() {
        let units: Vec<(&str, &str)> = BASE_UNITS
            .into_iter()
            .filter(|(name, _)| *name != REGISTERS_PER_THREAD)
            .collect();
        let text = table(&units, &[&["1000", "256", "50", "10", "20", "4", "0"]]);
        let error = parse_raw_csv(&text).unwrap_err();
        assert!(
            matches!(error, NcuError::MissingColumn { ref column } if column == REGISTERS_PER_THREAD)
        );
        assert!(error.to_string().contains("launch__registers_per_thread"));
    }

    #[test]
    fn parse_skips_a_kernel_whose_duration_is_not_available() {
        let text = table(
            &BASE_UNITS,
            &[
                &["n/a", "256", "50", "10", "20", "32", "4", "0"],
                &["2000", "512", "60", "10", "20", "32", "4", "0"],
            ],
        );
        let kernels = parse_raw_csv(&text).unwrap();
        assert_eq!(kernels.len(), 1);
        assert_eq!(kernels[0].name, "kernel_1(float *, int)");
    }

    #[test]
    fn parse_refuses_a_kernel_with_an_unavailable_metric() {
        let text = table(
            &BASE_UNITS,
            &[&["1000", "256", "50", "n/a", "20", "32", "4", "0"]],
        );
        let error = parse_raw_csv(&text).unwrap_err();
        // Line 3: header, units row, then this kernel.
        assert!(
            matches!(error, NcuError::NotAvailable { row: 3, ref column } if column == DRAM_THROUGHPUT),
            "{error:?}"
        );
    }

    #[test]
    fn parse_names_the_row_and_column_of_a_bad_number() {
        let text = table(
            &BASE_UNITS,
            &[&["1000", "lots", "50", "10", "20", "32", "4", "0"]],
        );
        let error = parse_raw_csv(&format!("==PROF== Connected\n{text}")).unwrap_err();
        assert!(
            matches!(error, NcuError::BadNumber { row: 4, ref column, ref value }
                if column == THREAD_COUNT && value == "lots"),
            "{error:?}"
        );
    }

    #[test]
    fn parse_without_a_header_is_an_error() {
        let error = parse_raw_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n").unwrap_err();
        assert!(matches!(error, NcuError::NoHeader));
    }

    #[test]
    fn parse_of_real_output_that_profiled_no_kernels_is_no_kernels() {
        let error = parse_raw_csv(FIXTURE_REAL_NO_KERNELS).unwrap_err();
        assert!(matches!(error, NcuError::NoKernels), "{error:?}");
    }

    #[test]
    fn aggregate_of_no_kernels_is_an_error() {
        let text = table(&BASE_UNITS, &[]);
        let kernels = parse_raw_csv(&text).unwrap();
        assert!(matches!(aggregate(&kernels), Err(NcuError::NoKernels)));
    }

    #[test]
    fn aggregate_of_kernels_without_duration_is_an_error() {
        let text = table(
            &BASE_UNITS,
            &[&["0", "256", "50", "10", "20", "32", "4", "0"]],
        );
        let kernels = parse_raw_csv(&text).unwrap();
        assert!(matches!(
            aggregate(&kernels),
            Err(NcuError::ZeroTotalDuration)
        ));
    }

    #[test]
    fn ncu_args_for_an_nvtx_range_include_the_push_pop_range_with_its_trailing_slash() {
        let args = ncu_args(&StepSelector::Nvtx {
            range: "coloc_step".into(),
        });
        let expected: Vec<String> = [
            "--csv",
            "--page",
            "raw",
            "--print-units",
            "base",
            "--metrics",
            "gpu__time_duration.sum,launch__thread_count,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,launch__shared_mem_per_block_static",
            "--nvtx",
            "--nvtx-include",
            "coloc_step/",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(args, expected);
        let already_slashed = ncu_args(&StepSelector::Nvtx {
            range: "coloc_step/".into(),
        });
        assert_eq!(already_slashed.last().unwrap(), "coloc_step/");
    }

    #[test]
    fn ncu_args_for_launches_skip_then_count() {
        let args = ncu_args(&StepSelector::Launches {
            skip: 1200,
            count: 350,
        });
        assert_eq!(
            &args[args.len() - 4..],
            ["--launch-skip", "1200", "--launch-count", "350"]
        );
        assert!(!args.contains(&"--nvtx".to_string()));
    }
}

//! Nsight Compute (`ncu`) for one profiled step: the command line coloc runs it with, the
//! parser of what it prints ([`parse`]: both of its CSV layouts), and the KACE aggregation
//! of the step's kernels into the six kernel metrics of a profile ([`report`]: duration-
//! weighted means, weight = `gpu__time_duration.sum` of each kernel).
//!
//! **The invocation** ([`ncu_args`]), decided from real recordings (`../shared/data/ncu-real`,
//! see docs/profiling.md): `ncu --csv --page details --print-units base
//! --target-processes all --log-file <file> --metrics <the 8 metrics> <step filter>
//! <program> <args>`.
//! - `--page details`, not `--page raw`: the details page is ncu's default and what every
//!   real recording we have holds (ncu 2021.2 to 2025.1, and KACE's own); with `--metrics` it
//!   prints the asked metrics under their raw names in the section `Command line profiler
//!   metrics`, exactly as the 162-kernel recording `actual-param_dropout_nsight162.csv`
//!   shows. No real raw-page recording with kernels could be found, so the parser's raw-page
//!   path rests on documentation alone (it is kept for files people bring to `coloc ncu`).
//! - `--metrics` with the eight raw names, not `--set full`: far cheaper (fewer replay
//!   passes), and the raw names are the same on every version (the section names are
//!   parsed too, for recordings made KACE's way).
//! - `--print-units base`: values in nanoseconds and bytes, not rounded to three digits
//!   after scaling (`6.75 us`); the parser converts any unit either way.
//! - `--log-file`: the table goes to a file of its own, so that nothing the workload prints
//!   can end up inside it, and the workload's stdout stays capped as before. The file is
//!   read up to [`MAX_OUTPUT_BYTES`] (an error beyond that, never a silent cut).
//! - `--target-processes all`: launch specs may start the training process through a
//!   launcher (a shell script, `torchrun`).
//! - One step: the NVTX push/pop range `coloc_step` (`--nvtx --nvtx-include coloc_step/`,
//!   as KACE selected `steps10/`), or `--launch-skip N --launch-count M` for workloads
//!   without the range (`profiler.ncu_launch_skip`, `ncu_launch_count`; the 2025.1
//!   recording was made with `--launch-skip 1 --launch-count 1`).

pub mod check;
pub mod metric;
pub mod parse;
pub mod report;

use std::path::Path;

pub use check::{run_check, NcuCheck};
pub use metric::{Metric, NumberFormat};
pub use parse::{parse, Kernel, Layout, NcuTable, Reading, PERCENT_ROUNDING_MARGIN};
pub use report::{MetricSummary, MissingMetric, NcuSummary};

/// The metrics coloc asks ncu for, in `--metrics` order.
pub const NCU_METRICS: [&str; 8] = [
    Metric::Duration.raw_name(),
    Metric::Threads.raw_name(),
    Metric::SmThroughput.raw_name(),
    Metric::DramThroughput.raw_name(),
    Metric::MemoryThroughput.raw_name(),
    Metric::RegistersPerThread.raw_name(),
    Metric::GridSize.raw_name(),
    Metric::StaticSharedPerBlock.raw_name(),
];

/// ncu output files larger than this are refused, not cut: at about 1 KB per row (kernel
/// names are long) and eight rows per kernel, a step of some 30,000 kernels.
pub const MAX_OUTPUT_BYTES: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum NcuError {
    #[error("no ncu CSV table (a header row with the columns ID and Kernel Name) in the output{}",
        .ncu_said.as_ref().map(|said| format!("; ncu said: {said}")).unwrap_or_default())]
    NoTable { ncu_said: Option<String> },
    #[error("ncu profiled no kernels (check the NVTX range or the launch filter)")]
    NoKernels,
    #[error(
        "{kernels} kernel(s) read, but the output lacks {} of the 8 metrics of the method: \
         {}; no complete kernel profile can be built from it",
        .missing.len(),
        .missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    MissingMetrics {
        kernels: usize,
        missing: Vec<MissingMetric>,
    },
    #[error("line {line}: unit {unit:?} does not measure {metric}")]
    UnknownUnit {
        line: u64,
        metric: Metric,
        unit: String,
    },
    #[error("line {line}: bad number {value:?} for {metric}")]
    BadNumber {
        line: u64,
        metric: Metric,
        value: String,
    },
    #[error(
        "line {line}: {metric} = {value} is out of range (nothing may be negative; a \
         percentage may pass 100 by at most {PERCENT_ROUNDING_MARGIN} from rounding)"
    )]
    OutOfRange {
        line: u64,
        metric: Metric,
        value: f64,
    },
    #[error("line {line}: {fields} fields, but the table has {columns} columns")]
    RowWidth {
        line: u64,
        fields: usize,
        columns: usize,
    },
    #[error("the counted kernels have a total duration of zero")]
    ZeroTotalDuration,
    #[error("the duration-weighted means overflow: the values are too large to be real")]
    NotFinite,
    /// The aggregate is finite but beyond the physical bounds every profile is held to
    /// (the same bounds as RegisterWorkload and the importer).
    #[error("the aggregated kernel metrics are beyond any real GPU: {}", .0.message)]
    Implausible(crate::domain::ValidationError),
    #[error("unreadable ncu CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds {bytes} bytes, more than the {MAX_OUTPUT_BYTES} an ncu output may")]
    TooLarge { path: String, bytes: u64 },
}

/// Reads an ncu output file (bytes that are not UTF-8 become U+FFFD).
pub fn read_output_file(path: &Path) -> Result<String, NcuError> {
    use std::io::Read;
    let read_error = |source| NcuError::Read {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let too_large = |bytes| NcuError::TooLarge {
        path: path.display().to_string(),
        bytes,
    };
    let size = file.metadata().map_err(read_error)?.len();
    if size > MAX_OUTPUT_BYTES {
        return Err(too_large(size));
    }
    // The size may grow while we read (or the path is a pipe): read one byte past the
    // limit at most.
    let mut bytes = Vec::new();
    file.take(MAX_OUTPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_OUTPUT_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Which launches of the workload make up the one profiled step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepSelector {
    /// Kernels launched inside the NVTX push/pop range of this name (default domain).
    Nvtx { range: String },
    /// Skip this many kernel launches, then profile this many.
    Launches { skip: u64, count: u64 },
}

/// The ncu arguments for one profiled step, writing its table to `log_file` (see the
/// module header for why each is there). The workload's program and arguments follow them.
pub fn ncu_args(step: &StepSelector, log_file: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--csv",
        "--page",
        "details",
        "--print-units",
        "base",
        "--target-processes",
        "all",
        "--log-file",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    args.push(log_file.to_string_lossy().into_owned());
    args.push("--metrics".into());
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

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_RAW_PAGE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ncu/raw_page_three_kernels.csv"
    ));
    const FIXTURE_DETAILS_PAGE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ncu/details_page_three_kernels.csv"
    ));
    const FIXTURE_REAL_NO_KERNELS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ncu/real_no_kernels_profiled.csv"
    ));

    const DURATION: &str = Metric::Duration.raw_name();
    const THREADS: &str = Metric::Threads.raw_name();
    const SM: &str = Metric::SmThroughput.raw_name();
    const DRAM: &str = Metric::DramThroughput.raw_name();
    const MEMORY: &str = Metric::MemoryThroughput.raw_name();
    const REGISTERS: &str = Metric::RegistersPerThread.raw_name();
    const GRID: &str = Metric::GridSize.raw_name();
    const SHARED: &str = Metric::StaticSharedPerBlock.raw_name();

    fn quote(cells: &[String]) -> String {
        cells
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(",")
    }

    const FIXED: [&str; 11] = [
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

    fn fixed_cells(id: usize) -> Vec<String> {
        vec![
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
    }

    /// A raw page: header, units row, one row per kernel; metric columns in any order.
    fn raw_page(metric_columns: &[(&str, &str)], rows: &[&[&str]]) -> String {
        let mut out = String::new();
        let header: Vec<String> = FIXED
            .iter()
            .map(|s| s.to_string())
            .chain(metric_columns.iter().map(|(name, _)| name.to_string()))
            .collect();
        out.push_str(&quote(&header));
        out.push('\n');
        let units: Vec<String> = FIXED
            .iter()
            .map(|_| String::new())
            .chain(metric_columns.iter().map(|(_, unit)| unit.to_string()))
            .collect();
        out.push_str(&quote(&units));
        out.push('\n');
        for (id, values) in rows.iter().enumerate() {
            let mut cells = fixed_cells(id);
            cells.extend(values.iter().map(|v| v.to_string()));
            out.push_str(&quote(&cells));
            out.push('\n');
        }
        out
    }

    /// A details page in ncu 2025.1's layout (20 columns): metric rows end after the
    /// value (ragged), rule rows carry an empty metric name.
    fn details_page(rows: &[(usize, &str, &str, &str, &str)]) -> String {
        let mut header: Vec<String> = FIXED.iter().map(|s| s.to_string()).collect();
        header.extend(
            [
                "Section Name",
                "Metric Name",
                "Metric Unit",
                "Metric Value",
                "Rule Name",
                "Rule Type",
                "Rule Description",
                "Estimated Speedup Type",
                "Estimated Speedup",
            ]
            .map(String::from),
        );
        let mut out = quote(&header) + "\n";
        for (id, section, name, unit, value) in rows {
            let mut cells = fixed_cells(*id);
            cells.extend([section, name, unit, value].map(|s| s.to_string()));
            out.push_str(&quote(&cells));
            out.push_str(",\n");
        }
        out
    }

    const BASE_UNITS: [(&str, &str); 8] = [
        (DURATION, "nsecond"),
        (THREADS, "thread"),
        (SM, "%"),
        (DRAM, "%"),
        (MEMORY, "%"),
        (REGISTERS, "register/thread"),
        (GRID, ""),
        (SHARED, "byte/block"),
    ];

    fn assert_close(actual: f64, expected: f64) {
        let tolerance = 1e-9 * expected.abs().max(1.0);
        assert!(
            (actual - expected).abs() <= tolerance,
            "expected {expected}, got {actual}"
        );
    }

    /// The three kernels of both fixtures, aggregated by hand (see the fixtures' README).
    fn assert_fixture_aggregate(metrics: &crate::domain::KernelMetrics) {
        // Weights 4,480 + 120,160 + 15,360 = 140,000 ns.
        // threads = (4480*262144 + 120160*50688 + 15360*32768) / 140000
        //         = (1,174,405,120 + 6,090,670,080 + 503,316,480) / 140000 = 55,488.512
        assert_close(metrics.threads, 55_488.512);
        // compute = (4480*12.50 + 120160*71.30 + 15360*35.00) / 140000
        //         = (56,000 + 8,567,408 + 537,600) / 140000 = 65.4357714285...
        assert_close(metrics.compute_throughput_pct, 9_161_008.0 / 140_000.0);
        // dram = (4480*80.25 + 120160*20.10 + 15360*60.50) / 140000
        //      = (359,520 + 2,415,216 + 929,280) / 140000 = 26.4572571428...
        assert_close(metrics.dram_throughput_pct, 3_704_016.0 / 140_000.0);
        // memory = (4480*81.30 + 120160*45.60 + 15360*62.75) / 140000
        //        = (364,224 + 5,479,296 + 963,840) / 140000 = 48.624
        assert_close(metrics.memory_throughput_pct, 48.624);
        // registers = (4480*262144*16 + 120160*50688*168 + 15360*32768*40) / 140000
        //           = (18,790,481,920 + 1,023,232,573,440 + 20,132,659,200) / 140000
        assert_close(metrics.registers, 1_062_155_714_560.0 / 140_000.0);
        // shared = (4480*2048*0 + 120160*132*16380 + 15360*64*2050) / 140000
        //        = (259,805,145,600 + 2,015,232,000) / 140000 = 1,870,145.5542857...
        assert_close(
            metrics.static_shared_memory_bytes,
            261_820_377_600.0 / 140_000.0,
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
    fn the_raw_page_fixture_is_read_in_bytes_and_nanoseconds() {
        let table = parse(FIXTURE_RAW_PAGE).unwrap();
        assert_eq!(table.layout, Layout::RawPage);
        assert_eq!(table.kernels.len(), 3);
        let kernels = &table.kernels;
        assert!(kernels[0]
            .name
            .starts_with("void at::native::vectorized_elementwise_kernel<4,"));
        // "4.48" usecond, "262,144" threads, "2,048" blocks.
        assert_close(kernels[0].value(Metric::Duration).unwrap(), 4480.0);
        assert_close(kernels[0].value(Metric::Threads).unwrap(), 262_144.0);
        assert_close(kernels[0].value(Metric::GridSize).unwrap(), 2048.0);
        assert_close(kernels[0].value(Metric::StaticSharedPerBlock).unwrap(), 0.0);
        // "16.38" Kbyte/block is 16,380 bytes; the columns are read by name, not position.
        let gemm = &kernels[1];
        assert!(gemm.name.starts_with("sm90_xmma_gemm_f32f32"));
        let expected = [
            (Metric::Duration, 120_160.0),
            (Metric::Threads, 50_688.0),
            (Metric::SmThroughput, 71.30),
            (Metric::DramThroughput, 20.10),
            (Metric::MemoryThroughput, 45.60),
            (Metric::RegistersPerThread, 168.0),
            (Metric::GridSize, 132.0),
            (Metric::StaticSharedPerBlock, 16_380.0),
        ];
        for (metric, value) in expected {
            assert_close(gemm.value(metric).unwrap(), value);
        }
    }

    #[test]
    fn both_fixtures_aggregate_to_the_hand_computed_weighted_means() {
        let raw = parse(FIXTURE_RAW_PAGE).unwrap();
        assert_fixture_aggregate(&raw.kernel_metrics().unwrap());
        let details = parse(FIXTURE_DETAILS_PAGE).unwrap();
        assert_eq!(details.layout, Layout::Details);
        assert_eq!(details.kernels.len(), 3);
        assert_fixture_aggregate(&details.kernel_metrics().unwrap());
    }

    #[test]
    fn aggregate_weights_each_kernel_by_its_duration() {
        // Kernel A: 100 ns, 1000 threads, 32 regs/thread, grid 4, 1024 B static shared/block.
        // Kernel B: 300 ns, 2000 threads, 64 regs/thread, grid 8, no static shared memory.
        let text = raw_page(
            &BASE_UNITS,
            &[
                &["100", "1000", "40", "10", "20", "32", "4", "1024"],
                &["300", "2000", "80", "50", "60", "64", "8", "0"],
            ],
        );
        let metrics = parse(&text).unwrap().kernel_metrics().unwrap();
        assert_close(metrics.threads, 1750.0); // (100*1000 + 300*2000) / 400
        assert_close(metrics.compute_throughput_pct, 70.0); // (100*40 + 300*80) / 400
        assert_close(metrics.dram_throughput_pct, 40.0); // (100*10 + 300*50) / 400
        assert_close(metrics.memory_throughput_pct, 50.0); // (100*20 + 300*60) / 400
        assert_close(metrics.registers, 104_000.0); // (100*32,000 + 300*128,000) / 400
        assert_close(metrics.static_shared_memory_bytes, 1024.0); // (100*4096 + 0) / 400
    }

    #[test]
    fn profiler_and_program_lines_before_and_inside_the_table_are_skipped() {
        let body = raw_page(
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
        let table = parse(&text).unwrap();
        assert_eq!(table.kernels.len(), 1);
        assert_eq!(table.skipped_rows, 0);
        assert_eq!(table.kernels[0].name, "kernel_0(float *, int)");
        assert_close(table.kernels[0].value(Metric::Duration).unwrap(), 1000.0);
    }

    #[test]
    fn a_row_wider_than_the_header_is_an_error_and_a_cut_line_is_counted() {
        let body = raw_page(
            &BASE_UNITS,
            &[&["1000", "256", "50", "10", "20", "32", "4", "0"]],
        );
        let wide = body.trim_end().to_string() + ",\"extra\"\n";
        let error = parse(&wide).unwrap_err();
        assert!(
            matches!(
                error,
                NcuError::RowWidth {
                    line: 3,
                    fields: 20,
                    columns: 19
                }
            ),
            "{error:?}"
        );
        let cut = format!("{body}\"1\",\"100\",\"pyth");
        let table = parse(&cut).unwrap();
        assert_eq!(table.kernels.len(), 1);
        assert_eq!(table.skipped_rows, 1);
        assert_eq!(table.summary().skipped_rows, 1);
    }

    #[test]
    fn numbers_with_thousands_separators_are_read() {
        let text = raw_page(
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
        let kernel = &parse(&text).unwrap().kernels[0];
        assert_close(kernel.value(Metric::Duration).unwrap(), 1_234_567.5);
        assert_close(kernel.value(Metric::Threads).unwrap(), 1_048_576.0);
        assert_close(kernel.value(Metric::GridSize).unwrap(), 4096.0);
        assert_close(kernel.value(Metric::StaticSharedPerBlock).unwrap(), 1024.0);
    }

    #[test]
    fn a_locale_with_a_decimal_comma_is_recognised_by_its_values() {
        // "27.595.520" can only be grouped thousands; then "6,75" is 6.75.
        let text = raw_page(
            &BASE_UNITS,
            &[&["27.595.520", "1.024", "6,75", "10", "20", "32", "4", "0"]],
        );
        let table = parse(&text).unwrap();
        assert_eq!(table.number_format, NumberFormat::DecimalComma);
        let kernel = &table.kernels[0];
        assert_close(kernel.value(Metric::Duration).unwrap(), 27_595_520.0);
        assert_close(kernel.value(Metric::Threads).unwrap(), 1024.0);
        assert_close(kernel.value(Metric::SmThroughput).unwrap(), 6.75);
    }

    #[test]
    fn scaled_units_are_converted_to_bytes_and_nanoseconds() {
        let units = [
            (DURATION, "msecond"),
            (THREADS, "Kthread"),
            (SM, "%"),
            (DRAM, "%"),
            (MEMORY, "%"),
            (REGISTERS, "register/thread"),
            (GRID, ""),
            (SHARED, "Kbyte/block"),
        ];
        let text = raw_page(
            &units,
            &[&["1.5", "2.5", "50", "10", "20", "32", "4", "16.38"]],
        );
        let kernel = &parse(&text).unwrap().kernels[0];
        assert_close(kernel.value(Metric::Duration).unwrap(), 1_500_000.0);
        assert_close(kernel.value(Metric::Threads).unwrap(), 2500.0);
        assert_close(kernel.value(Metric::RegistersPerThread).unwrap(), 32.0);
        assert_close(
            kernel.value(Metric::StaticSharedPerBlock).unwrap(),
            16_380.0,
        );
    }

    #[test]
    fn a_unit_that_does_not_measure_the_metric_is_an_error() {
        let mut units = BASE_UNITS;
        units[0] = (DURATION, "cycle");
        let text = raw_page(&units, &[&["1", "256", "50", "10", "20", "32", "4", "0"]]);
        let error = parse(&text).unwrap_err();
        assert!(
            matches!(error, NcuError::UnknownUnit { ref unit, metric: Metric::Duration, line: 3 }
                if unit == "cycle"),
            "{error:?}"
        );
    }

    #[test]
    fn the_dram_throughput_alternative_name_is_read() {
        let mut units = BASE_UNITS;
        units[3] = ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%");
        let text = raw_page(
            &units,
            &[&["1000", "256", "50", "12.5", "20", "32", "4", "0"]],
        );
        let table = parse(&text).unwrap();
        assert_close(
            table.kernels[0].value(Metric::DramThroughput).unwrap(),
            12.5,
        );
        assert_eq!(
            table.found_as(Metric::DramThroughput),
            ["dram__throughput.avg.pct_of_peak_sustained_elapsed"]
        );
    }

    #[test]
    fn a_missing_metric_column_is_named_with_the_kernel_count() {
        let units: Vec<(&str, &str)> = BASE_UNITS
            .into_iter()
            .filter(|(name, _)| *name != REGISTERS)
            .collect();
        let text = raw_page(
            &units,
            &[
                &["1000", "256", "50", "10", "20", "4", "0"],
                &["1000", "256", "50", "10", "20", "4", "0"],
            ],
        );
        let error = parse(&text).unwrap().kernel_metrics().unwrap_err();
        let NcuError::MissingMetrics { kernels, missing } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*kernels, 2);
        assert_eq!(
            missing.iter().map(|m| m.metric).collect::<Vec<_>>(),
            [Metric::RegistersPerThread]
        );
        assert_eq!(
            error.to_string(),
            "2 kernel(s) read, but the output lacks 1 of the 8 metrics of the method: \
             launch__registers_per_thread (\"Registers Per Thread\"); no complete kernel \
             profile can be built from it"
        );
    }

    #[test]
    fn a_kernel_whose_duration_is_not_available_is_left_out() {
        let text = raw_page(
            &BASE_UNITS,
            &[
                &["n/a", "256", "50", "10", "20", "32", "4", "0"],
                &["2000", "512", "60", "10", "20", "32", "4", "0"],
            ],
        );
        let table = parse(&text).unwrap();
        assert_eq!(table.kernels.len(), 2);
        let summary = table.summary();
        assert_eq!(summary.kernels_without_duration, 1);
        assert_eq!(summary.total_duration_ns, Some(2000.0));
        assert_close(table.kernel_metrics().unwrap().threads, 512.0);
    }

    #[test]
    fn a_kernel_with_an_unavailable_metric_makes_the_profile_incomplete() {
        let text = raw_page(
            &BASE_UNITS,
            &[
                &["1000", "256", "50", "n/a", "20", "32", "4", "0"],
                &["1000", "256", "50", "10", "20", "32", "4", "0"],
            ],
        );
        let table = parse(&text).unwrap();
        assert_eq!(
            table.kernels[0].reading(Metric::DramThroughput),
            Reading::NotAvailable
        );
        let error = table.kernel_metrics().unwrap_err();
        assert!(
            error.to_string().contains(
                "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed (\"DRAM Throughput\") \
                 (in 1 of 2 kernels)"
            ),
            "{error}"
        );
        assert_eq!(
            table.summary().metrics[Metric::DramThroughput.index()].kernels_not_available,
            1
        );
    }

    #[test]
    fn a_bad_number_is_named_by_line_and_metric() {
        let text = raw_page(
            &BASE_UNITS,
            &[&["1000", "lots", "50", "10", "20", "32", "4", "0"]],
        );
        let error = parse(&format!("==PROF== Connected\n{text}")).unwrap_err();
        assert!(
            matches!(error, NcuError::BadNumber { line: 4, metric: Metric::Threads, ref value }
                if value == "lots"),
            "{error:?}"
        );
    }

    #[test]
    fn a_percentage_within_rounding_above_100_is_read_as_100_and_beyond_is_an_error() {
        let text = raw_page(
            &BASE_UNITS,
            &[&["1000", "256", "100.3", "101", "20", "32", "4", "0"]],
        );
        let table = parse(&text).unwrap();
        assert_eq!(table.clamped_percentages, 2);
        let metrics = table.kernel_metrics().unwrap();
        assert_eq!(metrics.compute_throughput_pct, 100.0);
        assert_eq!(metrics.dram_throughput_pct, 100.0);
        metrics.validate().unwrap();

        let text = raw_page(
            &BASE_UNITS,
            &[&["1000", "256", "50", "101.5", "20", "32", "4", "0"]],
        );
        let error = parse(&text).unwrap_err();
        assert!(
            matches!(error, NcuError::OutOfRange { metric: Metric::DramThroughput, value, .. }
                if value == 101.5),
            "{error:?}"
        );
        let text = raw_page(
            &BASE_UNITS,
            &[&["1000", "-256", "50", "10", "20", "32", "4", "0"]],
        );
        assert!(matches!(
            parse(&text).unwrap_err(),
            NcuError::OutOfRange {
                metric: Metric::Threads,
                ..
            }
        ));
    }

    #[test]
    fn output_without_a_table_is_an_error_that_quotes_ncu() {
        let error = parse("==ERROR== ERR_NVGPUCTRPERM - no permission\n").unwrap_err();
        assert!(
            matches!(error, NcuError::NoTable { ncu_said: Some(ref said) }
                if said.contains("ERR_NVGPUCTRPERM")),
            "{error:?}"
        );
        assert!(error
            .to_string()
            .contains("ncu said: ==ERROR== ERR_NVGPUCTRPERM"));
    }

    #[test]
    fn real_output_that_profiled_no_kernels_is_no_kernels() {
        let error = parse(FIXTURE_REAL_NO_KERNELS).unwrap_err();
        assert!(matches!(error, NcuError::NoKernels), "{error:?}");
    }

    #[test]
    fn a_table_without_kernel_rows_has_no_kernels() {
        let text = raw_page(&BASE_UNITS, &[]);
        let table = parse(&text).unwrap();
        assert!(matches!(table.kernel_metrics(), Err(NcuError::NoKernels)));
    }

    #[test]
    fn kernels_without_duration_are_an_error() {
        let text = raw_page(
            &BASE_UNITS,
            &[&["0", "256", "50", "10", "20", "32", "4", "0"]],
        );
        let table = parse(&text).unwrap();
        assert!(matches!(
            table.kernel_metrics(),
            Err(NcuError::ZeroTotalDuration)
        ));
    }

    #[test]
    fn values_too_large_to_average_are_refused_not_stored_as_infinity() {
        let text = raw_page(
            &BASE_UNITS,
            &[&["1e300", "1e300", "50", "10", "20", "32", "4", "0"]],
        );
        let table = parse(&text).unwrap();
        assert!(matches!(table.kernel_metrics(), Err(NcuError::NotFinite)));
    }

    #[test]
    fn the_details_page_reads_raw_and_section_names_and_skips_rule_and_body_item_rows() {
        let text = details_page(&[
            (
                0,
                "Command line profiler metrics",
                DURATION,
                "nsecond",
                "2,000",
            ),
            (0, "GPU Speed Of Light Throughput", "Duration", "us", "9.99"),
            (
                0,
                "GPU Speed Of Light Throughput",
                "Compute (SM) Throughput",
                "%",
                "40",
            ),
            (
                0,
                "GPU Speed Of Light Throughput",
                "DRAM Throughput",
                "%",
                "100.4",
            ),
            (
                0,
                "GPU Speed Of Light Throughput",
                "Memory Throughput",
                "%",
                "30",
            ),
            (
                0,
                "Memory Workload Analysis",
                "Memory Throughput",
                "Gbyte/s",
                "345.14",
            ),
            (0, "Launch Statistics", "Threads", "thread", "1,024"),
            (
                0,
                "Launch Statistics",
                "Registers Per Thread",
                "register/thread",
                "32",
            ),
            (0, "Launch Statistics", "Grid Size", "", "8"),
            (
                0,
                "Launch Statistics",
                "Static Shared Memory Per Block",
                "Kbyte/block",
                "1.02",
            ),
            (0, "SpeedOfLight", "", "", ""),
        ]);
        let table = parse(&text).unwrap();
        assert_eq!(table.layout, Layout::Details);
        assert_eq!(table.columns, 20);
        assert_eq!(table.kernels.len(), 1);
        let kernel = &table.kernels[0];
        // The raw duration wins over the section's rounded one.
        assert_eq!(kernel.value(Metric::Duration), Some(2000.0));
        assert_eq!(kernel.value(Metric::DramThroughput), Some(100.0));
        assert_eq!(kernel.value(Metric::MemoryThroughput), Some(30.0));
        assert_eq!(kernel.value(Metric::StaticSharedPerBlock), Some(1020.0));
        // Both names are reported; the value is the raw one's.
        assert_eq!(
            table.found_as(Metric::Duration),
            ["gpu__time_duration.sum", "Duration"]
        );
        assert_eq!(table.found_as(Metric::Threads), ["Threads"]);
        let metrics = table.kernel_metrics().unwrap();
        assert_eq!(metrics.registers, 32_768.0);
        assert_eq!(metrics.static_shared_memory_bytes, 8160.0);

        // With `--print-details all`, rows with a body item label are sub-items.
        let with_body_items = text
            .replacen(
                "\"Metric Value\"",
                "\"Metric Value\",\"Body Item Label\"",
                1,
            )
            .replace("\"1,024\",\n", "\"1,024\",\"\",\n");
        let sub_item = with_body_items.replace(
            "\"Launch Statistics\",\"Threads\",\"thread\",\"1,024\",\"\",\n",
            "\"Launch Statistics\",\"Threads\",\"thread\",\"1,024\",\"\",\n\
             \"0\",\"100\",\"python3\",\"127.0.0.1\",\"kernel_0(float *, int)\",\"1\",\"7\",\
             \"(256, 1, 1)\",\"(4, 1, 1)\",\"0\",\"9.0\",\"Launch Statistics\",\"Threads\",\
             \"thread\",\"7\",\"a body item\",\n",
        );
        let table = parse(&sub_item).unwrap();
        assert_eq!(table.kernels[0].value(Metric::Threads), Some(1024.0));
    }

    #[test]
    fn kernels_of_the_details_page_are_told_apart_by_their_id() {
        let mut rows = Vec::new();
        for id in 0..3 {
            rows.push((
                id,
                "Command line profiler metrics",
                DURATION,
                "nsecond",
                "100",
            ));
            rows.push((id, "Command line profiler metrics", SM, "%", "10"));
        }
        let table = parse(&details_page(&rows)).unwrap();
        assert_eq!(table.kernels.len(), 3);
        assert_eq!(
            table.kernels.iter().map(|k| k.id).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        let error = table.kernel_metrics().unwrap_err();
        assert!(error
            .to_string()
            .starts_with("3 kernel(s) read, but the output lacks 6 of"));
    }

    #[test]
    fn the_ncu_version_is_read_from_a_version_line_outside_the_table() {
        let text = format!(
            "NVIDIA (R) Nsight Compute Command Line Profiler\n\
             Copyright (c) 2018-2025 NVIDIA Corporation\n\
             Version 2025.1.1.0 (build 35528883) (public-release)\n{}",
            raw_page(&BASE_UNITS, &[])
        );
        assert_eq!(
            parse(&text).unwrap().ncu_version.as_deref(),
            Some("2025.1.1.0")
        );
        assert_eq!(parse(FIXTURE_RAW_PAGE).unwrap().ncu_version, None);
    }

    #[test]
    fn ncu_args_ask_for_the_details_page_in_base_units_into_the_log_file() {
        let args = ncu_args(
            &StepSelector::Nvtx {
                range: "coloc_step".into(),
            },
            Path::new("/tmp/job/ncu.csv"),
        );
        let expected: Vec<String> = [
            "--csv",
            "--page",
            "details",
            "--print-units",
            "base",
            "--target-processes",
            "all",
            "--log-file",
            "/tmp/job/ncu.csv",
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
        let already_slashed = ncu_args(
            &StepSelector::Nvtx {
                range: "coloc_step/".into(),
            },
            Path::new("x"),
        );
        assert_eq!(already_slashed.last().unwrap(), "coloc_step/");
    }

    #[test]
    fn ncu_args_for_launches_skip_then_count() {
        let args = ncu_args(
            &StepSelector::Launches {
                skip: 1200,
                count: 350,
            },
            Path::new("x"),
        );
        assert_eq!(
            &args[args.len() - 4..],
            ["--launch-skip", "1200", "--launch-count", "350"]
        );
        assert!(!args.contains(&"--nvtx".to_string()));
    }

    #[test]
    fn an_output_file_larger_than_the_limit_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.csv");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_OUTPUT_BYTES + 1).unwrap();
        assert!(matches!(
            read_output_file(&path),
            Err(NcuError::TooLarge { bytes, .. }) if bytes == MAX_OUTPUT_BYTES + 1
        ));
        assert!(matches!(
            read_output_file(&dir.path().join("absent.csv")),
            Err(NcuError::Read { .. })
        ));
    }
}

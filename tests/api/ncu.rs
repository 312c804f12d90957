//! The Nsight Compute parser on real recordings (`../shared/data/ncu-real`, read in place;
//! see its README), and `coloc ncu FILE`, the operator's check, run as the built binary.
//!
//! Also the three recordings coloc's own worker made on an H100 (`tests/fixtures/ncu/h100_*`,
//! the worker's exact command; see that folder's README): the only real files that hold all
//! eight metrics, so the only real complete profiles.
//!
//! Expected values come from `tests/fixtures/ncu/expected.py`, a separate reading of the
//! same files with Python's csv module (units honoured), run as
//! `python3 tests/fixtures/ncu/expected.py ../shared/data/ncu-real/*.csv
//! tests/fixtures/ncu/h100_*.csv tests/fixtures/ncu/details_page_three_kernels.csv`; its
//! printed numbers are pasted below.

use std::path::{Path, PathBuf};

use coloc::{
    domain::KernelMetrics,
    profiler::ncu::{self, Layout, Metric, NcuError, NcuTable, NumberFormat},
};

fn real(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/ncu-real")
        .join(file)
}

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ncu")
        .join(file)
}

const DROPOUT: &str = "actual-param_dropout_nsight162.csv";
const SAM: &str = "actual-param_sam_flashattn_nsight.csv";
const LLM_PERF: &str = "llm-perf-opt_kernel_0001_ncu.details.csv";

fn table(path: &Path) -> NcuTable {
    let text = ncu::read_output_file(path).unwrap();
    ncu::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-12 * expected.abs().max(1.0),
        "expected {expected}, got {actual}"
    );
}

fn missing(table: &NcuTable) -> (usize, Vec<(Metric, usize)>) {
    match table.kernel_metrics() {
        Err(NcuError::MissingMetrics { kernels, missing }) => (
            kernels,
            missing.iter().map(|m| (m.metric, m.found_in)).collect(),
        ),
        other => panic!("expected missing metrics, got {other:?}"),
    }
}

/// The names under which the output holds each metric, in the order of `Metric::ALL`.
fn assert_found_as(table: &NcuTable, expected: [&[&str]; 8]) {
    for (metric, names) in Metric::ALL.into_iter().zip(expected) {
        assert_eq!(table.found_as(metric), names, "{metric}");
    }
}

const SM: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
const MEMORY: &str = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed";

const LAUNCH_METRICS: [Metric; 4] = [
    Metric::Threads,
    Metric::RegistersPerThread,
    Metric::GridSize,
    Metric::StaticSharedPerBlock,
];

#[test]
fn the_162_kernel_recording_gives_its_throughput_means_and_names_the_four_launch_metrics_it_lacks()
{
    let table = table(&real(DROPOUT));
    assert_eq!(table.layout, Layout::Details);
    assert_eq!(table.columns, 12);
    assert_eq!(table.number_format, NumberFormat::DecimalPoint);
    assert_eq!(table.kernels.len(), 162);
    assert!(table.kernels[0]
        .name
        .starts_with("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<double,"));
    // The first kernel's duration is printed "11,744" nsecond.
    assert_eq!(table.kernels[0].value(Metric::Duration), Some(11_744.0));
    assert_found_as(
        &table,
        [
            &["gpu__time_duration.sum"],
            &[],
            &[SM],
            &["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"],
            &[MEMORY],
            &[],
            &[],
            &[],
        ],
    );

    let summary = table.summary();
    assert_eq!(summary.kernels, 162);
    assert_eq!(summary.kernels_without_duration, 0);
    // expected.py: "duration in 162 of 162 kernels; total 5689984.0 ns", then the
    // duration-weighted means 21.613517085461062 (sm), 56.015996895597596 (dram),
    // 60.89780577238885 (memory).
    assert_close(summary.total_duration_ns.unwrap(), 5_689_984.0);
    let mean = |metric: Metric| summary.metrics[metric.index()].weighted_mean;
    assert_close(mean(Metric::SmThroughput).unwrap(), 21.613517085461062);
    assert_close(mean(Metric::DramThroughput).unwrap(), 56.015996895597596);
    assert_close(mean(Metric::MemoryThroughput).unwrap(), 60.89780577238885);
    for metric in LAUNCH_METRICS {
        assert_eq!(summary.metrics[metric.index()].kernels_with_value, 0);
        assert_eq!(mean(metric), None);
    }

    let (kernels, missing) = missing(&table);
    assert_eq!(kernels, 162);
    assert_eq!(missing, LAUNCH_METRICS.map(|m| (m, 0)));
    let message = table.kernel_metrics().unwrap_err().to_string();
    assert!(
        message.starts_with(
            "162 kernel(s) read, but the output lacks 4 of the 8 metrics of the method: \
             launch__thread_count (\"Threads\"), launch__registers_per_thread"
        ),
        "{message}"
    );
}

#[test]
fn the_cuda_11_4_recording_gives_each_kernels_launch_statistics_and_names_duration_and_dram_as_missing(
) {
    let table = table(&real(SAM));
    assert_eq!(table.layout, Layout::Details);
    assert_eq!(table.columns, 15);
    assert_eq!(table.kernels.len(), 9);
    assert!(table.kernels[7]
        .name
        .starts_with("void fmha_fwd_loop_kernel<"));
    assert!(table.kernels[8]
        .name
        .contains("cutlass_80_wmma_tensorop_f16"));
    // expected.py, "per kernel" (no duration: nothing can be weighted).
    let per_kernel: [(Metric, [f64; 9]); 6] = [
        (
            Metric::Threads,
            [
                196608.0, 768.0, 65536.0, 256.0, 114688.0, 14336.0, 128.0, 327680.0, 14336.0,
            ],
        ),
        (
            Metric::SmThroughput,
            [39.39, 0.34, 20.31, 0.12, 35.32, 11.52, 0.0, 28.47, 8.45],
        ),
        (
            Metric::MemoryThroughput,
            [2.99, 0.8, 1.6, 0.81, 2.69, 18.43, 0.77, 31.13, 16.79],
        ),
        (
            Metric::RegistersPerThread,
            [48.0, 48.0, 48.0, 48.0, 37.0, 96.0, 16.0, 125.0, 94.0],
        ),
        (
            Metric::GridSize,
            [768.0, 3.0, 256.0, 1.0, 448.0, 112.0, 2.0, 2560.0, 112.0],
        ),
        (Metric::StaticSharedPerBlock, [0.0; 9]),
    ];
    for (metric, expected) in per_kernel {
        let read: Vec<f64> = table
            .kernels
            .iter()
            .map(|k| k.value(metric).unwrap())
            .collect();
        assert_eq!(read, expected, "{metric}");
    }
    // Launch statistics under KACE's section names, throughputs under their raw names.
    assert_found_as(
        &table,
        [
            &[],
            &["Threads"],
            &[SM],
            &[],
            &[MEMORY],
            &["Registers Per Thread"],
            &["Grid Size"],
            &["Static Shared Memory Per Block"],
        ],
    );
    let summary = table.summary();
    assert_eq!(summary.total_duration_ns, None);
    assert!(summary.metrics.iter().all(|m| m.weighted_mean.is_none()));

    let (kernels, missing) = missing(&table);
    assert_eq!(kernels, 9);
    assert_eq!(
        missing,
        [(Metric::Duration, 0), (Metric::DramThroughput, 0)],
        "no duration and no DRAM throughput, as the data's README says"
    );
}

#[test]
fn the_ncu_2025_recording_reads_microseconds_the_dram_alternative_and_the_section_memory_throughput(
) {
    let table = table(&real(LLM_PERF));
    assert_eq!(table.layout, Layout::Details);
    assert_eq!(table.columns, 20);
    assert_eq!(
        table.kernels.len(),
        1,
        "44 metric rows and 4 rule rows, one kernel"
    );
    let kernel = &table.kernels[0];
    // expected.py: total 6750.0 ns ("6.75" us); sm 9.15, dram 19.66, memory 19.66.
    assert_close(kernel.value(Metric::Duration).unwrap(), 6750.0);
    assert_close(kernel.value(Metric::SmThroughput).unwrap(), 9.15);
    assert_close(kernel.value(Metric::DramThroughput).unwrap(), 19.66);
    // Memory Throughput: the speed-of-light percentage, not the 345.14 Gbyte/s of the
    // memory workload analysis.
    assert_close(kernel.value(Metric::MemoryThroughput).unwrap(), 19.66);
    // Each value comes from the first name: the raw one where the page has both.
    assert_found_as(
        &table,
        [
            &["gpu__time_duration.sum", "Duration"],
            &[],
            &[SM, "Compute (SM) Throughput"],
            &[
                "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "DRAM Throughput",
            ],
            &["Memory Throughput"],
            &[],
            &[],
            &[],
        ],
    );
    let summary = table.summary();
    assert_close(
        summary.metrics[Metric::MemoryThroughput.index()]
            .weighted_mean
            .unwrap(),
        19.66,
    );

    let (kernels, missing) = missing(&table);
    assert_eq!(kernels, 1);
    assert_eq!(missing, LAUNCH_METRICS.map(|m| (m, 0)));
}

const H100_BMM: &str = "h100_bmm_nvtx_details.csv";
const H100_BERT: &str = "h100_bert_encoder_nvtx_details.csv";
const H100_GPT: &str = "h100_gpt_decoder_launch_count_details.csv";

/// The raw names `--metrics` puts in the section `Command line profiler metrics`, in the
/// order of `Metric::ALL`: what the worker's command gets from ncu 2025.3.
const RAW_NAMES: [&[&str]; 8] = [
    &["gpu__time_duration.sum"],
    &["launch__thread_count"],
    &[SM],
    &["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"],
    &[MEMORY],
    &["launch__registers_per_thread"],
    &["launch__grid_size"],
    &["launch__shared_mem_per_block_static"],
];

/// The profile's six kernel metrics against expected.py's figures, in its order: threads,
/// sm, dram, memory (duration-weighted means), then "registers (threads x per thread)" and
/// "static shared (grid x per block)".
fn assert_kernel_metrics(metrics: &KernelMetrics, expected: [f64; 6]) {
    let read = [
        metrics.threads,
        metrics.compute_throughput_pct,
        metrics.dram_throughput_pct,
        metrics.memory_throughput_pct,
        metrics.registers,
        metrics.static_shared_memory_bytes,
    ];
    for (actual, expected) in read.into_iter().zip(expected) {
        assert_close(actual, expected);
    }
}

#[test]
fn the_h100_bmm_recording_is_a_complete_one_kernel_profile_with_the_independent_means() {
    let table = table(&fixture(H100_BMM));
    assert_eq!(table.layout, Layout::Details);
    // 15 columns plus the two NVTX columns that --nvtx adds after "Host Name".
    assert_eq!(table.columns, 17);
    assert_eq!(table.number_format, NumberFormat::DecimalPoint);
    assert_eq!(table.ncu_version, None, "ncu's log file does not name it");
    assert_eq!(table.kernels.len(), 1);
    assert_eq!(
        table.kernels[0].name,
        "void Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(Params)"
    );
    assert_found_as(&table, RAW_NAMES);
    let summary = table.summary();
    // expected.py: "kernels: 1", "duration in 1 of 1 kernels; total 3318880.0 ns" (printed
    // "3,318,880" ns), registers per thread 202, grid 1024.
    assert_eq!(summary.kernels, 1);
    assert_close(summary.total_duration_ns.unwrap(), 3_318_880.0);
    let mean = |metric: Metric| summary.metrics[metric.index()].weighted_mean.unwrap();
    assert_close(mean(Metric::RegistersPerThread), 202.0);
    assert_close(mean(Metric::GridSize), 1024.0);
    // expected.py: threads 262144.0, sm 85.77999999999999, dram 4.55, memory 46.7,
    // registers (threads x per thread) 52953088.0, static shared (grid x per block) 0.0.
    assert_kernel_metrics(
        &table.kernel_metrics().unwrap(),
        [262_144.0, 85.77999999999999, 4.55, 46.7, 52_953_088.0, 0.0],
    );
}

#[test]
fn the_h100_bert_encoder_recording_aggregates_its_109_kernels_to_the_independent_means() {
    let table = table(&fixture(H100_BERT));
    assert_eq!(table.layout, Layout::Details);
    assert_eq!(table.columns, 17);
    assert_eq!(table.kernels.len(), 109);
    assert!(table.kernels[0]
        .name
        .starts_with("void at::vectorized_gather_kernel<16, long>"));
    assert_found_as(&table, RAW_NAMES);
    let summary = table.summary();
    // expected.py: "kernels: 109", "total 11898400.0 ns".
    assert_eq!(summary.kernels, 109);
    assert_eq!(summary.kernels_without_duration, 0);
    assert_close(summary.total_duration_ns.unwrap(), 11_898_400.0);
    let mean = |metric: Metric| summary.metrics[metric.index()].weighted_mean.unwrap();
    // expected.py: registers (per thread) 151.53350635379547, grid 737.6462798359444.
    assert_close(mean(Metric::RegistersPerThread), 151.53350635379547);
    assert_close(mean(Metric::GridSize), 737.6462798359444);
    // expected.py: threads 94491.69337188193, sm 73.9958149936126, dram 4.603490082700195,
    // memory 80.74086242183823, registers (threads x per thread) 13795668.083942715,
    // static shared (grid x per block) 0.0 (no kernel of the step has static shared memory).
    assert_kernel_metrics(
        &table.kernel_metrics().unwrap(),
        [
            94_491.69337188193,
            73.9958149936126,
            4.603490082700195,
            80.74086242183823,
            13_795_668.083942715,
            0.0,
        ],
    );
}

#[test]
fn the_h100_gpt_decoder_launch_count_recording_aggregates_its_200_kernels_to_the_independent_means()
{
    let table = table(&fixture(H100_GPT));
    assert_eq!(table.layout, Layout::Details);
    // No --nvtx: no NVTX columns.
    assert_eq!(table.columns, 15);
    assert_eq!(table.kernels.len(), 200, "--launch-count 200");
    assert!(table.kernels[0]
        .name
        .starts_with("fmha_cutlassF_f32_aligned_64x64_rf_sm80("));
    assert_found_as(&table, RAW_NAMES);
    let summary = table.summary();
    // expected.py: "kernels: 200", "total 2035200.0 ns".
    assert_eq!(summary.kernels, 200);
    assert_close(summary.total_duration_ns.unwrap(), 2_035_200.0);
    // expected.py: threads 101466.77937106918, sm 12.24973899371069, dram 12.68754198113208,
    // memory 19.004591666666663, registers (threads x per thread) 7432014.546918239,
    // static shared (grid x per block) 3145766.5670440253.
    assert_kernel_metrics(
        &table.kernel_metrics().unwrap(),
        [
            101_466.77937106918,
            12.24973899371069,
            12.68754198113208,
            19.004591666666663,
            7_432_014.546918239,
            3_145_766.5670440253,
        ],
    );
}

#[test]
fn coloc_ncu_exits_0_complete_on_the_real_h100_recordings() {
    let path = fixture(H100_BERT);
    let (ok, out, err) = coloc_ncu(&[path.to_str().unwrap()]);
    assert!(ok, "{err}\n{out}");
    assert!(
        out.contains("complete: a kernel profile can be built"),
        "{out}"
    );
    assert!(
        out.contains("kernels: 109, total duration 11898400 ns"),
        "{out}"
    );

    for (file, kernels, threads) in [
        (H100_BMM, 1, 262_144.0),
        (H100_BERT, 109, 94_491.69337188193),
        (H100_GPT, 200, 101_466.77937106918),
    ] {
        let path = fixture(file);
        let (ok, out, err) = coloc_ncu(&[path.to_str().unwrap(), "--json"]);
        assert!(ok, "{file}: {err}\n{out}");
        let check: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(check["complete"], true, "{file}");
        assert_eq!(check["error"], serde_json::Value::Null, "{file}");
        assert_eq!(check["summary"]["kernels"], kernels, "{file}");
        assert_close(
            check["kernel_metrics"]["threads"].as_f64().unwrap(),
            threads,
        );
    }
}

#[test]
fn the_constructed_details_fixture_matches_the_independent_means() {
    let metrics = table(&fixture("details_page_three_kernels.csv"))
        .kernel_metrics()
        .unwrap();
    // expected.py on the fixture.
    assert_close(metrics.threads, 55488.512);
    assert_close(metrics.compute_throughput_pct, 65.43577142857143);
    assert_close(metrics.dram_throughput_pct, 26.45725714285714);
    assert_close(metrics.memory_throughput_pct, 48.624);
    assert_close(metrics.registers, 7586826.532571428);
    assert_close(metrics.static_shared_memory_bytes, 1870145.5542857142);
}

/// Runs the built binary: (exit status 0, stdout, stderr).
fn coloc_ncu(args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .arg("ncu")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn coloc_ncu_reports_what_a_real_recording_holds_and_fails_because_it_is_incomplete() {
    let path = real(DROPOUT);
    let (ok, out, err) = coloc_ncu(&[path.to_str().unwrap()]);
    assert!(!ok, "an incomplete profile must not exit 0:\n{out}");
    assert!(
        out.contains("layout: details page (one row per kernel and metric), 12 columns"),
        "{out}"
    );
    assert!(
        out.contains("ncu version: not named in the output"),
        "{out}"
    );
    assert!(
        out.contains("kernels: 162, total duration 5689984 ns"),
        "{out}"
    );
    assert!(
        out.contains("DRAM Throughput                  in 162 of 162 kernels as gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed; duration-weighted mean 56.015996895597596 %"),
        "{out}"
    );
    assert!(
        out.contains("Threads                          absent"),
        "{out}"
    );
    assert!(
        err.contains("162 kernel(s) read, but the output lacks 4 of the 8 metrics"),
        "{err}"
    );
    assert!(!err.contains("no kernels"), "{err}");

    let (ok, out, _) = coloc_ncu(&[real(SAM).to_str().unwrap(), "--json"]);
    assert!(!ok);
    let check: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(check["complete"], false);
    assert_eq!(check["kernel_metrics"], serde_json::Value::Null);
    assert_eq!(check["summary"]["layout"], "details");
    assert_eq!(check["summary"]["kernels"], 9);
    assert_eq!(check["summary"]["ncu_version"], serde_json::Value::Null);
    let metrics = check["summary"]["metrics"].as_array().unwrap();
    assert_eq!(metrics.len(), 8);
    assert_eq!(metrics[0]["metric"], "duration");
    assert_eq!(metrics[0]["found_as"], serde_json::json!([]));
    assert_eq!(metrics[1]["found_as"], serde_json::json!(["Threads"]));
    assert_eq!(metrics[1]["kernels_with_value"], 9);
    let error = check["error"].as_str().unwrap();
    assert!(
        error.contains("gpu__time_duration.sum (\"Duration\")")
            && error.contains("gpu__dram_throughput"),
        "{error}"
    );
}

#[test]
fn coloc_ncu_exits_0_with_the_profiles_kernel_metrics_for_a_complete_output() {
    let path = fixture("details_page_three_kernels.csv");
    let (ok, out, err) = coloc_ncu(&[path.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}\n{out}");
    let check: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(check["complete"], true);
    assert_eq!(check["error"], serde_json::Value::Null);
    assert_eq!(check["kernel_metrics"]["threads"], 55488.512);
    assert_eq!(check["kernel_metrics"]["memory_throughput_pct"], 48.624);
    assert_eq!(check["summary"]["total_duration_ns"], 140000.0);

    let (ok, out, _) = coloc_ncu(&[path.to_str().unwrap()]);
    assert!(ok);
    assert!(
        out.contains("complete: a kernel profile can be built"),
        "{out}"
    );
    assert!(
        out.contains("threads                    55488.512"),
        "{out}"
    );
}

#[test]
fn coloc_ncu_fails_clearly_on_a_missing_file_and_on_output_that_profiled_nothing() {
    let (ok, out, err) = coloc_ncu(&["/nonexistent/ncu.csv", "--json"]);
    assert!(!ok);
    let check: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        check["error"]
            .as_str()
            .unwrap()
            .starts_with("cannot read /nonexistent/ncu.csv"),
        "{out}"
    );
    assert!(err.contains("cannot read /nonexistent/ncu.csv"), "{err}");

    let empty = fixture("real_no_kernels_profiled.csv");
    let (ok, _, err) = coloc_ncu(&[empty.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("ncu profiled no kernels"), "{err}");
}

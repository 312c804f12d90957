//! Property test of the Nsight Compute parser over mutated real recordings
//! (`../shared/data/ncu-real`, two of the H100 ones in `tests/fixtures/ncu`) and the
//! constructed fixtures: truncated files, shuffled columns, garbage bytes, huge numbers, NaN
//! and other non-numbers. Whatever the input,
//! parsing and checking never panic, a kernel profile that is built is valid (finite,
//! percentages within 0..=100), and the heap the parser uses stays within a small multiple
//! of the input's size. Shuffling the columns alone changes nothing the parser reads.
//!
//! A test binary of its own (not part of `tests/api`): it counts heap bytes with a global
//! allocator, which must see no other test's allocations, so this binary holds one test.
//! The case count is kept modest so that `cargo test` (and CI) stays fast.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
};

use coloc::{
    domain::KernelMetrics,
    profiler::ncu::{self, Metric, NcuCheck},
};
use proptest::prelude::*;

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = IN_USE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap the parser may use beyond its input. It keeps at most one copy of the fields it
/// reads (kernel names, process ids, the eight metrics' values), never more than the input
/// itself, plus buffers of fixed size. Measured on the unmutated files (printed by the
/// test with --nocapture): 16 KB for the 23 KB file, 207 KB for the 1.6 MB one.
fn heap_bound(input_bytes: usize) -> usize {
    input_bytes + (1 << 20)
}

fn inputs() -> Vec<(String, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    [
        "../shared/data/ncu-real/llm-perf-opt_kernel_0001_ncu.details.csv",
        "../shared/data/ncu-real/actual-param_sam_flashattn_nsight.csv",
        "../shared/data/ncu-real/actual-param_dropout_nsight162.csv",
        "tests/fixtures/ncu/h100_bmm_nvtx_details.csv",
        "tests/fixtures/ncu/h100_bert_encoder_nvtx_details.csv",
        "tests/fixtures/ncu/details_page_three_kernels.csv",
        "tests/fixtures/ncu/raw_page_three_kernels.csv",
    ]
    .into_iter()
    .map(|path| {
        let bytes = std::fs::read(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        (path.to_string(), bytes)
    })
    .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Cut the file at this fraction of its length.
    Truncate(f64),
    /// Put these bytes at this fraction of the file.
    Garbage(f64, Vec<u8>),
    /// Replace the first quoted field from this fraction of the file on with this text.
    Field(f64, String),
    /// In the line nearest this fraction of the file, replace one of the quoted fields
    /// that hold a number (an ID, a metric value): the one this index picks.
    NumberField(f64, usize, String),
    /// Delete the line nearest this fraction of the file.
    DeleteLine(f64),
    /// Repeat the line nearest this fraction of the file.
    RepeatLine(f64),
}

fn odd_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("9".repeat(400)),
        3 => Just("18,446,744,073,709,551,616".to_string()),
        3 => "[0-9]{19,40}",
        1 => Just("NaN".to_string()),
        1 => Just("nan".to_string()),
        1 => Just("inf".to_string()),
        1 => Just("-inf".to_string()),
        1 => Just("-1".to_string()),
        1 => Just("1e308".to_string()),
        1 => Just("1e-400".to_string()),
        1 => Just("179,769,313,486,231,570,000".to_string()),
        1 => Just("9".repeat(400)),
        1 => Just("100.9".to_string()),
        1 => Just("101.01".to_string()),
        1 => Just("n/a".to_string()),
        1 => Just(String::new()),
        1 => Just("\"".to_string()),
        1 => "[0-9.,]{1,30}",
        1 => "\\PC{0,20}",
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = 0.0..1.0f64;
    prop_oneof![
        1 => at.clone().prop_map(Mutation::Truncate),
        1 => (at.clone(), proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Mutation::Garbage(at, bytes)),
        1 => (at.clone(), odd_value()).prop_map(|(at, value)| Mutation::Field(at, value)),
        3 => (at.clone(), any::<usize>(), odd_value())
            .prop_map(|(at, pick, value)| Mutation::NumberField(at, pick, value)),
        1 => at.clone().prop_map(Mutation::DeleteLine),
        1 => at.prop_map(Mutation::RepeatLine),
    ]
}

fn position(bytes: &[u8], at: f64) -> usize {
    ((bytes.len() as f64 * at) as usize).min(bytes.len())
}

/// The start and end (after its newline) of the line holding byte `index`.
fn line_around(bytes: &[u8], index: usize) -> (usize, usize) {
    let start = bytes[..index]
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let end = bytes[index..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(bytes.len(), |i| index + i + 1);
    (start, end)
}

/// The positions of the opening and closing quote of each quoted field, in order.
fn quoted_fields(bytes: &[u8]) -> Vec<(usize, usize)> {
    let quotes: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'"')
        .map(|(i, _)| i)
        .collect();
    (0..quotes.len() / 2)
        .map(|i| (quotes[2 * i], quotes[2 * i + 1]))
        .collect()
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::Truncate(at) => bytes.truncate(position(bytes, *at)),
        Mutation::Garbage(at, garbage) => {
            let at = position(bytes, *at);
            bytes.splice(at..at, garbage.iter().copied());
        }
        Mutation::Field(at, value) => {
            // The next quoted field from there on: "...".
            let from = position(bytes, *at);
            if let Some(&(open, close)) = quoted_fields(&bytes[from..]).first() {
                bytes.splice(from + open + 1..from + close, value.bytes());
            }
        }
        Mutation::NumberField(at, pick, value) => {
            let (start, end) = line_around(bytes, position(bytes, *at));
            let numbers: Vec<(usize, usize)> = quoted_fields(&bytes[start..end])
                .into_iter()
                .filter(|&(open, close)| {
                    let inside = &bytes[start + open + 1..start + close];
                    !inside.is_empty()
                        && inside
                            .iter()
                            .all(|b| b.is_ascii_digit() || *b == b',' || *b == b'.')
                })
                .collect();
            if !numbers.is_empty() {
                let (open, close) = numbers[pick % numbers.len()];
                bytes.splice(start + open + 1..start + close, value.bytes());
            }
        }
        Mutation::DeleteLine(at) => {
            let (start, end) = line_around(bytes, position(bytes, *at));
            bytes.drain(start..end);
        }
        Mutation::RepeatLine(at) => {
            let (start, end) = line_around(bytes, position(bytes, *at));
            let line = bytes[start..end].to_vec();
            bytes.splice(end..end, line);
        }
    }
}

/// The same table with its columns in another order (every CSV line from the header on;
/// ragged rows are padded first, and every field is quoted again).
fn shuffle_columns(text: &str, order_seed: u64) -> String {
    let header_at = text
        .lines()
        .position(|line| line.starts_with("\"ID\","))
        .expect("a header");
    let mut lines = text.lines();
    let mut out: String = lines
        .by_ref()
        .take(header_at)
        .map(|line| format!("{line}\n"))
        .collect();
    let table: String = lines
        .filter(|line| !line.starts_with("=="))
        .map(|line| format!("{line}\n"))
        .collect();
    let rows: Vec<Vec<String>> = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(table.as_bytes())
        .records()
        .map(|record| record.unwrap().iter().map(str::to_string).collect())
        .collect();
    let width = rows[0].len();
    let mut order: Vec<usize> = (0..width).collect();
    // A Fisher-Yates shuffle driven by the seed (splitmix64 steps).
    let mut state = order_seed;
    for i in (1..width).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let j = ((z ^ (z >> 31)) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    for row in rows {
        let cells: Vec<String> = order
            .iter()
            .map(|&i| format!("\"{}\"", row.get(i).map_or("", String::as_str)))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// What the parser read, for comparing two readings of the same table.
fn reading(text: &str) -> Vec<(u64, String, Vec<Option<f64>>)> {
    let table = ncu::parse(text).unwrap();
    table
        .kernels
        .iter()
        .map(|k| {
            let values = Metric::ALL.iter().map(|m| k.value(*m)).collect();
            (k.id, k.name.clone(), values)
        })
        .collect()
}

/// Parses and checks `text`, asserting the invariants; returns the peak heap it used.
fn exercise(text: &str) -> Result<usize, TestCaseError> {
    let before = IN_USE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let check = NcuCheck::of("mutated.csv", text);
    prop_assert_eq!(check.complete, check.kernel_metrics.is_some());
    if let Some(summary) = &check.summary {
        prop_assert!(summary.kernels <= text.lines().count());
    }
    if let Some(k) = check.kernel_metrics {
        let metrics = KernelMetrics {
            threads: k.threads,
            compute_throughput_pct: k.compute_throughput_pct,
            dram_throughput_pct: k.dram_throughput_pct,
            memory_throughput_pct: k.memory_throughput_pct,
            registers: k.registers,
            static_shared_memory_bytes: k.static_shared_memory_bytes,
        };
        prop_assert!(
            metrics.validate().is_ok(),
            "a built profile must be valid: {metrics:?}"
        );
    }
    let mut rendered = Vec::new();
    check.write_text(&mut rendered).unwrap();
    serde_json::to_string(&check).unwrap();
    drop(rendered);
    drop(check);
    Ok(PEAK.load(Ordering::Relaxed) - before)
}

#[test]
fn the_parser_survives_mutated_recordings_within_bounded_memory() {
    let inputs = inputs();
    for (path, bytes) in &inputs {
        let text = String::from_utf8_lossy(bytes);
        let peak = exercise(&text).unwrap();
        eprintln!(
            "{path}: {} bytes, peak heap while parsing and checking {peak} bytes",
            bytes.len()
        );
        assert!(peak <= heap_bound(bytes.len()), "{path}: {peak} bytes");
        // Shuffled columns: the same kernels and values.
        for seed in [1, 2, 3] {
            let shuffled = shuffle_columns(&text, seed);
            assert_eq!(reading(&shuffled), reading(&text), "{path}, order {seed}");
        }
    }

    let config = ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (
        0..inputs.len(),
        proptest::collection::vec(mutation(), 1..5),
        any::<u64>(),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(which, mutations, seed, shuffle)| {
            let (_, original) = &inputs[which];
            let mut bytes = if shuffle {
                shuffle_columns(&String::from_utf8_lossy(original), seed).into_bytes()
            } else {
                original.clone()
            };
            for mutation in &mutations {
                apply(&mut bytes, mutation);
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let peak = exercise(&text)?;
            prop_assert!(
                peak <= heap_bound(text.len()),
                "peak heap {peak} bytes for {} bytes of input",
                text.len()
            );
            Ok(())
        })
        .unwrap();
}

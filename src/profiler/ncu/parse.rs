//! Reading what `ncu --csv` printed into kernels and their metrics, whichever of its two
//! layouts it is:
//!
//! - the **details page** (`--page details`, ncu's default, and what `--metrics` alone
//!   prints): one row per kernel and metric, with the columns `ID`, `Process ID`, `Kernel
//!   Name`, ..., `Section Name`, `Metric Name`, `Metric Unit`, `Metric Value` and, on newer
//!   versions, the rule columns (`Rule Name`, `Rule Type`, `Rule Description`, `Estimated
//!   Speedup ...`). Rows whose rule columns are empty end early (ragged rows); rule rows
//!   have an empty metric name. `--print-details all` adds a `Body Item Label` column
//!   whose rows are sub-items of a metric. A kernel is one `ID` (of one process).
//! - the **raw page** (`--page raw`): one row per kernel, one column per metric, and a
//!   second row holding each column's unit.
//!
//! The header is the first line whose fields include `ID` and `Kernel Name`; columns are
//! found by name, never by position. Every field may be quoted; numbers may
//! carry thousands separators in the locale's style (see [`NumberFormat`]). The table is
//! looked for after ncu's own `==PROF==` / `==WARNING==` lines (and any program output
//! before it); lines of those kinds inside the table are skipped. Only the eight metrics
//! of the method are read; every other row and column is left alone.
//!
//! Choices:
//! - A metric printed as `n/a` (or empty) is not available for that kernel; the report
//!   ([`super::report`]) decides what that means.
//! - A raw metric name with a unit that does not measure it is an error
//!   ([`NcuError::UnknownUnit`]); a section name with such a unit is another quantity of
//!   the same name and is passed over (`Memory Throughput` in `Gbyte/s`).
//! - When a kernel reports a metric under more than one name, the raw name wins over the
//!   section name (they are the same measurement on the pages that print both).
//! - A percentage up to [`PERCENT_ROUNDING_MARGIN`] above 100 is ncu's rounding and is read
//!   as 100; above that it is an error. Negative values are errors.
//! - A row with more fields than the header is an error (fields would be misread); a line
//!   too short to reach the kernel name is not a row (program output, a cut line) and is
//!   counted in [`NcuTable::skipped_rows`].
//! - Errors name the line in the text handed to [`parse`].

use std::collections::HashMap;

use serde::Serialize;

use super::{
    metric::{unit_scale, FormatVotes, Metric, Naming, NumberFormat, Quantity},
    NcuError,
};

/// ncu prints percentages of peak rounded to two decimals and can print 100.3 for a unit
/// that ran at its peak; values up to 100 + this margin are read as 100.
pub const PERCENT_ROUNDING_MARGIN: f64 = 1.0;

/// Which table ncu printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `--page details` (ncu's default): one row per kernel and metric.
    Details,
    /// `--page raw`: one row per kernel, a column per metric, a units row.
    RawPage,
}

impl Layout {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Details => "details page (one row per kernel and metric)",
            Self::RawPage => "raw page (one row per kernel, one column per metric)",
        }
    }
}

/// What the output said about one metric of one kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// No row or column of the output names the metric for this kernel.
    Absent,
    /// ncu printed `n/a` or nothing.
    NotAvailable,
    /// The value in coloc's unit ([`Metric::unit`]).
    Value(f64),
}

impl Reading {
    pub fn value(self) -> Option<f64> {
        match self {
            Self::Value(value) => Some(value),
            _ => None,
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// ncu's `ID` of the launch.
    pub id: u64,
    pub name: String,
    readings: [Reading; 8],
}

impl Kernel {
    pub fn reading(&self, metric: Metric) -> Reading {
        self.readings[metric.index()]
    }

    pub fn value(&self, metric: Metric) -> Option<f64> {
        self.reading(metric).value()
    }
}

/// Everything read from one ncu output.
#[derive(Debug, Clone)]
pub struct NcuTable {
    pub layout: Layout,
    /// The Nsight Compute version, when the output names it (a `Version 2025.1.1.0` or
    /// `Nsight Compute 2023.2` line outside the table); ncu's CSV itself does not.
    pub ncu_version: Option<String>,
    pub columns: usize,
    pub number_format: NumberFormat,
    /// In the order ncu listed them.
    pub kernels: Vec<Kernel>,
    /// Percentages above 100 (within the rounding margin) read as 100.
    pub clamped_percentages: usize,
    /// Lines inside the table that start with a kernel ID but are too short to reach the
    /// kernel name: program output, or a cut line. Left out, and counted.
    pub skipped_rows: usize,
    /// For each metric, whether the output names it in each way of [`Naming::ALL`].
    named: [[bool; 3]; 8],
}

impl NcuTable {
    /// The names under which `metric` was found (raw name, alternative, section name).
    /// Every name the output uses, best first: a kernel's value comes from the first.
    pub fn found_as(&self, metric: Metric) -> Vec<&'static str> {
        Naming::ALL
            .into_iter()
            .zip(self.named[metric.index()])
            .filter(|(_, named)| *named)
            .map(|(naming, _)| metric.name_for(naming))
            .collect()
    }
}

/// One value as printed, until the number format of the whole output is known.
struct RawCell {
    naming: Naming,
    value: String,
    scale: f64,
    line: u64,
}

struct PendingKernel {
    id: u64,
    name: String,
    cells: [Option<RawCell>; 8],
    /// The names each metric came under, in the order of [`Naming::ALL`].
    named: [[bool; 3]; 8],
}

impl PendingKernel {
    /// Keeps the better-named cell: raw names over section names, the first of equals.
    fn offer(&mut self, metric: Metric, cell: RawCell) {
        self.named[metric.index()][cell.naming as usize] = true;
        let slot = &mut self.cells[metric.index()];
        if slot.as_ref().is_none_or(|kept| cell.naming < kept.naming) {
            *slot = Some(cell);
        }
    }
}

/// The kernels seen so far, by (ID, process), in the order first seen.
#[derive(Default)]
struct Kernels {
    by_key: HashMap<(u64, String), usize>,
    list: Vec<PendingKernel>,
}

impl Kernels {
    fn get_or_insert(&mut self, id: u64, process: &str, name: &str) -> &mut PendingKernel {
        let next = self.list.len();
        let index = *self.by_key.entry((id, process.to_string())).or_insert(next);
        if index == next {
            self.list.push(PendingKernel {
                id,
                name: name.to_string(),
                cells: Default::default(),
                named: [[false; 3]; 8],
            });
        }
        &mut self.list[index]
    }
}

/// Whether a line is the table's header: CSV fields that include `ID` and `Kernel Name`
/// (anywhere: columns are found by name). KACE's device table (`"GPU ID","GPU Name"`) and
/// ncu's messages are not.
fn is_header(line: &str) -> bool {
    if !line.contains("ID") || !line.contains("Kernel Name") {
        return false;
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(line.as_bytes());
    let mut record = csv::StringRecord::new();
    matches!(reader.read_record(&mut record), Ok(true))
        && record.iter().any(|field| field.trim() == "ID")
        && record.iter().any(|field| field.trim() == "Kernel Name")
}

/// The byte offset and 0-based line index of the table's header row, if any.
fn find_header(text: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_start_matches('\u{feff}').trim_start();
        if is_header(trimmed) {
            return Some((offset + (line.len() - trimmed.len()), index));
        }
        offset += line.len();
    }
    None
}

/// The Nsight Compute version named by a line outside the table: `Version 2025.1.1.0` (as
/// `ncu --version` prints it) or `... Nsight Compute ... 2023.2.1`.
fn find_version<'t>(lines: impl Iterator<Item = &'t str>) -> Option<String> {
    lines.filter_map(version_in_line).next()
}

fn version_in_line(line: &str) -> Option<String> {
    let lower = line.to_ascii_lowercase();
    let after = if lower.trim_start().starts_with("version ") {
        lower.find("version ")? + "version ".len()
    } else {
        lower.find("nsight compute")? + "nsight compute".len()
    };
    // The first year.number[.number[.number]] after the name, within a short reach.
    let reach = &line[after..line.len().min(after + 80)];
    reach.char_indices().find_map(|(start, _)| {
        let candidate = &reach[start..];
        let end = candidate
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(candidate.len());
        let version = candidate[..end].trim_end_matches('.');
        let parts: Vec<&str> = version.split('.').collect();
        let is_version = (2..=4).contains(&parts.len())
            && parts[0].len() == 4
            && parts[0].starts_with("20")
            && parts.iter().all(|p| !p.is_empty());
        let starts_a_number =
            start == 0 || !reach[..start].ends_with(|c: char| c.is_ascii_digit() || c == '.');
        (is_version && starts_a_number).then(|| version.to_string())
    })
}

/// The first `==ERROR==` line, to say why there is no table.
fn first_error_line(text: &str) -> Option<String> {
    text.lines()
        .find(|line| line.starts_with("==ERROR=="))
        .map(|line| line.chars().take(300).collect())
}

/// A kernel ID (`"12"`, or `"1,024"` with a thousands separator); `None` for anything else.
fn parse_id(raw: &str) -> Option<u64> {
    let raw = raw.trim();
    if raw.is_empty()
        || !raw
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b',' || b == b'.')
    {
        return None;
    }
    let digits: String = raw.chars().filter(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn column(header: &csv::StringRecord, name: &str) -> Option<usize> {
    header.iter().position(|field| field.trim() == name)
}

/// Reads ncu's CSV output (either layout; other lines before the table are allowed).
pub fn parse(text: &str) -> Result<NcuTable, NcuError> {
    let Some((header_offset, header_line)) = find_header(text) else {
        if text.contains("No kernels were profiled") {
            return Err(NcuError::NoKernels);
        }
        return Err(NcuError::NoTable {
            ncu_said: first_error_line(text),
        });
    };
    let preamble = text[..header_offset].lines();
    let profiler_lines = text[header_offset..]
        .lines()
        .filter(|line| line.starts_with("=="));
    let ncu_version = find_version(preamble.chain(profiler_lines));

    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(&text.as_bytes()[header_offset..]);
    let mut records = reader.records();
    let header = match records.next() {
        Some(record) => record?,
        None => return Err(NcuError::NoTable { ncu_said: None }),
    };
    let shape = Shape::of(&header, header_line)?;
    let mut collected = Collected::default();
    let layout = match DetailsColumns::of(&header) {
        Some(details) => {
            read_details(records, &shape, &details, &mut collected)?;
            Layout::Details
        }
        None => {
            read_raw_page(records, &shape, &header, &mut collected)?;
            Layout::RawPage
        }
    };

    let number_format = collected.votes.decide();
    let mut named = [[false; 3]; 8];
    let mut clamped_percentages = 0;
    let mut kernels = Vec::with_capacity(collected.kernels.list.len());
    for pending in collected.kernels.list {
        for (all, kernel) in named.iter_mut().zip(pending.named) {
            for (seen, kernel_seen) in all.iter_mut().zip(kernel) {
                *seen |= kernel_seen;
            }
        }
        let mut readings = [Reading::Absent; 8];
        for metric in Metric::ALL {
            let Some(cell) = &pending.cells[metric.index()] else {
                continue;
            };
            readings[metric.index()] =
                match read_value(metric, cell, number_format, &mut clamped_percentages)? {
                    Some(value) => Reading::Value(value),
                    None => Reading::NotAvailable,
                };
        }
        kernels.push(Kernel {
            id: pending.id,
            name: pending.name,
            readings,
        });
    }
    Ok(NcuTable {
        layout,
        ncu_version,
        columns: header.len(),
        number_format,
        kernels,
        clamped_percentages,
        skipped_rows: collected.skipped_rows,
        named,
    })
}

/// The columns both layouts share, and where the table starts.
struct Shape {
    columns: usize,
    id: usize,
    process: Option<usize>,
    name: Option<usize>,
    /// A row of the table reaches at least its kernel name.
    min_row: usize,
    /// The 0-based line of the header in the text.
    header_line: usize,
}

impl Shape {
    fn of(header: &csv::StringRecord, header_line: usize) -> Result<Self, NcuError> {
        let id = column(header, "ID").ok_or(NcuError::NoTable { ncu_said: None })?;
        let name = column(header, "Kernel Name");
        Ok(Self {
            columns: header.len(),
            id,
            process: column(header, "Process ID"),
            name,
            min_row: id.max(name.unwrap_or(0)) + 1,
            header_line,
        })
    }

    /// The line of a record in the text (csv counts from 1 at the header).
    fn line_of(&self, record: &csv::StringRecord) -> u64 {
        record
            .position()
            .map_or(0, |p| p.line() + self.header_line as u64)
    }
}

/// What the rows of the table give, before the number format is known.
#[derive(Default)]
struct Collected {
    kernels: Kernels,
    votes: FormatVotes,
    skipped_rows: usize,
}

impl Collected {
    /// The kernel a row belongs to, or `None` for a line that is no row of the table
    /// (ncu's messages, the units row, program output, a cut line: counted when it starts
    /// with an ID).
    fn kernel_of(
        &mut self,
        shape: &Shape,
        record: &csv::StringRecord,
    ) -> Result<Option<&mut PendingKernel>, NcuError> {
        if record.get(0).is_some_and(|first| first.starts_with("==")) {
            return Ok(None);
        }
        let Some(id) = record.get(shape.id).and_then(parse_id) else {
            return Ok(None);
        };
        if record.len() < shape.min_row {
            self.skipped_rows += 1;
            return Ok(None);
        }
        if record.len() > shape.columns {
            return Err(NcuError::RowWidth {
                line: shape.line_of(record),
                fields: record.len(),
                columns: shape.columns,
            });
        }
        let field = |column: Option<usize>| column.and_then(|c| record.get(c)).unwrap_or("");
        Ok(Some(self.kernels.get_or_insert(
            id,
            field(shape.process).trim(),
            field(shape.name),
        )))
    }
}

/// The details page: one row per kernel and metric.
fn read_details(
    records: csv::StringRecordsIter<'_, &[u8]>,
    shape: &Shape,
    details: &DetailsColumns,
    collected: &mut Collected,
) -> Result<(), NcuError> {
    for record in records {
        let record = record?;
        // Every value counts towards the number format, read or not.
        let value = record.get(details.value);
        if let Some(value) = value {
            collected.votes.add(value);
        }
        let Some(kernel) = collected.kernel_of(shape, &record)? else {
            continue;
        };
        // A row cut short before its value (a truncated file) names no metric.
        let Some(value) = value else {
            continue;
        };
        let field = |column: Option<usize>| column.and_then(|c| record.get(c)).unwrap_or("").trim();
        if !field(details.body_item).is_empty() {
            continue;
        }
        let unit = field(details.unit);
        let Some((metric, naming)) = Metric::from_details_name(field(Some(details.name)), unit)
        else {
            continue;
        };
        let line = shape.line_of(&record);
        let scale = checked_scale(metric, unit, line)?;
        kernel.offer(
            metric,
            RawCell {
                naming,
                value: value.trim().to_string(),
                scale,
                line,
            },
        );
    }
    Ok(())
}

/// The raw page: a units row, then one row per kernel with a column per metric.
fn read_raw_page(
    records: csv::StringRecordsIter<'_, &[u8]>,
    shape: &Shape,
    header: &csv::StringRecord,
    collected: &mut Collected,
) -> Result<(), NcuError> {
    // Metric columns by raw name; the better name when a metric has two columns. Other
    // metric columns (`a__b`) still tell the number format.
    let mut metric_columns: [Option<(usize, Naming)>; 8] = Default::default();
    let mut other_metric_columns = Vec::new();
    for (index, name) in header.iter().enumerate() {
        match Metric::from_raw_name(name.trim()) {
            Some((metric, naming)) => {
                let slot = &mut metric_columns[metric.index()];
                if slot.is_none_or(|(_, kept)| naming < kept) {
                    *slot = Some((index, naming));
                }
            }
            None if name.contains("__") => other_metric_columns.push(index),
            None => {}
        }
    }
    let mut units: Option<csv::StringRecord> = None;
    for record in records {
        let record = record?;
        let id_field = record.get(shape.id).unwrap_or("").trim();
        if id_field.is_empty() {
            // The units row: the first full row without an ID before any kernel.
            if units.is_none() && collected.kernels.list.is_empty() && record.len() == shape.columns
            {
                units = Some(record);
            }
            continue;
        }
        let Some(kernel) = collected.kernel_of(shape, &record)? else {
            continue;
        };
        let line = shape.line_of(&record);
        for metric in Metric::ALL {
            let Some((index, naming)) = metric_columns[metric.index()] else {
                continue;
            };
            // A row cut short before this column (a truncated file) lacks it.
            let Some(value) = record.get(index) else {
                continue;
            };
            let unit = units
                .as_ref()
                .and_then(|u| u.get(index))
                .unwrap_or("")
                .trim();
            let scale = checked_scale(metric, unit, line)?;
            kernel.offer(
                metric,
                RawCell {
                    naming,
                    value: value.trim().to_string(),
                    scale,
                    line,
                },
            );
        }
        for index in metric_columns
            .iter()
            .flatten()
            .map(|(index, _)| *index)
            .chain(other_metric_columns.iter().copied())
        {
            collected.votes.add(record.get(index).unwrap_or(""));
        }
    }
    Ok(())
}

/// The columns of the details page.
struct DetailsColumns {
    name: usize,
    value: usize,
    unit: Option<usize>,
    body_item: Option<usize>,
}

impl DetailsColumns {
    /// `None` for a table without `Metric Name` and `Metric Value`: the raw page.
    fn of(header: &csv::StringRecord) -> Option<Self> {
        Some(Self {
            name: column(header, "Metric Name")?,
            value: column(header, "Metric Value")?,
            unit: column(header, "Metric Unit"),
            body_item: column(header, "Body Item Label"),
        })
    }
}

fn checked_scale(metric: Metric, unit: &str, line: u64) -> Result<f64, NcuError> {
    unit_scale(metric.quantity(), unit).ok_or_else(|| NcuError::UnknownUnit {
        line,
        metric,
        unit: unit.chars().take(40).collect(),
    })
}

/// The value of one cell in coloc's unit; `None` when ncu printed n/a or nothing.
fn read_value(
    metric: Metric,
    cell: &RawCell,
    format: NumberFormat,
    clamped: &mut usize,
) -> Result<Option<f64>, NcuError> {
    if cell.value.is_empty() || cell.value.eq_ignore_ascii_case("n/a") {
        return Ok(None);
    }
    let bad = || NcuError::BadNumber {
        line: cell.line,
        metric,
        value: cell.value.chars().take(40).collect(),
    };
    let value = format.parse(&cell.value).ok_or_else(bad)? * cell.scale;
    if !value.is_finite() {
        return Err(bad());
    }
    if value < 0.0 {
        return Err(NcuError::OutOfRange {
            line: cell.line,
            metric,
            value,
        });
    }
    if metric.quantity() == Quantity::Percent && value > 100.0 {
        if value > 100.0 + PERCENT_ROUNDING_MARGIN {
            return Err(NcuError::OutOfRange {
                line: cell.line,
                metric,
                value,
            });
        }
        *clamped += 1;
        return Ok(Some(100.0));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_read_from_ncus_banner_or_a_line_naming_nsight_compute() {
        assert_eq!(
            version_in_line("Version 2025.1.1.0 (build 35528883) (public-release)").as_deref(),
            Some("2025.1.1.0")
        );
        assert_eq!(
            version_in_line("==PROF== NVIDIA Nsight Compute 2023.2.1 profiling").as_deref(),
            Some("2023.2.1")
        );
        assert_eq!(version_in_line("==PROF== Connected to process 41872"), None);
        assert_eq!(version_in_line("Nsight Compute, build 12345"), None);
        assert_eq!(version_in_line("version 12020.1"), None);
    }
}

//! The eight Nsight Compute metrics of the KACE method, under every name ncu prints them:
//! the raw metric names coloc asks for with `--metrics` (and the `dram__throughput` spelling
//! of older ncu versions and some GPUs), and the section names of the details page that
//! KACE aggregated (`Duration`, `Threads`, `Compute (SM) Throughput`, ...). Also the units
//! ncu prints for them, converted once here to coloc's units: nanoseconds, bytes, percent
//! of peak, and plain counts.

use serde::Serialize;

/// One metric of the method, in the order of [`Metric::ALL`] (and of `--metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// `gpu__time_duration.sum`, the weight of each kernel.
    Duration,
    /// `launch__thread_count`: threads per launch (block size x grid size).
    Threads,
    /// `sm__throughput.avg.pct_of_peak_sustained_elapsed`.
    SmThroughput,
    /// `gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed`.
    DramThroughput,
    /// `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`.
    MemoryThroughput,
    /// `launch__registers_per_thread`.
    RegistersPerThread,
    /// `launch__grid_size`: blocks per launch.
    GridSize,
    /// `launch__shared_mem_per_block_static`.
    StaticSharedPerBlock,
}

/// What a metric measures, which decides the units it may come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Converted to nanoseconds.
    Time,
    /// Converted to bytes; `/block` may follow the unit.
    BytesPerBlock,
    /// Percent of peak, kept as it is.
    Percent,
    /// Threads, registers, blocks: only an SI prefix (`Kthread`) scales them.
    Count(&'static [&'static str]),
}

/// How a metric was named in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Naming {
    /// Its raw metric name (`gpu__time_duration.sum`), as `--metrics` prints it.
    Raw,
    /// An alternative raw name (`dram__throughput...` for the DRAM throughput).
    RawAlternative,
    /// Its section name on the details page (`Duration`), as KACE read it.
    Section,
}

impl Naming {
    /// Best first.
    pub const ALL: [Naming; 3] = [Naming::Raw, Naming::RawAlternative, Naming::Section];
}

impl Metric {
    pub const ALL: [Metric; 8] = [
        Metric::Duration,
        Metric::Threads,
        Metric::SmThroughput,
        Metric::DramThroughput,
        Metric::MemoryThroughput,
        Metric::RegistersPerThread,
        Metric::GridSize,
        Metric::StaticSharedPerBlock,
    ];

    /// Its position in [`Metric::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name coloc asks ncu for (`--metrics`).
    pub const fn raw_name(self) -> &'static str {
        match self {
            Self::Duration => "gpu__time_duration.sum",
            Self::Threads => "launch__thread_count",
            Self::SmThroughput => "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            Self::DramThroughput => "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            Self::MemoryThroughput => {
                "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
            }
            Self::RegistersPerThread => "launch__registers_per_thread",
            Self::GridSize => "launch__grid_size",
            Self::StaticSharedPerBlock => "launch__shared_mem_per_block_static",
        }
    }

    /// Another raw name ncu uses for the same metric (older versions, some GPUs).
    fn alternative_raw_name(self) -> Option<&'static str> {
        match self {
            Self::DramThroughput => Some("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            _ => None,
        }
    }

    /// The metric's name on the details page (sections `GPU Speed Of Light Throughput` and
    /// `Launch Statistics`), as KACE aggregated it.
    pub fn section_name(self) -> &'static str {
        match self {
            Self::Duration => "Duration",
            Self::Threads => "Threads",
            Self::SmThroughput => "Compute (SM) Throughput",
            Self::DramThroughput => "DRAM Throughput",
            Self::MemoryThroughput => "Memory Throughput",
            Self::RegistersPerThread => "Registers Per Thread",
            Self::GridSize => "Grid Size",
            Self::StaticSharedPerBlock => "Static Shared Memory Per Block",
        }
    }

    pub fn quantity(self) -> Quantity {
        match self {
            Self::Duration => Quantity::Time,
            Self::SmThroughput | Self::DramThroughput | Self::MemoryThroughput => Quantity::Percent,
            Self::Threads => Quantity::Count(&["thread"]),
            Self::RegistersPerThread => Quantity::Count(&["register/thread", "register"]),
            Self::GridSize => Quantity::Count(&["block"]),
            Self::StaticSharedPerBlock => Quantity::BytesPerBlock,
        }
    }

    /// The unit of [`Metric`] values after conversion.
    pub fn unit(self) -> &'static str {
        match self.quantity() {
            Quantity::Time => "ns",
            Quantity::BytesPerBlock => "byte/block",
            Quantity::Percent => "%",
            Quantity::Count(units) => units[0],
        }
    }

    /// The metric a raw metric name (a column of the raw page, or a `Metric Name` of the
    /// details page) stands for.
    pub fn from_raw_name(name: &str) -> Option<(Metric, Naming)> {
        Self::ALL.into_iter().find_map(|metric| {
            if metric.raw_name() == name {
                Some((metric, Naming::Raw))
            } else if metric.alternative_raw_name() == Some(name) {
                Some((metric, Naming::RawAlternative))
            } else {
                None
            }
        })
    }

    /// The metric a `Metric Name` of the details page stands for: a raw name, or a
    /// section name. A section name counts only with a unit of the metric's kind:
    /// `Memory Throughput` is a percentage in the speed-of-light section but a rate
    /// (`Gbyte/s`) in the memory workload analysis, which is another quantity.
    pub fn from_details_name(name: &str, unit: &str) -> Option<(Metric, Naming)> {
        if let Some(found) = Self::from_raw_name(name) {
            return Some(found);
        }
        let metric = Self::ALL
            .into_iter()
            .find(|metric| metric.section_name() == name)?;
        unit_scale(metric.quantity(), unit).map(|_| (metric, Naming::Section))
    }

    /// The name under which the metric was found.
    pub fn name_for(self, naming: Naming) -> &'static str {
        match naming {
            Naming::Raw => self.raw_name(),
            Naming::RawAlternative => self.alternative_raw_name().unwrap_or(self.raw_name()),
            Naming::Section => self.section_name(),
        }
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.raw_name(), self.section_name())
    }
}

/// The factor from a value in `unit` to coloc's unit for that quantity; `None` for a unit
/// that does not measure it. An empty unit (a raw page without a units row) is the base
/// unit. SI prefixes are decimal, as ncu prints them: its `Kbyte` is 1,000 bytes.
pub fn unit_scale(quantity: Quantity, unit: &str) -> Option<f64> {
    let unit = unit.trim();
    match quantity {
        Quantity::Time => match unit {
            "" | "ns" | "nsecond" | "nsec" => Some(1.0),
            "us" | "usecond" | "usec" | "\u{b5}s" => Some(1e3),
            "ms" | "msecond" | "msec" => Some(1e6),
            "s" | "second" | "sec" => Some(1e9),
            _ => None,
        },
        Quantity::BytesPerBlock => {
            let per_item = match unit.split_once('/') {
                None => unit,
                Some((bytes, "block")) => bytes,
                Some(_) => return None,
            };
            match per_item {
                "" | "byte" => Some(1.0),
                "Kbyte" => Some(1e3),
                "Mbyte" => Some(1e6),
                "Gbyte" => Some(1e9),
                "Tbyte" => Some(1e12),
                _ => None,
            }
        }
        Quantity::Percent => match unit {
            "" | "%" => Some(1.0),
            _ => None,
        },
        Quantity::Count(words) => {
            if unit.is_empty() || words.contains(&unit) {
                return Some(1.0);
            }
            let mut chars = unit.chars();
            let factor = match chars.next()? {
                'K' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                _ => return None,
            };
            words.contains(&chars.as_str()).then_some(factor)
        }
    }
}

/// How the numbers of one output are written: which character is the decimal point, and
/// which groups thousands. ncu follows the locale: `27,595,520.5` in English,
/// `27.595.520,5` where the comma is the decimal point. Spaces, no-break spaces and
/// apostrophes (`27 595 520`, `27'595'520`) always group thousands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NumberFormat {
    /// `1,234.5`: ncu's default (C and English locales).
    DecimalPoint,
    /// `1.234,5`.
    DecimalComma,
}

/// What one value says about the number format, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FormatEvidence {
    DecimalPoint,
    DecimalComma,
    Ambiguous,
}

fn evidence(raw: &str) -> FormatEvidence {
    let dots = raw.matches('.').count();
    let commas = raw.matches(',').count();
    let digits_after = |separator: char| {
        raw.rsplit(separator).next().map_or(0, |tail| {
            tail.chars().take_while(char::is_ascii_digit).count()
        })
    };
    match (dots, commas) {
        (0, 0) => FormatEvidence::Ambiguous,
        (_, 0) if dots > 1 => FormatEvidence::DecimalComma,
        (0, _) if commas > 1 => FormatEvidence::DecimalPoint,
        (1, 0) if digits_after('.') != 3 => FormatEvidence::DecimalPoint,
        (0, 1) if digits_after(',') != 3 => FormatEvidence::DecimalComma,
        (_, 0) | (0, _) => FormatEvidence::Ambiguous,
        _ => {
            // Both: the last one is the decimal point.
            if raw.rfind('.') > raw.rfind(',') {
                FormatEvidence::DecimalPoint
            } else {
                FormatEvidence::DecimalComma
            }
        }
    }
}

/// Tallies the number format over the values of one output.
#[derive(Debug, Default, Clone, Copy)]
pub struct FormatVotes {
    decimal_point: usize,
    decimal_comma: usize,
}

impl FormatVotes {
    /// Counts what this value says; text that is no number says nothing.
    pub fn add(&mut self, raw: &str) {
        let raw = raw.trim();
        if raw.is_empty()
            || !raw.bytes().any(|b| b.is_ascii_digit())
            || !raw
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+'))
        {
            return;
        }
        match evidence(raw) {
            FormatEvidence::DecimalPoint => self.decimal_point += 1,
            FormatEvidence::DecimalComma => self.decimal_comma += 1,
            FormatEvidence::Ambiguous => {}
        }
    }

    /// The format most values agree on; ncu's default when none says.
    pub fn decide(self) -> NumberFormat {
        if self.decimal_comma > self.decimal_point {
            NumberFormat::DecimalComma
        } else {
            NumberFormat::DecimalPoint
        }
    }
}

impl NumberFormat {
    /// A number as ncu prints it in this format; `None` for anything else (`n/a`, text,
    /// misplaced separators, NaN, infinities, numbers too large for an f64).
    pub fn parse(self, raw: &str) -> Option<f64> {
        let (decimal, group) = match self {
            Self::DecimalPoint => ('.', ','),
            Self::DecimalComma => (',', '.'),
        };
        let raw = raw.trim();
        let (sign, unsigned) = match raw.strip_prefix('-') {
            Some(rest) => ("-", rest),
            None => ("", raw.strip_prefix('+').unwrap_or(raw)),
        };
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
            None => (unsigned, None),
        };
        let (integer, fraction) = match mantissa.split_once(decimal) {
            Some((integer, fraction)) => (integer, Some(fraction)),
            None => (mantissa, None),
        };
        let is_group = |c: char| c == group || matches!(c, ' ' | '\u{a0}' | '\u{202f}' | '\'');
        // Thousands groups: the first of one to three digits, every other of exactly three.
        let mut digits = String::with_capacity(integer.len() + 8);
        let groups: Vec<&str> = integer.split(is_group).collect();
        for (index, part) in groups.iter().enumerate() {
            let well_sized = if groups.len() == 1 {
                !part.is_empty()
            } else if index == 0 {
                (1..=3).contains(&part.len())
            } else {
                part.len() == 3
            };
            if !well_sized || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.push_str(part);
        }
        if let Some(fraction) = fraction {
            if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.push('.');
            digits.push_str(fraction);
        }
        if let Some(exponent) = exponent {
            let unsigned_exponent = exponent.strip_prefix(['-', '+']).unwrap_or(exponent);
            if unsigned_exponent.is_empty()
                || !unsigned_exponent.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            digits.push('e');
            digits.push_str(exponent);
        }
        format!("{sign}{digits}")
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_names_section_names_and_the_dram_alternative_name_the_same_metrics() {
        assert_eq!(
            Metric::from_raw_name("gpu__time_duration.sum"),
            Some((Metric::Duration, Naming::Raw))
        );
        assert_eq!(
            Metric::from_raw_name("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            Some((Metric::DramThroughput, Naming::RawAlternative))
        );
        assert_eq!(Metric::from_raw_name("Duration"), None);
        assert_eq!(
            Metric::from_details_name("Duration", "us"),
            Some((Metric::Duration, Naming::Section))
        );
        assert_eq!(
            Metric::from_details_name("Static Shared Memory Per Block", "byte/block"),
            Some((Metric::StaticSharedPerBlock, Naming::Section))
        );
        assert_eq!(Metric::from_details_name("Elapsed Cycles", "cycle"), None);
    }

    #[test]
    fn memory_throughput_as_a_rate_is_not_the_percentage_of_the_method() {
        assert_eq!(
            Metric::from_details_name("Memory Throughput", "%"),
            Some((Metric::MemoryThroughput, Naming::Section))
        );
        assert_eq!(
            Metric::from_details_name("Memory Throughput", "Gbyte/s"),
            None
        );
    }

    #[test]
    fn every_time_and_memory_unit_ncu_prints_converts_to_nanoseconds_and_bytes() {
        let time = |unit| unit_scale(Quantity::Time, unit);
        assert_eq!(time("nsecond"), Some(1.0));
        assert_eq!(time("ns"), Some(1.0));
        assert_eq!(time("usecond"), Some(1e3));
        assert_eq!(time("us"), Some(1e3));
        assert_eq!(time("msecond"), Some(1e6));
        assert_eq!(time("ms"), Some(1e6));
        assert_eq!(time("second"), Some(1e9));
        assert_eq!(time("cycle"), None);
        let bytes = |unit| unit_scale(Quantity::BytesPerBlock, unit);
        assert_eq!(bytes("byte/block"), Some(1.0));
        assert_eq!(bytes("byte"), Some(1.0));
        assert_eq!(bytes("Kbyte/block"), Some(1e3));
        assert_eq!(bytes("Mbyte"), Some(1e6));
        assert_eq!(bytes("Gbyte/s"), None, "a rate is not a size");
        assert_eq!(unit_scale(Quantity::Percent, "%"), Some(1.0));
        assert_eq!(unit_scale(Quantity::Percent, "Gbyte/s"), None);
        let threads = Metric::Threads.quantity();
        assert_eq!(unit_scale(threads, "thread"), Some(1.0));
        assert_eq!(unit_scale(threads, "Kthread"), Some(1e3));
        assert_eq!(unit_scale(threads, "cycle"), None);
        let registers = Metric::RegistersPerThread.quantity();
        assert_eq!(unit_scale(registers, "register/thread"), Some(1.0));
    }

    #[test]
    fn numbers_are_read_with_the_separators_of_their_locale() {
        let point = NumberFormat::DecimalPoint;
        assert_eq!(point.parse("11,744"), Some(11_744.0));
        assert_eq!(point.parse("1,046,387,753.56"), Some(1_046_387_753.56));
        assert_eq!(point.parse("6.75"), Some(6.75));
        assert_eq!(point.parse("0"), Some(0.0));
        assert_eq!(point.parse("27 595 520"), Some(27_595_520.0));
        assert_eq!(point.parse("1.5e3"), Some(1500.0));
        let comma = NumberFormat::DecimalComma;
        assert_eq!(comma.parse("27.595.520"), Some(27_595_520.0));
        assert_eq!(comma.parse("6,75"), Some(6.75));
        assert_eq!(comma.parse("1.046.387.753,56"), Some(1_046_387_753.56));
        for bad in [
            "n/a",
            "",
            "1,2",
            "12,34,567",
            "1..2",
            "NaN",
            "inf",
            "1e999",
            "--1",
            "0x10",
        ] {
            assert_eq!(point.parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_number_format_is_decided_by_the_values_that_are_unambiguous() {
        let mut english = FormatVotes::default();
        for raw in ["11,744", "19.04", "n/a", "0", "1,024"] {
            english.add(raw);
        }
        assert_eq!(english.decide(), NumberFormat::DecimalPoint);
        let mut german = FormatVotes::default();
        for raw in ["27.595.520", "6,75", "1.024", "text, with a comma"] {
            german.add(raw);
        }
        assert_eq!(german.decide(), NumberFormat::DecimalComma);
        assert_eq!(
            FormatVotes::default().decide(),
            NumberFormat::DecimalPoint,
            "ncu's default when nothing says otherwise"
        );
    }
}

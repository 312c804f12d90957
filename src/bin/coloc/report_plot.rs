//! The model report as a picture (`coloc model report --plot FILE.png`): predicted against
//! observed throughput sums of the reported runs, coloured by the model version that
//! predicted them, and the rolling error over time with each promotion marked.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::prelude::*;

use coloc::advisor::trimmed_mean;

use crate::plot::{cycled, register_embedded_font};

/// One reported run: when the server received it, its predicted and observed throughput
/// sums, and the model version that predicted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub at_ms: i64,
    pub predicted: f64,
    pub observed: f64,
    pub version: u64,
}

/// What the picture shows: a GPU model's reported runs (oldest first) and when each
/// promoted version was fitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub gpu: String,
    pub runs: Vec<Run>,
    /// (version, fitted at, ms since the epoch), oldest first.
    pub promotions: Vec<(u64, i64)>,
}

/// The relative error |predicted - observed| / observed of a run; `None` when nothing was
/// observed (no relative error is defined).
fn relative_error(run: &Run) -> Option<f64> {
    (run.observed > 0.0).then(|| (run.predicted - run.observed).abs() / run.observed)
}

/// The rolling error after each run, as the server measures it for the serving model: the
/// trimmed mean ([`trimmed_mean`], the server's own) of the relative errors of the last
/// `window` runs (this one included) predicted by the same version, so that it starts afresh when another version serves. `None` for a run whose
/// window has no run with an observed throughput.
pub fn rolling_errors(runs: &[Run], window: usize) -> Vec<Option<f64>> {
    let window = window.max(1);
    let mut out = Vec::with_capacity(runs.len());
    let mut recent: std::collections::VecDeque<f64> = std::collections::VecDeque::new();
    let mut version = None;
    for run in runs {
        if version != Some(run.version) {
            recent.clear();
            version = Some(run.version);
        }
        if let Some(error) = relative_error(run) {
            recent.push_back(error);
            if recent.len() > window {
                recent.pop_front();
            }
        }
        out.push((!recent.is_empty()).then(|| trimmed_mean(&recent)));
    }
    out
}

/// The time axis' unit for a span of `span_ms`: (name, milliseconds per unit).
fn time_unit(span_ms: i64) -> (&'static str, f64) {
    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 60 * MINUTE;
    if span_ms < 3 * MINUTE {
        ("s", 1_000.0)
    } else if span_ms < 3 * HOUR {
        ("min", MINUTE as f64)
    } else if span_ms < 72 * HOUR {
        ("h", HOUR as f64)
    } else {
        ("days", 24.0 * HOUR as f64)
    }
}

fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// Draws `report` into a PNG at `path`; `window` is the rolling error's window in runs.
/// A report without runs is refused: an empty picture would say nothing.
pub fn draw(path: &Path, report: &Report, window: usize) -> anyhow::Result<()> {
    let (Some(first), Some(last)) = (report.runs.first(), report.runs.last()) else {
        bail!("no reported runs with a prediction to draw");
    };
    register_embedded_font()?;
    let root = BitMapBackend::new(path, (1600, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(44);
    title.draw(&Text::new(
        format!(
            "GPU {}: {} reported runs, {} to {}",
            report.gpu,
            report.runs.len(),
            utc(first.at_ms),
            utc(last.at_ms)
        ),
        (16, 12),
        ("sans-serif", 24),
    ))?;
    let (left, right) = body.split_horizontally(700);

    let mut versions: Vec<u64> = report.runs.iter().map(|r| r.version).collect();
    versions.sort_unstable();
    versions.dedup();

    draw_scatter(&left, report, &versions)?;
    draw_rolling_errors(&right, report, window, &versions, (first, last))?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// A model version's colour: its place among the versions drawn.
fn colour_of(versions: &[u64], version: u64) -> RGBColor {
    cycled(versions.iter().position(|v| *v == version).unwrap_or(0))
}

/// Predicted against observed, with the y = x line, one colour per model version.
fn draw_scatter(left: &Area, report: &Report, versions: &[u64]) -> anyhow::Result<()> {
    let top = report
        .runs
        .iter()
        .map(|r| r.predicted.max(r.observed))
        .fold(f64::MIN_POSITIVE, f64::max)
        * 1.08;
    let bottom = report
        .runs
        .iter()
        .map(|r| r.predicted.min(r.observed))
        .fold(0.0f64, f64::min);
    let mut scatter = ChartBuilder::on(left)
        .caption("predicted vs observed throughput sum", ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(bottom..top, bottom..top)?;
    scatter
        .configure_mesh()
        .x_desc("observed sum of members' throughputs (their own units, e.g. samples/s)")
        .y_desc("predicted sum (same units)")
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 14))
        .draw()?;
    scatter
        .draw_series(LineSeries::new(
            [(bottom, bottom), (top, top)],
            BLACK.mix(0.5).stroke_width(2),
        ))?
        .label("y = x (perfect prediction)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5).stroke_width(2)));
    let radius = if report.runs.len() > 2000 { 2 } else { 4 };
    for &version in versions {
        let color = colour_of(versions, version);
        let runs: Vec<&Run> = report
            .runs
            .iter()
            .filter(|r| r.version == version)
            .collect();
        let errors: Vec<f64> = runs.iter().filter_map(|r| relative_error(r)).collect();
        let mean = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
        scatter
            .draw_series(
                runs.iter().map(|r| {
                    Circle::new((r.observed, r.predicted), radius, color.mix(0.6).filled())
                }),
            )?
            .label(format!(
                "predicted by v{version}: {} runs, mean error {:.1} %",
                runs.len(),
                mean * 100.0
            ))
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, color.filled()));
    }
    scatter
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    Ok(())
}

/// Rolling error over time per serving version, promotions marked.
fn draw_rolling_errors(
    right: &Area,
    report: &Report,
    window: usize,
    versions: &[u64],
    (first, last): (&Run, &Run),
) -> anyhow::Result<()> {
    let (unit, per_unit) = time_unit(last.at_ms - first.at_ms);
    let at = |ms: i64| (ms - first.at_ms) as f64 / per_unit;
    let rolling = rolling_errors(&report.runs, window);
    let promotions: Vec<(u64, f64)> = report
        .promotions
        .iter()
        .filter(|(_, ms)| *ms >= first.at_ms)
        .map(|&(v, ms)| (v, at(ms)))
        .collect();
    let x_end = promotions
        .iter()
        .map(|p| p.1)
        .fold(at(last.at_ms), f64::max)
        .max(f64::EPSILON)
        * 1.03;
    // Headroom: the data stays in the lower 60 %, the promotions' labels above it and the
    // legend at the top.
    let y_top = rolling.iter().flatten().fold(0.01f64, |a, &b| a.max(b)) * 100.0 * 1.7;
    let mut errors = ChartBuilder::on(right)
        .caption(
            format!("rolling error (last {window} runs of the serving version)"),
            ("sans-serif", 22),
        )
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, 0f64..y_top)?;
    errors
        .configure_mesh()
        .x_desc(format!(
            "time since the first reported run ({unit}; reported at the server)"
        ))
        .y_desc("mean |predicted - observed| / observed (%)")
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 14))
        .draw()?;
    for &version in versions {
        let color = colour_of(versions, version);
        let points: Vec<(f64, f64)> = report
            .runs
            .iter()
            .zip(&rolling)
            .filter(|(r, _)| r.version == version)
            .filter_map(|(r, e)| e.map(|e| (at(r.at_ms), e * 100.0)))
            .collect();
        let promoted = report
            .promotions
            .iter()
            .find(|(v, _)| *v == version)
            .map_or(
                "served without a promotion (pinned)".to_string(),
                |&(_, ms)| format!("promoted {}", utc(ms)),
            );
        errors
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(format!("v{version}, {promoted}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        errors.draw_series(points.iter().map(|&p| Circle::new(p, 2, color.filled())))?;
    }
    let marker = RGBColor(90, 90, 90);
    for (i, &(version, x)) in promotions.iter().enumerate() {
        let series = errors.draw_series(std::iter::once(PathElement::new(
            [(x, 0.0), (x, y_top)],
            marker.stroke_width(2),
        )))?;
        if i == 0 {
            series
                .label("a promotion (the new version serves from then on)")
                .legend(move |(x, y)| {
                    PathElement::new([(x + 8, y - 6), (x + 8, y + 6)], marker.stroke_width(2))
                });
        }
        errors.draw_series(std::iter::once(Text::new(
            format!("v{version} promoted"),
            (x + x_end * 0.006, y_top * 0.66),
            ("sans-serif", 14).into_font().color(&marker),
        )))?;
    }
    errors
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(version: u64, predicted: f64, observed: f64) -> Run {
        Run {
            at_ms: 0,
            predicted,
            observed,
            version,
        }
    }

    #[test]
    fn rolling_error_averages_the_window_and_restarts_with_a_new_version() {
        // Errors by hand: 0.1, 0.3, 0.5 (v1), then 0.2 (v2).
        let runs = [
            run(1, 110.0, 100.0),
            run(1, 130.0, 100.0),
            run(1, 50.0, 100.0),
            run(2, 80.0, 100.0),
        ];
        let rolling = rolling_errors(&runs, 2);
        let expected = [0.1, 0.2, 0.4, 0.2];
        for (got, want) in rolling.iter().zip(expected) {
            assert!((got.unwrap() - want).abs() < 1e-12, "{rolling:?}");
        }
    }

    #[test]
    fn one_absurd_run_moves_the_rolling_error_no_more_than_it_moves_the_servers() {
        // Nine runs 10 % off, then one predicted at 100x: the server trims the highest and
        // lowest tenth, so the window's error stays 0.1 (a plain mean would say 10.0).
        let mut runs: Vec<Run> = (0..9).map(|_| run(1, 110.0, 100.0)).collect();
        runs.push(run(1, 10_000.0, 100.0));
        let rolling = rolling_errors(&runs, 10);
        assert!((rolling[9].unwrap() - 0.1).abs() < 1e-12, "{rolling:?}");
    }

    #[test]
    fn a_run_with_nothing_observed_has_no_relative_error() {
        let rolling = rolling_errors(&[run(1, 10.0, 0.0), run(1, 12.0, 10.0)], 5);
        assert_eq!(rolling[0], None);
        assert!((rolling[1].unwrap() - 0.2).abs() < 1e-12);
    }

    #[test]
    fn a_report_with_promotions_is_drawn() {
        // Two days of runs; v2 and v3 promoted during them.
        let hour = 3_600_000;
        let start = 1_795_000_000_000;
        let runs: Vec<Run> = (0..600)
            .map(|i| {
                let version = 1 + (i >= 200) as u64 + (i >= 420) as u64;
                let observed = 80.0 + (i % 37) as f64 * 4.0;
                let bias = [1.25, 0.92, 1.03][version as usize - 1];
                Run {
                    at_ms: start + i * hour / 12,
                    predicted: observed * bias + ((i * 7919) % 23) as f64 - 11.0,
                    observed,
                    version,
                }
            })
            .collect();
        let report = Report {
            gpu: "A100-SXM4-40GB".into(),
            promotions: vec![
                (1, start - 24 * hour),
                (2, start + 200 * hour / 12 - 60_000),
                (3, start + 420 * hour / 12 - 60_000),
            ],
            runs,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.png");
        draw(&path, &report, 50).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn an_empty_report_draws_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.png");
        let report = Report {
            gpu: "A100".into(),
            runs: vec![],
            promotions: vec![],
        };
        let error = draw(&path, &report, 50).unwrap_err();
        assert!(error.to_string().contains("no reported runs"), "{error}");
        assert!(!path.exists());
    }
}

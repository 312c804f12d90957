//! The simulation as pictures (one seed): the CDF of job completion time per policy, and
//! the busy GPUs over time per policy.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::engine::Outcome;
use crate::plot::{register_embedded_font, PALETTE};

// One colour per policy `--policies` may name.
const _: () = assert!(PALETTE.len() >= super::POLICIES.len());

/// JCT CDF per policy, hours on a log axis.
pub fn jct_cdf(path: &Path, seed: u64, outcomes: &[(String, &Outcome)]) -> anyhow::Result<()> {
    register_embedded_font()?;
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let hours = |o: &Outcome| {
        let mut v: Vec<f64> = o
            .jobs
            .iter()
            .map(|j| (j.completion_time() / 3600.0).max(1e-3))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let top = outcomes
        .iter()
        .flat_map(|(_, o)| hours(o).last().copied())
        .fold(1.0f64, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("job completion time, CDF (seed {seed})"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((1e-3f64..top).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("hours from arrival to finish (log)")
        .y_desc("share of jobs")
        .draw()?;
    for (k, (name, outcome)) in outcomes.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let v = hours(outcome);
        let n = v.len() as f64;
        chart
            .draw_series(LineSeries::new(
                v.iter().enumerate().map(|(i, &x)| (x, (i + 1) as f64 / n)),
                color.stroke_width(2),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Busy GPUs over time per policy (a step line each), days on the x axis.
pub fn busy_gpus(
    path: &Path,
    seed: u64,
    gpus: usize,
    outcomes: &[(String, &Outcome)],
) -> anyhow::Result<()> {
    register_embedded_font()?;
    let root = BitMapBackend::new(path, (1400, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let day = 86_400.0;
    let start = outcomes
        .iter()
        .filter_map(|(_, o)| o.busy_series.first().map(|p| p.0))
        .fold(f64::INFINITY, f64::min);
    let end = outcomes
        .iter()
        .filter_map(|(_, o)| o.busy_series.last().map(|p| p.0))
        .fold(start, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("busy GPUs of {gpus} (seed {seed})"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(
            0f64..((end - start) / day).max(1e-3),
            0f64..(gpus as f64 + 0.5),
        )?;
    chart
        .configure_mesh()
        .x_desc("days since the first arrival")
        .y_desc("GPUs with at least one job")
        .draw()?;
    for (k, (name, outcome)) in outcomes.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let mut points = Vec::with_capacity(2 * outcome.busy_series.len());
        let mut last = 0.0;
        for &(t, busy) in &outcome.busy_series {
            let x = (t - start) / day;
            points.push((x, last));
            last = f64::from(busy);
            points.push((x, last));
        }
        chart
            .draw_series(LineSeries::new(points, color.mix(0.8).stroke_width(1)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))
}

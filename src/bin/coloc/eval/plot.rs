//! The evaluation as a picture: per-target scores at n_occur=2 for each policy (like the
//! paper's Figure 5), and predicted against actual throughput sums on held-out workloads.

use std::path::Path;

use anyhow::Context;
use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{CaseResult, EvalData, Policy, Protocol, Summary};
use crate::plot::{cycled, register_embedded_font};

/// Shortens a KACE workload name for an axis label, as the paper's figure does:
/// "albert-base-v2_batch16-train" -> "ALBERT b16 train".
fn short_name(name: &str) -> String {
    let (model, rest) = name.rsplit_once("_batch").unwrap_or((name, ""));
    let model = match model {
        "albert-base-v2" => "ALBERT",
        "bert-base-cased" => "BERT",
        "vit-base-patch16-224" => "ViT",
        "vit_h_14" => "ViT-H/14",
        "wav2vec2-base-960h" => "Wav2vec2",
        "whisper-large-v2" => "Whisper",
        other => other,
    };
    if rest.is_empty() {
        model.to_string()
    } else {
        format!("{model} b{}", rest.replace('-', " "))
    }
}

/// Draws the plot into a PNG at `path`. `scatter_policies` are the model kinds whose
/// unseen-workload predictions are drawn against the actual sums.
pub fn draw(
    path: &Path,
    data: &EvalData,
    summary: &Summary,
    results: &[CaseResult],
    scatter_policies: &[Policy],
) -> anyhow::Result<()> {
    register_embedded_font()?;
    let root = BitMapBackend::new(path, (1800, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(1150);

    draw_scores(&left, summary)?;
    draw_held_out(&right, data, results, scatter_policies, &summary.policies)?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Per-target bars: each policy's score against the oracle at n_occur=2.
fn draw_scores(left: &Area, summary: &Summary) -> anyhow::Result<()> {
    let targets: Vec<String> = summary
        .per_target_n_occur_2
        .values()
        .flat_map(|m| m.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let policies = &summary.policies;
    let mut chart = ChartBuilder::on(left)
        .caption(
            "score vs oracle per target (n_occur=2, mean of 5 seeds)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(150)
        .y_label_area_size(55)
        // Group i is centred on x = i so that integer ticks label it; headroom above 1.0
        // keeps the legend off the bars.
        .build_cartesian_2d(-0.5f64..targets.len() as f64 - 0.5, 0f64..1.3f64)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        // Target names are drawn below, anchored at their start (mesh labels are centred).
        .x_labels(0)
        .y_desc("actual sum of pick / oracle")
        .draw()?;
    let width = 0.8 / policies.len() as f64;
    for (j, policy) in policies.iter().enumerate() {
        let color = cycled(j);
        let scores = &summary.per_target_n_occur_2[policy];
        chart
            .draw_series(targets.iter().enumerate().map(|(i, target)| {
                let x0 = i as f64 - 0.4 + j as f64 * width;
                let score = scores.get(target).copied().unwrap_or(0.0);
                Rectangle::new([(x0, 0.0), (x0 + width, score)], color.filled())
            }))?
            .label(policy.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    let label_style = TextStyle::from(
        ("sans-serif", 14)
            .into_font()
            .transform(FontTransform::Rotate90),
    )
    .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, target) in targets.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64, 0.0));
        left.draw(&Text::new(short_name(target), (x, y + 6), &label_style))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperMiddle)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    Ok(())
}

/// Predicted against actual sums on held-out workloads, one colour per model kind (its
/// colour among `policies`).
fn draw_held_out(
    right: &Area,
    data: &EvalData,
    results: &[CaseResult],
    scatter_policies: &[Policy],
    policies: &[String],
) -> anyhow::Result<()> {
    let mut points: Vec<(usize, f64, f64)> = Vec::new();
    for (k, policy) in scatter_policies.iter().enumerate() {
        for result in results.iter().filter(|r| r.policy == *policy) {
            let case = &data.cases[result.case];
            if case.protocol != Protocol::Unseen {
                continue;
            }
            for (&i, &predicted) in case.test.iter().zip(&result.pair_scores) {
                points.push((k, data.pairs[i].throughput_sum(), predicted));
            }
        }
    }
    let top = points.iter().map(|p| p.1.max(p.2)).fold(1.0f64, f64::max) * 1.05;
    let bottom = points.iter().map(|p| p.1.min(p.2)).fold(0.0f64, f64::min);
    let mut scatter = ChartBuilder::on(right)
        .caption(
            "held-out workloads: predicted vs actual sum",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(bottom..top, bottom..top)?;
    scatter
        .configure_mesh()
        .x_desc("actual throughput sum")
        .y_desc("predicted throughput sum")
        .draw()?;
    scatter.draw_series(LineSeries::new(
        [(bottom, bottom), (top, top)],
        BLACK.mix(0.4),
    ))?;
    for (k, policy) in scatter_policies.iter().enumerate() {
        let color = cycled(
            policies
                .iter()
                .position(|p| *p == policy.name())
                .unwrap_or(k),
        );
        scatter
            .draw_series(
                points
                    .iter()
                    .filter(|p| p.0 == k)
                    .map(|p| Circle::new((p.1, p.2), 3, color.mix(0.7).filled())),
            )?
            .label(policy.name())
            .legend(move |(x, y)| Circle::new((x + 6, y), 4, color.filled()));
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

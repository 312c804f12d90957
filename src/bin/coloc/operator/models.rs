//! The model commands of the operator CLI: `coloc report` (a measured run as training
//! data), `coloc train`, `coloc predict`, `coloc models list` and `coloc model` (one
//! version; its report, with `--plot` drawn by `report_plot`).

use anyhow::{bail, Context};

use coloc::proto as pb;

use super::{print_canonical, print_table, status_error, Client};
use crate::args::{
    Connection, ModelArgs, ModelCommand, ModelsCommand, PredictArgs, ReportArgs, TrainArgs,
};

pub async fn report(connection: &Connection, args: ReportArgs) -> anyhow::Result<()> {
    let mut members = args
        .members
        .iter()
        .map(|m| {
            let (workload, throughput) = m
                .split_once('=')
                .with_context(|| format!("{m:?} is not WORKLOAD=THROUGHPUT"))?;
            Ok(pb::ColocatedMember {
                workload: workload.to_string(),
                throughput: throughput
                    .parse()
                    .with_context(|| format!("{throughput:?} is not a number"))?,
                job_id: String::new(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !args.job_ids.is_empty() && args.job_ids.len() != members.len() {
        bail!(
            "{} --job-id for {} members: give one per member, in the members' order, or none",
            args.job_ids.len(),
            members.len()
        );
    }
    for (member, job_id) in members.iter_mut().zip(args.job_ids) {
        member.job_id = job_id;
    }
    let observed_at = args
        .at
        .as_deref()
        .map(|at| {
            at.parse::<prost_types::Timestamp>()
                .map_err(|e| anyhow::anyhow!("--at {at:?} is not an RFC 3339 time: {e}"))
        })
        .transpose()?;
    let mut client = connection.client().await?;
    let response = client
        .report_colocation(pb::ReportColocationRequest {
            sharing_mode: args.sharing_mode.map(|mode| mode.to_pb()),
            gpu_id: String::new(),
            gpu: args.gpu,
            members,
            observed_at,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.ReportColocationResponse");
    }
    println!(
        "observation {} {}",
        response.observation_id,
        if response.created {
            "stored"
        } else {
            "was already stored"
        }
    );
    Ok(())
}

fn status_name(status: i32) -> &'static str {
    match pb::ModelStatus::try_from(status) {
        Ok(pb::ModelStatus::Promoted) => "promoted",
        Ok(pb::ModelStatus::Rejected) => "rejected",
        _ => "-",
    }
}

const MODEL_HEADERS: [&str; 8] = [
    "VERSION", "KIND", "STATUS", "", "RUNS", "CV SCORE", "R2", "REASON",
];

fn model_row(m: &pb::Model) -> Vec<String> {
    let status = status_name(m.status);
    let mut flags = Vec::new();
    if m.serving {
        flags.push("serving");
    }
    if m.pinned {
        flags.push("pinned");
    }
    vec![
        m.version.to_string(),
        m.kind.clone(),
        status.into(),
        flags.join(","),
        m.observations.to_string(),
        m.cv_score.map_or("-".into(), |s| format!("{s:.4}")),
        format!("{:.3}", m.r2),
        m.reason.clone(),
    ]
}

pub async fn model(connection: &Connection, args: ModelArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let model = client
        .get_model(pb::GetModelRequest {
            gpu: args.gpu,
            version: args.version,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&model, "coloc.v1.Model");
    }
    if model.serving {
        println!(
            "GPU {}: version {} ({}) serving{}",
            model.gpu,
            model.version,
            model.kind,
            if model.pinned { ", pinned" } else { "" }
        );
    } else {
        println!(
            "GPU {}: version {} ({}) {}, not serving",
            model.gpu,
            model.version,
            model.kind,
            status_name(model.status)
        );
    }
    if let Some(error) = model.rolling_error {
        println!(
            "rolling error {:.1} % over {} reported runs",
            error * 100.0,
            model.rolling_error_samples
        );
    }
    let rows: Vec<Vec<String>> = model.history.iter().map(model_row).collect();
    print_table(&MODEL_HEADERS, &rows);
    Ok(())
}

/// `coloc model pin VERSION` / `coloc model unpin`.
pub async fn model_command(connection: &Connection, command: ModelCommand) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let model = match command {
        ModelCommand::Report {
            plot,
            gpu,
            limit,
            window,
        } => return model_report(&mut client, connection.json, &plot, gpu, limit, window).await,
        ModelCommand::Pin { version, gpu } => client
            .pin_model(pb::PinModelRequest { gpu, version })
            .await
            .map_err(status_error)?
            .into_inner(),
        ModelCommand::Unpin { gpu } => client
            .unpin_model(pb::UnpinModelRequest { gpu })
            .await
            .map_err(status_error)?
            .into_inner(),
    };
    if connection.json {
        return print_canonical(&model, "coloc.v1.Model");
    }
    println!(
        "GPU {}: version {} ({}) serving{}",
        model.gpu,
        model.version,
        model.kind,
        if model.pinned { ", pinned" } else { "" }
    );
    Ok(())
}

/// `coloc model report --plot FILE.png`.
async fn model_report(
    client: &mut Client,
    json: bool,
    plot: &std::path::Path,
    gpu: String,
    limit: u32,
    window: u32,
) -> anyhow::Result<()> {
    let report = client
        .get_model_report(pb::GetModelReportRequest { gpu, limit })
        .await
        .map_err(status_error)?
        .into_inner();
    if report.runs.is_empty() {
        bail!(
            "GPU {}: no reported runs with a prediction yet, so there is nothing to draw \
             ({} not written). Runs are predicted when they are reported \
             (ReportColocation, `coloc report`) while a model serves; imported runs have none.",
            report.gpu,
            plot.display()
        );
    }
    let ms = |t: &Option<prost_types::Timestamp>| {
        t.as_ref()
            .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
    };
    let picture = crate::report_plot::Report {
        gpu: report.gpu.clone(),
        runs: report
            .runs
            .iter()
            .map(|r| crate::report_plot::Run {
                at_ms: ms(&r.reported_at),
                predicted: r.predicted_sum,
                observed: r.observed_sum,
                version: r.predicted_by_version,
            })
            .collect(),
        promotions: report
            .models
            .iter()
            .filter(|m| m.status == pb::ModelStatus::Promoted as i32)
            .map(|m| (m.version, ms(&m.trained_at)))
            .collect(),
    };
    crate::report_plot::draw(plot, &picture, window as usize)?;
    if json {
        return print_canonical(&report, "coloc.v1.ModelReport");
    }
    let last = crate::report_plot::rolling_errors(&picture.runs, window as usize)
        .last()
        .copied()
        .flatten();
    println!(
        "GPU {}: {} reported runs, {} promotions; rolling error now {}; wrote {}",
        report.gpu,
        report.runs.len(),
        picture.promotions.len(),
        last.map_or("-".to_string(), |e| format!("{:.1} %", e * 100.0)),
        plot.display()
    );
    Ok(())
}

/// `coloc models list`.
pub async fn models(connection: &Connection, command: ModelsCommand) -> anyhow::Result<()> {
    let ModelsCommand::List { gpu, limit } = command;
    let mut client = connection.client().await?;
    let response = client
        .list_models(pb::ListModelsRequest { gpu, limit })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.ListModelsResponse");
    }
    let rows: Vec<Vec<String>> = response.models.iter().map(model_row).collect();
    print_table(&MODEL_HEADERS, &rows);
    Ok(())
}

/// `coloc predict W1 W2 ...`.
pub async fn predict(connection: &Connection, args: PredictArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let response = client
        .predict(pb::PredictRequest {
            sharing_mode: args.sharing_mode.map(|mode| mode.to_pb()),
            workloads: args.workloads,
            gpu: args.gpu,
            gpu_memory_gb: args.gpu_memory_gb,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.PredictResponse");
    }
    println!(
        "GPU {}, model version {}: predicted sum {:.2}, normalized sum {}, {:.1} GB ({}){}",
        response.gpu,
        response.model_version,
        response.predicted_throughput_sum,
        response
            .predicted_normalized_sum
            .map_or("-".into(), |n| format!("{n:.3}")),
        response.memory_gb,
        if response.fits_memory {
            "fits"
        } else {
            "does not fit"
        },
        if response.members_estimated {
            "; member figures estimated from exclusive throughputs (the model predicts only sums)"
        } else {
            ""
        }
    );
    if response.mode_unmeasured {
        println!("note: {}", response.mode_note);
    }
    let rows: Vec<Vec<String>> = response
        .members
        .iter()
        .map(|m| {
            vec![
                m.workload.clone(),
                format!("{:.2}", m.exclusive_throughput),
                m.predicted_throughput
                    .map_or("-".into(), |t| format!("{t:.2}")),
                m.predicted_speed_fraction
                    .map_or("-".into(), |f| format!("{:.0} %", f * 100.0)),
                m.throughput_unit.clone(),
                if m.exclusive_suspect {
                    format!(
                        "suspect profile (alone {:.2}; runs show more)",
                        m.profile_exclusive_throughput
                    )
                } else {
                    super::evidence_name(m.evidence).to_string()
                },
            ]
        })
        .collect();
    print_table(
        &[
            "MEMBER",
            "ALONE",
            "PREDICTED",
            "SPEED FRACTION",
            "UNIT",
            "EVIDENCE",
        ],
        &rows,
    );
    Ok(())
}

/// `coloc train`.
pub async fn train(connection: &Connection, args: TrainArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let response = client
        .train(pb::TrainRequest {
            gpu: args.gpu,
            kind: args.kind,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.TrainResponse");
    }
    if let Some(model) = &response.model {
        println!(
            "version {} ({}), {} runs: {} ({})",
            model.version,
            model.kind,
            model.observations,
            status_name(model.status),
            model.reason
        );
    }
    println!("serving version {}", response.champion_version);
    if response.unusable_observations > 0 {
        println!(
            "{} runs left out: a member has no complete profile on this GPU model",
            response.unusable_observations
        );
    }
    Ok(())
}

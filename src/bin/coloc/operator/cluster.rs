//! The cluster commands of the operator CLI: `coloc place` (which GPU for a new job, from a
//! JSON file of GPUs or the occupancy the server keeps), `coloc gpus list`, `coloc jobs
//! assign|release`, and `coloc agents list` (the profiling agents on the GPU nodes).

use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;
use tonic::metadata::MetadataValue;

use coloc::proto as pb;

use super::{print_canonical, print_table, status_error};
use crate::args::{AgentsCommand, Connection, GpusCommand, JobsCommand, ObjectiveArg, PlaceArgs};

/// `coloc agents list`.
pub async fn agents(connection: &Connection, command: AgentsCommand) -> anyhow::Result<()> {
    let AgentsCommand::List = command;
    let channel = connection.channel().await?;
    let token: Option<MetadataValue<_>> = match &connection.token {
        Some(token) => Some(
            format!("Bearer {token}")
                .parse()
                .context("COLOC_TOKEN is not a valid header value")?,
        ),
        None => None,
    };
    let mut client = pb::profiling_agents_client::ProfilingAgentsClient::new(channel);
    let mut request = tonic::Request::new(pb::ListAgentsRequest {});
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token);
    }
    let answer = client
        .list_agents(request)
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&answer, "coloc.v1.ListAgentsResponse");
    }
    let now = coloc::domain::now_ms();
    let rows: Vec<[String; 6]> = answer
        .agents
        .iter()
        .map(|a| {
            let seen_ms = a
                .last_seen
                .as_ref()
                .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000);
            [
                a.agent_id.clone(),
                a.node.clone(),
                a.gpu.clone(),
                format!(
                    "{}s ago{}",
                    (now - seen_ms).max(0) / 1000,
                    if a.live { "" } else { " (not live)" }
                ),
                if a.job_id == 0 {
                    String::new()
                } else {
                    format!("{}={}", a.job_id, a.job_workload)
                },
                a.ncu_version.clone(),
            ]
        })
        .collect();
    let header = ["ID", "NODE", "GPU", "LAST SEEN", "JOB", "NCU"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&header.map(String::from)));
    for row in &rows {
        println!("{}", line(row));
    }
    Ok(())
}

/// One GPU of a --gpu-state file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuStateFile {
    id: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    gpu: String,
    #[serde(default)]
    memory_gb: f64,
    #[serde(default)]
    residents: Vec<String>,
}

fn read_gpu_state(path: &PathBuf) -> anyhow::Result<Vec<pb::GpuState>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let gpus: Vec<GpuStateFile> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of GPUs", path.display()))?;
    Ok(gpus
        .into_iter()
        .map(|g| pb::GpuState {
            id: g.id,
            node: g.node,
            gpu: g.gpu,
            memory_gb: g.memory_gb,
            residents: g.residents,
            resident_min_fractions: Vec::new(),
        })
        .collect())
}

fn percent(fraction: Option<f64>) -> String {
    fraction.map_or("-".into(), |f| format!("{:.0} %", f * 100.0))
}

pub async fn place(connection: &Connection, args: PlaceArgs) -> anyhow::Result<()> {
    let gpus = match &args.gpu_state {
        Some(path) => read_gpu_state(path)?,
        None => Vec::new(),
    };
    let mut client = connection.client().await?;
    let response = client
        .place(pb::PlaceRequest {
            sharing_mode: None,
            workload: args.workload,
            gpus,
            objective: args.objective.map(|o| match o {
                ObjectiveArg::Throughput => pb::Objective::ThroughputSum as i32,
                ObjectiveArg::Normalized => pb::Objective::NormalizedSum as i32,
            }),
            min_job_fraction: args.min_job_fraction,
            min_resident_fraction: args.min_resident_fraction,
            max_jobs_per_gpu: args.max_jobs_per_gpu,
            top_k: args.top,
            include_oversubscribed: args.include_oversubscribed,
            cautious: args.cautious,
            nodes: args.nodes,
            gpu: args.gpu,
            rule: pb::PlaceRule::Unspecified as i32,
            policy: Some(super::policy_request(&args.policy)),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.PlaceResponse");
    }
    for model in &response.models {
        println!(
            "GPU model {}: model version {} ({})",
            model.gpu, model.version, model.kind
        );
    }
    println!("{}", super::policy_line(response.policy.as_ref()));
    let rows: Vec<Vec<String>> = response
        .placements
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let residents: Vec<&str> = p.members[1..].iter().map(|m| m.workload.as_str()).collect();
            let worst = p.members[1..]
                .iter()
                .filter_map(|m| m.predicted_speed_fraction)
                .min_by(f64::total_cmp);
            vec![
                (i + 1).to_string(),
                p.gpu_id.clone(),
                p.node.clone(),
                if residents.is_empty() {
                    "(empty)".into()
                } else {
                    residents.join(" ")
                },
                format!("{:.2}", p.gain),
                format!("{:.2}", p.gain_low),
                format!("{:.2} -> {:.2}", p.value_before, p.value_after),
                percent(p.members[0].predicted_speed_fraction),
                percent(worst),
                format!(
                    "{:.1}/{:.0}{}",
                    p.memory_gb,
                    p.gpu_memory_gb,
                    if p.fits_memory { "" } else { " !" }
                ),
            ]
        })
        .collect();
    print_table(
        &[
            "#",
            "GPU",
            "NODE",
            "RESIDENTS",
            "GAIN",
            "LOW END",
            "VALUE",
            "JOB KEEPS",
            "WORST RESIDENT KEEPS",
            "MEMORY GB",
        ],
        &rows,
    );
    for skipped in &response.skipped {
        println!("skipped {}: {}", skipped.gpu_id, skipped.reason);
    }
    Ok(())
}

/// Every GPU of the occupancy the server keeps (all pages), on these nodes and GPU model.
async fn all_gpus(
    connection: &Connection,
    nodes: &[String],
    gpu: &str,
) -> anyhow::Result<Vec<pb::ClusterGpu>> {
    let mut client = connection.client().await?;
    let mut gpus = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_gpus(pb::ListGpusRequest {
                page_size: 1000,
                page_token,
                nodes: nodes.to_vec(),
                gpu: gpu.to_string(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        gpus.extend(page.gpus);
        if page.next_page_token.is_empty() {
            return Ok(gpus);
        }
        page_token = page.next_page_token;
    }
}

/// Who says each job runs on the GPU, once per source in the order of its jobs:
/// "assign-job", "pod-resources" (the kubelet), "hami-annotation", "gpu-annotation".
fn sources(gpu: &pb::ClusterGpu) -> String {
    let mut names: Vec<&str> = Vec::new();
    for job in &gpu.jobs {
        let name = match job.source() {
            pb::ResidentSource::AssignJob => "assign-job",
            pb::ResidentSource::PodResources => "pod-resources",
            pb::ResidentSource::HamiAnnotation => "hami-annotation",
            pb::ResidentSource::GpuAnnotation => "gpu-annotation",
            pb::ResidentSource::DraAllocation => "dra-allocation",
            pb::ResidentSource::Unspecified => "-",
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names.join(" ")
}

/// When a job's lease ends, from now: "in 4m 12s", "no lease", or "expired".
fn lease_left(job: &pb::ClusterJob, now_s: i64) -> String {
    let Some(expires) = &job.expires_at else {
        return "no lease".to_string();
    };
    let left = expires.seconds - now_s;
    if left <= 0 {
        return "expired".to_string();
    }
    let (hours, minutes, seconds) = (left / 3600, left % 3600 / 60, left % 60);
    if hours > 0 {
        format!("in {hours}h {minutes}m")
    } else if minutes > 0 {
        format!("in {minutes}m {seconds}s")
    } else {
        format!("in {seconds}s")
    }
}

/// `coloc jobs list`: every running job of the occupancy, one row each.
pub async fn jobs_list(connection: &Connection, nodes: &[String], gpu: &str) -> anyhow::Result<()> {
    let gpus = all_gpus(connection, nodes, gpu).await?;
    if connection.json {
        let jobs: Vec<serde_json::Value> = gpus
            .iter()
            .flat_map(|g| {
                g.jobs.iter().map(move |j| {
                    serde_json::json!({
                        "jobId": j.job_id,
                        "workload": j.workload,
                        "gpuId": g.id,
                        "node": g.node,
                        "gpu": g.gpu,
                        "leaseExpiresAt": j.expires_at.as_ref().map(|t| t.seconds),
                    })
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "jobs": jobs }))?
        );
        return Ok(());
    }
    let now = coloc::domain::now_ms() / 1000;
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .flat_map(|g| {
            g.jobs.iter().map(move |j| {
                vec![
                    j.job_id.clone(),
                    j.workload.clone(),
                    g.id.clone(),
                    g.node.clone(),
                    g.gpu.clone(),
                    lease_left(j, now),
                ]
            })
        })
        .collect();
    print_table(
        &["JOB", "WORKLOAD", "GPU ID", "NODE", "GPU", "LEASE ENDS"],
        &rows,
    );
    Ok(())
}

pub async fn gpus(connection: &Connection, command: GpusCommand) -> anyhow::Result<()> {
    let (nodes, gpu) = match command {
        GpusCommand::List { nodes, gpu } => (nodes, gpu),
        GpusCommand::Forget { gpu_id, node, undo } => {
            return super::undo::forget_gpus(connection, gpu_id, node, undo).await
        }
    };
    let gpus = all_gpus(connection, &nodes, &gpu).await?;
    if connection.json {
        return print_canonical(
            &pb::ListGpusResponse {
                gpus,
                next_page_token: String::new(),
            },
            "coloc.v1.ListGpusResponse",
        );
    }
    let now = coloc::domain::now_ms() / 1000;
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            vec![
                g.id.clone(),
                g.node.clone(),
                g.gpu.clone(),
                g.jobs
                    .iter()
                    .map(|j| {
                        let workload = if j.workload.is_empty() {
                            "?"
                        } else {
                            &j.workload
                        };
                        match lease_left(j, now) {
                            lease if j.expires_at.is_some() => {
                                format!("{}={workload} (lease ends {lease})", j.job_id)
                            }
                            _ => format!("{}={workload}", j.job_id),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                sources(g),
            ]
        })
        .collect();
    print_table(&["ID", "NODE", "GPU", "JOBS", "SOURCES"], &rows);
    Ok(())
}

pub async fn jobs(connection: &Connection, command: JobsCommand) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    match command {
        JobsCommand::List { nodes, gpu } => jobs_list(connection, &nodes, &gpu).await?,
        JobsCommand::Assign {
            job_id,
            gpu_id,
            workload,
            node,
            gpu,
            lease,
        } => {
            let response = client
                .assign_job(pb::AssignJobRequest {
                    job_id: job_id.clone(),
                    gpu_id: gpu_id.clone(),
                    node,
                    gpu,
                    workload,
                    lease_secs: lease,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&response, "coloc.v1.AssignJobResponse");
            }
            println!(
                "job {job_id} {} on GPU {gpu_id} ({})",
                if response.created {
                    "assigned"
                } else {
                    "renewed"
                },
                response.gpu
            );
        }
        JobsCommand::Release { job_id } => {
            let response = client
                .release_job(pb::ReleaseJobRequest {
                    job_id: job_id.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&response, "coloc.v1.ReleaseJobResponse");
            }
            println!(
                "job {job_id} {}",
                if response.released {
                    "released"
                } else {
                    "was not running"
                }
            );
        }
    }
    Ok(())
}

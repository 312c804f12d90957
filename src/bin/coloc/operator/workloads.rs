//! The workload commands of the operator CLI: `coloc workloads list|get|register|delete`
//! and `coloc rank` (the partners the service ranks for a workload).

use anyhow::Context;

use coloc::proto as pb;

use super::{
    all_workloads, evidence_name, mode_name, policy_line, print_canonical, print_table, state_name,
    status_error,
};
use crate::args::{
    Connection, ModeArg, ObjectiveArg, ProfileFiles, RankArgs, StateArg, WorkloadsCommand,
};

pub async fn workloads(connection: &Connection, command: WorkloadsCommand) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    match command {
        WorkloadsCommand::List { state } => list(connection, &mut client, state).await?,
        WorkloadsCommand::Get { name } => {
            let w = client
                .get_workload(pb::GetWorkloadRequest { name })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&w, "coloc.v1.Workload");
            }
            print_table(
                &["NAME", "MODE", "MODEL", "BATCH", "STATE", "REASON"],
                &[vec![
                    w.name.clone(),
                    mode_name(w.mode).into(),
                    w.model.clone(),
                    w.batch_size.to_string(),
                    state_name(w.state).into(),
                    w.state_reason.clone(),
                ]],
            );
        }
        WorkloadsCommand::Register {
            name,
            mode,
            model,
            batch_size,
            labels,
            program,
            args,
            working_dir,
            env,
            nvtx_range,
            profile_on,
            files,
        } => {
            let profile = uploaded_profile(&files)?;
            let labels = key_values("label", &labels)?;
            let launch = launch_spec(program, args, &env, working_dir, nvtx_range)?;
            let w = client
                .register_workload(pb::RegisterWorkloadRequest {
                    name,
                    mode: match mode {
                        ModeArg::Training => pb::WorkloadMode::Training,
                        ModeArg::Inference => pb::WorkloadMode::Inference,
                    } as i32,
                    model,
                    batch_size,
                    labels,
                    profile,
                    launch,
                    profile_on_gpus: profile_on,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&w, "coloc.v1.Workload");
            }
            println!("registered {} ({})", w.name, state_name(w.state));
        }
        WorkloadsCommand::SubmitProfile { name, files } => {
            let Some(profile) = uploaded_profile(&files)? else {
                anyhow::bail!(
                    "name the profile's files: --ncu FILE.csv --nvml FILE.jsonl --throughput X"
                );
            };
            let w = client
                .put_profile(pb::PutProfileRequest {
                    name,
                    profile: Some(profile),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&w, "coloc.v1.Workload");
            }
            println!("stored the profile of {} ({})", w.name, state_name(w.state));
        }
        WorkloadsCommand::DeleteProfile { name, gpu, undo } => {
            return super::undo::delete_profile(connection, name, gpu, undo).await
        }
        WorkloadsCommand::Delete { name } => {
            let response = client
                .delete_workload(pb::DeleteWorkloadRequest { name: name.clone() })
                .await
                .map_err(status_error)?
                .into_inner();
            if connection.json {
                return print_canonical(&response, "coloc.v1.DeleteWorkloadResponse");
            }
            println!("deleted {name}");
        }
    }
    Ok(())
}

/// The profile of `--ncu --nvml --throughput`, checked here before anything is sent;
/// `None` without `--ncu`.
fn uploaded_profile(files: &ProfileFiles) -> anyhow::Result<Option<pb::Profile>> {
    let (Some(ncu), Some(nvml), Some(throughput)) = (&files.ncu, &files.nvml, files.throughput)
    else {
        return Ok(None);
    };
    let gpu = files
        .gpu
        .as_deref()
        .map(|g| coloc::domain::GpuName::parse("--gpu", g))
        .transpose()?;
    let profile = coloc::profiler::upload::profile_from_files(
        ncu,
        nvml,
        throughput,
        &files.throughput_unit,
        gpu.as_ref(),
        coloc::domain::now_ms(),
    )?;
    Ok(Some(coloc::api::convert::profile_to_pb(&profile)))
}

/// `coloc workloads list`.
async fn list(
    connection: &Connection,
    client: &mut super::Client,
    state: Option<StateArg>,
) -> anyhow::Result<()> {
    let state = state.map_or(0, |s| match s {
        StateArg::PendingProfile => pb::WorkloadState::PendingProfile,
        StateArg::Profiled => pb::WorkloadState::Profiled,
        StateArg::Failed => pb::WorkloadState::Failed,
    } as i32);
    let all = all_workloads(client, state).await.map_err(status_error)?;
    if connection.json {
        return print_canonical(
            &pb::ListWorkloadsResponse {
                workloads: all,
                next_page_token: String::new(),
            },
            "coloc.v1.ListWorkloadsResponse",
        );
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                mode_name(w.mode).into(),
                w.batch_size.to_string(),
                state_name(w.state).into(),
                w.profiles
                    .iter()
                    .map(|p| p.gpu.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect();
    print_table(&["NAME", "MODE", "BATCH", "STATE", "PROFILED ON"], &rows);
    Ok(())
}

/// `--FLAG KEY=VALUE` pairs as a map.
fn key_values<C: FromIterator<(String, String)>>(
    flag: &str,
    pairs: &[String],
) -> anyhow::Result<C> {
    pairs
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--{flag} {l:?} is not KEY=VALUE"))
        })
        .collect::<anyhow::Result<_>>()
}

/// The launch spec `coloc workloads register` gives: none without `--program`, whose
/// companions (`--arg`, `--env`, `--nvtx-range`) it then refuses.
fn launch_spec(
    program: Option<String>,
    args: Vec<String>,
    env: &[String],
    working_dir: Option<String>,
    nvtx_range: Option<String>,
) -> anyhow::Result<Option<pb::LaunchSpec>> {
    if program.is_none() && (!args.is_empty() || !env.is_empty() || nvtx_range.is_some()) {
        anyhow::bail!("--arg, --env and --nvtx-range belong to a launch spec: give --program");
    }
    Ok(match program {
        Some(program) => Some(pb::LaunchSpec {
            program,
            args,
            env: key_values("env", env)?,
            working_dir: working_dir.unwrap_or_default(),
            nvtx_range,
            ..Default::default()
        }),
        None => None,
    })
}

pub async fn rank(connection: &Connection, args: RankArgs) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let response = client
        .rank(pb::RankRequest {
            target: args.target,
            candidates: args.candidates,
            top_k: args.top,
            gpu: args.gpu,
            objective: args.objective.map(|o| match o {
                ObjectiveArg::Throughput => pb::Objective::ThroughputSum as i32,
                ObjectiveArg::Normalized => pb::Objective::NormalizedSum as i32,
            }),
            min_target_speed_fraction: args.min_target_speed_fraction,
            min_benefit: args.min_benefit,
            include_below_break_even: args.include_below_break_even,
            cautious: args.cautious,
            include_oversubscribed: args.include_oversubscribed,
            gpu_memory_gb: args.gpu_memory_gb,
            policy: Some(super::policy_request(&args.policy)),
            sharing_mode: args.sharing_mode.map(|mode| mode.to_pb()),
            ..Default::default()
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.RankResponse");
    }
    if response.mode_unmeasured {
        println!("note: {}", response.mode_note);
    }
    let rows: Vec<Vec<String>> = response
        .ranked
        .iter()
        .enumerate()
        .map(|(i, c)| {
            vec![
                (i + 1).to_string(),
                c.workload.clone(),
                format!("{:.2}", c.predicted_throughput_sum),
                c.predicted_normalized_sum
                    .map_or("-".into(), |n| format!("{n:.3}")),
                c.predicted_normalized_sum_low
                    .map_or("-".into(), |n| format!("{n:.3}")),
                c.members
                    .first()
                    .and_then(|m| m.predicted_speed_fraction)
                    .map_or("-".into(), |s| format!("{:.0} %", s * 100.0)),
                c.members.get(1).map_or("-".into(), |m| {
                    format!(
                        "{}{}{}",
                        evidence_name(m.evidence),
                        if m.exclusive_suspect { ", suspect" } else { "" },
                        if m.profile_level() == pb::ProfileLevel::NvmlOnly {
                            ", NVML-only"
                        } else {
                            ""
                        }
                    )
                }),
                format!("{:.1}", c.memory_gb),
            ]
        })
        .collect();
    println!(
        "GPU {}, model version {}, ordered by {}{}",
        response.gpu,
        response.model_version,
        response.objective().as_str_name(),
        if response.members_estimated {
            "; member figures estimated from exclusive throughputs (the model predicts only sums)"
        } else {
            ""
        }
    );
    println!("{}", policy_line(response.policy.as_ref()));
    print_table(
        &[
            "#",
            "CANDIDATE",
            "PREDICTED SUM",
            "NORMALIZED",
            "LOW END",
            "TARGET SPEED FRACTION",
            "PARTNER EVIDENCE",
            "MEMORY GB",
        ],
        &rows,
    );
    if !response.skipped.is_empty() {
        // How many per reason, then one example of each.
        let mut by_code: std::collections::BTreeMap<&str, (usize, &pb::SkippedCandidate)> =
            std::collections::BTreeMap::new();
        for skipped in &response.skipped {
            by_code
                .entry(skipped.code().as_str_name())
                .or_insert((0, skipped))
                .0 += 1;
        }
        let counts: Vec<String> = by_code
            .iter()
            .map(|(code, (n, _))| format!("{n} {code}"))
            .collect();
        println!("{} skipped ({})", response.skipped.len(), counts.join(", "));
        for (code, (_, example)) in &by_code {
            println!("  {code}, e.g. {}: {}", example.workload, example.reason);
        }
    }
    Ok(())
}

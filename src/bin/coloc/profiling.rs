//! The commands of a GPU node: `coloc agent` (a profiling agent serving the service's job
//! queue), `coloc calibrate` (measured pairs submitted as training data) and `coloc ncu` (an
//! Nsight Compute recording checked before workloads are registered).

use tokio_util::sync::CancellationToken;

use coloc::{settings::Settings, startup::cancel_on_signal, telemetry};

use crate::{
    args::{
        AgentArgs, AgentNodeArgs, CalibrateArgs, CommonArgs, NcuArgs, ProfileJobArgs, SharingArg,
    },
    serve::load_settings,
};

/// `coloc agent`.
pub async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    let (settings, identity, channel) = agent_node(&args.node, None)?;
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(cancel.clone()));
    let ran = coloc::agent::run(
        channel,
        args.node.connection.token.clone(),
        identity,
        settings.profiler,
        settings.agents,
        cancel,
    )
    .await;
    signals.abort();
    tracing::info!("agent stopped");
    ran
}

/// `coloc profile-job`: exits 0 once the outcome reached the service (a profile, or a
/// failure it recorded), else non-zero (the Job fails and the service says why).
pub async fn profile_job(args: ProfileJobArgs) -> anyhow::Result<()> {
    let (settings, identity, channel) = agent_node(&args.node, None)?;
    let launch = coloc::agent::one_job::container_launch(&args.command)?;
    let handed = coloc::agent::one_job::HandedClaim {
        job_id: args.job_id,
        claim: args.claim,
        attempt: args.attempt,
        workload: coloc::domain::WorkloadName::parse("COLOC_WORKLOAD", &args.workload)?,
    };
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(cancel.clone()));
    let outcome = coloc::agent::one_job::run(
        channel,
        args.node.connection.token.clone(),
        identity,
        settings.profiler,
        handed,
        launch,
        cancel,
    )
    .await;
    signals.abort();
    let outcome = outcome?;
    println!("{outcome:?}");
    match outcome {
        coloc::worker::RunOutcome::Idle
        | coloc::worker::RunOutcome::Interrupted { .. }
        | coloc::worker::RunOutcome::LeaseLost { .. } => {
            anyhow::bail!("the job's outcome did not reach the service: {outcome:?}")
        }
        _ => Ok(()),
    }
}

/// `coloc ncu`.
pub fn ncu(args: NcuArgs) -> anyhow::Result<()> {
    coloc::profiler::ncu::run_check(&args.file, args.json)
}

/// `coloc calibrate`.
pub async fn calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    let (settings, identity, channel) = agent_node(&args.node, args.gpu_index)?;
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(cancel.clone()));
    let summary = coloc::agent::calibrate::run(
        channel,
        args.node.connection.token.clone(),
        identity,
        settings.profiler,
        &coloc::profiler::calibrate::Plan {
            max_pairs: args.pairs,
            with: args
                .with
                .iter()
                .map(|w| coloc::domain::WorkloadName::parse("--with", w))
                .collect::<Result<_, _>>()?,
            sharing: match args.sharing {
                SharingArg::Auto => None,
                SharingArg::Mps => Some(coloc::profiler::calibrate::Sharing::Mps),
                SharingArg::Shared => Some(coloc::profiler::calibrate::Sharing::Shared),
            },
        },
        &cancel,
    )
    .await;
    signals.abort();
    let summary = summary?;
    println!("GPU {} ({} sharing)", summary.gpu, summary.sharing.as_str());
    for (a, b, ta, tb) in &summary.measured {
        println!("  {a} {ta:.3} + {b} {tb:.3} = {:.3}", ta + tb);
    }
    for (a, b, why) in &summary.failed {
        println!("  {a} + {b}: failed: {why}");
    }
    println!(
        "{} pairs stored as calibrated runs of {}, {} failed; call Train to use them",
        summary.measured.len(),
        summary.gpu,
        summary.failed.len()
    );
    Ok(())
}

/// What a profiling agent (or `coloc calibrate`) on this node starts from: its settings
/// (`gpu_index` overriding profiler.gpu_index), with logging set up from them; who it is
/// (`--id`, default NODE-gpuINDEX; `--node`, default the host name); and a channel to the
/// service.
fn agent_node(
    args: &AgentNodeArgs,
    gpu_index: Option<u32>,
) -> anyhow::Result<(
    Settings,
    coloc::agent::AgentIdentity,
    tonic::transport::Channel,
)> {
    let mut settings = load_settings(
        &CommonArgs {
            config: args.config.clone(),
            database: None,
        },
        None,
    )?;
    if let Some(index) = gpu_index {
        settings.profiler.gpu_index = index;
    }
    telemetry::init(&settings.log.level, settings.log.format);
    let node = args.node.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "node".into())
    });
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("{node}-gpu{}", settings.profiler.gpu_index));
    let channel = args.connection.lazy_channel()?;
    Ok((settings, coloc::agent::AgentIdentity { id, node }, channel))
}

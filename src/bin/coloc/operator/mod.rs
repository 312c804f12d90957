//! The operator CLI: `coloc workloads|rank|predict|report|train|models|model|health` talk
//! gRPC to a running server (`--addr`, `COLOC_ADDR`; bearer token from `COLOC_TOKEN`;
//! `--ca-cert` for TLS) and print readable tables, or with `--json` the answer in the API's
//! canonical JSON mapping (what grpcurl prints); `coloc model report --plot` draws a PNG
//! (`report_plot`). A failed RPC exits with 64 + its gRPC code,
//! as grpcurl does.

pub mod cluster;

use std::{path::PathBuf, sync::OnceLock};

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use tonic::{
    metadata::MetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};

/// A failed RPC, kept whole so that the exit code can say which.
#[derive(Debug, thiserror::Error)]
#[error("{:?}: {}", .0.code(), .0.message())]
pub struct RpcError(pub tonic::Status);

/// grpcurl's convention: a failed RPC exits with this + its gRPC status code.
pub const STATUS_EXIT_OFFSET: u8 = 64;

/// The exit code of a failed command: 64 + the gRPC code of a failed RPC (65 CANCELLED ..
/// 80 UNAUTHENTICATED, e.g. 69 NOT_FOUND, 67 INVALID_ARGUMENT), else 1.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<RpcError>() {
        Some(RpcError(status)) => STATUS_EXIT_OFFSET + status.code() as u8,
        None => 1,
    }
}

/// `message` in the API's canonical proto3 JSON mapping (lowerCamelCase names, enums by
/// name, 64-bit integers as strings, default values left out): what grpcurl prints.
/// `full_name` is the message's proto name, e.g. "coloc.v1.RankResponse".
pub fn canonical_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<Value> {
    static POOL: OnceLock<Result<prost_reflect::DescriptorPool, String>> = OnceLock::new();
    let pool = POOL
        .get_or_init(|| {
            prost_reflect::DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET)
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("the embedded descriptor set is unreadable: {e}"))?;
    let descriptor = pool
        .get_message_by_name(full_name)
        .with_context(|| format!("no message {full_name} in the API"))?;
    let dynamic =
        prost_reflect::DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())?;
    Ok(serde_json::to_value(&dynamic)?)
}

pub(crate) fn print_canonical<M: prost::Message>(
    message: &M,
    full_name: &str,
) -> anyhow::Result<()> {
    print_json(&canonical_json(message, full_name)?)
}

#[derive(Debug, Args, Clone)]
pub struct Connection {
    /// The server, e.g. http://127.0.0.1:50051 (https:// with TLS); an address without a
    /// scheme, like 127.0.0.1:50051, means http:// (https:// with --ca-cert).
    #[arg(
        long,
        env = "COLOC_ADDR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// A bearer token (reader or operator); read from the environment, never a flag.
    #[arg(skip = std::env::var("COLOC_TOKEN").ok())]
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the server's TLS certificate.
    #[arg(long, env = "COLOC_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadsCommand {
    /// Every workload (all pages).
    List {
        /// Only workloads in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
    },
    Get {
        name: String,
    },
    /// Register a workload (without a profile it waits for the profiling worker).
    Register {
        name: String,
        #[arg(long, value_enum)]
        mode: ModeArg,
        #[arg(long, default_value = "")]
        model: String,
        #[arg(long, default_value_t = 0)]
        batch_size: u32,
        /// KEY=VALUE, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Launch spec: the program the profiling worker runs (absolute path).
        #[arg(long)]
        program: Option<String>,
        /// Launch spec: an argument, repeatable.
        #[arg(long = "arg", allow_hyphen_values = true)]
        args: Vec<String>,
        #[arg(long)]
        working_dir: Option<String>,
        /// Launch spec: an environment variable KEY=VALUE for the program, repeatable.
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Launch spec: the NVTX range that marks one step for Nsight Compute (default
        /// coloc_step); "" selects kernels by launch count (profiler.ncu_launch_skip and
        /// ncu_launch_count) instead.
        #[arg(long)]
        nvtx_range: Option<String>,
        /// A GPU model to profile it on (one job each, run by an agent of that model),
        /// repeatable; none = every GPU model with a live agent, else model.default_gpu.
        #[arg(long = "profile-on")]
        profile_on: Vec<String>,
    },
    Delete {
        name: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    PendingProfile,
    Profiled,
    Failed,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Training,
    Inference,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ObjectiveArg {
    Throughput,
    Normalized,
}

#[derive(Debug, Args)]
pub struct RankArgs {
    pub target: String,
    #[arg(long, default_value_t = 10)]
    pub top: i32,
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Only these candidates (comma-separated); default every profiled workload.
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// What to order by; default the server's (normalized).
    #[arg(long, value_enum)]
    pub objective: Option<ObjectiveArg>,
    /// The lowest fraction of its exclusive throughput the target may keep (0-1; 0 = no
    /// limit). `--max-target-slowdown` is its deprecated name.
    #[arg(long, alias = "max-target-slowdown", default_value_t = 0.0)]
    pub min_target_speed_fraction: f64,
    /// The least predicted gain over running the pair apart (normalized sum - 1), e.g. 0.2.
    #[arg(long, default_value_t = 0.0)]
    pub min_benefit: f64,
    /// Also rank candidates predicted to do less work together than apart.
    #[arg(long)]
    pub include_below_break_even: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[arg(long)]
    pub gpu: String,
    /// WORKLOAD=THROUGHPUT for each member (2 or more).
    #[arg(required = true, num_args = 2..)]
    pub members: Vec<String>,
    /// The scheduler's job id of each member, in the members' order (repeat the flag).
    #[arg(long = "job-id", value_name = "ID")]
    pub job_ids: Vec<String>,
    /// When the run was measured (RFC 3339, e.g. 2026-11-23T18:00:00Z); default now. The
    /// same GPU, time, members, values and job ids are the same run: reporting it again
    /// stores nothing (created = false). Without --at each call is a new run.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// 2 or more workloads; a name may repeat (copies of one workload).
    #[arg(required = true, num_args = 2..)]
    pub workloads: Vec<String>,
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Memory available, GB; 0 = the GPU model's total memory.
    #[arg(long, default_value_t = 0.0)]
    pub gpu_memory_gb: f64,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// Model kind: member-ridge-gbt or kace-linear; default the server's model.kind.
    #[arg(long, default_value = "")]
    pub kind: String,
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every stored version of a GPU model, newest first, rejected challengers included.
    List {
        #[arg(long, default_value = "")]
        gpu: String,
        /// At most this many; 0 = 100.
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Serve this stored version whatever training decides, until unpinned.
    Pin {
        version: u64,
        #[arg(long, default_value = "")]
        gpu: String,
    },
    /// Return to the newest promoted version.
    Unpin {
        #[arg(long, default_value = "")]
        gpu: String,
    },
    /// Draw predicted vs observed throughput of the reported runs, the rolling error over
    /// time and each promotion into a PNG (GetModelReport).
    Report {
        /// The PNG to write.
        #[arg(long)]
        plot: PathBuf,
        #[arg(long, default_value = "")]
        gpu: String,
        /// The newest this many reported runs; 0 = the server's default (10000).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Runs in the rolling error's window (the server's trainer.drift_window is 50).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        window: u32,
    },
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    #[arg(long, default_value = "")]
    pub gpu: String,
    /// A stored version; default the one serving.
    #[arg(long, default_value_t = 0)]
    pub version: u64,
}

type Authorize =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
pub(crate) type Client = ColocationAdvisorClient<InterceptedService<Channel, Authorize>>;

impl Connection {
    /// The server's URL: `addr` as given, or with the scheme its TLS setting implies.
    pub fn url(&self) -> String {
        if self.addr.contains("://") {
            self.addr.clone()
        } else if self.ca_cert.is_some() {
            format!("https://{}", self.addr)
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The endpoint of `--addr`, with TLS when a CA certificate was given.
    fn endpoint(&self) -> anyhow::Result<Endpoint> {
        let endpoint = Endpoint::from_shared(self.url()).with_context(|| {
            format!(
                "--addr {:?} is not a URL like http://127.0.0.1:50051",
                self.addr
            )
        })?;
        Ok(match &self.ca_cert {
            Some(ca) => {
                let pem =
                    std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
                endpoint
                    .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))?
            }
            None => endpoint,
        })
    }

    /// A channel that connects on first use and again after the server went away (an
    /// agent outlives restarts of the service).
    pub fn lazy_channel(&self) -> anyhow::Result<Channel> {
        Ok(self
            .endpoint()?
            .connect_timeout(std::time::Duration::from_secs(10))
            .connect_lazy())
    }

    pub async fn channel(&self) -> anyhow::Result<Channel> {
        self.endpoint()?
            .connect()
            .await
            .with_context(|| format!("cannot reach coloc at {}", self.addr))
    }

    pub(crate) async fn client(&self) -> anyhow::Result<Client> {
        let token: Option<MetadataValue<_>> = match &self.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .context("COLOC_TOKEN is not a valid header value")?,
            ),
            None => None,
        };
        let authorize: Authorize = Box::new(move |mut request| {
            if let Some(token) = &token {
                request
                    .metadata_mut()
                    .insert("authorization", token.clone());
            }
            Ok(request)
        });
        Ok(ColocationAdvisorClient::with_interceptor(
            self.channel().await?,
            authorize,
        ))
    }
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Every agent that announced itself: id, node, GPU model, last seen, job in hand.
    List,
}

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

pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    RpcError(status).into()
}

fn mode_name(mode: i32) -> &'static str {
    match pb::WorkloadMode::try_from(mode) {
        Ok(pb::WorkloadMode::Training) => "training",
        Ok(pb::WorkloadMode::Inference) => "inference",
        _ => "unspecified",
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::WorkloadState::try_from(state) {
        Ok(pb::WorkloadState::PendingProfile) => "pending_profile",
        Ok(pb::WorkloadState::Profiled) => "profiled",
        Ok(pb::WorkloadState::Failed) => "failed",
        _ => "unspecified",
    }
}

/// Prints rows as an aligned table under `headers`.
pub(crate) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Every workload on the server in `state` (0 = any), page after page.
pub async fn all_workloads<T>(
    client: &mut ColocationAdvisorClient<T>,
    state: i32,
) -> Result<Vec<pb::Workload>, tonic::Status>
where
    // The generated client's own bounds.
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_workloads(pb::ListWorkloadsRequest {
                page_size: 1000,
                page_token,
                state,
            })
            .await?
            .into_inner();
        all.extend(page.workloads);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

pub async fn workloads(connection: &Connection, command: WorkloadsCommand) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    match command {
        WorkloadsCommand::List { state } => {
            let state = state.map_or(0, |s| match s {
                StateArg::PendingProfile => pb::WorkloadState::PendingProfile,
                StateArg::Profiled => pb::WorkloadState::Profiled,
                StateArg::Failed => pb::WorkloadState::Failed,
            } as i32);
            let all = all_workloads(&mut client, state)
                .await
                .map_err(status_error)?;
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
        }
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
        } => {
            let key_values = |flag: &str, pairs: &[String]| {
                pairs
                    .iter()
                    .map(|l| {
                        l.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .with_context(|| format!("--{flag} {l:?} is not KEY=VALUE"))
                    })
                    .collect::<anyhow::Result<_>>()
            };
            let labels = key_values("label", &labels)?;
            if program.is_none() && (!args.is_empty() || !env.is_empty() || nvtx_range.is_some()) {
                anyhow::bail!(
                    "--arg, --env and --nvtx-range belong to a launch spec: give --program"
                );
            }
            let launch = match program {
                Some(program) => Some(pb::LaunchSpec {
                    program,
                    args,
                    env: key_values("env", &env)?,
                    working_dir: working_dir.unwrap_or_default(),
                    nvtx_range,
                    ..Default::default()
                }),
                None => None,
            };
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
                    profile: None,
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
            ..Default::default()
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&response, "coloc.v1.RankResponse");
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
                c.members
                    .first()
                    .and_then(|m| m.predicted_speed_fraction)
                    .map_or("-".into(), |s| format!("{:.0} %", s * 100.0)),
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
    print_table(
        &[
            "#",
            "CANDIDATE",
            "PREDICTED SUM",
            "NORMALIZED",
            "TARGET SPEED FRACTION",
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
            ]
        })
        .collect();
    print_table(
        &["MEMBER", "ALONE", "PREDICTED", "SPEED FRACTION", "UNIT"],
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

/// Exits non-zero unless the server's health service says SERVING (container probes).
pub async fn health(connection: &Connection) -> anyhow::Result<()> {
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(connection.channel().await?);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(status_error)?
        .into_inner()
        .status();
    if status != tonic_health::pb::health_check_response::ServingStatus::Serving {
        bail!("coloc at {} is {:?}", connection.addr, status);
    }
    println!("SERVING");
    Ok(())
}

/// `coloc import kace DIR --addr URL`: the same import as the direct one, through a running
/// server's API, so that the server learns of everything at once. Workloads are registered
/// with their profiles (a taken name is compared and its profile replaced only when it
/// differs), pairs are reported as runs at time 0 (a repeated import, by either path, is
/// recognised run by run), and models are trained (the KACE baseline first, then the
/// server's default kind) only when something changed.
pub async fn import_kace(
    connection: &Connection,
    dir: &std::path::Path,
    gpu: &coloc::domain::GpuName,
    gpu_memory_gb: f64,
) -> anyhow::Result<coloc::import::ImportSummary> {
    use coloc::import::{prepare, ImportSummary, ModelLine};

    let prepared = prepare(dir, gpu, gpu_memory_gb)?;
    let mut client = connection.client().await?;
    let (mut registered, mut updated, mut unchanged) = (0, 0, 0);
    let progress = coloc::progress::bar(
        (prepared.workloads.len() + prepared.observations.len()) as u64,
        "import",
    );
    for workload in &prepared.workloads {
        progress.inc(1);
        let profile = workload
            .profile
            .as_ref()
            .expect("imported workloads carry a profile");
        let pb_profile = pb::Profile {
            gpu: gpu.to_string(),
            kernel: Some(pb::KernelMetrics {
                threads: profile.kernel.threads,
                compute_throughput_pct: profile.kernel.compute_throughput_pct,
                dram_throughput_pct: profile.kernel.dram_throughput_pct,
                memory_throughput_pct: profile.kernel.memory_throughput_pct,
                registers: profile.kernel.registers,
                static_shared_memory_bytes: profile.kernel.static_shared_memory_bytes,
            }),
            system: Some(pb::SystemMetrics {
                exclusive_throughput: profile.system.exclusive_throughput,
                throughput_unit: profile.system.throughput_unit.clone(),
                sm_busy_pct: profile.system.sm_busy_pct,
                mem_busy_pct: profile.system.mem_busy_pct,
                memory_gb: profile.system.memory_gb,
            }),
            source: pb::ProfileSource::Imported as i32,
            gpu_memory_gb,
            ..Default::default()
        };
        let request = pb::RegisterWorkloadRequest {
            name: workload.name.to_string(),
            mode: match workload.mode {
                coloc::domain::WorkloadMode::Training => pb::WorkloadMode::Training,
                coloc::domain::WorkloadMode::Inference => pb::WorkloadMode::Inference,
            } as i32,
            model: workload.model.clone(),
            batch_size: workload.batch_size,
            labels: workload.labels.clone().into_iter().collect(),
            profile: Some(pb_profile.clone()),
            ..Default::default()
        };
        match client.register_workload(request).await {
            Ok(_) => registered += 1,
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                let stored = client
                    .get_workload(pb::GetWorkloadRequest {
                        name: workload.name.to_string(),
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                let same = stored.profiles.iter().any(|p| {
                    p.gpu == pb_profile.gpu
                        && p.kernel == pb_profile.kernel
                        && p.system == pb_profile.system
                });
                if same {
                    unchanged += 1;
                } else {
                    client
                        .put_profile(pb::PutProfileRequest {
                            name: workload.name.to_string(),
                            profile: Some(pb_profile),
                        })
                        .await
                        .map_err(status_error)?;
                    updated += 1;
                }
            }
            Err(status) => return Err(status_error(status)),
        }
    }
    let mut observations_new = 0;
    for run in &prepared.observations {
        progress.inc(1);
        let answer = client
            .report_colocation(pb::ReportColocationRequest {
                gpu: gpu.to_string(),
                members: run
                    .members
                    .iter()
                    .map(|m| pb::ColocatedMember {
                        workload: m.workload.to_string(),
                        throughput: m.throughput,
                        job_id: m.job_id.clone(),
                    })
                    .collect(),
                observed_at: Some(prost_types::Timestamp {
                    seconds: run.observed_at_ms / 1000,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        observations_new += usize::from(answer.created);
    }
    let line = |m: &pb::Model| ModelLine {
        version: m.version,
        kind: m.kind.clone(),
        observations: m.observations,
        r2: m.r2,
        mse: m.mse,
        status: match pb::ModelStatus::try_from(m.status) {
            Ok(pb::ModelStatus::Promoted) => "promoted",
            Ok(pb::ModelStatus::Rejected) => "rejected",
            _ => "unspecified",
        }
        .to_string(),
        reason: m.reason.clone(),
    };
    progress.finish_and_clear();
    let nothing_changed = registered == 0 && updated == 0 && observations_new == 0;
    let current = client
        .get_model(pb::GetModelRequest {
            gpu: gpu.to_string(),
            version: 0,
        })
        .await;
    let models = match current {
        Ok(current) if nothing_changed => vec![Ok(line(current.get_ref()))],
        _ => {
            let training = coloc::progress::spinner("training models");
            let mut models = Vec::new();
            for kind in ["kace-linear", ""] {
                let trained = client
                    .train(pb::TrainRequest {
                        gpu: gpu.to_string(),
                        kind: kind.into(),
                    })
                    .await;
                models.push(match trained {
                    Ok(answer) => Ok(line(
                        answer
                            .get_ref()
                            .model
                            .as_ref()
                            .unwrap_or(&pb::Model::default()),
                    )),
                    Err(status) => Err(status.message().to_string()),
                });
            }
            training.finish_and_clear();
            models
        }
    };
    Ok(ImportSummary {
        workloads_registered: registered,
        workloads_updated: updated,
        workloads_unchanged: unchanged,
        incomplete_workloads: prepared.incomplete_workloads,
        observations_new,
        observations_total: prepared.observations.len(),
        pairs_skipped: prepared.pairs_skipped,
        models,
    })
}

//! The operator CLI: `coloc workloads|rank|predict|report|train|models|model|health|agents|
//! place|gpus|jobs` talk gRPC to a running server (`--addr`, `COLOC_ADDR`; bearer token from
//! `COLOC_TOKEN`; `--ca-cert` for TLS) and print readable tables, or with `--json` the answer
//! in the API's canonical JSON mapping (what grpcurl prints). This module holds what they
//! share: the connection and its authorization, the exit code of a failed RPC (64 + its gRPC
//! code, as grpcurl does), and the printing; the commands live in one file per family.

pub mod cluster;
pub mod import;
pub mod models;
pub mod undo;
pub mod workloads;

use std::sync::OnceLock;

use anyhow::{bail, Context};
use serde_json::Value;
use tonic::{
    metadata::MetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};

use crate::args::{Connection, PolicyArgs, RuleArg};

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

pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    RpcError(status).into()
}

/// The policy fields the flags set; the rest keep the server's defaults.
fn policy_request(args: &PolicyArgs) -> pb::Policy {
    pb::Policy {
        rule: match args.rule {
            None => pb::PlaceRule::Unspecified,
            Some(RuleArg::FairShare) => pb::PlaceRule::FairShare,
            Some(RuleArg::BreakEven) => pb::PlaceRule::BreakEven,
            Some(RuleArg::Gain) => pb::PlaceRule::Gain,
            Some(RuleArg::None) => pb::PlaceRule::None,
        } as i32,
        cautious: args.point.then_some(false),
        min_partner_fraction: (args.min_partner_fraction > 0.0)
            .then_some(args.min_partner_fraction),
        include_losses: args.include_losses.then_some(true),
        ..Default::default()
    }
}

/// The policy an answer says it applied, in one line.
fn policy_line(policy: Option<&pb::Policy>) -> String {
    let Some(policy) = policy else {
        return "policy: (not said)".into();
    };
    let objective = match policy
        .objective
        .and_then(|o| pb::Objective::try_from(o).ok())
    {
        Some(pb::Objective::ThroughputSum) => "throughput-sum",
        _ => "normalized-sum",
    };
    let rule = match pb::PlaceRule::try_from(policy.rule) {
        Ok(pb::PlaceRule::FairShare) => "fair-share",
        Ok(pb::PlaceRule::BreakEven) => "break-even",
        Ok(pb::PlaceRule::Gain) => "gain",
        _ => "none",
    };
    let floor = |f: Option<f64>| f.map_or("none".to_string(), |f| format!("{:.0} %", f * 100.0));
    format!(
        "policy: {objective}, rule {rule}, {}, job floor {}, partner floor {}{}",
        if policy.cautious == Some(false) {
            "point predictions"
        } else {
            "cautious (low ends)"
        },
        floor(policy.min_job_fraction),
        floor(policy.min_partner_fraction),
        if policy.include_losses == Some(true) {
            ", losses listed"
        } else {
            ""
        }
    )
}

/// A member's evidence, for tables.
fn evidence_name(evidence: i32) -> &'static str {
    match pb::Evidence::try_from(evidence) {
        Ok(pb::Evidence::RunsOfSet) => "runs of set",
        Ok(pb::Evidence::RunsOfWorkload) => "runs of workload",
        Ok(pb::Evidence::ProfileOnly) => "profile only",
        _ => "-",
    }
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

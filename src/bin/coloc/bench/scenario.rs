//! One measured scenario: C clients over a few HTTP/2 connections send one kind of call
//! (Health/Check, Rank over N pre-encoded requests, ReportColocation) for T seconds after
//! a warm-up, and the latencies go into an hdrhistogram.

use std::{
    marker::PhantomData,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::bail;
use bytes::{BufMut, Bytes};
use hdrhistogram::Histogram;
use prost::Message;
use rand::{rngs::StdRng, seq::index::sample, Rng, SeedableRng};
use tonic::{
    codec::{Codec, EncodeBuf, Encoder},
    transport::{Channel, Endpoint},
    Status,
};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use tonic_prost::ProstCodec;

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};

use super::{
    echo::ECHO_RANK_PATH, process::cpu_seconds, report::ScenarioResult, BenchArgs, GPU,
    REQUEST_POOL,
};

/// Requests encoded once, sent through tonic's client as they are; answers decoded in full
/// as a scheduler would. Building and encoding 1 000 names per call would cost the load
/// generator more CPU than the server spends on the request, on the same cores, and the
/// Health/Check floor pays no such cost.
pub(super) struct PreEncoded<U>(PhantomData<U>);

impl<U> Default for PreEncoded<U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub(super) struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl<U: Message + Default + Send + 'static> Codec for PreEncoded<U> {
    type Encode = Bytes;
    type Decode = U;
    type Encoder = BytesEncoder;
    type Decoder = <ProstCodec<U, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<U, U>::default().decoder()
    }
}

const RANK_PATH: &str = "/coloc.v1.ColocationAdvisor/Rank";
const PLACE_PATH: &str = "/coloc.v1.ColocationAdvisor/Place";
const OCCUPANCY_GPU: &str = "bench-occupancy-gpu";

/// What one scenario sends.
#[derive(Clone)]
pub(super) enum Call {
    Health,
    /// Encoded `RankRequest`s.
    Rank(Arc<Vec<Bytes>>),
    /// The same, sent to the bench's echo service (`echo_rank_N`).
    EchoRank(Arc<Vec<Bytes>>),
    Report {
        names: Arc<Vec<String>>,
        clock: Arc<AtomicI64>,
    },
    /// Encoded `PlaceRequest`s.
    Place(Arc<Vec<Bytes>>),
    /// AssignJob of a new job, then ReleaseJob of it, one RPC per call.
    Occupancy {
        names: Arc<Vec<String>>,
        jobs: Arc<AtomicI64>,
    },
}

pub(super) async fn run_scenario(
    channels: &[Channel],
    call: Call,
    args: &BenchArgs,
    peer_pid: Option<u32>,
) -> anyhow::Result<ScenarioResult> {
    let warmup = Duration::from_secs_f64(args.warmup);
    let measure = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let mut tasks = Vec::with_capacity(args.concurrency);
    for task in 0..args.concurrency {
        let channel = channels[task % channels.len()].clone();
        let call = call.clone();
        let seed = args.seed ^ (task as u64) << 32;
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut errors = 0u64;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut health = HealthClient::new(channel.clone());
            let mut raw = tonic::client::Grpc::new(channel.clone())
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20);
            let mut advisor = ColocationAdvisorClient::new(channel)
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20);
            let mut i = task;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let ok = match &call {
                    Call::Health => health
                        .check(HealthCheckRequest {
                            service: String::new(),
                        })
                        .await
                        .is_ok(),
                    Call::Rank(pool) => {
                        let request = pool[i % pool.len()].clone();
                        unary::<pb::RankResponse>(&mut raw, RANK_PATH, request).await
                    }
                    Call::EchoRank(pool) => {
                        let request = pool[i % pool.len()].clone();
                        unary::<pb::RankResponse>(&mut raw, ECHO_RANK_PATH, request).await
                    }
                    Call::Place(pool) => {
                        let request = pool[i % pool.len()].clone();
                        unary::<pb::PlaceResponse>(&mut raw, PLACE_PATH, request).await
                    }
                    Call::Occupancy { names, jobs } => {
                        occupancy_call(&mut advisor, names, jobs, (task, i), &mut rng).await
                    }
                    Call::Report { names, clock } => {
                        report_call(&mut advisor, names, clock, &mut rng).await
                    }
                };
                i += 1;
                if sent >= from {
                    if ok {
                        histogram.record(sent.elapsed().as_micros().max(1) as u64)?;
                    } else {
                        errors += 1;
                    }
                }
            }
            anyhow::Ok((histogram, errors))
        }));
    }
    tokio::time::sleep_until(from.into()).await;
    let (cpu_from, peer_from) = (cpu_seconds(None), peer_pid.map(|p| cpu_seconds(Some(p))));
    tokio::time::sleep_until(until.into()).await;
    let cpu = cpu_seconds(None) - cpu_from + peer_pid.map_or(0.0, |p| cpu_seconds(Some(p)));
    let cpu = cpu - peer_from.unwrap_or(0.0);
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0;
    for task in tasks {
        let (h, e) = task.await??;
        histogram.add(h)?;
        errors += e;
    }
    Ok(ScenarioResult {
        rps: histogram.len() as f64 / measure.as_secs_f64(),
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        cpu_cores: cpu / measure.as_secs_f64(),
        errors,
    })
}

/// One pre-encoded call on `path`, its answer decoded as a `U`: whether it succeeded.
async fn unary<U: Message + Default + Send + 'static>(
    raw: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Bytes,
) -> bool {
    let path = http::uri::PathAndQuery::from_static(path);
    match raw.ready().await {
        Ok(()) => raw
            .unary(
                tonic::Request::new(request),
                path,
                PreEncoded::<U>::default(),
            )
            .await
            .is_ok(),
        Err(_) => false,
    }
}

/// One Rank call with a pre-encoded request on `channel`, its answer decoded.
pub(super) async fn rank_once(
    channel: &Channel,
    request: Bytes,
) -> Result<pb::RankResponse, Status> {
    let mut raw = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(256 << 20);
    raw.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(RANK_PATH);
    let codec = PreEncoded::<pb::RankResponse>::default();
    Ok(raw
        .unary(tonic::Request::new(request), path, codec)
        .await?
        .into_inner())
}

/// Waits until the server on `channel` says it is ready (`coloc.v1.Ready` SERVING) and
/// answers `request` with model `version`: a replica reads a new champion within its poll
/// period, and measuring before would count its errors.
pub(super) async fn wait_until_serving(
    channel: &Channel,
    version: u64,
    request: &Bytes,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut health = HealthClient::new(channel.clone());
    loop {
        let ready = health
            .check(HealthCheckRequest {
                service: coloc::leader::follow::READY_SERVICE.into(),
            })
            .await
            .map(|r| r.into_inner().status);
        let ranked = rank_once(channel, request.clone()).await;
        let serving = matches!(&ranked, Ok(r) if r.model_version == version);
        if ready
            .as_ref()
            .is_ok_and(|s| *s == ServingStatus::Serving as i32)
            && serving
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "a replica did not serve model version {version} within 60 s (readiness \
                 {ready:?}, Rank {:?})",
                ranked.map(|r| r.model_version)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One call of the `occupancy` scenario by client `task` (its `i`-th): even calls assign a
/// new job, odd calls release the one before.
async fn occupancy_call(
    advisor: &mut ColocationAdvisorClient<Channel>,
    names: &[String],
    jobs: &AtomicI64,
    (task, i): (usize, usize),
    rng: &mut StdRng,
) -> bool {
    let job = if (i - task) % 2 == 0 {
        jobs.fetch_add(1, Ordering::Relaxed)
    } else {
        jobs.load(Ordering::Relaxed)
    };
    let job_id = format!("bench-{task}-{}", (i - task) / 2);
    if (i - task) % 2 == 0 {
        advisor
            .assign_job(pb::AssignJobRequest {
                job_id,
                gpu_id: format!("bench-gpu-{}", job % 4096),
                node: String::new(),
                // Its own GPU model, so that these GPUs stay out of
                // the place_stored scenarios' view.
                gpu: OCCUPANCY_GPU.into(),
                workload: names[rng.random_range(0..names.len())].clone(),
                lease_secs: 0,
            })
            .await
            .is_ok_and(|r| r.into_inner().created)
    } else {
        advisor
            .release_job(pb::ReleaseJobRequest { job_id })
            .await
            .is_ok_and(|r| r.into_inner().released)
    }
}

/// One call of the `report` scenario: a run of two random workloads, reported at the
/// shared clock's next millisecond.
async fn report_call(
    advisor: &mut ColocationAdvisorClient<Channel>,
    names: &[String],
    clock: &AtomicI64,
    rng: &mut StdRng,
) -> bool {
    let member = |rng: &mut StdRng| pb::ColocatedMember {
        workload: names[rng.random_range(0..names.len())].clone(),
        throughput: 1.0 + 100.0 * rng.random::<f64>(),
        job_id: String::new(),
    };
    let at = clock.fetch_add(1, Ordering::Relaxed);
    let request = pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: GPU.into(),
        members: vec![member(rng), member(rng)],
        observed_at: Some(prost_types::Timestamp {
            seconds: at / 1000,
            nanos: (at % 1000) as i32 * 1_000_000,
        }),
    };
    advisor
        .report_colocation(request)
        .await
        .is_ok_and(|r| r.into_inner().created)
}

pub(super) fn rank_pool(names: &[String], n: Option<usize>, top_k: i32, seed: u64) -> Vec<Bytes> {
    rank_pool_with(names, n, top_k, seed, false)
}

/// What a cautious scheduler asks (`rank_cautious_N`): the target keeps half its speed at
/// the low end of its interval.
pub(super) const CAUTIOUS_FRACTION: f64 = 0.5;

/// [`rank_pool`]; with `cautious`, each request asks that the target keep
/// [`CAUTIOUS_FRACTION`] of its speed at the low end of its interval.
pub(super) fn rank_pool_with(
    names: &[String],
    n: Option<usize>,
    top_k: i32,
    seed: u64,
    cautious: bool,
) -> Vec<Bytes> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..REQUEST_POOL)
        .map(|_| pb::RankRequest {
            target: names[rng.random_range(0..names.len())].clone(),
            candidates: match n {
                Some(n) => sample(&mut rng, names.len(), n.min(names.len()))
                    .into_iter()
                    .map(|i| names[i].clone())
                    .collect(),
                None => Vec::new(),
            },
            top_k: if n.is_some() { top_k } else { 10 },
            gpu: GPU.into(),
            min_target_speed_fraction: if cautious { CAUTIOUS_FRACTION } else { 0.0 },
            cautious,
            ..Default::default()
        })
        .map(|request| Bytes::from(request.encode_to_vec()))
        .collect()
}

pub(super) async fn connect(addr: &str, connections: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        channels.push(Endpoint::from_shared(addr.to_string())?.connect().await?);
    }
    Ok(channels)
}

/// `connections` connections spread round-robin over the servers at `addrs` (the first to
/// the first server, the second to the second, ...), so the clients, which take the
/// connections round-robin too, load every replica alike.
pub(super) async fn connect_spread(
    addrs: &[String],
    connections: usize,
) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(connections);
    for i in 0..connections.max(addrs.len()) {
        let addr = &addrs[i % addrs.len()];
        channels.push(Endpoint::from_shared(addr.clone())?.connect().await?);
    }
    Ok(channels)
}

/// Workload names of a running server, for `--addr`.
pub(super) async fn server_names(channel: Channel) -> anyhow::Result<Vec<String>> {
    let mut client = ColocationAdvisorClient::new(channel);
    let workloads = crate::operator::all_workloads(&mut client, 0).await?;
    Ok(workloads.into_iter().map(|w| w.name).collect())
}

pub(super) async fn connect_when_ready(
    addr: &str,
    connections: usize,
) -> anyhow::Result<Vec<Channel>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(channels) = connect(addr, connections).await {
            let mut health = HealthClient::new(channels[0].clone());
            let request = HealthCheckRequest {
                service: String::new(),
            };
            if health.check(request).await.is_ok() {
                return Ok(channels);
            }
        }
        if Instant::now() > deadline {
            bail!("the peer at {addr} did not become healthy within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_pool_holds_encoded_requests_naming_n_distinct_candidates() {
        let names: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
        let pool = rank_pool(&names, Some(10), 3, 1);
        assert_eq!(pool.len(), REQUEST_POOL);
        for bytes in &pool {
            let request = pb::RankRequest::decode(bytes.clone()).unwrap();
            assert!(names.contains(&request.target));
            let distinct: std::collections::HashSet<_> = request.candidates.iter().collect();
            assert_eq!((request.candidates.len(), distinct.len()), (10, 10));
            assert_eq!(request.top_k, 3);
            assert_eq!(request.gpu, GPU);
        }
        let first = pb::RankRequest::decode(pool[0].clone()).unwrap();
        assert!(!first.cautious);
        assert_eq!(first.min_target_speed_fraction, 0.0);
        // The cautious pool asks the same, with the target's floor read at the low end.
        let cautious = rank_pool_with(&names, Some(10), 3, 1, true);
        let careful = pb::RankRequest::decode(cautious[0].clone()).unwrap();
        assert!(careful.cautious);
        assert_eq!(careful.min_target_speed_fraction, CAUTIOUS_FRACTION);
        assert_eq!(careful.candidates, first.candidates);
        // rank_all names no candidates and asks for the best 10.
        let all = pb::RankRequest::decode(rank_pool(&names, None, 0, 1)[0].clone()).unwrap();
        assert!(all.candidates.is_empty());
        assert_eq!(all.top_k, 10);
        // More candidates than workloads: every workload once.
        let capped =
            pb::RankRequest::decode(rank_pool(&names, Some(500), 0, 1)[0].clone()).unwrap();
        assert_eq!(capped.candidates.len(), 50);
    }
}

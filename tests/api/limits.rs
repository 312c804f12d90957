//! Bounded requests and answers: Rank names at most 10 000 candidates, and an answer about
//! 10 000 unknown ones lists 100 and counts the rest, small enough for any client; a flood
//! of such Ranks and Places against `coloc serve` (a real child process) keeps its peak
//! memory under 500 MB: heavy calls wait for a permit (once decoded) before they compute.

use std::{process::Stdio, time::Duration};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};
use tonic::Code;

use crate::helpers::{database_url, expect_code, seed_workloads_and_runs, spawn_app, GPU};

#[tokio::test]
async fn rank_bounds_its_candidates_and_summarises_the_skipped() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let names = |n: usize| -> Vec<String> { (0..n).map(|i| format!("u-{i:0>120}")).collect() };
    let message = expect_code(
        app.client
            .rank(pb::RankRequest {
                target: "w00".into(),
                candidates: names(10_001),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(message.contains("at most 10000 candidates"), "{message}");

    // 10 000 unknown names (1.3 MB): 100 listed, all counted, the answer a few kB.
    let answer = app
        .client
        .rank(pb::RankRequest {
            target: "w00".into(),
            candidates: names(10_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.ranked.is_empty());
    assert_eq!(answer.skipped.len(), 100);
    assert_eq!(
        answer.skipped_counts,
        [pb::SkippedCount {
            code: pb::SkipReason::UnknownWorkload as i32,
            count: 10_000
        }]
    );
    assert_eq!(answer.ranked_not_listed, 0);
    assert!(
        prost::Message::encoded_len(&answer) < 64 * 1024,
        "{}",
        prost::Message::encoded_len(&answer)
    );
}

/// The server's peak resident memory (VmHWM), in MB.
fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kb: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024.0
}

/// One heavy call: a Rank naming `names` as candidates, or a Place naming them as empty
/// GPUs.
async fn heavy_call(
    mut client: ColocationAdvisorClient<tonic::transport::Channel>,
    rank: bool,
    names: Vec<String>,
) -> Result<&'static str, tonic::Status> {
    if rank {
        client
            .rank(pb::RankRequest {
                target: "w00".into(),
                candidates: names,
                ..Default::default()
            })
            .await
            .map(|answer| {
                assert_eq!(answer.get_ref().skipped.len(), 100);
                "Rank OK"
            })
    } else {
        client
            .place(pb::PlaceRequest {
                workload: "w00".into(),
                gpu: GPU.into(),
                gpus: names
                    .into_iter()
                    .map(|id| pb::GpuState {
                        id,
                        ..Default::default()
                    })
                    .collect(),
                top_k: 10,
                ..Default::default()
            })
            .await
            .map(|_| "Place OK")
    }
}

/// 256 heavy calls in flight on one connection, two rounds of 1.3-2.7 MB requests: every
/// call answers, and the server's peak RSS stays below 500 MB (the bound). With
/// the permit taken after decoding, every waiting request is read and decoded at once:
/// 607 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_heavy_calls_keeps_the_servers_memory_bounded() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let dir = app.stop().await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database", &database_url(&dir)])
        .env("COLOC__METRICS__LISTEN", "")
        .env("COLOC__SERVER__MAX_CONCURRENT_HEAVY_RPCS", "4")
        .env("COLOC__PROFILER__BACKEND", "off")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = server.id().unwrap();
    let address = format!("http://127.0.0.1:{port}");
    let mut channel = None;
    for _ in 0..200 {
        if let Ok(connected) = tonic::transport::Endpoint::from_shared(address.clone())
            .unwrap()
            .connect()
            .await
        {
            channel = Some(connected);
            break;
        }
        assert!(server.try_wait().unwrap().is_none(), "the server died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let channel = channel.expect("the server never listened");
    let at_start = peak_rss_mb(pid);

    // Round 0: the flood, Ranks naming 100 000 unknown 25-character candidates
    // (2.7 MB requests), refused past 10 000 candidates. Round 1: Ranks naming 10 000
    // unknown 128-character candidates and Places naming 10 000 empty GPUs (1.3 MB
    // requests), answered.
    let short: Vec<String> = (0..100_000)
        .map(|i| format!("unknown-candidate-{i:0>7}"))
        .collect();
    let long: Vec<String> = (0..10_000).map(|i| format!("u{i:0>127}")).collect();
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..2 {
        let calls: Vec<_> = (0..256)
            .map(|i| {
                let client = ColocationAdvisorClient::new(channel.clone());
                let names = if round == 0 {
                    short.clone()
                } else {
                    long.clone()
                };
                tokio::spawn(heavy_call(client, round == 0 || i % 2 == 0, names))
            })
            .collect();
        for call in calls {
            let key = match call.await.unwrap() {
                Ok(what) => what.to_string(),
                Err(status) => format!("{:?}", status.code()),
            };
            *answered.entry(key).or_default() += 1;
        }
    }
    let peak = peak_rss_mb(pid);
    eprintln!("peak RSS {peak:.0} MB under the flood (at start {at_start:.0} MB): {answered:?}");
    server.kill().await.unwrap();
    let expected: std::collections::BTreeMap<String, usize> = [
        ("InvalidArgument".to_string(), 256),
        ("Place OK".to_string(), 128),
        ("Rank OK".to_string(), 128),
    ]
    .into();
    assert_eq!(answered, expected);
    assert!(
        peak < 500.0,
        "peak RSS {peak:.0} MB under the flood (at start {at_start:.0} MB)"
    );
}

#[tokio::test]
async fn a_heavy_call_whose_body_never_ends_gives_its_turn_up_after_the_body_timeout() {
    let config = "[server]\nmax_concurrent_heavy_rpcs = 1\nheavy_body_timeout_secs = 1\n";
    let (app, _) = crate::helpers::slowdown_app_with_config(6, config).await;
    // A raw HTTP/2 Rank whose gRPC frame announces 100 bytes and sends 2 of them: it takes
    // the only turn and never lets its body end.
    let tcp = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/coloc.v1.ColocationAdvisor/Rank",
            app.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 100, 10, 3]), false)
        .unwrap();
    // A whole Rank behind it is answered once the trickler's turn is taken back.
    let mut client = app.client.clone();
    let whole = tokio::time::timeout(
        Duration::from_secs(20),
        client.rank(pb::RankRequest {
            target: "w00".into(),
            ..Default::default()
        }),
    )
    .await
    .expect("a call behind a trickling body is answered after the body timeout");
    assert!(!whole.unwrap().into_inner().ranked.is_empty());
    // The trickler is told why.
    let response = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .unwrap()
        .unwrap();
    let mut status = response.headers().get("grpc-status").cloned();
    let mut message = response.headers().get("grpc-message").cloned();
    if status.is_none() {
        let mut body = response.into_body();
        while body.data().await.is_some() {}
        let trailers = body.trailers().await.unwrap().unwrap_or_default();
        status = trailers.get("grpc-status").cloned();
        message = trailers.get("grpc-message").cloned();
    }
    assert_eq!(
        status.unwrap(),
        (Code::DeadlineExceeded as i32).to_string().as_str()
    );
    let message = message.unwrap();
    assert!(
        message
            .to_str()
            .unwrap()
            .contains("heavy_body_timeout_secs"),
        "{message:?}"
    );
}

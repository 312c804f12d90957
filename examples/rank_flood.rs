//! A flood of heavy Rank requests, to measure the server's peak memory under them (issue
//! 19, item 5): `cargo run --example rank_flood -- ADDR IN_FLIGHT CANDIDATES ROUNDS TARGET`
//! sends IN_FLIGHT concurrent Ranks for TARGET, each naming CANDIDATES unknown workloads
//! (128-character names), ROUNDS times, and prints how each answered (code, answer bytes).
//! Read the server's peak RSS from /proc/PID/status (VmHWM) before and after.

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, in_flight, candidates, rounds, target] = &args[..] else {
        eprintln!("usage: rank_flood ADDR IN_FLIGHT CANDIDATES ROUNDS TARGET");
        std::process::exit(2);
    };
    let (in_flight, candidates, rounds): (usize, usize, usize) = (
        in_flight.parse().unwrap(),
        candidates.parse().unwrap(),
        rounds.parse().unwrap(),
    );
    let channel = tonic::transport::Endpoint::from_shared(addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let names: Vec<String> = (0..candidates).map(|i| format!("u{i:0>127}")).collect();
    let mut outcomes = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for _ in 0..rounds {
        let calls: Vec<_> = (0..in_flight)
            .map(|_| {
                let mut client = ColocationAdvisorClient::new(channel.clone())
                    .max_decoding_message_size(4 * 1024 * 1024);
                let request = pb::RankRequest {
                    target: target.clone(),
                    candidates: names.clone(),
                    ..Default::default()
                };
                tokio::spawn(async move { client.rank(request).await })
            })
            .collect();
        for call in calls {
            let (key, bytes) = match call.await.unwrap() {
                Ok(answer) => (
                    "OK".to_string(),
                    prost::Message::encoded_len(answer.get_ref()),
                ),
                Err(status) => (format!("{:?}", status.code()), 0),
            };
            let entry = outcomes.entry(key).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(bytes);
        }
    }
    for (code, (count, largest)) in outcomes {
        println!("{code}: {count} calls, largest answer {largest} bytes");
    }
}

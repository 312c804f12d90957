//! Running coloc in production: bearer-token auth, TLS, the request size limit, graceful
//! shutdown, and the Prometheus endpoint.

use std::{sync::Arc, time::Duration};

use coloc::proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
    Code,
};

use crate::helpers::{expect_code, kace_dir, register_request, spawn_app_with_config, TestApp};

const READER: &str = "reader-0123456789abcdef";
const OPERATOR: &str = "operator-0123456789abcdef";

async fn app_with_tokens() -> TestApp {
    let dir = Arc::new(TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("reader {READER}\noperator {OPERATOR}\n")).unwrap();
    let config = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    spawn_app_with_config(dir, &config).await
}

type AddToken =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
type AuthedClient =
    ColocationAdvisorClient<tonic::service::interceptor::InterceptedService<Channel, AddToken>>;

fn client_with(app: &TestApp, token: Option<&'static str>) -> AuthedClient {
    let channel = Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect_lazy();
    let add_token: AddToken = Box::new(move |mut request: tonic::Request<()>| {
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        Ok(request)
    });
    ColocationAdvisorClient::with_interceptor(channel, add_token)
}

fn list() -> pb::ListWorkloadsRequest {
    pb::ListWorkloadsRequest::default()
}

#[tokio::test]
async fn auth_refuses_missing_and_unknown_tokens_and_limits_readers_to_reads() {
    let app = app_with_tokens().await;
    let mut anonymous = client_with(&app, None);
    expect_code(
        anonymous.list_workloads(list()).await,
        Code::Unauthenticated,
    );
    let mut forged = client_with(&app, Some("forged-0123456789abcdef"));
    expect_code(forged.list_workloads(list()).await, Code::Unauthenticated);

    let mut reader = client_with(&app, Some(READER));
    reader.list_workloads(list()).await.unwrap();
    let before = app.dump_store().await;
    let message = expect_code(
        reader.register_workload(register_request("w", None)).await,
        Code::PermissionDenied,
    );
    assert!(message.contains("operator"), "{message}");
    assert_eq!(app.dump_store().await, before);

    let mut operator = client_with(&app, Some(OPERATOR));
    operator
        .register_workload(register_request("w", None))
        .await
        .unwrap();
    assert_eq!(
        reader
            .list_workloads(list())
            .await
            .unwrap()
            .into_inner()
            .workloads
            .len(),
        1
    );

    // Probes need no token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(app.channel().await);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn tls_round_trip_with_a_generated_certificate() {
    let dir = Arc::new(TempDir::new().unwrap());
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = certified.cert.pem();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let config = format!(
        "[server]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let mut app = spawn_app_with_config(dir, &config).await;

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert_pem))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://localhost:{}", app.addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut secure = ColocationAdvisorClient::new(channel);
    secure
        .register_workload(register_request("w", None))
        .await
        .unwrap();
    let listed = secure.list_workloads(list()).await.unwrap().into_inner();
    assert_eq!(listed.workloads[0].name, "w");

    // Plaintext is not answered.
    assert!(app.client.list_workloads(list()).await.is_err());
}

#[tokio::test]
async fn requests_over_the_size_limit_are_refused() {
    let mut app = spawn_app_with_config(
        Arc::new(TempDir::new().unwrap()),
        "[server]\nmax_request_bytes = 2048\n",
    )
    .await;
    let big = pb::RankRequest {
        target: "w".into(),
        candidates: (0..200).map(|i| format!("candidate-{i:04}")).collect(),
        ..Default::default()
    };
    let status = app.client.rank(big).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // A request under the limit is served (answered: no GPU model is known yet).
    let message = expect_code(
        app.client
            .rank(pb::RankRequest {
                target: "w".into(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("no GPU model"), "{message}");
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_call_finish_and_then_refuses_new_ones() {
    let app = spawn_app_with_config(
        Arc::new(TempDir::new().unwrap()),
        "[trainer]\ninterval_secs = 0\n",
    )
    .await;
    let gpu = coloc::domain::GpuName::parse("gpu", coloc::import::KACE_GPU).unwrap();
    coloc::import::import_kace(&app.advisor, &kace_dir(), &gpu, 32.0)
        .await
        .unwrap();
    // Training with cross-validation takes a while: it is in flight when the stop comes.
    let mut client = app.client.clone();
    let training = tokio::spawn(async move {
        client
            .train(pb::TrainRequest {
                gpu: String::new(),
                kind: String::new(),
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let addr = app.addr;
    app.stop().await;
    let answer = training.await.unwrap();
    assert!(
        answer.is_ok(),
        "the in-flight Train was cut off: {answer:?}"
    );
    assert!(Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .is_err());
}

/// `GET /metrics`, parsed into (name with labels, value).
pub(crate) async fn scrape(app: &TestApp) -> Vec<(String, f64)> {
    let mut stream = tokio::net::TcpStream::connect(app.metrics_addr.unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: coloc\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_lowercase().contains("content-type: text/plain"),
        "{head}"
    );
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

pub(crate) fn value(samples: &[(String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} missing from the scrape"))
        .1
}

#[tokio::test]
async fn the_metrics_endpoint_reports_rpcs_jobs_models_and_the_store() {
    let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), "").await;
    crate::helpers::seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(pb::TrainRequest {
            gpu: crate::helpers::GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    for _ in 0..3 {
        app.client.list_workloads(list()).await.unwrap();
    }
    expect_code(
        app.client
            .get_workload(pb::GetWorkloadRequest {
                name: "ghost".into(),
            })
            .await,
        Code::NotFound,
    );

    let samples = scrape(&app).await;
    // grpc-ecosystem names and labels (go-grpc-prometheus), codes spelled as grpc-go does.
    let list_ok = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="ListWorkloads",grpc_service="coloc.v1.ColocationAdvisor",grpc_type="unary"}"#;
    assert_eq!(value(&samples, list_ok), 3.0);
    let not_found = r#"grpc_server_handled_total{grpc_code="NotFound",grpc_method="GetWorkload",grpc_service="coloc.v1.ColocationAdvisor",grpc_type="unary"}"#;
    assert_eq!(value(&samples, not_found), 1.0);
    let latency_count = r#"grpc_server_handling_seconds_count{grpc_method="ListWorkloads",grpc_service="coloc.v1.ColocationAdvisor",grpc_type="unary"}"#;
    assert_eq!(value(&samples, latency_count), 3.0);
    assert_eq!(
        value(
            &samples,
            &format!(
                r#"coloc_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0
    );
    assert!(value(&samples, "process_resident_memory_bytes") > 0.0);
    assert_eq!(
        value(&samples, r#"coloc_trainings_total{outcome="promoted"}"#),
        1.0
    );
    assert!(value(&samples, r#"coloc_reports_total{outcome="stored"}"#) > 0.0);
    assert!(
        value(
            &samples,
            r#"coloc_model_trained_timestamp_seconds{gpu="Test GPU 16GB"}"#
        ) > 1.7e9
    );
    assert_eq!(
        value(&samples, r#"coloc_profiling_jobs{state="pending"}"#),
        1.0
    );
    assert_eq!(
        value(&samples, r#"coloc_model_version{gpu="Test GPU 16GB"}"#),
        1.0
    );
    assert!(value(&samples, r#"coloc_model_age_seconds{gpu="Test GPU 16GB"}"#) >= 0.0);
    assert!(value(&samples, "coloc_store_bytes") > 0.0);
}

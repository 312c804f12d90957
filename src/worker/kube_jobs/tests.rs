//! The Job manifest against the hand-written example in deploy/ (which deploy/validate.sh
//! checks against the Kubernetes schemas), and a Job's lifecycle against kube-rs's mock
//! API service (tower-test) with the Job and Pod JSON as the API server returns them,
//! over a real SQLite store.

use std::{pin::pin, time::Duration};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{
    domain::{GpuName, LaunchSpec, NewWorkload, WorkloadMode, WorkloadName, WorkloadState},
    settings::KubeJobSettings,
    store::{ClaimedJob, Store},
};

const GPU: &str = "Tesla V100-SXM2-32GB";

fn read(path: &str) -> Value {
    let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn settings() -> KubeJobSettings {
    KubeJobSettings {
        namespace: "coloc".into(),
        coloc_image: "registry.example/coloc:0.9".into(),
        service_addr: "http://coloc.coloc.svc:50051".into(),
        token_secret: "coloc-agent-token".into(),
        gpu_label: "nvidia.com/gpu.product".into(),
        active_deadline_secs: 3600,
        ttl_secs_after_finished: 600,
        poll_interval_ms: 10,
        gpus: vec![GPU.into()],
    }
}

fn launch() -> LaunchSpec {
    LaunchSpec {
        program: "/usr/bin/python3".into(),
        args: vec!["train.py".into(), "--steps".into(), "100".into()],
        env: [("OMP_NUM_THREADS".to_string(), "4".to_string())].into(),
        working_dir: Some("/workspace".into()),
        timeout_secs: None,
        throughput_regex: None,
        nvtx_range: None,
        image: Some("registry.example/train:1.4".into()),
    }
}

fn claimed() -> ClaimedJob {
    ClaimedJob {
        id: 7,
        claim: 3,
        holder: KUBE_JOBS_HOLDER.into(),
        workload: WorkloadName::parse("workload", "resnet50/train").unwrap(),
        gpu: Some(GpuName::parse("gpu", GPU).unwrap()),
        attempts: 1,
        launch: Some(launch()),
        lease_expires_ms: 0,
    }
}

#[test]
fn the_job_manifest_is_the_example_in_deploy() {
    let expected = read("deploy/kubernetes/profiling-job/job.json");
    assert_eq!(job_manifest(&claimed(), &settings(), 3).unwrap(), expected);
    // The same through kube-rs's typed Job, as it is sent.
    let typed = serde_json::to_value(typed_job(&claimed(), &settings(), 3).unwrap()).unwrap();
    assert_eq!(typed, expected);
}

#[test]
fn a_job_without_an_image_or_gpu_model_is_refused_with_the_reason() {
    let mut job = claimed();
    job.launch.as_mut().unwrap().image = None;
    let error = job_manifest(&job, &settings(), 3).unwrap_err();
    assert!(matches!(error, KubeJobError::NoImage), "{error}");
    assert!(error.is_permanent());
    let mut job = claimed();
    job.gpu = None;
    assert!(matches!(
        job_manifest(&job, &settings(), 3).unwrap_err(),
        KubeJobError::NoGpuModel
    ));
    assert_eq!(
        gpu_product_label(&GpuName::parse("gpu", "NVIDIA H100 80GB HBM3").unwrap()).unwrap(),
        "NVIDIA-H100-80GB-HBM3"
    );
}

/// A store with one workload queued for profiling on `GPU`.
async fn store_with_job() -> Store {
    let store = Store::open("sqlite::memory:").await.unwrap();
    let workload = NewWorkload {
        name: WorkloadName::parse("workload", "resnet50/train").unwrap(),
        mode: WorkloadMode::Training,
        model: "resnet50".into(),
        batch_size: 64,
        labels: Default::default(),
        profile: None,
        launch: Some(launch()),
        profile_on: vec![GpuName::parse("gpu", GPU).unwrap()],
    };
    store.register_workload(&workload, 1_000).await.unwrap();
    store
}

fn dispatcher(store: Store, client: kube::Client, max_attempts: u32) -> KubeDispatcher {
    KubeDispatcher::new(
        KubeJobs::new(client, settings(), max_attempts),
        store,
        vec![GpuName::parse("gpu", GPU).unwrap()],
        30_000,
        max_attempts,
        Duration::from_secs(30),
    )
}

fn answer(value: &Value, status: u16) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

type Mock = tower_test::mock::Handle<Request<Body>, Response<Body>>;

async fn next(
    handle: &mut std::pin::Pin<&mut Mock>,
) -> (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("coloc stopped asking the API server")
        .expect("coloc dropped its client")
}

/// Plays the API server for one Job that runs for one poll and then fails, its pod
/// OOMKilled. Returns the Job manifest coloc posted.
async fn api_server_with_failing_job(handle: Mock) -> Value {
    let mut handle = pin!(handle);
    let (request, send) = next(&mut handle).await;
    assert_eq!(request.method(), Method::POST);
    assert_eq!(request.uri().path(), "/apis/batch/v1/namespaces/coloc/jobs");
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let posted: Value = serde_json::from_slice(&bytes).unwrap();
    let name = posted["metadata"]["name"].as_str().unwrap().to_string();
    let mut created = posted.clone();
    created["metadata"]["uid"] = json!("5d3c1f2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f");
    created["status"] = json!({});
    send.send_response(answer(&created, 201));
    let job_path = format!("/apis/batch/v1/namespaces/coloc/jobs/{name}");
    for fixture in ["job-running.json", "job-failed.json"] {
        let (request, send) = next(&mut handle).await;
        assert_eq!(
            (request.method(), request.uri().path()),
            (&Method::GET, job_path.as_str())
        );
        let mut job = read(&format!("tests/fixtures/kubernetes/{fixture}"));
        job["metadata"]["name"] = json!(name);
        send.send_response(answer(&job, 200));
    }
    let (request, send) = next(&mut handle).await;
    assert_eq!(request.uri().path(), "/api/v1/namespaces/coloc/pods");
    let query = request.uri().query().unwrap_or("").to_string();
    assert!(
        query.contains(&format!("labelSelector=job-name%3D{name}")),
        "{query}"
    );
    send.send_response(answer(
        &read("tests/fixtures/kubernetes/pod-list-job-failed.json"),
        200,
    ));
    posted
}

#[tokio::test]
async fn a_failed_job_requeues_the_profiling_job_with_the_pods_reason() {
    let store = store_with_job().await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let server = tokio::spawn(api_server_with_failing_job(handle));
    let outcome = dispatcher(store.clone(), client, 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    let posted = server.await.unwrap();
    assert_eq!(
        posted["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"],
        "Tesla-V100-SXM2-32GB"
    );
    let DispatchOutcome::Requeued { reason, .. } = outcome else {
        panic!("expected a re-queued job, got {outcome:?}");
    };
    assert!(reason.contains("BackoffLimitExceeded"), "{reason}");
    assert!(
        reason.contains("container workload ended: OOMKilled (exit 137)"),
        "{reason}"
    );
    let record = store.get_workload("resnet50/train").await.unwrap().unwrap();
    assert_eq!(record.state, WorkloadState::PendingProfile);
    assert!(
        record.state_reason.contains("OOMKilled"),
        "{}",
        record.state_reason
    );
    assert!(
        record.state_reason.contains("attempt 1 of 3"),
        "{}",
        record.state_reason
    );
}

#[tokio::test]
async fn a_failed_job_on_the_last_attempt_fails_the_profiling_job_with_the_reason() {
    let store = store_with_job().await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let server = tokio::spawn(api_server_with_failing_job(handle));
    let outcome = dispatcher(store.clone(), client, 1)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    server.await.unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::Failed { .. }),
        "{outcome:?}"
    );
    let record = store.get_workload("resnet50/train").await.unwrap().unwrap();
    assert_eq!(record.state, WorkloadState::Failed);
    assert!(
        record.state_reason.contains("OOMKilled"),
        "{}",
        record.state_reason
    );
}

/// Answers the create POST with the posted Job; returns its name.
async fn answer_create(handle: &mut std::pin::Pin<&mut Mock>) -> String {
    let (request, send) = next(handle).await;
    assert_eq!(request.method(), Method::POST);
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let posted: Value = serde_json::from_slice(&bytes).unwrap();
    send.send_response(answer(&posted, 201));
    posted["metadata"]["name"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_job_that_succeeds_without_a_report_is_requeued_with_that_reason() {
    let store = store_with_job().await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let name = answer_create(&mut handle).await;
        let (request, send) = next(&mut handle).await;
        assert_eq!(request.method(), Method::GET);
        let mut job = read("tests/fixtures/kubernetes/job-running.json");
        job["metadata"]["name"] = json!(name);
        job["status"] = json!({
            "conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}],
            "succeeded": 1, "active": 0,
        });
        send.send_response(answer(&job, 200));
    });
    let outcome = dispatcher(store.clone(), client, 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    server.await.unwrap();
    let DispatchOutcome::Requeued { reason, .. } = outcome else {
        panic!("expected a re-queued job, got {outcome:?}");
    };
    assert!(reason.contains("reported nothing"), "{reason}");
}

#[tokio::test]
async fn a_stopping_service_deletes_the_job_and_requeues_the_profiling_job() {
    let store = store_with_job().await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let stop = CancellationToken::new();
    let stopping = stop.clone();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let name = answer_create(&mut handle).await;
        stopping.cancel();
        let (request, send) = next(&mut handle).await;
        assert_eq!(request.method(), Method::DELETE);
        assert_eq!(
            request.uri().path(),
            format!("/apis/batch/v1/namespaces/coloc/jobs/{name}")
        );
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let options: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(options["propagationPolicy"], "Background");
        send.send_response(answer(
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
            200,
        ));
    });
    let outcome = dispatcher(store.clone(), client, 3)
        .run_once(&stop)
        .await
        .unwrap();
    server.await.unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::Interrupted { .. }),
        "{outcome:?}"
    );
    let record = store.get_workload("resnet50/train").await.unwrap().unwrap();
    assert_eq!(record.state, WorkloadState::PendingProfile);
    assert!(
        record.state_reason.contains("service stopped"),
        "{}",
        record.state_reason
    );
}

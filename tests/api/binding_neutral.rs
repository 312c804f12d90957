//! Every way the binding webhook can fail answers neutrally, over real HTTP: `allowed:
//! true`, the request's uid, no patch (the pod schedules as it would without coloc), and
//! the reason counted; a body that is no AdmissionReview at all is answered 400 (the API
//! server then applies `failurePolicy: Ignore`). Objects coloc has nothing to say about
//! (no workload, an update, another kind) pass untouched and are not counted as failures.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use coloc::{
    extender::{
        binding::{webhook, Chooser, Inventory, Webhook},
        decide::{PlaceFuture, PlacementAsk, PlacementError, Placer, SlotOutcome},
        placer::AdvisorPlacer,
    },
    settings::BindingMode,
    store::{reservations::Reservations, Store},
};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    binding::{fixture, hami_node, patched, pod_review, JOB},
    extender::post,
    helpers::slowdown_app_with_config,
};

/// A coloc whose model cannot be read.
struct Failing;

impl Placer for Failing {
    fn place<'a>(&'a self, _: &'a PlacementAsk) -> PlaceFuture<'a> {
        Box::pin(async {
            Err(PlacementError::Unavailable(
                "the model cannot be read".into(),
            ))
        })
    }
}

/// A coloc that refuses every GPU.
struct RefusesAll;

impl Placer for RefusesAll {
    fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
        let n = ask.slots.len();
        Box::pin(async move {
            Ok(vec![
                SlotOutcome::DoesNotFit {
                    reason: "exceeds GPU memory".into()
                };
                n
            ])
        })
    }
}

struct Served {
    addr: SocketAddr,
    webhook: Arc<Webhook>,
    _dir: TempDir,
}

async fn serve(
    mode: BindingMode,
    placer: Arc<dyn Placer>,
    inventory: Arc<Inventory>,
    store_open: bool,
) -> Served {
    let dir = TempDir::new().unwrap();
    let store = Store::open(&format!(
        "sqlite://{}",
        dir.path().join("coloc.db").display()
    ))
    .await
    .unwrap();
    let pool = store.pool().clone();
    if !store_open {
        store.close().await;
    }
    let chooser = Chooser::new(
        placer,
        Arc::new(coloc::extender::ClusterView::new()),
        inventory,
        Reservations::Store(pool),
        Duration::from_secs(60),
        3,
    );
    let webhook = Arc::new(Webhook::new(mode, chooser));
    let router = webhook::router(webhook.clone(), "/coloc", 1 << 20);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Served {
        addr,
        webhook,
        _dir: dir,
    }
}

fn inventory() -> Arc<Inventory> {
    let inventory = Arc::new(Inventory::new());
    inventory.apply_node(&hami_node("gpu-node-1", &["GPU-a", "GPU-b"]));
    inventory
}

/// Posts `review`; asserts the neutral answer (allowed, no patch) and that `reason` was
/// counted once more.
async fn assert_neutral(served: &Served, review: &Value, reason: &str) {
    let before = served
        .webhook
        .counters()
        .neutral_by_reason()
        .get(reason)
        .copied()
        .unwrap_or(0);
    let (status, response) = post(served.addr, "/coloc/mutate", review, "").await;
    assert_eq!(status, 200, "{reason}: {response}");
    assert!(
        patched(review, &response).is_none(),
        "{reason}: no patch: {response}"
    );
    let after = served
        .webhook
        .counters()
        .neutral_by_reason()
        .get(reason)
        .copied()
        .unwrap_or(0);
    assert_eq!(
        after,
        before + 1,
        "{reason} counted: {:?}",
        served.webhook.counters().neutral_by_reason()
    );
}

async fn assert_untouched(served: &Served, review: &Value, case: &str) {
    let before = served.webhook.counters().neutral_by_reason();
    let (status, response) = post(served.addr, "/coloc/mutate", review, "").await;
    assert_eq!(status, 200, "{case}: {response}");
    assert!(patched(review, &response).is_none(), "{case}: {response}");
    assert_eq!(
        served.webhook.counters().neutral_by_reason(),
        before,
        "{case}: not a failure"
    );
}

#[tokio::test]
async fn every_failure_answers_allowed_without_a_patch_and_is_counted() {
    let (app, _) = slowdown_app_with_config(7, "").await;
    let real: Arc<dyn Placer> = Arc::new(AdvisorPlacer::new(app.advisor.clone()));
    let served = serve(BindingMode::Hami, real.clone(), inventory(), true).await;
    let job = json!({"coloc.io/workload": JOB});

    // Not coloc's: no workload, an update, another kind.
    assert_untouched(
        &served,
        &pod_review("u1", json!({"team": "web"})),
        "no workload",
    )
    .await;
    let mut update = pod_review("u2", job.clone());
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    assert_untouched(&served, &update, "an update").await;
    assert_untouched(
        &served,
        &fixture("admission-review-claim-create.json"),
        "a claim under hami",
    )
    .await;

    // Failures, each neutral and counted.
    assert_neutral(
        &served,
        &pod_review(
            "f1",
            json!({"coloc.io/workload": JOB, "coloc.io/min-job-fraction": "most"}),
        ),
        "bad_annotation",
    )
    .await;
    assert_neutral(
        &served,
        &pod_review(
            "f2",
            json!({"coloc.io/workload": JOB, "nvidia.com/use-gpuuuid": "GPU-x"}),
        ),
        "already_pinned",
    )
    .await;
    assert_neutral(
        &served,
        &pod_review("f3", json!({"coloc.io/workload": "nobody-knows"})),
        "unknown_workload",
    )
    .await;
    let mut too_big = pod_review("f10", job.clone());
    too_big["request"]["object"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}});
    assert_neutral(&served, &too_big, "no_hami_room").await;
    let mut no_kind = pod_review("f4", job.clone());
    no_kind["request"].as_object_mut().unwrap().remove("kind");
    assert_neutral(&served, &no_kind, "bad_request").await;
    let mut no_object = pod_review("f5", job.clone());
    no_object["request"]["object"] = Value::Null;
    assert_neutral(&served, &no_object, "bad_request").await;

    let empty = serve(
        BindingMode::Hami,
        real.clone(),
        Arc::new(Inventory::new()),
        true,
    )
    .await;
    assert_neutral(&empty, &pod_review("f6", job.clone()), "no_inventory").await;
    let failing = serve(BindingMode::Hami, Arc::new(Failing), inventory(), true).await;
    assert_neutral(
        &failing,
        &pod_review("f7", job.clone()),
        "placement_unavailable",
    )
    .await;
    let refusing = serve(BindingMode::Hami, Arc::new(RefusesAll), inventory(), true).await;
    assert_neutral(&refusing, &pod_review("f8", job.clone()), "none_acceptable").await;
    let closed = serve(BindingMode::Hami, real.clone(), inventory(), false).await;
    assert_neutral(&closed, &pod_review("f9", job.clone()), "store").await;

    // DRA: a marked claim without an `exactly` request cannot be pinned; an unmarked one
    // is not coloc's.
    let dra = serve(BindingMode::Dra, real.clone(), inventory(), true).await;
    let mut claim = fixture("admission-review-claim-create.json");
    claim["request"]["object"]["spec"]["devices"]["requests"][0]
        .as_object_mut()
        .unwrap()
        .remove("exactly");
    assert_neutral(&dra, &claim, "claim_without_exact_request").await;
    let mut unmarked = fixture("admission-review-claim-create.json");
    unmarked["request"]["object"]["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("coloc.io/workload");
    assert_untouched(&dra, &unmarked, "an unmarked claim").await;

    // node-only: whatever comes is left alone.
    let node_only = serve(BindingMode::NodeOnly, real, inventory(), true).await;
    assert_untouched(&node_only, &pod_review("n1", job.clone()), "node-only").await;
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_is_no_admission_review_is_refused_without_harm() {
    let served = serve(BindingMode::Hami, Arc::new(Failing), inventory(), true).await;
    // JSON, but no request uid to answer to.
    let (status, body) = post(
        served.addr,
        "/coloc/mutate",
        &json!({"kind": "AdmissionReview"}),
        "",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Not JSON at all.
    let mut stream = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let garbage = b"{not json";
    stream
        .write_all(
            format!(
                "POST /coloc/mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                garbage.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    stream.write_all(garbage).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(
        served
            .webhook
            .counters()
            .neutral_by_reason()
            .get("bad_request"),
        Some(&2)
    );
}

//! The mutating admission webhook: `POST <prefix>/mutate`, AdmissionReview v1 in and out
//! (the request parsed with kube-rs's admission types; the response written as the API
//! server reads it, the JSONPatch base64-encoded in `patch`). Registered with
//! `failurePolicy: Ignore`, it never blocks creation: every answer is `allowed: true`, and
//! whatever goes wrong (a body it cannot read, an annotation it cannot parse, no inventory,
//! no acceptable GPU, the store or the model unavailable) answers with no patch, is logged
//! and counted by reason ([`Counters`]).
//!
//! - `hami`: a Pod with `coloc.io/workload` gets `nvidia.com/use-gpuuuid` (the acceptable
//!   GPUs' UUIDs, best first, comma-separated: HAMi's `GPUUseUUID`, checked by
//!   `device.CheckUUID` in HAMi's NVIDIA `Fit`, pkg/device/nvidia/device.go; only GPUs
//!   that `Fit` would also find room on for the pod's `nvidia.com/gpumem` and
//!   `nvidia.com/gpucores`, see `hami`; none left: neutral), a required
//!   node affinity to their nodes (`matchFields` on `metadata.name`, added to each term the
//!   pod already has), and `coloc.io/gpu-choice` / `coloc.io/reservation` naming the GPU
//!   held for it. A pod that already names its GPUs is left alone.
//! - `dra`: a ResourceClaim marked with `coloc.io/workload` (written into the claims a
//!   ResourceClaimTemplate makes through the template's `spec.metadata.annotations`) gets a
//!   CEL selector on each `exactly` request,
//!   `device.attributes["gpu.nvidia.com"].uuid in ["GPU-..", ..]`, held for the claim's
//!   owner pod (the resource claim controller makes it its controller). The claim's sharing mode
//!   is the NVIDIA DRA driver's: the `sharing.strategy` of a `GpuConfig` in its opaque
//!   device config (`MPS`, `TimeSlicing`), else the server's default.
//! - `node-only`, a dry run (no hold may be taken), and every other object: allowed, no
//!   patch.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use axum::{
    extract::{rejection::JsonRejection, DefaultBodyLimit, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    admission::{AdmissionRequest, AdmissionReview, Operation},
    DynamicObject,
};
use serde_json::{json, Value};

use super::{
    choose::{Ask, Choice, Chooser},
    hami,
};
use crate::{
    domain::SharingMode,
    extender::pod::{pod_ask, WORKLOAD_ANNOTATION},
    settings::BindingMode,
    sync::Unpoisoned,
};

pub const USE_GPU_UUID_ANNOTATION: &str = "nvidia.com/use-gpuuuid";
pub const GPU_CHOICE_ANNOTATION: &str = "coloc.io/gpu-choice";
pub const RESERVATION_ANNOTATION: &str = "coloc.io/reservation";
/// The DRA attribute the claim's selector reads (the NVIDIA DRA driver's `uuid`).
pub const DRA_UUID_ATTRIBUTE: &str = r#"device.attributes["gpu.nvidia.com"].uuid"#;

/// What the webhook answered, counted.
#[derive(Debug, Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub patched: AtomicU64,
    /// Objects coloc has nothing to say about (no workload, not a create, another kind).
    pub skipped: AtomicU64,
    neutral: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counters {
    fn neutral(&self, reason: &'static str) {
        *self.neutral.lock().unpoisoned().entry(reason).or_default() += 1;
    }

    /// Neutral answers by reason.
    pub fn neutral_by_reason(&self) -> BTreeMap<&'static str, u64> {
        self.neutral.lock().unpoisoned().clone()
    }
}

pub struct Webhook {
    mode: BindingMode,
    chooser: Chooser,
    counters: Counters,
}

/// An answer: a patch, nothing to say, or neutral for a reason.
enum Verdict {
    Patch(json_patch::Patch),
    Skip,
    Neutral(&'static str, String),
}

impl Webhook {
    pub fn new(mode: BindingMode, chooser: Chooser) -> Self {
        Self {
            mode,
            chooser,
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn chooser(&self) -> &Chooser {
        &self.chooser
    }

    /// The AdmissionReview answering `body`; `Err` only when the body names no request uid
    /// (then there is nothing to answer: 400, and the API server ignores the failure).
    pub async fn review(&self, body: Value) -> Result<Value, String> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let Some(uid) = body
            .pointer("/request/uid")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            self.counters.neutral("bad_request");
            tracing::warn!("webhook: the body is not an AdmissionReview request (no request.uid)");
            return Err("not an AdmissionReview v1 request: no request.uid".into());
        };
        let verdict = match serde_json::from_value::<AdmissionReview<DynamicObject>>(body)
            .map_err(|e| e.to_string())
            .and_then(|review| {
                TryInto::<AdmissionRequest<DynamicObject>>::try_into(review)
                    .map_err(|e| e.to_string())
            }) {
            Err(error) => Verdict::Neutral("bad_request", error),
            Ok(request) => self.verdict(&request).await,
        };
        let mut response = json!({"uid": uid, "allowed": true});
        match verdict {
            Verdict::Patch(patch) => {
                self.counters.patched.fetch_add(1, Ordering::Relaxed);
                let bytes = serde_json::to_vec(&patch).map_err(|e| e.to_string())?;
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
            Verdict::Skip => {
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Neutral(reason, detail) => {
                self.counters.neutral(reason);
                tracing::warn!(%uid, reason, %detail, "webhook: neutral answer");
            }
        }
        Ok(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }))
    }

    async fn verdict(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        // A dry run must have no side effect (sideEffects: NoneOnDryRun): no hold is taken.
        if request.operation != Operation::Create || request.dry_run {
            return Verdict::Skip;
        }
        let Some(object) = request.object.as_ref() else {
            return Verdict::Neutral("bad_request", "a create without an object".into());
        };
        let object = match serde_json::to_value(object) {
            Ok(object) => object,
            Err(error) => return Verdict::Neutral("bad_request", error.to_string()),
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let name = Some(request.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| request.uid.clone());
        let holder = format!("{namespace}/{name}");
        match (self.mode, request.kind.kind.as_str()) {
            (BindingMode::Hami, "Pod") => self.pod(object, holder).await,
            (BindingMode::Dra, "ResourceClaim") => {
                // The hold is the owner pod's: it ends when the view sees the pod land.
                let holder = super::dra::owner_pod(&object).unwrap_or(holder);
                self.claim(object, holder).await
            }
            _ => Verdict::Skip,
        }
    }

    async fn choose(&self, ask: &Ask) -> Result<Choice, Verdict> {
        self.chooser
            .choose(ask)
            .await
            .map_err(|no| Verdict::Neutral(no.reason(), no.to_string()))
    }

    async fn pod(&self, object: Value, holder: String) -> Verdict {
        let pod: Pod = match serde_json::from_value(object.clone()) {
            Ok(pod) => pod,
            Err(error) => return Verdict::Neutral("bad_request", error.to_string()),
        };
        let ask = match pod_ask(&pod) {
            Ok(Some(ask)) => ask,
            Ok(None) => return Verdict::Skip,
            Err(reason) => return Verdict::Neutral("bad_annotation", reason),
        };
        if pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(USE_GPU_UUID_ANNOTATION))
        {
            return Verdict::Neutral(
                "already_pinned",
                format!("the pod already carries {USE_GPU_UUID_ANNOTATION}"),
            );
        }
        let ask = Ask {
            workload: ask.workload,
            min_job_fraction: ask.min_job_fraction,
            sharing_mode: ask.sharing_mode,
            holder: holder.clone(),
            hami: hami::requests(&pod),
        };
        let choice = match self.choose(&ask).await {
            Ok(choice) => choice,
            Err(neutral) => return neutral,
        };
        let mut patched = object.clone();
        let ids: Vec<&str> = choice.gpus.iter().map(|d| d.id.as_str()).collect();
        let mut nodes: Vec<&str> = Vec::new();
        for device in &choice.gpus {
            if !nodes.contains(&device.node.as_str()) {
                nodes.push(&device.node);
            }
        }
        set_annotations(
            &mut patched,
            &[
                (USE_GPU_UUID_ANNOTATION, ids.join(",")),
                (GPU_CHOICE_ANNOTATION, ids[0].to_string()),
                (RESERVATION_ANNOTATION, holder),
            ],
        );
        require_nodes(&mut patched, &nodes);
        Verdict::Patch(json_patch::diff(&object, &patched))
    }

    async fn claim(&self, object: Value, holder: String) -> Verdict {
        let annotations = object.pointer("/metadata/annotations");
        let Some(workload) = annotations
            .and_then(|a| a.get(WORKLOAD_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|w| !w.is_empty())
        else {
            return Verdict::Skip;
        };
        let has_exact = object
            .pointer("/spec/devices/requests")
            .and_then(Value::as_array)
            .is_some_and(|requests| requests.iter().any(|r| r.get("exactly").is_some()));
        if !has_exact {
            return Verdict::Neutral(
                "claim_without_exact_request",
                "the claim has no `exactly` device request to pin".into(),
            );
        }
        let sharing_mode = match claim_sharing_mode(&object) {
            Ok(mode) => mode,
            Err(reason) => return Verdict::Neutral("malformed_annotation", reason),
        };
        let ask = Ask {
            workload: workload.to_string(),
            min_job_fraction: None,
            sharing_mode,
            holder: holder.clone(),
            hami: Vec::new(),
        };
        let choice = match self.choose(&ask).await {
            Ok(choice) => choice,
            Err(neutral) => return neutral,
        };
        let ids: Vec<&str> = choice.gpus.iter().map(|d| d.id.as_str()).collect();
        let mut patched = object.clone();
        set_annotations(
            &mut patched,
            &[
                (GPU_CHOICE_ANNOTATION, ids[0].to_string()),
                (RESERVATION_ANNOTATION, holder),
            ],
        );
        let expression = uuid_selector(&ids);
        if let Some(requests) = patched
            .pointer_mut("/spec/devices/requests")
            .and_then(Value::as_array_mut)
        {
            for request in requests {
                if let Some(exactly) = request.get_mut("exactly").and_then(Value::as_object_mut) {
                    let selectors = exactly.entry("selectors").or_insert_with(|| json!([]));
                    if let Some(list) = selectors.as_array_mut() {
                        list.push(json!({"cel": {"expression": expression}}));
                    }
                }
            }
        }
        Verdict::Patch(json_patch::diff(&object, &patched))
    }
}

/// The CEL selector that keeps only these GPUs.
pub fn uuid_selector(ids: &[&str]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("{id:?}")).collect();
    format!("{DRA_UUID_ATTRIBUTE} in [{}]", quoted.join(", "))
}

fn set_annotations(object: &mut Value, pairs: &[(&str, String)]) {
    let metadata = object
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    let Some(annotations) = metadata
        .and_then(Value::as_object_mut)
        .map(|m| m.entry("annotations").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (key, value) in pairs {
        annotations.insert((*key).to_string(), json!(value));
    }
}

/// Adds "the node is one of `nodes`" to every required node-selector term (a pod without
/// one gets one term): terms are ORed, the requirements of one term ANDed.
fn require_nodes(pod: &mut Value, nodes: &[&str]) {
    let requirement = json!({"key": "metadata.name", "operator": "In", "values": nodes});
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let required = spec
        .entry("affinity")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .map(|a| a.entry("nodeAffinity").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
        .map(|n| {
            n.entry("requiredDuringSchedulingIgnoredDuringExecution")
                .or_insert_with(|| json!({"nodeSelectorTerms": []}))
        })
        .and_then(Value::as_object_mut)
        .map(|r| r.entry("nodeSelectorTerms").or_insert_with(|| json!([])))
        .and_then(Value::as_array_mut);
    let Some(terms) = required else {
        return;
    };
    if terms.is_empty() {
        terms.push(json!({"matchFields": [requirement]}));
        return;
    }
    for term in terms {
        if let Some(term) = term.as_object_mut() {
            let fields = term.entry("matchFields").or_insert_with(|| json!([]));
            if let Some(fields) = fields.as_array_mut() {
                fields.push(requirement.clone());
            }
        }
    }
}

/// `POST <prefix>/mutate`.
pub fn router(webhook: Arc<Webhook>, prefix: &str, max_request_bytes: usize) -> Router {
    Router::new()
        .route(
            &format!("{}/mutate", prefix.trim_end_matches('/')),
            post(mutate),
        )
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .with_state(webhook)
}

async fn mutate(
    State(webhook): State<Arc<Webhook>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => {
            webhook.counters.calls.fetch_add(1, Ordering::Relaxed);
            webhook.counters.neutral("bad_request");
            tracing::warn!(error = %rejection.body_text(), "webhook: the body is not JSON");
            return (rejection.status(), rejection.body_text()).into_response();
        }
    };
    match webhook.review(body).await {
        Ok(review) => Json(review).into_response(),
        Err(message) => (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response(),
    }
}
/// The sharing mode a ResourceClaim configures for the NVIDIA DRA driver: the `strategy` of
/// the `sharing` of a `GpuConfig` in `spec.devices.config[].opaque.parameters` (`MPS`,
/// `TimeSlicing`); `None` when it configures none, `Err` for another strategy.
pub fn claim_sharing_mode(claim: &Value) -> Result<Option<SharingMode>, String> {
    let configs = claim
        .pointer("/spec/devices/config")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for config in configs {
        let Some(parameters) = config.pointer("/opaque/parameters") else {
            continue;
        };
        if parameters.get("kind").and_then(Value::as_str) != Some("GpuConfig") {
            continue;
        }
        match parameters
            .pointer("/sharing/strategy")
            .and_then(Value::as_str)
        {
            None => continue,
            Some("MPS") => return Ok(Some(SharingMode::Mps)),
            Some("TimeSlicing") => return Ok(Some(SharingMode::TimeSlicing)),
            Some(other) => {
                return Err(format!(
                    "the claim's GpuConfig sharing strategy {other:?} is neither \"MPS\" nor \
                     \"TimeSlicing\""
                ))
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ResourceClaim's device config as the NVIDIA DRA driver's demo specs write it
    /// (NVIDIA/k8s-dra-driver-gpu, `demo/specs/quickstart`: a `GpuConfig` with `sharing`).
    fn claim(sharing: Value) -> Value {
        json!({"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": sharing}}}]
        }}})
    }

    #[test]
    fn a_claims_gpu_config_names_its_sharing_mode() {
        let mps = claim(json!({"strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": 50}}));
        assert_eq!(claim_sharing_mode(&mps), Ok(Some(SharingMode::Mps)));
        let sliced = claim(json!({"strategy": "TimeSlicing",
            "timeSlicingConfig": {"interval": "Long"}}));
        assert_eq!(
            claim_sharing_mode(&sliced),
            Ok(Some(SharingMode::TimeSlicing))
        );
        assert!(claim_sharing_mode(&claim(json!({"strategy": "Exclusive"}))).is_err());
        let plain = json!({"spec": {"devices": {"requests": []}}});
        assert_eq!(claim_sharing_mode(&plain), Ok(None));
    }
}

//! The extender's HTTP face (axum): `POST <prefix>/filter` and `POST <prefix>/prioritize`
//! with kube-scheduler's JSON, and `GET <prefix>/healthz`. TLS is optional (PEM certificate
//! and key), as is a client CA that makes kube-scheduler present a certificate (its
//! extender `tlsConfig`); a bearer token from `auth.tokens_file` is asked for only when
//! `extender.require_token` is on, because kube-scheduler itself sends none (a proxy in
//! front may). A body that is not the extender JSON is answered 400; kube-scheduler then
//! skips coloc (`ignorable: true`). When the extender has metrics, every routed call is
//! counted by verb (the last segment of its route) and status, with its latency.
//! Each answer for a pod coloc judged carries the policy
//! applied in the `x-coloc-policy` header, and the debug log line names it.

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{DefaultBodyLimit, Request, State},
    http::{HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use hyper::{body::Incoming, service::service_fn};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{decide::Extender, wire::ExtenderArgs};
use crate::tokens::Tokens;

/// How the endpoint is served.
pub struct ServeOptions {
    /// Where the two verbs live, e.g. "" or "/coloc" (no trailing slash).
    pub url_prefix: String,
    pub max_request_bytes: usize,
    /// `Some` = requests need a token of role reader or operator.
    pub tokens: Option<Tokens>,
    pub tls: Option<TlsAcceptor>,
    /// More routes on the same server (the binding webhook, `extender::binding`).
    pub extra_routes: Option<Router>,
}

#[derive(Clone)]
struct AppState {
    extender: Arc<Extender>,
    tokens: Option<Arc<Tokens>>,
}

/// The router, without transport (tests and benches call it directly too).
pub fn router(extender: Arc<Extender>, options: &ServeOptions) -> Router {
    let prefix = options.url_prefix.trim_end_matches('/');
    let state = AppState {
        extender,
        tokens: options.tokens.clone().map(Arc::new),
    };
    Router::new()
        .route(&format!("{prefix}/filter"), post(filter))
        .route(&format!("{prefix}/prioritize"), post(prioritize))
        .route(&format!("{prefix}/healthz"), get(|| async { "ok\n" }))
        .route_layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(options.max_request_bytes))
        .with_state(state)
        .merge(options.extra_routes.clone().unwrap_or_default())
}

/// Counts a routed call in the extender's metrics (when it has them).
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(metrics) = state.extender.metrics().cloned() else {
        return next.run(request).await;
    };
    // Only routed calls get here, so the path's last segment is a verb of the router.
    let verb = request
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.observe_call(
        &verb,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
    let Some(tokens) = &state.tokens else {
        return Ok(());
    };
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // The extender reads as Rank does: a reader token suffices.
    tokens
        .check("/coloc.v1.ColocationAdvisor/Rank", authorization)
        .map_err(|status| {
            let code = if status.code() == tonic::Code::PermissionDenied {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::UNAUTHORIZED
            };
            (code, format!("{}\n", status.message()))
        })
}

fn bad_body(rejection: axum::extract::rejection::JsonRejection) -> Response {
    tracing::warn!(error = %rejection.body_text(), "extender: request is not extender JSON");
    (rejection.status(), rejection.body_text()).into_response()
}

async fn filter(
    State(state): State<AppState>,
    headers: HeaderMap,
    args: Result<Json<ExtenderArgs>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(denied) = authorize(&state, &headers) {
        return denied.into_response();
    }
    let Json(args) = match args {
        Ok(args) => args,
        Err(rejection) => return bad_body(rejection),
    };
    let started = Instant::now();
    let policy = state.extender.policy_for(args.pod.as_ref());
    let result = state.extender.filter(args).await;
    tracing::debug!(
        policy = policy.as_deref().unwrap_or("none (neutral answer)"),
        passed = result
            .node_names
            .as_ref()
            .map(Vec::len)
            .or(result.nodes.as_ref().map(|l| l.items.len())),
        failed = result.failed_nodes.len(),
        micros = started.elapsed().as_micros() as u64,
        "extender: filter"
    );
    with_policy(policy, Json(result))
}

async fn prioritize(
    State(state): State<AppState>,
    headers: HeaderMap,
    args: Result<Json<ExtenderArgs>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(denied) = authorize(&state, &headers) {
        return denied.into_response();
    }
    let Json(args) = match args {
        Ok(args) => args,
        Err(rejection) => return bad_body(rejection),
    };
    let started = Instant::now();
    let policy = state.extender.policy_for(args.pod.as_ref());
    let scores = state.extender.prioritize(args).await;
    tracing::debug!(
        policy = policy.as_deref().unwrap_or("none (neutral answer)"),
        nodes = scores.len(),
        micros = started.elapsed().as_micros() as u64,
        "extender: prioritize"
    );
    with_policy(policy, Json(scores))
}

/// The answer's header that echoes the policy applied (Rank's and Place's answers carry
/// it in their messages; kube-scheduler's JSON has no place for it, and ignores the header).
pub const POLICY_HEADER: &str = "x-coloc-policy";

/// `body` with the [`POLICY_HEADER`] where a policy was applied.
fn with_policy(policy: Option<String>, body: impl IntoResponse) -> Response {
    let mut response = body.into_response();
    if let Some(value) = policy.and_then(|p| http::HeaderValue::from_str(&p).ok()) {
        response
            .headers_mut()
            .insert(http::HeaderName::from_static(POLICY_HEADER), value);
    }
    response
}

/// Serves the extender on `listener` until `shutdown`; open connections then finish
/// their request in flight.
pub async fn serve(
    listener: TcpListener,
    extender: Arc<Extender>,
    options: ServeOptions,
    shutdown: CancellationToken,
) {
    match listener.local_addr() {
        Ok(address) => {
            tracing::info!(%address, tls = options.tls.is_some(), "serving the scheduler extender")
        }
        Err(error) => {
            tracing::info!(%error, "serving the scheduler extender on an address it cannot name")
        }
    }
    let router = router(extender, &options);
    let service =
        service_fn(move |request: http::Request<Incoming>| router.clone().oneshot(request));
    crate::http_server::serve("extender", listener, options.tls, service, shutdown).await;
}

/// A TLS acceptor from PEM files; with `client_ca`, clients must present a certificate
/// signed by it.
pub fn tls_acceptor(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> anyhow::Result<TlsAcceptor> {
    use anyhow::Context;
    use tokio_rustls::rustls::{
        self,
        pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("the certificate file holds no valid PEM certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .context("the key file holds no valid PEM private key")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem) {
                roots
                    .add(cert.context("the client CA file holds an invalid PEM certificate")?)
                    .context("the client CA file holds an unusable certificate")?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .context("cannot verify client certificates with that CA")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the certificate and key do not make a TLS identity")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

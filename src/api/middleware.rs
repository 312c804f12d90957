//! The tower layers around the RPCs: [`RpcLayer`] around every one (a span with method,
//! request id and peer, one log line with the gRPC status code and latency, and the RPC
//! metrics), and [`HeavyLimitLayer`], which bounds how many heavy calls are read and
//! computed at once, and how long one that has its turn may take to send its body.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tonic::{
    body::Body,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};
use tracing::Instrument;

use crate::metrics::Metrics;

#[derive(Clone)]
pub struct RpcLayer {
    metrics: Option<Arc<Metrics>>,
    request_ids: Arc<AtomicU64>,
}

impl RpcLayer {
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            metrics,
            request_ids: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = Rpc<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Rpc {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Rpc<S> {
    inner: S,
    layer: RpcLayer,
}

/// The gRPC status of a response: in its headers when the call failed (a trailers-only
/// response); a unary success sends it in the trailers, so none in the headers means OK.
fn status_code(response: &http::Response<Body>) -> i32 {
    status_code_of(response.headers())
}

/// Turns tonic's INTERNAL "failed to decode Protobuf message" into INVALID_ARGUMENT with
/// a message that does not show the decoder's text (status.rs decides both).
fn rewrite_undecodable(response: &mut http::Response<Body>) {
    let headers = response.headers_mut();
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let code = status_code_of(headers);
    if let Some((code, message)) = super::status::undecodable_request(code, message) {
        tracing::debug!("refused a request that could not be decoded");
        headers.insert("grpc-status", http::HeaderValue::from(code as i32));
        headers.insert("grpc-message", http::HeaderValue::from_static(message));
    }
}

fn status_code_of(headers: &http::HeaderMap) -> i32 {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl<S> tower::Service<http::Request<Body>> for Rpc<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().to_string();
        let request_id = request
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                self.layer
                    .request_ids
                    .fetch_add(1, Ordering::Relaxed)
                    .to_string()
            });
        let peer = request
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .or_else(|| {
                request
                    .extensions()
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .and_then(|info| info.get_ref().remote_addr())
            })
            .map(|a| a.to_string())
            .unwrap_or_default();
        let span =
            tracing::info_span!("rpc", method = %method, request_id = %request_id, peer = %peer);
        let metrics = self.layer.metrics.clone();
        let started = Instant::now();
        let call = self.inner.call(request);
        Box::pin(
            async move {
                let mut result = call.await;
                if let Ok(response) = &mut result {
                    rewrite_undecodable(response);
                }
                let latency = started.elapsed();
                match &result {
                    Ok(response) => {
                        let code = status_code(response);
                        if let Some(metrics) = &metrics {
                            metrics.observe_rpc(&method, code, latency.as_secs_f64());
                        }
                        tracing::info!(code, latency_us = latency.as_micros() as u64, "rpc");
                    }
                    Err(error) => tracing::warn!(%error, "rpc transport error"),
                }
                result
            }
            .instrument(span),
        )
    }
}

/// The RPCs whose work and answers grow with the catalog or the cluster.
const HEAVY_METHODS: [&str; 3] = [
    "/coloc.v1.ColocationAdvisor/Rank",
    "/coloc.v1.ColocationAdvisor/Predict",
    "/coloc.v1.ColocationAdvisor/Place",
];

/// At most a set number of heavy calls ([`HEAVY_METHODS`]) are read, decoded and computed
/// at once; the others wait for a permit with their request bodies unread, so a flood
/// costs the server a flow-control window per waiting call, not its whole request. This
/// is safe only because the server's HTTP/2 windows are set so that waiting streams can
/// never fill their connection's window (`startup/mod.rs`: the connection window exceeds
/// the streams a connection may open times the stream window); else the unread requests
/// would stall the very calls that hold the permits. The layer sits inside the auth
/// layer, so unauthenticated calls never hold a permit.
#[derive(Clone)]
pub struct HeavyLimitLayer {
    permits: Arc<tokio::sync::Semaphore>,
    body_timeout: Option<Duration>,
}

impl HeavyLimitLayer {
    /// `max_heavy`: heavy calls at once (0 = twice the cores, at least 4); `body_timeout`:
    /// how long after its turn comes a call's body must have arrived (`None` = no limit).
    pub fn new(max_heavy: usize, body_timeout: Option<Duration>) -> Self {
        let max_heavy = if max_heavy == 0 {
            std::thread::available_parallelism().map_or(4, |n| (2 * n.get()).max(4))
        } else {
            max_heavy
        };
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(max_heavy)),
            body_timeout,
        }
    }
}

impl<S> tower::Layer<S> for HeavyLimitLayer {
    type Service = HeavyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HeavyLimit {
            inner,
            permits: self.permits.clone(),
            body_timeout: self.body_timeout,
        }
    }
}

#[derive(Clone)]
pub struct HeavyLimit<S> {
    inner: S,
    permits: Arc<tokio::sync::Semaphore>,
    body_timeout: Option<Duration>,
}

impl<S> tower::Service<http::Request<Body>> for HeavyLimit<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if !HEAVY_METHODS.contains(&request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        // The service poll_ready made ready goes into the future; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let permits = self.permits.clone();
        let body_timeout = self.body_timeout;
        Box::pin(async move {
            // The semaphore is never closed, so the permit always comes.
            let _permit = permits.acquire_owned().await.ok();
            let request = match body_timeout {
                Some(limit) => request.map(|body| Body::new(DeadlineBody::new(body, limit))),
                None => request,
            };
            inner.call(request).await
        })
    }
}

/// A request body that fails with DEADLINE_EXCEEDED unless it has ended `limit` after it
/// was wrapped: the call decoding it fails, and its permit goes back.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl DeadlineBody {
    fn new(inner: Body, limit: Duration) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                "the request did not arrive whole within {} s of its turn \
                 (server.heavy_body_timeout_secs): a Rank, Predict or Place call must send its \
                 request at once",
                this.limit.as_secs_f64()
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

//! One tower layer around every RPC: a span with method, request id and peer, one log line
//! with the gRPC status code and latency, and the RPC metrics.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Instant,
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

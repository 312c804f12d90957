//! Bearer-token authorization for `coloc.v1.ColocationAdvisor` and
//! `coloc.v1.ProfilingAgents`, as a tower layer in front of the router (it needs the method
//! path, which tonic interceptors do not see). Which role a method needs and which token
//! holds which role is [`crate::tokens`]'s; health and reflection stay open, for probes and
//! grpcurl.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tonic::body::Body;

use crate::tokens::{Role, Tokens};

/// The role of the token a request was let in with, in the request's extensions (the
/// audit trail names it); absent when auth is off.
#[derive(Debug, Clone, Copy)]
pub struct CallerRole(pub Role);

/// The tower layer that applies [`Tokens::check`] to every request.
#[derive(Clone)]
pub struct AuthLayer {
    tokens: Option<Arc<Tokens>>,
}

impl AuthLayer {
    /// `None` = auth off: every request passes.
    pub fn new(tokens: Option<Tokens>) -> Self {
        Self {
            tokens: tokens.map(Arc::new),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            tokens: self.tokens.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    tokens: Option<Arc<Tokens>>,
}

impl<S> tower::Service<http::Request<Body>> for Auth<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
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

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if let Some(tokens) = &self.tokens {
            let authorization = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if let Err(status) = tokens.check(request.uri().path(), authorization) {
                return Box::pin(async move { Ok(status.into_http()) });
            }
            if let Some(role) = tokens.role(authorization) {
                request.extensions_mut().insert(CallerRole(role));
            }
        }
        Box::pin(self.inner.call(request))
    }
}

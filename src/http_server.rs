//! The accept/serve/shutdown loop of coloc's small HTTP/1.1 endpoints (the scheduler
//! extender's, over TLS when configured, and the metrics endpoint): each connection is
//! an owned task; at shutdown the loop stops accepting, open connections finish the
//! request in flight, and the loop returns once they have all closed.

use hyper::{body::Incoming, server::conn::http1, service::HttpService};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Serves `service` on every connection `listener` accepts (through `tls` when given)
/// until `shutdown`. `endpoint` names the endpoint in the log lines.
pub async fn serve<S>(
    endpoint: &'static str,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: S,
    shutdown: CancellationToken,
) where
    S: HttpService<Incoming> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "{endpoint}: accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let tls = tls.clone();
        let stop = shutdown.clone();
        connections.spawn(async move {
            let served = match tls {
                None => serve_connection(TokioIo::new(stream), service, stop).await,
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => serve_connection(TokioIo::new(stream), service, stop).await,
                    Err(error) => {
                        tracing::debug!(%error, "{endpoint}: TLS handshake failed");
                        return;
                    }
                },
            };
            if let Err(error) = served {
                tracing::debug!(%error, "{endpoint}: connection ended");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}

/// One connection until it closes; at `shutdown`, after the request in flight.
async fn serve_connection<I, S>(
    io: I,
    service: S,
    shutdown: CancellationToken,
) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: HttpService<Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let connection = http1::Builder::new().serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => served,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    }
}

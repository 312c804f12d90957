//! The transport's floor for Rank (`echo_rank_N`): a gRPC service that exists only inside
//! `coloc bench`, never in the product's proto or API. It answers every call on
//! [`ECHO_RANK_PATH`] with the bytes of one real Rank answer (taken from the server at
//! setup, encoded once), whatever the request holds; the clients send it the rank_N
//! requests and decode its answers as RankResponses, as they do Rank's. So an echo call
//! moves the same bytes both ways as a Rank call over the same kind of HTTP/2 connection,
//! and Rank's cost reads against that, not against an empty Health/Check.

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use tokio_util::sync::CancellationToken;
use tonic::{
    body::Body,
    codec::{Codec, DecodeBuf, Decoder},
    server::{Grpc, NamedService, UnaryService},
    Status,
};

use anyhow::Context as _;
use prost::Message;
use tonic::transport::Channel;

use super::scenario::{connect, rank_once, BytesEncoder};

/// The echo service's one method.
pub(super) const ECHO_RANK_PATH: &str = "/bench.Echo/Rank";

/// Messages as bytes both ways: the request is read and dropped, the answer is sent as it
/// was encoded.
#[derive(Default)]
struct RawCodec;

struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// The one method: the kept answer, whatever was asked.
struct Answer(Bytes);

impl UnaryService<Bytes> for Answer {
    type Response = Bytes;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(self.0.clone())))
    }
}

/// The echo service as tonic's server routes it.
#[derive(Clone)]
struct Echo {
    answer: Bytes,
}

impl NamedService for Echo {
    const NAME: &'static str = "bench.Echo";
}

type Answered = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<Body>> for Echo {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answered;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Answered {
        let answer = self.answer.clone();
        Box::pin(async move {
            if request.uri().path() != ECHO_RANK_PATH {
                return Ok(Status::unimplemented("the echo service answers Rank only").into_http());
            }
            let mut grpc =
                Grpc::new(RawCodec).apply_max_message_size_config(Some(256 << 20), Some(256 << 20));
            Ok(grpc.unary(Answer(answer), request).await)
        })
    }
}

/// The echo server on a loopback port, answering `answer` until `stop`; its address and
/// task. Its transport is set as the service's (`startup`): no Nagle delay, at most 256
/// streams per connection, 128 KiB stream windows, a connection window twice what they
/// hold together, no adaptive window; the service's layers (metrics, tokens, the
/// heavy-call limit) are its own work, not the transport's, and are left out.
pub(super) async fn start_echo(
    answer: Bytes,
    stop: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    const MAX_STREAMS: u32 = 256;
    const STREAM_WINDOW: u32 = 128 * 1024;
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(2 * MAX_STREAMS * STREAM_WINDOW)
        .http2_adaptive_window(Some(false))
        .add_service(Echo { answer })
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned());
    let task = tokio::spawn(async move { Ok(server.await?) });
    Ok((addr, task))
}

/// The echo servers of one bench run, one per rank size N asked for, started on first use.
#[derive(Default)]
pub(super) struct EchoFloors {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    channels: std::collections::HashMap<usize, Vec<Channel>>,
}

impl EchoFloors {
    /// The connections to the echo server of rank size `n`: on first use, the server's
    /// answer to the rank_N pool's first request is taken from `server`, encoded, and kept
    /// by a new echo server; its sizes go into the setup figures.
    pub(super) async fn channels(
        &mut self,
        n: usize,
        pool: &[Bytes],
        server: &Channel,
        connections: usize,
        setup: &mut impl FnMut(&str, serde_json::Value),
    ) -> anyhow::Result<Vec<Channel>> {
        if let Some(channels) = self.channels.get(&n) {
            return Ok(channels.clone());
        }
        let answer = rank_once(server, pool[0].clone())
            .await
            .context("taking a Rank answer for the echo service")?
            .encode_to_vec();
        setup(
            &format!("echo_rank_{n}_request_bytes"),
            pool[0].len().into(),
        );
        setup(&format!("echo_rank_{n}_answer_bytes"), answer.len().into());
        let (addr, task) = start_echo(answer.into(), self.stop.clone()).await?;
        self.tasks.push(task);
        let channels = connect(&format!("http://{addr}"), connections).await?;
        self.channels.insert(n, channels.clone());
        Ok(channels)
    }

    /// Stops the echo servers.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        drop(self.channels);
        self.stop.cancel();
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scenario::PreEncoded;
    use coloc::proto as pb;

    #[tokio::test]
    async fn the_echo_answers_the_kept_bytes_to_any_request_on_its_path_only() {
        let kept = pb::RankResponse {
            model_version: 7,
            gpu: "g".into(),
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let (addr, task) = start_echo(kept.encode_to_vec().into(), stop.clone())
            .await
            .unwrap();
        let channel = connect(&format!("http://{addr}"), 1)
            .await
            .unwrap()
            .remove(0);
        let mut raw = tonic::client::Grpc::new(channel);
        let request = Bytes::from(vec![1u8; 300]);
        raw.ready().await.unwrap();
        let answer = raw
            .unary(
                tonic::Request::new(request.clone()),
                http::uri::PathAndQuery::from_static(ECHO_RANK_PATH),
                PreEncoded::<pb::RankResponse>::default(),
            )
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer, kept);
        raw.ready().await.unwrap();
        let elsewhere = raw
            .unary(
                tonic::Request::new(request),
                http::uri::PathAndQuery::from_static("/bench.Echo/Other"),
                PreEncoded::<pb::RankResponse>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(elsewhere.code(), tonic::Code::Unimplemented);
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}

//! Hostile requests answered with the codes README promises: forged page tokens and
//! strings that are not UTF-8 are INVALID_ARGUMENT, and no answer shows internals.

use coloc::proto as pb;
use tonic::{codegen::http::uri::PathAndQuery, Code};

use crate::helpers::{expect_code, spawn_app};

/// GetWorkloadRequest with its `name` as raw bytes, so that it can carry invalid UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetWorkload {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
}

#[tokio::test]
async fn a_name_that_is_not_utf8_is_invalid_argument_without_the_decoders_text() {
    let app = spawn_app().await;
    let mut grpc = tonic::client::Grpc::new(app.channel().await);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<RawGetWorkload, pb::Workload, _>(
            tonic::Request::new(RawGetWorkload {
                name: vec![b'a', 0xff, 0xfe, b'b'],
            }),
            PathAndQuery::from_static("/coloc.v1.ColocationAdvisor/GetWorkload"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("UTF-8"), "{status:?}");
    assert!(!status.message().contains("Protobuf message"), "{status:?}");
}

#[tokio::test]
async fn forged_page_tokens_are_invalid_argument() {
    let mut app = spawn_app().await;
    for token in [
        hex::encode("anything at all"),
        hex::encode("w01"),
        format!("p1{}", "61".repeat(500_000)),
        "p1zz".to_string(),
    ] {
        let message = expect_code(
            app.client
                .list_workloads(pb::ListWorkloadsRequest {
                    page_token: token,
                    ..Default::default()
                })
                .await,
            Code::InvalidArgument,
        );
        assert!(message.contains("page_token"), "{message}");
    }
}

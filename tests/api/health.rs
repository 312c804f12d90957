//! Health and reflection as probes and grpcurl see them: SERVING once ready, both
//! reflection versions listing the services, and a stop that releases the database.

use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use tonic_reflection::pb::v1::{
    server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
    server_reflection_response::MessageResponse, ServerReflectionRequest,
};

use crate::helpers::spawn_app;

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_advisor_service() {
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel().await);
    for service in ["", "coloc.v1.ColocationAdvisor"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "service {service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await;
    assert_eq!(unknown.unwrap_err().code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn reflection_v1_lists_the_advisor_and_health_services() {
    let app = spawn_app().await;
    let mut reflection = ServerReflectionClient::new(app.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["coloc.v1.ColocationAdvisor", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn the_server_stops_when_asked_and_releases_the_database() {
    let app = spawn_app().await;
    let addr = app.addr;
    let dir = app.stop().await;
    assert!(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .is_err()
    );
    // The database is closed and can be opened again at once.
    let again = crate::helpers::spawn_app_in(dir).await;
    again.stop().await;
}

//! The key-status service answers for gRPC keys: the record's method is
//! `POST` and its path the full method name.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_guard::store::AnyStore;
use idempotency_guard::{Engine, Store};
use idempotency_service::Tokens;
use idempotency_service::{AppState, build_router};
use tower::ServiceExt;

use crate::server::proto::CreatePaymentRequest;
use crate::server::{CREATE, start};

const TOKEN: &str = "token-of-tenant-a-0123456789";

/// A completed gRPC call shows in the status service as `completed`,
/// advice `replay`, with the method path; another scope's token sees
/// nothing.
pub(crate) async fn the_status_service_answers_for_grpc_keys<S: Store + Into<AnyStore>>(store: S) {
    let server = start(Engine::new(store.clone())).await;
    let mut client = server.client().await;
    let key = format!("status-{}", uuid::Uuid::new_v4());
    let mut request = tonic::Request::new(CreatePaymentRequest {
        account: "acct".into(),
        amount_cents: 5,
        currency: "EUR".into(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-tenant", "tenant-a".parse().unwrap());
    client.create_payment(request).await.unwrap();

    let mut tokens = Tokens::default();
    tokens
        .add_pairs(&format!(
            "tenant-a {TOKEN}\ntenant-b token-of-tenant-b-0123456789"
        ))
        .unwrap();
    let router = build_router(AppState {
        store: store.into(),
        tokens: Arc::new(tokens),
        metrics: None,
        retry_after: Duration::from_secs(1),
        admin_tokens: Arc::new(Default::default()),
        reconciled: Arc::new(Default::default()),
        console: false,
        console_sessions: Arc::new(Default::default()),
    });
    let ask = |token: &str| {
        Request::get(format!("/v1/keys/{key}"))
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    let answer = router.clone().oneshot(ask(TOKEN)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["state"], "completed", "{json}");
    assert_eq!(json["advice"], "replay");
    assert_eq!(json["method"], "POST");
    assert_eq!(json["path"], CREATE);
    let other = router
        .oneshot(ask("token-of-tenant-b-0123456789"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
}

//! The service under test: its router over a fresh store, two tenants'
//! tokens, and a check of every answer against the OpenAPI document.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use idempotency_guard::store::{AnyStore, Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, Store, StoredResponse};
use idempotency_service::Tokens;
use idempotency_service::{AppState, build_router};
use idempotency_tests::{Answer, names};
use serde_json::Value;

pub(crate) const TOKEN_A: &str = "token-of-tenant-a-0123456789";
pub(crate) const TOKEN_B: &str = "token-of-tenant-b-0123456789";
pub(crate) const FP: Fingerprint = Fingerprint::from_bytes([0x5a; 32]);

pub(crate) fn tokens() -> Tokens {
    let mut tokens = Tokens::default();
    tokens
        .add_pairs(&format!("tenant-a {TOKEN_A}\ntenant-b {TOKEN_B}"))
        .unwrap();
    tokens
}

pub(crate) const ADMIN_ALL: &str = "admin-token-of-ops-0123456789";
pub(crate) const ADMIN_A: &str = "admin-token-of-tenant-a-0123456789";

/// Two admin tokens: `ops` for every scope, `alice` for `tenant-a` only.
pub(crate) fn admin_tokens() -> idempotency_service::AdminTokens {
    let mut tokens = idempotency_service::AdminTokens::default();
    tokens
        .add_triples(&format!(
            "ops * {ADMIN_ALL}
alice tenant-a {ADMIN_A}"
        ))
        .unwrap();
    tokens
}

/// The router over `store`.
pub(crate) fn router(store: AnyStore) -> Router {
    build_router(AppState {
        store,
        tokens: Arc::new(tokens()),
        metrics: None,
        retry_after: Duration::from_secs(1),
        admin_tokens: Arc::new(admin_tokens()),
        reconciled: Arc::new(idempotency_service::Reconciled::in_memory()),
        console: true,
        console_sessions: Arc::new(idempotency_service::ConsoleSessions::default()),
    })
}

/// The OpenAPI document, parsed once.
pub(crate) fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        serde_json::to_value(<idempotency_service::ApiDoc as utoipa::OpenApi>::openapi()).unwrap()
    })
}

/// Sends a request and checks the answer against the OpenAPI document:
/// its status must be documented for the operation, its content type
/// listed, and its JSON body valid against the schema.
pub(crate) async fn call(router: &Router, template: &str, request: Request<Body>) -> Answer {
    let method = request.method().as_str().to_lowercase();
    let answer = idempotency_tests::call(router, request).await;
    conforms(template, &method, &answer);
    answer
}

/// Asserts that an answer is one the document describes.
pub(crate) fn conforms(template: &str, method: &str, answer: &Answer) {
    let document = document();
    let operation = &document["paths"][template][method];
    assert!(
        operation.is_object(),
        "{method} {template} is not documented"
    );
    let response = &operation["responses"][answer.status.as_str()];
    assert!(
        response.is_object(),
        "{method} {template} answered {}, which is not documented: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    let content_type = answer
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let documented = response["content"]
        .as_object()
        .and_then(|content| {
            content
                .iter()
                .find(|(name, _)| name.split(';').next().unwrap_or("").trim() == content_type)
        })
        .map(|(_, media)| media.clone());
    let Some(media) = documented else {
        panic!(
            "{method} {template} {}: content type {content_type:?} is not documented",
            answer.status
        );
    };
    if content_type.ends_with("json") {
        let mut schema = media["schema"].clone();
        schema["components"] = document["components"].clone();
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .expect("the response schema compiles");
        let instance = answer.json();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {template} {}: the body does not match its schema: {errors:?}\n{instance}",
            answer.status
        );
    }
}

pub(crate) fn get(path: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::get(path);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(Body::empty()).unwrap()
}

pub(crate) fn lookup_request(body: &str, token: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/v1/keys/lookup")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// The states a test can put a key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seed {
    InFlight,
    Completed,
    CompletedNotStored,
    Abandoned,
    TransactionalLapsed,
}

/// Puts `key` of `scope` in the given state, through the store's own operations.
pub(crate) async fn seed<S: Store>(store: &S, scope: &str, key: &str, seed: Seed) -> Lease {
    let new = NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint: &FP,
        method: "POST",
        path: "/payments?x=1",
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: seed == Seed::TransactionalLapsed,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{scope}/{key} was already claimed");
    };
    match seed {
        Seed::InFlight => {}
        Seed::Completed | Seed::CompletedNotStored => {
            let body = (seed == Seed::Completed).then(|| Bytes::from_static(br#"{"id":1}"#));
            let response = StoredResponse {
                status: StatusCode::CREATED,
                headers: http::HeaderMap::new(),
                body,
            };
            store.complete(&lease, &response).await.unwrap();
        }
        Seed::Abandoned | Seed::TransactionalLapsed => {
            store.renew(&lease, Duration::ZERO).await.unwrap()
        }
    }
    lease
}

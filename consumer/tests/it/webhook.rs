//! Webhook receivers in front of the guard, on real stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderName, Request, StatusCode};
use idempotency_consumer::webhook::{
    DeliveryId, DeliveryIdError, WebhookLayer, sign_standard_webhook,
};
use idempotency_guard::{IdempotencyLayer, Store};
use idempotency_tests::{Answer, call, names};
use sha2::{Digest, Sha256};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SCOPE: &str = "webhooks:orders";

fn app<S: Store>(store: S, runs: Arc<AtomicU32>) -> Router {
    app_behind(
        WebhookLayer::standard_webhooks(SECRET).unwrap(),
        store,
        runs,
    )
}

/// The orders route, guarded by the store and verified by `webhooks`.
fn app_behind<S: Store>(webhooks: WebhookLayer, store: S, runs: Arc<AtomicU32>) -> Router {
    Router::new()
        .route(
            "/webhooks/orders",
            post(move || {
                let runs = Arc::clone(&runs);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::OK, format!("received, run {n}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(store).with_scope(|_| SCOPE.into()))
        .route_layer(webhooks)
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn delivery(
    id: Option<&str>,
    timestamp: i64,
    signature: Option<&str>,
    body: &'static str,
) -> Request<Body> {
    let mut request = Request::post("/webhooks/orders").header("content-type", "application/json");
    if let Some(id) = id {
        request = request.header("webhook-id", id);
    }
    request = request.header("webhook-timestamp", timestamp.to_string());
    if let Some(signature) = signature {
        request = request.header("webhook-signature", signature);
    }
    request.body(Body::from(body)).unwrap()
}

pub(crate) async fn a_valid_delivery_runs_once_and_replays<S: Store>(store: S) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let body = r#"{"type":"order.paid","order":"o-1"}"#;
    let ts = now();
    let signature = sign_standard_webhook(SECRET, &id, ts, body.as_bytes()).unwrap();
    let first = call(&app, delivery(Some(&id), ts, Some(&signature), body)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.as_ref(), b"received, run 1");
    assert!(!first.replayed());
    // The sender retries (same id, re-signed at a later second): the stored 2xx.
    let later = ts + 1;
    let resigned = sign_standard_webhook(SECRET, &id, later, body.as_bytes()).unwrap();
    let again = call(&app, delivery(Some(&id), later, Some(&resigned), body)).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body.as_ref(), b"received, run 1");
    assert!(again.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&id))
            .await
            .unwrap()
            .is_some()
    );
}

pub(crate) async fn refused_deliveries_store_nothing<S: Store>(store: S) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));
    let body = r#"{"type":"order.paid","order":"o-2"}"#;
    let ts = now();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let good = sign_standard_webhook(SECRET, &id, ts, body.as_bytes()).unwrap();
    let forged = sign_standard_webhook(
        "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==",
        &id,
        ts,
        body.as_bytes(),
    )
    .unwrap();
    let old = ts - 3600;
    let signed_old = sign_standard_webhook(SECRET, &id, old, body.as_bytes()).unwrap();
    let cases = [
        (
            delivery(Some(&id), ts, Some(&forged), body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        (
            delivery(Some(&id), ts, None, body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        (
            delivery(Some(&id), old, Some(&signed_old), body),
            StatusCode::BAD_REQUEST,
            "webhook-timestamp-expired",
        ),
        (
            delivery(None, ts, Some(&good), body),
            StatusCode::BAD_REQUEST,
            "webhook-id-missing",
        ),
    ];
    // A body that breaks off mid-stream (the sender's connection failed),
    // and one over the limit.
    let broken = {
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![
            Ok(r#"{"type":"order.paid","#),
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the sender went away",
            )),
        ];
        let mut request = delivery(Some(&id), ts, Some(&good), body);
        *request.body_mut() = Body::from_stream(futures_util::stream::iter(chunks));
        request
    };
    let too_large = {
        let mut request = delivery(Some(&id), ts, Some(&good), body);
        *request.body_mut() = Body::from(vec![b' '; 1024 * 1024 + 1]);
        request
    };
    let cases = cases.into_iter().chain([
        (broken, StatusCode::BAD_REQUEST, "body-unreadable"),
        (too_large, StatusCode::PAYLOAD_TOO_LARGE, "body-too-large"),
    ]);
    for (request, status, problem) in cases {
        let answer = call(&app, request).await;
        assert_eq!(answer.status, status, "{problem}");
        assert_eq!(answer.problem(), problem);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&id))
            .await
            .unwrap()
            .is_none(),
        "nothing was stored"
    );
}

/// HMAC-SHA256 of `message` under `key`, in lowercase hex: computed here,
/// over the exact bytes sent, not by the crate under test.
fn hmac_hex(key: &[u8], message: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
    mac.update(message);
    hex(&mac.finalize().into_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A delivery to the orders route with `headers` and `body`.
fn signed_post(headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut request = Request::post("/webhooks/orders").header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

fn assert_ran(answer: &Answer, run: u32) {
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body.as_ref(),
        format!("received, run {run}").as_bytes()
    );
    assert!(!answer.replayed(), "run {run} is not a replay");
}

fn assert_replayed_run_1(answer: &Answer, what: &str) {
    assert_eq!(answer.status, StatusCode::OK, "{what}");
    assert_eq!(answer.body.as_ref(), b"received, run 1", "{what}");
    assert!(answer.replayed(), "{what} is answered from the store");
}

fn assert_refused(answer: &Answer, status: StatusCode, problem: &str) {
    assert_eq!(answer.status, status, "{problem}");
    assert_eq!(answer.problem(), problem);
}

const GITHUB_SECRET: &[u8] = b"It's a Secret to Everybody";

/// A captured GitHub delivery resent under a fresh `X-GitHub-Delivery`
/// verifies (GitHub signs the body only) and is not run again: the key is
/// the body's digest. GitHub's own redelivery (same id, same body) replays.
pub(crate) async fn a_github_delivery_resent_under_a_fresh_id_does_not_run_again<S: Store>(
    store: S,
) {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = WebhookLayer::github(GITHUB_SECRET).unwrap();
    let app = app_behind(layer, store.clone(), Arc::clone(&runs));
    let body = format!(
        r#"{{"action":"opened","number":{},"issue":{{"id":1}}}}"#,
        uuid::Uuid::new_v4().as_u128() % 1_000_000_007
    );
    let signature = format!("sha256={}", hmac_hex(GITHUB_SECRET, body.as_bytes()));
    let delivery_id = uuid::Uuid::new_v4().to_string();
    let deliver = |id: &str, body: &str, signature: &str| {
        signed_post(
            &[
                ("x-github-event", "issues"),
                ("x-github-delivery", id),
                ("x-hub-signature-256", signature),
            ],
            body,
        )
    };
    assert_ran(
        &call(&app, deliver(&delivery_id, &body, &signature)).await,
        1,
    );
    // The attacker's copies: the captured bytes and signature, fresh ids.
    for _ in 0..3 {
        let fresh = uuid::Uuid::new_v4().to_string();
        let copy = call(&app, deliver(&fresh, &body, &signature)).await;
        assert_replayed_run_1(&copy, "a copy under a fresh X-GitHub-Delivery");
    }
    let without_id = call(
        &app,
        signed_post(&[("x-hub-signature-256", signature.as_str())], &body),
    )
    .await;
    assert_replayed_run_1(&without_id, "a copy without X-GitHub-Delivery");
    // GitHub's redelivery: the same id and the same body.
    let redelivery = call(&app, deliver(&delivery_id, &body, &signature)).await;
    assert_replayed_run_1(&redelivery, "GitHub's redelivery");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let key = format!("sha256:{}", hex(&Sha256::digest(body.as_bytes())));
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&key))
            .await
            .unwrap()
            .is_some(),
        "stored under the body's digest"
    );
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&delivery_id))
            .await
            .unwrap()
            .is_none(),
        "nothing under the unsigned delivery id"
    );
    // Another event (another body) runs; a body changed under the captured
    // signature is refused.
    let next = body.replace(r#""action":"opened""#, r#""action":"closed""#);
    let next_signature = format!("sha256={}", hmac_hex(GITHUB_SECRET, next.as_bytes()));
    assert_ran(
        &call(&app, deliver(&delivery_id, &next, &next_signature)).await,
        2,
    );
    let tampered = body.replace(r#""id":1"#, r#""id":2"#);
    assert_refused(
        &call(&app, deliver(&delivery_id, &tampered, &signature)).await,
        StatusCode::UNAUTHORIZED,
        "webhook-signature-invalid",
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A captured Standard Webhooks delivery resent under a fresh `webhook-id`
/// is refused (the id is signed), and a configuration keying on a header
/// the scheme does not sign cannot be built.
pub(crate) async fn a_standard_webhooks_delivery_resent_under_a_fresh_id_is_refused<S: Store>(
    store: S,
) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let body = r#"{"type":"order.paid","order":"o-3"}"#;
    let ts = now();
    let signature = sign_standard_webhook(SECRET, &id, ts, body.as_bytes()).unwrap();
    assert_ran(
        &call(&app, delivery(Some(&id), ts, Some(&signature), body)).await,
        1,
    );
    let fresh = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let copy = call(&app, delivery(Some(&fresh), ts, Some(&signature), body)).await;
    assert_refused(&copy, StatusCode::UNAUTHORIZED, "webhook-signature-invalid");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the copy did not run");
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&fresh))
            .await
            .unwrap()
            .is_none()
    );
    // The same copy under the captured id is a replay.
    let again = call(&app, delivery(Some(&id), ts, Some(&signature), body)).await;
    assert_replayed_run_1(&again, "the captured delivery under its own id");

    // Keying on an unsigned header is refused when the layer is built.
    let unsigned = WebhookLayer::standard_webhooks(SECRET)
        .unwrap()
        .with_delivery_id(DeliveryId::Header(HeaderName::from_static("x-request-id")));
    assert!(matches!(
        unsigned,
        Err(DeliveryIdError::Unsigned { ref header, .. }) if header == "x-request-id"
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

const STRIPE_SECRET: &str = "whsec_3mB1yQhW1vyQ3c2sCvYbZ8tJc5cH3Yx9";
const STRIPE_NEXT_SECRET: &str = "whsec_Pq7rXkz2LmN8vB4cD6fG1hJ0kL5mN9pQ";

/// A `Stripe-Signature` for `body` at `t` under `secret`: computed here.
fn stripe_signature(secret: &str, t: i64, body: &str) -> String {
    let signed = format!("{t}.{body}");
    format!(
        "t={t},v1={}",
        hmac_hex(secret.as_bytes(), signed.as_bytes())
    )
}

/// A Stripe-signed event verifies and runs once; Stripe's retry (the same
/// event, signed again later) and a captured copy under fresh header values
/// are answered from the store; a wrong or expired signature is refused.
pub(crate) async fn a_stripe_delivery_runs_once_and_forged_or_stale_ones_are_refused<S: Store>(
    store: S,
) {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = WebhookLayer::stripe(&[STRIPE_SECRET]).unwrap();
    let app = app_behind(layer, store.clone(), Arc::clone(&runs));
    let event = format!("evt_{}", uuid::Uuid::new_v4().simple());
    let body = format!(r#"{{"id":"{event}","object":"event","type":"charge.succeeded"}}"#);
    let ts = now();
    let signature = stripe_signature(STRIPE_SECRET, ts, &body);
    let deliver = |signature: &str, extra: &[(&str, &str)], body: &str| {
        let mut headers = vec![("stripe-signature", signature)];
        headers.extend_from_slice(extra);
        signed_post(&headers, body)
    };
    assert_ran(&call(&app, deliver(&signature, &[], &body)).await, 1);
    // Stripe's retry: the same event, signed again at a later second.
    let retry = stripe_signature(STRIPE_SECRET, ts + 2, &body);
    assert_replayed_run_1(
        &call(&app, deliver(&retry, &[], &body)).await,
        "Stripe's retry",
    );
    // A captured copy under fresh header values: a sender-set key, another
    // request id, the signature header padded with a v0 and a stranger's v1.
    let padded = format!("{signature},v0={},v1={}", "1".repeat(64), "2".repeat(64));
    let fresh_key = uuid::Uuid::new_v4().to_string();
    let copy = call(
        &app,
        deliver(
            &padded,
            &[
                ("idempotency-key", fresh_key.as_str()),
                ("request-id", "req_fresh"),
            ],
            &body,
        ),
    )
    .await;
    assert_replayed_run_1(&copy, "a captured copy under fresh header values");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&event))
            .await
            .unwrap()
            .is_some(),
        "keyed by the event id"
    );
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&fresh_key))
            .await
            .unwrap()
            .is_none()
    );

    let other = format!("evt_{}", uuid::Uuid::new_v4().simple());
    let other_body = body.replace(&event, &other);
    let old = ts - 3600;
    let cases = [
        // Signed with someone else's secret.
        (
            deliver(
                &stripe_signature("whsec_not_the_endpoints", ts, &other_body),
                &[],
                &other_body,
            ),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        // The captured signature over another event's body.
        (
            deliver(&signature, &[], &other_body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        // The captured v1 under a fresh t.
        (
            deliver(
                &signature.replace(&format!("t={ts}"), &format!("t={}", ts + 1)),
                &[],
                &other_body,
            ),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        // Correctly signed an hour ago: a replay attack.
        (
            deliver(
                &stripe_signature(STRIPE_SECRET, old, &other_body),
                &[],
                &other_body,
            ),
            StatusCode::BAD_REQUEST,
            "webhook-timestamp-expired",
        ),
        (
            signed_post(&[], &other_body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        (
            deliver(&format!("v1={}", "2".repeat(64)), &[], &other_body),
            StatusCode::BAD_REQUEST,
            "webhook-timestamp-invalid",
        ),
    ];
    for (request, status, problem) in cases {
        assert_refused(&call(&app, request).await, status, problem);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused delivery ran");
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&other))
            .await
            .unwrap()
            .is_none(),
        "nothing stored"
    );
}

/// While a Stripe secret is rolled, the endpoint holds both: events signed
/// with either verify (alone, or with both signatures as Stripe sends
/// them), one signed with neither does not.
pub(crate) async fn a_second_stripe_secret_verifies_while_one_is_rolled<S: Store>(store: S) {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = WebhookLayer::stripe(&[STRIPE_SECRET, STRIPE_NEXT_SECRET]).unwrap();
    let app = app_behind(layer, store.clone(), Arc::clone(&runs));
    let event = |n: u32| {
        let id = format!("evt_{}_{n}", uuid::Uuid::new_v4().simple());
        let body = format!(r#"{{"id":"{id}","object":"event"}}"#);
        (id, body)
    };
    let ts = now();
    let (_, first) = event(1);
    let signed_old = stripe_signature(STRIPE_SECRET, ts, &first);
    assert_ran(
        &call(
            &app,
            signed_post(&[("stripe-signature", &signed_old)], &first),
        )
        .await,
        1,
    );
    let (_, second) = event(2);
    let signed_new = stripe_signature(STRIPE_NEXT_SECRET, ts, &second);
    assert_ran(
        &call(
            &app,
            signed_post(&[("stripe-signature", &signed_new)], &second),
        )
        .await,
        2,
    );
    // Both signatures in one header, as Stripe sends during the roll.
    let (_, third) = event(3);
    let both = format!(
        "{},v1={}",
        stripe_signature("whsec_retired_long_ago", ts, &third),
        hmac_hex(
            STRIPE_NEXT_SECRET.as_bytes(),
            format!("{ts}.{third}").as_bytes()
        )
    );
    assert_ran(
        &call(&app, signed_post(&[("stripe-signature", &both)], &third)).await,
        3,
    );
    let (stranger, fourth) = event(4);
    let signed_neither = stripe_signature("whsec_retired_long_ago", ts, &fourth);
    assert_refused(
        &call(
            &app,
            signed_post(&[("stripe-signature", &signed_neither)], &fourth),
        )
        .await,
        StatusCode::UNAUTHORIZED,
        "webhook-signature-invalid",
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(
        store
            .get(names::scope(SCOPE), names::key(&stranger))
            .await
            .unwrap()
            .is_none()
    );
}

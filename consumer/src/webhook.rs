//! Webhook receivers: verify the sender's signature before anything is
//! stored, then hand the delivery id on as the `Idempotency-Key` of the
//! [`IdempotencyLayer`](idempotency_guard::IdempotencyLayer) mounted behind
//! this layer, so a repeat delivery gets the stored 2xx without running.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idempotency_consumer::webhook::WebhookLayer;
//! use idempotency_guard::{IdempotencyLayer, store::AnyStore};
//!
//! # async fn f(store: AnyStore) -> anyhow::Result<Router> {
//! let app = Router::new()
//!     .route("/webhooks/orders", post(|| async { "received" }))
//!     // Inner: run once per delivery id.
//!     .route_layer(IdempotencyLayer::new(store).with_scope(|_| "webhooks:orders".into()))
//!     // Outer: verify first; a forged or stale delivery never reaches the store.
//!     .route_layer(WebhookLayer::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?);
//! # Ok(app) }
//! ```
//!
//! | delivery | answer | stored |
//! |---|---|---|
//! | no delivery id (`webhook-id`, `X-GitHub-Delivery`, or the configured source) | 400 `webhook-id-missing` | nothing |
//! | `webhook-timestamp` missing or not a number | 400 `webhook-timestamp-invalid` | nothing |
//! | timestamp further than the tolerance (default 5 minutes) from now | 400 `webhook-timestamp-expired` | nothing |
//! | no signature, or none that matches | 401 `webhook-signature-invalid` | nothing |
//! | body over the limit (default 1 MiB) | 413 `body-too-large` | nothing |
//! | valid, first time | the handler's | its response, under the delivery id |
//! | valid, again | the stored response, `Idempotent-Replayed: true` | — |

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use idempotency_guard::IDEMPOTENCY_KEY;
use idempotency_guard::problem::Problem;
use sha2::Sha256;

/// The Standard Webhooks id header.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The Standard Webhooks timestamp header (seconds since the epoch).
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The Standard Webhooks signature header (`v1,<base64>`, space separated).
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// GitHub's delivery id header.
pub const GITHUB_DELIVERY: &str = "x-github-delivery";
/// GitHub's signature header (`sha256=<hex>`).
pub const GITHUB_SIGNATURE: &str = "x-hub-signature-256";

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// A Standard Webhooks secret is `whsec_` followed by base64.
    #[error("a Standard Webhooks secret is `whsec_` followed by base64")]
    NotBase64,
    /// The secret is empty.
    #[error("the webhook secret is empty")]
    Empty,
}

/// Where a delivery's id (its idempotency key) comes from.
#[derive(Clone)]
#[non_exhaustive]
pub enum DeliveryId {
    /// The Standard Webhooks `webhook-id` header.
    StandardWebhooks,
    /// GitHub's `X-GitHub-Delivery` header.
    GitHub,
    /// Another header.
    Header(HeaderName),
    /// A function of the body (Stripe's event id: the `id` member, see
    /// [`DeliveryId::json_field`]).
    Body(crate::PayloadKey),
}

impl DeliveryId {
    /// The id from the top-level JSON string member `field` of the body
    /// (`DeliveryId::json_field("id")` for Stripe's events).
    pub fn json_field(field: &'static str) -> Self {
        Self::Body(Arc::new(move |body| {
            let value: serde_json::Value = serde_json::from_slice(body).ok()?;
            value.get(field)?.as_str().map(str::to_owned)
        }))
    }

    fn of(&self, headers: &HeaderMap, body: &[u8]) -> Option<String> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        match self {
            Self::StandardWebhooks => header(WEBHOOK_ID),
            Self::GitHub => header(GITHUB_DELIVERY),
            Self::Header(name) => header(name.as_str()),
            Self::Body(id) => id(body),
        }
        .filter(|id| !id.is_empty())
    }
}

impl std::fmt::Debug for DeliveryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::StandardWebhooks => f.write_str("StandardWebhooks"),
            Self::GitHub => f.write_str("GitHub"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Body(_) => f.write_str("Body(..)"),
        }
    }
}

/// How a delivery's signature is checked.
#[derive(Clone)]
enum Signature {
    /// HMAC-SHA256 over `id.timestamp.body`, base64, `v1,` prefix; any of
    /// the secrets (for rotation).
    StandardWebhooks(Vec<Vec<u8>>),
    /// HMAC-SHA256 over the body, hex, `sha256=` prefix.
    GitHub(Vec<u8>),
}

/// Why a delivery was refused before anything was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WebhookRejection {
    /// No delivery id.
    IdMissing,
    /// The timestamp is missing or not a number.
    TimestampInvalid,
    /// The timestamp is outside the tolerance.
    TimestampExpired,
    /// No signature matches.
    SignatureInvalid,
    /// The body is over the limit.
    BodyTooLarge,
}

impl WebhookRejection {
    /// The problem+json response.
    pub fn into_response(self) -> Response<Body> {
        let (status, name, title, detail) = match self {
            Self::IdMissing => (
                StatusCode::BAD_REQUEST,
                "webhook-id-missing",
                "Webhook id missing",
                "The delivery carries no id to deduplicate it by.",
            ),
            Self::TimestampInvalid => (
                StatusCode::BAD_REQUEST,
                "webhook-timestamp-invalid",
                "Webhook timestamp invalid",
                "The webhook-timestamp header is missing or not a number of seconds.",
            ),
            Self::TimestampExpired => (
                StatusCode::BAD_REQUEST,
                "webhook-timestamp-expired",
                "Webhook timestamp outside tolerance",
                "The delivery's timestamp is too far from now; it may be a replay attack.",
            ),
            Self::SignatureInvalid => (
                StatusCode::UNAUTHORIZED,
                "webhook-signature-invalid",
                "Webhook signature invalid",
                "No signature on the delivery matches its content and the shared secret.",
            ),
            Self::BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Body too large",
                "The delivery's body is over the limit.",
            ),
        };
        Problem::new(status, name, title, detail).into_response()
    }
}

/// The layer's settings. Each default says why it is the default.
#[derive(Clone)]
struct WebhookConfig {
    signature: Signature,
    /// The sender's own id header.
    id: DeliveryId,
    /// 5 minutes, as the Standard Webhooks libraries: a captured delivery
    /// cannot be replayed later, clocks may differ a little.
    tolerance: Duration,
    /// 1 MiB, as the guard's own body limit.
    body_limit: usize,
}

/// A tower layer that verifies webhook deliveries and keys them for the
/// [`IdempotencyLayer`](idempotency_guard::IdempotencyLayer) behind it.
#[derive(Clone)]
pub struct WebhookLayer {
    config: Arc<WebhookConfig>,
}

impl std::fmt::Debug for WebhookLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookLayer")
            .field("id", &self.config.id)
            .field("tolerance", &self.config.tolerance)
            .finish_non_exhaustive()
    }
}

impl WebhookLayer {
    /// Verifies Standard Webhooks signatures with `secret` (`whsec_` and
    /// base64) and keys deliveries by `webhook-id`.
    ///
    /// # Errors
    ///
    /// [`SecretError`] when the secret is not `whsec_` and base64.
    pub fn standard_webhooks(secret: &str) -> Result<Self, SecretError> {
        Self::standard_webhooks_rotating(&[secret])
    }

    /// Like [`WebhookLayer::standard_webhooks`] with several secrets, any of
    /// which may have signed (while one is rotated out).
    ///
    /// # Errors
    ///
    /// [`SecretError`] when a secret is not `whsec_` and base64, or none is given.
    pub fn standard_webhooks_rotating(secrets: &[&str]) -> Result<Self, SecretError> {
        let keys = secrets
            .iter()
            .map(|secret| {
                let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
                match BASE64.decode(encoded) {
                    Ok(key) if !key.is_empty() => Ok(key),
                    Ok(_) => Err(SecretError::Empty),
                    Err(_) => Err(SecretError::NotBase64),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self::with(
            Signature::StandardWebhooks(keys),
            DeliveryId::StandardWebhooks,
        ))
    }

    /// Verifies GitHub's `X-Hub-Signature-256` with `secret` and keys
    /// deliveries by `X-GitHub-Delivery`. GitHub signs no timestamp, so no
    /// tolerance applies: the id alone stops a replay.
    ///
    /// # Errors
    ///
    /// [`SecretError::Empty`] for an empty secret.
    pub fn github(secret: &[u8]) -> Result<Self, SecretError> {
        if secret.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self::with(
            Signature::GitHub(secret.to_vec()),
            DeliveryId::GitHub,
        ))
    }

    fn with(signature: Signature, id: DeliveryId) -> Self {
        Self {
            config: Arc::new(WebhookConfig {
                signature,
                id,
                tolerance: Duration::from_secs(300),
                body_limit: 1024 * 1024,
            }),
        }
    }

    /// Sets where the delivery id comes from (Stripe: `DeliveryId::json_field("id")`).
    ///
    /// The default value is the signature scheme's own header.
    pub fn with_delivery_id(mut self, id: DeliveryId) -> Self {
        Arc::make_mut(&mut self.config).id = id;
        self
    }

    /// Sets how far a Standard Webhooks timestamp may be from now.
    ///
    /// The default value is 5 minutes.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        Arc::make_mut(&mut self.config).tolerance = tolerance;
        self
    }

    /// Sets the largest body accepted, in bytes.
    ///
    /// The default value is 1 MiB.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).body_limit = bytes;
        self
    }

    /// Checks a delivery: its id, timestamp and signature. `Ok` with the
    /// delivery id when it may go on.
    ///
    /// # Errors
    ///
    /// The [`WebhookRejection`] to answer.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, WebhookRejection> {
        self.verify_at(headers, body, SystemTime::now())
    }

    fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<String, WebhookRejection> {
        let config = &self.config;
        let id = config
            .id
            .of(headers, body)
            .ok_or(WebhookRejection::IdMissing)?;
        let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        match &config.signature {
            Signature::StandardWebhooks(keys) => {
                // The signed id is always webhook-id, whatever keys the record.
                let signed_id = text(WEBHOOK_ID).ok_or(WebhookRejection::IdMissing)?;
                let timestamp: i64 = text(WEBHOOK_TIMESTAMP)
                    .and_then(|value| value.trim().parse().ok())
                    .ok_or(WebhookRejection::TimestampInvalid)?;
                let now = now
                    .duration_since(UNIX_EPOCH)
                    .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
                    .unwrap_or(0);
                let tolerance = i64::try_from(config.tolerance.as_secs()).unwrap_or(i64::MAX);
                if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
                    return Err(WebhookRejection::TimestampExpired);
                }
                let signatures =
                    text(WEBHOOK_SIGNATURE).ok_or(WebhookRejection::SignatureInvalid)?;
                let prefix = format!("{signed_id}.{timestamp}.");
                let matches = signatures
                    .split(' ')
                    .filter_map(|entry| entry.strip_prefix("v1,"))
                    .filter_map(|encoded| BASE64.decode(encoded).ok())
                    .any(|signature| {
                        keys.iter().any(|key| {
                            mac(key, &[prefix.as_bytes(), body])
                                .is_some_and(|mac| mac.verify_slice(&signature).is_ok())
                        })
                    });
                if !matches {
                    return Err(WebhookRejection::SignatureInvalid);
                }
            }
            Signature::GitHub(key) => {
                let signature = text(GITHUB_SIGNATURE)
                    .and_then(|value| value.strip_prefix("sha256="))
                    .and_then(hex_decode)
                    .ok_or(WebhookRejection::SignatureInvalid)?;
                let valid =
                    mac(key, &[body]).is_some_and(|mac| mac.verify_slice(&signature).is_ok());
                if !valid {
                    return Err(WebhookRejection::SignatureInvalid);
                }
            }
        }
        Ok(id)
    }
}

/// HMAC-SHA256 over the parts, in order.
fn mac(key: &[u8], parts: &[&[u8]]) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    for part in parts {
        mac.update(part);
    }
    Some(mac)
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

/// Signs a Standard Webhooks delivery: the `webhook-signature` value for
/// `id`, `timestamp` and `body` with `secret` (`whsec_` and base64). For
/// senders and tests.
///
/// # Errors
///
/// [`SecretError`] when the secret is not `whsec_` and base64.
pub fn sign_standard_webhook(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SecretError> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
    let prefix = format!("{id}.{timestamp}.");
    let mac = mac(&key, &[prefix.as_bytes(), body]).ok_or(SecretError::Empty)?;
    Ok(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())))
}

impl<I> tower::Layer<I> for WebhookLayer {
    type Service = WebhookService<I>;

    fn layer(&self, inner: I) -> Self::Service {
        WebhookService {
            layer: self.clone(),
            inner,
        }
    }
}

/// The service of [`WebhookLayer`].
#[derive(Clone, Debug)]
pub struct WebhookService<I> {
    layer: WebhookLayer,
    inner: I,
}

/// The future of [`WebhookService`].
pub struct ResponseFuture<E>(BoxFuture<'static, Result<Response<Body>, E>>);

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<E> std::future::Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<I> tower::Service<Request<Body>> for WebhookService<I>
where
    I: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let layer = self.layer.clone();
        // The ready clone serves this request; a fresh clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture(Box::pin(async move {
            let limit = layer.config.body_limit;
            let (mut parts, body) = request.into_parts();
            let declared = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<u64>().ok());
            if declared.is_some_and(|length| length > limit as u64) {
                return Ok(WebhookRejection::BodyTooLarge.into_response());
            }
            let body = match http_body_util::Limited::new(body, limit).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => return Ok(WebhookRejection::BodyTooLarge.into_response()),
            };
            let id = match layer.verify(&parts.headers, &body) {
                Ok(id) => id,
                Err(rejection) => {
                    tracing::warn!(rejection = ?rejection, "webhook delivery refused before anything was stored");
                    return Ok(rejection.into_response());
                }
            };
            // The delivery id is the key; a key the sender set is not trusted.
            parts.headers.remove(&IDEMPOTENCY_KEY);
            match HeaderValue::from_str(&id) {
                Ok(value) => {
                    parts.headers.insert(IDEMPOTENCY_KEY.clone(), value);
                }
                Err(_) => return Ok(WebhookRejection::IdMissing.into_response()),
            }
            inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn delivery(id: &str, timestamp: i64, signature: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(WEBHOOK_ID, HeaderValue::from_str(id).expect("id"));
        headers.insert(
            WEBHOOK_TIMESTAMP,
            HeaderValue::from_str(&timestamp.to_string()).expect("ts"),
        );
        headers.insert(
            WEBHOOK_SIGNATURE,
            HeaderValue::from_str(signature).expect("sig"),
        );
        headers
    }

    #[test]
    fn the_standard_webhooks_reference_vector_verifies() {
        // The example of the Standard Webhooks specification.
        let body = br#"{"test": 2432232314}"#;
        let headers = delivery(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        );
        let layer = WebhookLayer::standard_webhooks(SECRET).expect("secret");
        let at = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
        assert_eq!(
            layer.verify_at(&headers, body, at).as_deref(),
            Ok("msg_p5jXN8AQM9LWM0D4loKWxJek")
        );
        assert_eq!(
            sign_standard_webhook(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body)
                .as_deref(),
            Ok("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        // One byte changed, or another time: refused.
        assert_eq!(
            layer.verify_at(&headers, br#"{"test": 2432232315}"#, at),
            Err(WebhookRejection::SignatureInvalid)
        );
        let later = at + Duration::from_secs(301);
        assert_eq!(
            layer.verify_at(&headers, body, later),
            Err(WebhookRejection::TimestampExpired)
        );
    }

    #[test]
    fn github_signatures_verify_over_the_body() {
        let layer = WebhookLayer::github(b"It's a Secret to Everybody").expect("secret");
        let mut headers = HeaderMap::new();
        headers.insert(
            GITHUB_DELIVERY,
            HeaderValue::from_static("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        );
        // GitHub's documented example.
        headers.insert(
            GITHUB_SIGNATURE,
            HeaderValue::from_static(
                "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            ),
        );
        assert_eq!(
            layer.verify(&headers, b"Hello, World!").as_deref(),
            Ok("72d3162e-cc78-11e3-81ab-4c9367dc0958")
        );
        assert_eq!(
            layer.verify(&headers, b"Hello, World?"),
            Err(WebhookRejection::SignatureInvalid)
        );
    }

    #[test]
    fn stripe_events_are_keyed_by_their_id() {
        let id = DeliveryId::json_field("id");
        assert_eq!(
            id.of(
                &HeaderMap::new(),
                br#"{"id":"evt_1","type":"charge.succeeded"}"#
            )
            .as_deref(),
            Some("evt_1")
        );
        assert_eq!(id.of(&HeaderMap::new(), br#"{"type":"x"}"#), None);
    }

    #[test]
    fn secrets_must_be_base64() {
        assert_eq!(
            WebhookLayer::standard_webhooks("whsec_!!!").err(),
            Some(SecretError::NotBase64)
        );
        assert_eq!(WebhookLayer::github(b"").err(), Some(SecretError::Empty));
    }
}

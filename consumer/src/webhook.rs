//! Webhook receivers: verify the sender's signature before anything is
//! stored, then hand a key that the signature covers on as the
//! `Idempotency-Key` of the
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
//!     // Inner: run once per delivery.
//!     .route_layer(IdempotencyLayer::new(store).with_scope(|_| "webhooks:orders".into()))
//!     // Outer: verify first; a forged or stale delivery never reaches the store.
//!     .route_layer(WebhookLayer::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?);
//! # Ok(app) }
//! ```
//!
//! # What keys a delivery
//!
//! The key must be something the signature covers. A header the sender
//! does not sign can be changed by whoever captured a delivery: resent under
//! a fresh value, it would still verify and run again.
//!
//! | scheme | signed | key | a captured delivery resent under a fresh id header |
//! |---|---|---|---|
//! | [`WebhookLayer::standard_webhooks`] | `webhook-id`, `webhook-timestamp`, the body | `webhook-id` | the signature no longer matches: 401 `webhook-signature-invalid` |
//! | [`WebhookLayer::github`] | the body only (`X-Hub-Signature-256`) | `sha256:<hex>` of the raw body ([`DeliveryId::BodyDigest`]) | the same key: the stored answer, not run |
//! | [`WebhookLayer::stripe`] | `t` and the body (`Stripe-Signature`) | the event's `id` member ([`DeliveryId::json_field`]) | the same key: the stored answer, not run |
//!
//! GitHub signs neither `X-GitHub-Delivery` nor a time, so the delivery
//! header cannot key a record and nothing ages a captured delivery out: the
//! body is the only thing an attacker cannot change. Keying on its digest
//! makes a GitHub redelivery (the same payload, the same
//! `X-GitHub-Delivery`) and any copy under a fresh delivery id the same
//! key, so the handler runs once. Keying on both (refusing a new id for a
//! body already seen) was the alternative; it would change only what the
//! copy is answered (a refusal instead of the stored 2xx), not whether it
//! runs, and would need a second record per delivery. Two GitHub events
//! are not byte for byte the same body in practice (each carries its own
//! ids and times); if two were, the second would be taken for a repeat.
//!
//! [`WebhookLayer::with_delivery_id`] changes the key; a key the scheme does
//! not sign (another header, or `webhook-id` under a scheme that signs
//! another id) is refused there with [`DeliveryIdError::Unsigned`].
//!
//! # Answers
//!
//! | delivery | answer | stored |
//! |---|---|---|
//! | no key (`webhook-id` missing, or the body has no such member) | 400 `webhook-id-missing` | nothing |
//! | `webhook-timestamp` or Stripe's `t=` missing or not a number | 400 `webhook-timestamp-invalid` | nothing |
//! | a signed timestamp further than the tolerance (default 5 minutes) from now, either way | 400 `webhook-timestamp-expired` | nothing |
//! | no signature, or none that matches | 401 `webhook-signature-invalid` | nothing |
//! | body over the limit (default 1 MiB) | 413 `body-too-large` | nothing |
//! | valid, first time | the handler's | its response, under the key |
//! | valid, again (a retry, or a copy under a fresh id header) | the stored response, `Idempotent-Replayed: true` | — |
//!
//! # Warning
//!
//! A record lives as long as the guard's retention (24 hours by default,
//! [`with_retention`](idempotency_guard::IdempotencyLayer::with_retention)).
//! Set it longer than the sender retries (Stripe: 3 days): a retry after
//! the record is purged runs again. Standard Webhooks and Stripe deliveries
//! older than the tolerance are refused whatever the store holds; a GitHub
//! delivery has no time, so a copy resent after the retention runs again.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::IntoResponse;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use idempotency_guard::IDEMPOTENCY_KEY;
use idempotency_guard::problem::{Problem, types};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The Standard Webhooks id header.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The Standard Webhooks timestamp header (seconds since the epoch).
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The Standard Webhooks signature header (`v1,<base64>`, space separated).
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// GitHub's delivery id header (not signed: never a key).
pub const GITHUB_DELIVERY: &str = "x-github-delivery";
/// GitHub's signature header (`sha256=<hex>`).
pub const GITHUB_SIGNATURE: &str = "x-hub-signature-256";
/// Stripe's signature header (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`).
pub const STRIPE_SIGNATURE: &str = "stripe-signature";

/// The most signatures of one delivery that are compared (Standard
/// Webhooks' `v1,` entries, Stripe's `v1=` entries); the rest are ignored.
/// Each secret's HMAC is computed once, whatever the count, so the bound
/// only caps the comparisons.
const MAX_SIGNATURES: usize = 16;

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// A Standard Webhooks secret is `whsec_` followed by base64.
    #[error("a Standard Webhooks secret is `whsec_` followed by base64")]
    NotBase64,
    /// The secret is empty, or no secret is given.
    #[error("the webhook secret is empty")]
    Empty,
}

/// A delivery id the layer's signature scheme does not cover.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryIdError {
    /// The id comes from a header the scheme does not sign: a captured
    /// delivery resent under a fresh value there would verify and run
    /// again.
    #[error(
        "the {scheme} signature does not cover the header `{header}`, so it cannot key deliveries \
         (a captured delivery resent under a fresh `{header}` would verify and run again); \
         key on the signed body instead (DeliveryId::BodyDigest or DeliveryId::json_field)"
    )]
    Unsigned {
        /// The signature scheme (`Standard Webhooks`, `GitHub`, `Stripe`).
        scheme: &'static str,
        /// The header that was to key deliveries.
        header: String,
    },
}

/// Where a delivery's key (its `Idempotency-Key`) comes from. It must be
/// covered by the signature: [`WebhookLayer::with_delivery_id`] refuses a
/// source the scheme does not sign.
#[derive(Clone)]
#[non_exhaustive]
pub enum DeliveryId {
    /// The Standard Webhooks `webhook-id` header (signed by that scheme
    /// only).
    StandardWebhooks,
    /// `sha256:<64 lowercase hex>` of the raw body: what GitHub keys on
    /// (every scheme signs the body).
    BodyDigest,
    /// Another header. No scheme here signs one but `webhook-id`, so only
    /// `Header("webhook-id")` under Standard Webhooks is accepted.
    Header(HeaderName),
    /// A function of the body (Stripe's event id: the `id` member, see
    /// [`DeliveryId::json_field`]); every scheme signs the body.
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
            Self::BodyDigest => Some(format!("sha256:{}", hex_encode(&Sha256::digest(body)))),
            Self::Header(name) => header(name.as_str()),
            Self::Body(id) => id(body),
        }
        .filter(|id| !id.is_empty())
    }

    /// Whether `signature` covers this source.
    ///
    /// # Errors
    ///
    /// [`DeliveryIdError::Unsigned`] when it does not.
    fn signed_by(&self, signature: &Signature) -> Result<(), DeliveryIdError> {
        let header = match self {
            Self::Body(_) | Self::BodyDigest => return Ok(()),
            Self::StandardWebhooks => WEBHOOK_ID,
            Self::Header(name) => name.as_str(),
        };
        match signature {
            Signature::StandardWebhooks(_) if header == WEBHOOK_ID => Ok(()),
            _ => Err(DeliveryIdError::Unsigned {
                scheme: signature.scheme(),
                header: header.to_owned(),
            }),
        }
    }
}

impl std::fmt::Debug for DeliveryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::StandardWebhooks => f.write_str("StandardWebhooks"),
            Self::BodyDigest => f.write_str("BodyDigest"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Body(_) => f.write_str("Body(..)"),
        }
    }
}

/// How a delivery's signature is checked. Every variant holds one or more
/// secrets, any of which may have signed (while one is rotated out).
#[derive(Clone)]
enum Signature {
    /// HMAC-SHA256 over `id.timestamp.body`, base64, `v1,` prefix, with the
    /// base64-decoded secrets.
    StandardWebhooks(Vec<Vec<u8>>),
    /// HMAC-SHA256 over the body, hex, `sha256=` prefix.
    GitHub(Vec<u8>),
    /// HMAC-SHA256 over `t.body`, hex, `v1=` entries of `Stripe-Signature`,
    /// with the secrets' bytes as given (`whsec_...` included: Stripe does
    /// not decode them).
    Stripe(Vec<Vec<u8>>),
}

impl Signature {
    fn scheme(&self) -> &'static str {
        match self {
            Self::StandardWebhooks(_) => "Standard Webhooks",
            Self::GitHub(_) => "GitHub",
            Self::Stripe(_) => "Stripe",
        }
    }

    /// The key this scheme signs, the default [`DeliveryId`].
    fn default_id(&self) -> DeliveryId {
        match self {
            Self::StandardWebhooks(_) => DeliveryId::StandardWebhooks,
            Self::GitHub(_) => DeliveryId::BodyDigest,
            Self::Stripe(_) => DeliveryId::json_field("id"),
        }
    }
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
    /// The declared problem type and this refusal's detail.
    fn problem(self) -> Problem {
        match self {
            Self::IdMissing => types::WEBHOOK_ID_MISSING
                .problem("The delivery carries no id to deduplicate it by."),
            Self::TimestampInvalid => types::WEBHOOK_TIMESTAMP_INVALID.problem(
                "The delivery's signed timestamp (webhook-timestamp, or t= in Stripe-Signature) is missing or not a number of seconds.",
            ),
            Self::TimestampExpired => types::WEBHOOK_TIMESTAMP_EXPIRED.problem(
                "The delivery's timestamp is too far from now; it may be a replay attack.",
            ),
            Self::SignatureInvalid => types::WEBHOOK_SIGNATURE_INVALID.problem(
                "No signature on the delivery matches its content and the shared secret.",
            ),
            Self::BodyTooLarge => {
                types::BODY_TOO_LARGE.problem("The delivery's body is over the limit.")
            }
        }
    }
}

/// The refusal's problem+json response.
impl IntoResponse for WebhookRejection {
    fn into_response(self) -> Response<Body> {
        self.problem().into_response()
    }
}

/// The layer's settings. Each default says why it is the default.
#[derive(Clone)]
struct WebhookConfig {
    signature: Signature,
    /// The key the scheme signs (`webhook-id`, the body's digest, Stripe's
    /// event id): an unsigned one would let a copy run again.
    id: DeliveryId,
    /// 5 minutes, as the Standard Webhooks and Stripe libraries: a captured
    /// delivery cannot be replayed later, clocks may differ a little.
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
            .field("scheme", &self.config.signature.scheme())
            .field("id", &self.config.id)
            .field("tolerance", &self.config.tolerance)
            .finish_non_exhaustive()
    }
}

impl WebhookLayer {
    /// Verifies Standard Webhooks signatures with `secret` (`whsec_` and
    /// base64) and keys deliveries by the signed `webhook-id`.
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
        Ok(Self::with(Signature::StandardWebhooks(keys)))
    }

    /// Verifies GitHub's `X-Hub-Signature-256` (HMAC-SHA256 of the body)
    /// with `secret` and keys deliveries by `sha256:<hex>` of the raw body
    /// ([`DeliveryId::BodyDigest`]).
    ///
    /// GitHub signs neither `X-GitHub-Delivery` nor a time: the body is the
    /// only part of a delivery a copier cannot change, so a GitHub
    /// redelivery and a captured delivery resent under a fresh
    /// `X-GitHub-Delivery` both get the stored answer without running. No
    /// tolerance applies; the record's retention bounds how long a copy is
    /// recognised (see the module's warning).
    ///
    /// # Errors
    ///
    /// [`SecretError::Empty`] for an empty secret.
    pub fn github(secret: &[u8]) -> Result<Self, SecretError> {
        if secret.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self::with(Signature::GitHub(secret.to_vec())))
    }

    /// Verifies Stripe's `Stripe-Signature` (`t=<unix seconds>,v1=<hex>`,
    /// HMAC-SHA256 of `t`, `.` and the raw body) with any of `secrets` (the
    /// endpoint's `whsec_...` signing secrets, used as given; several while
    /// one is rolled), and keys deliveries by the event's `id` member,
    /// which the signature covers. Stripe's retries of an event carry the
    /// same id, so they replay.
    ///
    /// As Stripe's libraries: elements are split on `,` and each on the
    /// first `=`; `t` is the first timestamp, every `v1` entry is a
    /// candidate (Stripe sends one per active secret), other schemes
    /// (`v0`) are ignored; the signature is compared in constant time.
    /// Stricter than them: a timestamp more than the tolerance (default 5
    /// minutes, [`WebhookLayer::with_tolerance`]) in the future is refused
    /// too, not only one in the past.
    ///
    /// # Errors
    ///
    /// [`SecretError::Empty`] when no secret is given or one is empty.
    pub fn stripe(secrets: &[&str]) -> Result<Self, SecretError> {
        if secrets.is_empty() || secrets.iter().any(|secret| secret.is_empty()) {
            return Err(SecretError::Empty);
        }
        let keys = secrets
            .iter()
            .map(|secret| secret.as_bytes().to_vec())
            .collect();
        Ok(Self::with(Signature::Stripe(keys)))
    }

    fn with(signature: Signature) -> Self {
        Self {
            config: Arc::new(WebhookConfig {
                id: signature.default_id(),
                signature,
                tolerance: Duration::from_secs(300),
                body_limit: 1024 * 1024,
            }),
        }
    }

    /// Sets where the delivery's key comes from. It must be something the
    /// scheme signs: the body ([`DeliveryId::BodyDigest`],
    /// [`DeliveryId::json_field`], [`DeliveryId::Body`]) under any scheme,
    /// `webhook-id` under Standard Webhooks.
    ///
    /// The default value is the scheme's own signed key: `webhook-id`
    /// (Standard Webhooks), the body's digest (GitHub), the event's `id`
    /// member (Stripe).
    ///
    /// ```
    /// use http::HeaderName;
    /// use idempotency_consumer::webhook::{DeliveryId, DeliveryIdError, WebhookLayer};
    ///
    /// let layer = WebhookLayer::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    /// // The body is signed: a member of it may key deliveries.
    /// assert!(layer.clone().with_delivery_id(DeliveryId::json_field("order")).is_ok());
    /// // A header the sender does not sign may not.
    /// let unsigned = layer.with_delivery_id(DeliveryId::Header(HeaderName::from_static("x-request-id")));
    /// assert!(matches!(unsigned, Err(DeliveryIdError::Unsigned { .. })));
    ///
    /// // GitHub signs the body only: neither its delivery header nor `webhook-id`.
    /// let github = WebhookLayer::github(b"It's a Secret to Everybody").unwrap();
    /// let by_header = github.with_delivery_id(DeliveryId::Header(HeaderName::from_static("x-github-delivery")));
    /// assert!(matches!(by_header, Err(DeliveryIdError::Unsigned { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// [`DeliveryIdError::Unsigned`] for a header the scheme does not sign.
    pub fn with_delivery_id(mut self, id: DeliveryId) -> Result<Self, DeliveryIdError> {
        id.signed_by(&self.config.signature)?;
        Arc::make_mut(&mut self.config).id = id;
        Ok(self)
    }

    /// Sets how far a signed timestamp (Standard Webhooks'
    /// `webhook-timestamp`, Stripe's `t`) may be from now, either way.
    /// GitHub signs no time.
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

    /// Checks a delivery: its key, timestamp and signature. `Ok` with the
    /// key when it may go on.
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
        let matches = match &config.signature {
            Signature::StandardWebhooks(keys) => {
                // The signed id is always webhook-id, whatever keys the record.
                let signed_id = text(WEBHOOK_ID).ok_or(WebhookRejection::IdMissing)?;
                let timestamp: i64 = text(WEBHOOK_TIMESTAMP)
                    .and_then(|value| value.trim().parse().ok())
                    .ok_or(WebhookRejection::TimestampInvalid)?;
                self.within_tolerance(timestamp, now)?;
                let signatures =
                    text(WEBHOOK_SIGNATURE).ok_or(WebhookRejection::SignatureInvalid)?;
                let prefix = format!("{signed_id}.{timestamp}.");
                let candidates: Vec<Vec<u8>> = signatures
                    .split(' ')
                    .filter_map(|entry| entry.strip_prefix("v1,"))
                    .take(MAX_SIGNATURES)
                    .filter_map(|encoded| BASE64.decode(encoded).ok())
                    .collect();
                any_matches(keys, &[prefix.as_bytes(), body], &candidates)
            }
            Signature::GitHub(key) => {
                let candidate = text(GITHUB_SIGNATURE)
                    .and_then(|value| value.strip_prefix("sha256="))
                    .and_then(hex_decode)
                    .ok_or(WebhookRejection::SignatureInvalid)?;
                any_matches(std::slice::from_ref(key), &[body], &[candidate])
            }
            Signature::Stripe(keys) => {
                let header = text(STRIPE_SIGNATURE).ok_or(WebhookRejection::SignatureInvalid)?;
                let mut timestamp = None;
                let mut candidates = Vec::new();
                for element in header.split(',') {
                    let Some((prefix, value)) = element.trim().split_once('=') else {
                        continue;
                    };
                    match prefix {
                        "t" if timestamp.is_none() => timestamp = Some(value),
                        "v1" if candidates.len() < MAX_SIGNATURES => {
                            if let Some(candidate) = hex_decode(value) {
                                candidates.push(candidate);
                            }
                        }
                        _ => {}
                    }
                }
                let timestamp: i64 = timestamp
                    .filter(|digits| {
                        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|digits| digits.parse().ok())
                    .ok_or(WebhookRejection::TimestampInvalid)?;
                self.within_tolerance(timestamp, now)?;
                let prefix = format!("{timestamp}.");
                any_matches(keys, &[prefix.as_bytes(), body], &candidates)
            }
        };
        if matches {
            Ok(id)
        } else {
            Err(WebhookRejection::SignatureInvalid)
        }
    }

    /// `Ok` when `timestamp` (seconds since the epoch) is within the
    /// tolerance of `now`, before or after.
    fn within_tolerance(&self, timestamp: i64, now: SystemTime) -> Result<(), WebhookRejection> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let tolerance = i64::try_from(self.config.tolerance.as_secs()).unwrap_or(i64::MAX);
        if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
            return Err(WebhookRejection::TimestampExpired);
        }
        Ok(())
    }
}

/// Whether any candidate signature is the HMAC-SHA256 of `parts` under any
/// of `keys`. Each key's HMAC is computed once (a delivery listing many
/// signatures costs comparisons, not hashes of its body), and compared in
/// constant time.
fn any_matches(keys: &[Vec<u8>], parts: &[&[u8]], candidates: &[Vec<u8>]) -> bool {
    if candidates.is_empty() {
        return false;
    }
    keys.iter().filter_map(|key| mac(key, parts)).any(|mac| {
        let expected = mac.finalize().into_bytes();
        candidates
            .iter()
            .any(|candidate| bool::from(expected.as_slice().ct_eq(candidate)))
    })
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

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
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

/// Signs a GitHub delivery: the `X-Hub-Signature-256` value
/// (`sha256=<hex>`) of `body` with `secret`. For senders and tests.
///
/// # Errors
///
/// [`SecretError::Empty`] for an empty secret.
pub fn sign_github(secret: &[u8], body: &[u8]) -> Result<String, SecretError> {
    if secret.is_empty() {
        return Err(SecretError::Empty);
    }
    let mac = mac(secret, &[body]).ok_or(SecretError::Empty)?;
    Ok(format!(
        "sha256={}",
        hex_encode(&mac.finalize().into_bytes())
    ))
}

/// Signs a Stripe delivery: the `Stripe-Signature` value
/// (`t=<timestamp>,v1=<hex>`) of `body` at `timestamp` with `secret` (the
/// `whsec_...` string as given). For senders and tests.
///
/// # Errors
///
/// [`SecretError::Empty`] for an empty secret.
pub fn sign_stripe(secret: &str, timestamp: i64, body: &[u8]) -> Result<String, SecretError> {
    if secret.is_empty() {
        return Err(SecretError::Empty);
    }
    let prefix = format!("{timestamp}.");
    let mac = mac(secret.as_bytes(), &[prefix.as_bytes(), body]).ok_or(SecretError::Empty)?;
    Ok(format!(
        "t={timestamp},v1={}",
        hex_encode(&mac.finalize().into_bytes())
    ))
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
    fn github_signatures_verify_over_the_body_and_key_on_its_digest() {
        let layer = WebhookLayer::github(b"It's a Secret to Everybody").expect("secret");
        let mut headers = HeaderMap::new();
        headers.insert(
            GITHUB_DELIVERY,
            HeaderValue::from_static("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        );
        // GitHub's documented example.
        let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        headers.insert(GITHUB_SIGNATURE, HeaderValue::from_static(signature));
        assert_eq!(
            sign_github(b"It's a Secret to Everybody", b"Hello, World!").as_deref(),
            Ok(signature)
        );
        // sha256("Hello, World!"), as `sha256sum` prints it.
        let digest = "sha256:dffd6021bb2bd5b0af676290809ec3a53191dd81c7f70a4b28688a362182986f";
        assert_eq!(
            layer.verify(&headers, b"Hello, World!").as_deref(),
            Ok(digest)
        );
        // Another delivery id, or none: the same key (the header is not signed).
        headers.insert(GITHUB_DELIVERY, HeaderValue::from_static("another"));
        assert_eq!(
            layer.verify(&headers, b"Hello, World!").as_deref(),
            Ok(digest)
        );
        headers.remove(GITHUB_DELIVERY);
        assert_eq!(
            layer.verify(&headers, b"Hello, World!").as_deref(),
            Ok(digest)
        );
        assert_eq!(
            layer.verify(&headers, b"Hello, World?"),
            Err(WebhookRejection::SignatureInvalid)
        );
    }

    /// A vector computed outside this crate:
    /// `hmac.new(b"whsec_test_secret", b"1700000000." + body, sha256).hexdigest()`
    /// in Python (Stripe's own `_compute_signature`).
    #[test]
    fn a_stripe_signature_verifies_as_stripes_libraries_compute_it() {
        let body = br#"{"id":"evt_1","object":"event","type":"charge.succeeded"}"#;
        let expected = "ac1ab887a13a43f7e22e9eb21eab375b1f40446fa99ade9b6a94fca7f66acd38";
        assert_eq!(
            sign_stripe("whsec_test_secret", 1_700_000_000, body).as_deref(),
            Ok(format!("t=1700000000,v1={expected}").as_str())
        );
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let layer = WebhookLayer::stripe(&["whsec_test_secret"]).expect("secret");
        let verify = |header: &str, at: SystemTime| {
            let mut headers = HeaderMap::new();
            headers.insert(
                STRIPE_SIGNATURE,
                HeaderValue::from_str(header).expect("header"),
            );
            layer.verify_at(&headers, body, at)
        };
        assert_eq!(
            verify(&format!("t=1700000000,v1={expected}"), at).as_deref(),
            Ok("evt_1")
        );
        // Several v1 entries (one per active secret), a v0 and spaces: any v1 may match.
        let zeros = "0".repeat(64);
        assert_eq!(
            verify(
                &format!("t=1700000000, v1={zeros}, v0={zeros}, v1={expected}"),
                at
            )
            .as_deref(),
            Ok("evt_1")
        );
        // The timestamp is signed: another t with the same v1 fails.
        assert_eq!(
            verify(&format!("t=1700000001,v1={expected}"), at),
            Err(WebhookRejection::SignatureInvalid)
        );
        // Only v0, or no v1: no signature.
        assert_eq!(
            verify(&format!("t=1700000000,v0={expected}"), at),
            Err(WebhookRejection::SignatureInvalid)
        );
        for bad in [
            format!("v1={expected}"),
            format!("t=,v1={expected}"),
            format!("t=-5,v1={expected}"),
            format!("t=17e8,v1={expected}"),
        ] {
            assert_eq!(
                verify(&bad, at),
                Err(WebhookRejection::TimestampInvalid),
                "{bad}"
            );
        }
        // Past the tolerance, either way.
        let header = format!("t=1700000000,v1={expected}");
        assert_eq!(
            verify(&header, at + Duration::from_secs(301)),
            Err(WebhookRejection::TimestampExpired)
        );
        assert_eq!(
            verify(&header, at - Duration::from_secs(301)),
            Err(WebhookRejection::TimestampExpired)
        );
        assert_eq!(
            verify(&header, at + Duration::from_secs(300)).as_deref(),
            Ok("evt_1")
        );
    }

    #[test]
    fn a_key_the_scheme_does_not_sign_is_refused_at_construction() {
        let header = |name: &'static str| DeliveryId::Header(HeaderName::from_static(name));
        let standard = WebhookLayer::standard_webhooks(SECRET).expect("secret");
        let github = WebhookLayer::github(b"secret").expect("secret");
        let stripe = WebhookLayer::stripe(&["whsec_x"]).expect("secret");
        let refused = [
            (standard.clone(), header("x-request-id")),
            (github.clone(), header(GITHUB_DELIVERY)),
            (github.clone(), DeliveryId::StandardWebhooks),
            (stripe.clone(), header(STRIPE_SIGNATURE)),
            (stripe.clone(), DeliveryId::StandardWebhooks),
        ];
        for (layer, id) in refused {
            let described = format!("{layer:?} {id:?}");
            assert!(
                matches!(
                    layer.with_delivery_id(id),
                    Err(DeliveryIdError::Unsigned { .. })
                ),
                "{described}"
            );
        }
        let accepted = [
            (standard.clone(), header(WEBHOOK_ID)),
            (standard, DeliveryId::json_field("id")),
            (github.clone(), DeliveryId::BodyDigest),
            (github, DeliveryId::json_field("id")),
            (stripe, DeliveryId::BodyDigest),
        ];
        for (layer, id) in accepted {
            let described = format!("{layer:?} {id:?}");
            assert!(layer.with_delivery_id(id).is_ok(), "{described}");
        }
    }

    /// Many signature entries cost comparisons, not one HMAC of the body each.
    #[test]
    fn many_signature_entries_are_bounded() {
        let body = br#"{"test": 2432232314}"#;
        let junk = vec!["v1,AAAA"; 10_000].join(" ");
        let good = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        let layer = WebhookLayer::standard_webhooks(SECRET).expect("secret");
        let at = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
        // Past the bound, a good signature is not looked at: refused.
        let headers = delivery(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            &format!("{junk} {good}"),
        );
        assert_eq!(
            layer.verify_at(&headers, body, at),
            Err(WebhookRejection::SignatureInvalid)
        );
        let headers = delivery(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            &format!("v1,AAAA {good}"),
        );
        assert!(layer.verify_at(&headers, body, at).is_ok());
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
        assert_eq!(WebhookLayer::stripe(&[]).err(), Some(SecretError::Empty));
        assert_eq!(
            WebhookLayer::stripe(&["whsec_a", ""]).err(),
            Some(SecretError::Empty)
        );
    }
}

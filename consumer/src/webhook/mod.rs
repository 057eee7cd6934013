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
//! | body that breaks off before its end | 400 `body-unreadable` | nothing |
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
//!
//! # Files
//!
//! This file holds the verification contract every scheme keeps (the
//! refusals, the HMAC compared in constant time, the timestamp tolerance,
//! the bound on signatures compared); each scheme is one file
//! (`standard_webhooks.rs`, `github.rs`, `stripe.rs`: its headers, how it
//! verifies, how a sender signs); `delivery.rs` is what keys a delivery,
//! `layer.rs` the [`WebhookLayer`] and its settings, `service.rs` the
//! service that reads the body (under the guard's body limit) and hands the
//! key on.

mod delivery;
mod github;
mod layer;
mod service;
mod standard_webhooks;
mod stripe;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::IntoResponse;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, Response};
use idempotency_guard::problem::{Problem, types};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub use delivery::{DeliveryId, DeliveryIdError};
pub use github::{GITHUB_DELIVERY, GITHUB_SIGNATURE, sign_github};
pub use layer::WebhookLayer;
pub use service::{ResponseFuture, WebhookService};
pub use standard_webhooks::{
    WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP, sign_standard_webhook,
};
pub use stripe::{STRIPE_SIGNATURE, sign_stripe};

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

    /// Whether the delivery's signature matches (`Ok(false)`: none does).
    ///
    /// # Errors
    ///
    /// A refusal before any signature is compared: no signed id, a
    /// timestamp missing, malformed or outside `tolerance` of `now`.
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
        tolerance: Duration,
    ) -> Result<bool, WebhookRejection> {
        match self {
            Self::StandardWebhooks(keys) => {
                standard_webhooks::verify(keys, headers, body, now, tolerance)
            }
            Self::GitHub(key) => github::verify(std::slice::from_ref(key), headers, body),
            Self::Stripe(keys) => stripe::verify(keys, headers, body, now, tolerance),
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
    /// The body broke off before its end (the sender's connection failed).
    BodyUnreadable,
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
            Self::BodyUnreadable => {
                types::BODY_UNREADABLE.problem("The delivery's body broke off before its end.")
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

/// `Ok` when `timestamp` (seconds since the epoch) is within `tolerance`
/// of `now`, before or after.
fn within_tolerance(
    timestamp: i64,
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), WebhookRejection> {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
        return Err(WebhookRejection::TimestampExpired);
    }
    Ok(())
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

//! [`WebhookLayer`]: the scheme, what keys a delivery, the tolerance and
//! the body limit, and the check of one delivery.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::{
    DeliveryId, DeliveryIdError, SecretError, Signature, WebhookRejection, standard_webhooks,
};

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
        let keys = standard_webhooks::keys(secrets)?;
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

    /// [`WebhookLayer::verify`] at `now`.
    pub(super) fn verify_at(
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
        if config
            .signature
            .verify(headers, body, now, config.tolerance)?
        {
            Ok(id)
        } else {
            Err(WebhookRejection::SignatureInvalid)
        }
    }

    /// The largest body accepted, in bytes.
    pub(super) fn body_limit(&self) -> usize {
        self.config.body_limit
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderName;

    use super::*;
    use crate::webhook::{GITHUB_DELIVERY, STRIPE_SIGNATURE, WEBHOOK_ID};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

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

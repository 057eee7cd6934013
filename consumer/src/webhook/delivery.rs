//! What keys a delivery ([`DeliveryId`]): something its scheme signs.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use super::{Signature, WEBHOOK_ID, hex_encode};

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
///
/// [`WebhookLayer::with_delivery_id`]: super::WebhookLayer::with_delivery_id
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

    /// The delivery's key from `headers` and `body` (`None`: none, or empty).
    pub(super) fn of(&self, headers: &HeaderMap, body: &[u8]) -> Option<String> {
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
    pub(super) fn signed_by(&self, signature: &Signature) -> Result<(), DeliveryIdError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

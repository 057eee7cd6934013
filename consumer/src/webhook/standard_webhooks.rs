//! Standard Webhooks (<https://www.standardwebhooks.com>): HMAC-SHA256 over
//! `webhook-id.webhook-timestamp.body` with the base64-decoded `whsec_`
//! secret, sent base64 as `v1,` entries of `webhook-signature`, space
//! separated. It signs its id header, so `webhook-id` keys deliveries.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::Mac;
use http::HeaderMap;

use super::{MAX_SIGNATURES, SecretError, WebhookRejection, any_matches, mac, within_tolerance};

/// The Standard Webhooks id header.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The Standard Webhooks timestamp header (seconds since the epoch).
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The Standard Webhooks signature header (`v1,<base64>`, space separated).
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// The HMAC keys of `secrets` (each `whsec_` and base64; the prefix may be
/// left out).
///
/// # Errors
///
/// [`SecretError`] when a secret is not base64, decodes to nothing, or none
/// is given.
pub(super) fn keys(secrets: &[&str]) -> Result<Vec<Vec<u8>>, SecretError> {
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
    Ok(keys)
}

/// Whether a `v1,` entry of `webhook-signature` (the first
/// [`MAX_SIGNATURES`]) is the HMAC of the signed id, the timestamp and
/// `body` under any of `keys`.
///
/// # Errors
///
/// `webhook-id` missing, `webhook-timestamp` missing, malformed or outside
/// `tolerance` of `now`, no `webhook-signature`.
pub(super) fn verify(
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<bool, WebhookRejection> {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    // The signed id is always webhook-id, whatever keys the record.
    let signed_id = text(WEBHOOK_ID).ok_or(WebhookRejection::IdMissing)?;
    let timestamp: i64 = text(WEBHOOK_TIMESTAMP)
        .and_then(|value| value.trim().parse().ok())
        .ok_or(WebhookRejection::TimestampInvalid)?;
    within_tolerance(timestamp, now, tolerance)?;
    let signatures = text(WEBHOOK_SIGNATURE).ok_or(WebhookRejection::SignatureInvalid)?;
    let prefix = format!("{signed_id}.{timestamp}.");
    let candidates: Vec<Vec<u8>> = signatures
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .take(MAX_SIGNATURES)
        .filter_map(|encoded| BASE64.decode(encoded).ok())
        .collect();
    Ok(any_matches(keys, &[prefix.as_bytes(), body], &candidates))
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

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use http::HeaderValue;

    use super::*;
    use crate::webhook::WebhookLayer;

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
}

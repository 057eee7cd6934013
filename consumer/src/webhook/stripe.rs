//! Stripe: HMAC-SHA256 over `t.body` with the `whsec_...` secret as given
//! (Stripe does not decode it), sent hex as `v1=` entries of
//! `Stripe-Signature` (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`), one per
//! active secret. The event's `id` member keys deliveries.

use std::time::{Duration, SystemTime};

use hmac::Mac;
use http::HeaderMap;

use super::{
    MAX_SIGNATURES, SecretError, WebhookRejection, any_matches, hex_decode, hex_encode, mac,
    within_tolerance,
};

/// Stripe's signature header (`t=<unix seconds>,v1=<hex>[,v1=<hex>...]`).
pub const STRIPE_SIGNATURE: &str = "stripe-signature";

/// Whether a `v1=` entry of `Stripe-Signature` (the first
/// [`MAX_SIGNATURES`]) is the HMAC of `t`, `.` and `body` under any of
/// `keys`. As Stripe's libraries: elements are split on `,` and each on
/// the first `=`; `t` is the first timestamp; other schemes (`v0`) are
/// ignored.
///
/// # Errors
///
/// No `Stripe-Signature`; `t` missing, not digits, or outside `tolerance`
/// of `now`.
pub(super) fn verify(
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<bool, WebhookRejection> {
    let header = headers
        .get(STRIPE_SIGNATURE)
        .and_then(|value| value.to_str().ok())
        .ok_or(WebhookRejection::SignatureInvalid)?;
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
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|digits| digits.parse().ok())
        .ok_or(WebhookRejection::TimestampInvalid)?;
    within_tolerance(timestamp, now, tolerance)?;
    let prefix = format!("{timestamp}.");
    Ok(any_matches(keys, &[prefix.as_bytes(), body], &candidates))
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use http::HeaderValue;

    use super::*;
    use crate::webhook::WebhookLayer;

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
}

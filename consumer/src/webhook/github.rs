//! GitHub: HMAC-SHA256 over the body alone, sent hex as
//! `X-Hub-Signature-256: sha256=<hex>`. GitHub signs neither its delivery
//! header nor a time, so the body's digest keys deliveries and no
//! tolerance applies.

use hmac::Mac;
use http::HeaderMap;

use super::{SecretError, WebhookRejection, any_matches, hex_decode, hex_encode, mac};

/// GitHub's delivery id header (not signed: never a key).
pub const GITHUB_DELIVERY: &str = "x-github-delivery";
/// GitHub's signature header (`sha256=<hex>`).
pub const GITHUB_SIGNATURE: &str = "x-hub-signature-256";

/// Whether `X-Hub-Signature-256` is the HMAC of `body` under one of `keys`
/// (GitHub has one secret per hook).
///
/// # Errors
///
/// No `X-Hub-Signature-256`, or one that is not `sha256=` and hex.
pub(super) fn verify(
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<bool, WebhookRejection> {
    let candidate = headers
        .get(GITHUB_SIGNATURE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("sha256="))
        .and_then(hex_decode)
        .ok_or(WebhookRejection::SignatureInvalid)?;
    Ok(any_matches(keys, &[body], &[candidate]))
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

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::webhook::WebhookLayer;

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
}

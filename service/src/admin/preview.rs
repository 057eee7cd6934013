//! A stored response as an operator may see it: sealed ones show their
//! status only; credentials in headers and sensitive JSON members are
//! redacted, long digit runs masked, the body cut at 2048 characters.

use http::HeaderMap;
use idempotency_guard::StoredResponse;

use super::dto::{AdminBody, AdminHeader, AdminResponse};

/// The header the encryption at rest leaves in clear on a sealed response.
const SEALED: &str = "idempotency-sealed";

/// What replaces a redacted value.
const REDACTED: &str = "[redacted]";

/// The most characters of a body preview.
const PREVIEW_CHARS: usize = 2048;

fn sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || ["token", "secret", "key", "signature", "password", "session"]
        .iter()
        .any(|word| name.contains(word))
}

fn sensitive_member(name: &str) -> bool {
    let name: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "authorization",
        "card",
        "pan",
        "cvv",
        "cvc",
        "iban",
        "account",
        "ssn",
        "pin",
        "otp",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// Masks every run of 12 or more digits but its last four.
fn mask_digits(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 12 {
            let keep = run.len() - 4;
            out.extend(std::iter::repeat_n('•', keep));
            out.push_str(&run[keep..]);
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

fn redact_json(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(members) => {
            for (name, member) in members.iter_mut() {
                if sensitive_member(name) && !member.is_null() {
                    *member = Value::String(REDACTED.to_owned());
                } else {
                    redact_json(member);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::String(text) => *text = mask_digits(text),
        Value::Number(number) => {
            let text = number.to_string();
            if text.chars().filter(char::is_ascii_digit).count() >= 12 {
                *value = Value::String(mask_digits(&text));
            }
        }
        _ => {}
    }
}

/// Cuts `text` at [`PREVIEW_CHARS`] characters.
fn cut(text: String) -> (String, bool) {
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => (text[..end].to_owned(), true),
        None => (text, false),
    }
}

fn preview_body(headers: &HeaderMap, body: &[u8]) -> AdminBody {
    let bytes = Some(body.len() as u64);
    let is_json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) {
        redact_json(&mut value);
        let (preview, truncated) = cut(serde_json::to_string_pretty(&value).unwrap_or_default());
        return AdminBody {
            stored: true,
            bytes,
            preview: Some(preview),
            truncated,
            note: None,
        };
    }
    if is_json {
        return AdminBody {
            stored: true,
            bytes,
            preview: None,
            truncated: false,
            note: Some("declared JSON but does not parse: not shown".to_owned()),
        };
    }
    match std::str::from_utf8(body) {
        Ok(text) if !text.chars().any(|c| c.is_control() && !c.is_whitespace()) => {
            let (preview, truncated) = cut(mask_digits(text));
            AdminBody {
                stored: true,
                bytes,
                preview: Some(preview),
                truncated,
                note: None,
            }
        }
        _ => AdminBody {
            stored: true,
            bytes,
            preview: None,
            truncated: false,
            note: Some("not text: not shown".to_owned()),
        },
    }
}

/// The stored response as shown: sealed ones show their status only.
pub(crate) fn preview(response: &StoredResponse) -> AdminResponse {
    let status = response.status.as_u16();
    if response.headers.contains_key(SEALED) {
        return AdminResponse {
            status,
            sealed: true,
            headers: Vec::new(),
            body: AdminBody {
                stored: response.body.is_some(),
                bytes: None,
                preview: None,
                truncated: false,
                note: Some(
                    "sealed (encrypted at rest): the service holds no key, only the status is shown"
                        .to_owned(),
                ),
            },
        };
    }
    let headers = response
        .headers
        .iter()
        .map(|(name, value)| AdminHeader {
            name: name.as_str().to_owned(),
            value: if sensitive_header(name.as_str()) {
                REDACTED.to_owned()
            } else {
                value
                    .to_str()
                    .map_or_else(|_| "[binary]".to_owned(), mask_digits)
            },
        })
        .collect();
    let body = match &response.body {
        Some(body) => preview_body(&response.headers, body),
        None => AdminBody {
            stored: false,
            bytes: None,
            preview: None,
            truncated: false,
            note: Some(
                "past the stored-response limit: the first caller got it, replays answer response-not-stored"
                    .to_owned(),
            ),
        },
    };
    AdminResponse {
        status,
        sealed: false,
        headers,
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_digit_runs_keep_their_last_four() {
        assert_eq!(
            mask_digits("card 4111111111111111 ok"),
            "card ••••••••••••1111 ok"
        );
        assert_eq!(mask_digits("order 12345"), "order 12345");
    }

    #[test]
    fn sensitive_members_are_redacted_at_any_depth() {
        let mut value = serde_json::json!({
            "id": "pay_1",
            "card": {"number": "4111111111111111"},
            "customer": {"api_key": "sk_live_x", "note": "iban DE89370400440532013000"},
            "items": [{"password": "p"}],
            "amount": 1250
        });
        redact_json(&mut value);
        assert_eq!(value["card"], "[redacted]");
        assert_eq!(value["customer"]["api_key"], "[redacted]");
        assert_eq!(value["customer"]["note"], "iban DE••••••••••••••••3000");
        assert_eq!(value["items"][0]["password"], "[redacted]");
        assert_eq!(value["amount"], 1250);
        assert_eq!(value["id"], "pay_1");
    }

    #[test]
    fn sealed_responses_show_their_status_only() {
        let mut headers = HeaderMap::new();
        headers.insert(SEALED, http::HeaderValue::from_static("v1 k1"));
        let shown = preview(&StoredResponse {
            status: http::StatusCode::CREATED,
            headers,
            body: Some(bytes::Bytes::from_static(b"\x00\x01ciphertext")),
        });
        assert!(shown.sealed);
        assert_eq!(shown.status, 201);
        assert!(shown.headers.is_empty());
        assert!(shown.body.preview.is_none());
    }

    #[test]
    fn credentials_in_headers_are_redacted() {
        let mut headers = HeaderMap::new();
        headers.insert("set-cookie", http::HeaderValue::from_static("sid=abc"));
        headers.insert("x-api-key", http::HeaderValue::from_static("k"));
        headers.insert("location", http::HeaderValue::from_static("/payments/1"));
        let shown = preview(&StoredResponse {
            status: http::StatusCode::CREATED,
            headers,
            body: Some(bytes::Bytes::from_static(b"plain \x07 bell")),
        });
        let value = |name: &str| {
            shown
                .headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| h.value.clone())
        };
        assert_eq!(value("set-cookie").as_deref(), Some("[redacted]"));
        assert_eq!(value("x-api-key").as_deref(), Some("[redacted]"));
        assert_eq!(value("location").as_deref(), Some("/payments/1"));
        assert!(
            shown.body.preview.is_none(),
            "a control character: not text"
        );
    }
}

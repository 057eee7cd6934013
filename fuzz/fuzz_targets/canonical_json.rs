//! Any bytes as a JSON body: the canonical form never panics or overflows
//! the stack, is idempotent, and (when it exists) is JSON that means the
//! same as the input.
#![no_main]

use http::{HeaderMap, HeaderValue, Method};
use idempotency_guard::Fingerprint;
use idempotency_guard::fingerprint::canonical_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(canonical) = canonical_json(data) {
        assert_eq!(canonical_json(&canonical).as_deref(), Ok(canonical.as_slice()), "idempotent");
        if let (Ok(original), Ok(normal)) = (
            serde_json::from_slice::<serde_json::Value>(data),
            serde_json::from_slice::<serde_json::Value>(&canonical),
        ) {
            assert_eq!(original, normal, "the same value");
        }
    }
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let _ = Fingerprint::of_request(&Method::POST, "/p", &headers, data);
});

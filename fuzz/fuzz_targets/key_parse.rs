//! Any bytes as an `Idempotency-Key` value: parsing never panics, and every
//! key it accepts is 1 to 255 visible ASCII characters that survive quoting.
#![no_main]

use idempotency_guard::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse_bytes(data) {
        let text = key.as_str();
        assert!((1..=255).contains(&text.len()));
        assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        let quoted = format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
        assert_eq!(IdempotencyKey::parse_bytes(quoted.as_bytes()).as_ref(), Ok(&key));
        assert_eq!(IdempotencyKey::from_raw(text).as_ref(), Ok(&key));
    }
});

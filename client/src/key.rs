//! Idempotency keys: one per logical operation, sent with every attempt.

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The request header that numbers attempts: `0` is the first try, `1` the
/// first retry, and so on.
pub const RETRY_ATTEMPT: &str = "x-retry-attempt";

/// Makes a new idempotency key: a UUID v7, so keys are unique, sort by
/// creation time and keep the store's index compact.
///
/// ```
/// let key = idempotency_client::new_key();
/// assert_eq!(key.len(), 36);
/// assert_ne!(key, idempotency_client::new_key());
/// ```
pub fn new_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uuid_v7_and_valid_for_the_guard() {
        let key = new_key();
        let uuid = uuid::Uuid::parse_str(&key).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        // The guard accepts 1 to 255 visible ASCII characters.
        assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    }
}

//! Where a message's key and scope come from.

use std::sync::Arc;

/// A function that names a message's key from its payload.
pub type PayloadKey = Arc<dyn Fn(&[u8]) -> Option<String> + Send + Sync>;

/// A function that names a message's scope from its source (queue or
/// stream) and payload.
pub type ScopeFn = Arc<dyn Fn(&str, &[u8]) -> String + Send + Sync>;

/// Where a message's idempotency key comes from.
#[derive(Clone)]
#[non_exhaustive]
pub enum KeySource {
    /// The broker's message id: the AMQP `message-id` property on RabbitMQ,
    /// the `Nats-Msg-Id` header on NATS.
    MessageId,
    /// A header of the message.
    Header(String),
    /// A function of the payload (an order id in its JSON, say).
    Payload(PayloadKey),
}

impl KeySource {
    /// A key taken from the payload by `key`.
    pub fn payload(key: impl Fn(&[u8]) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::Payload(Arc::new(key))
    }

    /// A key taken from the top-level JSON member `field` of the payload (a
    /// string or a number).
    pub fn json_field(field: &'static str) -> Self {
        Self::payload(move |payload| {
            let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
            match value.get(field)? {
                serde_json::Value::String(text) => Some(text.clone()),
                serde_json::Value::Number(number) => Some(number.to_string()),
                _ => None,
            }
        })
    }
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MessageId => f.write_str("MessageId"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Payload(_) => f.write_str("Payload(..)"),
        }
    }
}

/// The scope of a message: its source's name unless a function says otherwise.
pub(crate) fn scope_of(scope: Option<&ScopeFn>, source: &str, payload: &[u8]) -> String {
    match scope {
        Some(scope) => scope(source, payload),
        None => source.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_field_is_a_key_when_it_is_a_string_or_a_number() {
        let KeySource::Payload(key) = KeySource::json_field("order_id") else {
            panic!("a payload key");
        };
        assert_eq!(key(br#"{"order_id":"o-1"}"#).as_deref(), Some("o-1"));
        assert_eq!(key(br#"{"order_id":42}"#).as_deref(), Some("42"));
        assert_eq!(key(br#"{"order_id":null}"#), None);
        assert_eq!(key(b"not json"), None);
    }
}

//! Where a guarded call's key comes from: the [`KeySource`]s, as the
//! configuration names them, and the search through them in order.

use http::HeaderMap;
use idempotency_guard::{IdempotencyKey, KeyError};

use crate::raw::{RawObject, member, string};

/// Where a guarded call's idempotency key may come from; the layer takes it
/// from the first source, in the configured order, that holds one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// The `Idempotency-Key` HTTP header (the A2A proposal, the Agentic
    /// Commerce Protocol).
    Header,
    /// A member of `params._meta` with this name (`idempotencyKey`, as
    /// MCP's SEP-3182 proposed).
    Meta(String),
    /// A tool argument with this name (`idempotency_key`, `requestKey`:
    /// what MCP servers use today). Only for `tools/call`.
    ToolArgument(String),
    /// A2A's `params.message.messageId`. Not for `tools/call`.
    MessageId,
}

impl KeySource {
    /// The sources in their default order: the header,
    /// `params._meta.idempotencyKey`, the tool arguments `idempotency_key`
    /// and `requestKey`, then A2A's `params.message.messageId`.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::Header,
            Self::Meta(String::from("idempotencyKey")),
            Self::ToolArgument(String::from("idempotency_key")),
            Self::ToolArgument(String::from("requestKey")),
            Self::MessageId,
        ]
    }
}

impl std::fmt::Display for KeySource {
    /// The source as [`KeySource::from_str`](std::str::FromStr) reads it:
    /// `header`, `meta:<name>`, `argument:<name>`, `message-id`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header => f.write_str("header"),
            Self::Meta(name) => write!(f, "meta:{name}"),
            Self::ToolArgument(name) => write!(f, "argument:{name}"),
            Self::MessageId => f.write_str("message-id"),
        }
    }
}

/// A key source's text is not one of `header`, `meta:<name>`,
/// `argument:<name>` or `message-id` (a name is 1 to 255 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key source {0:?}: expected header, meta:<name>, argument:<name> or message-id")]
pub struct KeySourceError(String);

impl std::str::FromStr for KeySource {
    type Err = KeySourceError;

    /// Reads a key source as configuration files write it (the gateway's
    /// `key_sources`): `header` (the `Idempotency-Key` header),
    /// `meta:<name>` (`params._meta.<name>`), `argument:<name>` (a tool
    /// argument), `message-id` (A2A's `params.message.messageId`).
    ///
    /// ```
    /// use idempotency_jsonrpc::KeySource;
    /// assert_eq!("meta:idempotencyKey".parse(), Ok(KeySource::Meta("idempotencyKey".into())));
    /// assert_eq!("argument:requestKey".parse(), Ok(KeySource::ToolArgument("requestKey".into())));
    /// assert!("cookie".parse::<KeySource>().is_err());
    /// ```
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let named = |name: &str| {
            (!name.is_empty() && name.len() <= 255)
                .then(|| name.to_owned())
                .ok_or_else(|| KeySourceError(text.to_owned()))
        };
        match text.split_once(':') {
            None if text == "header" => Ok(Self::Header),
            None if text == "message-id" => Ok(Self::MessageId),
            Some(("meta", name)) => named(name).map(Self::Meta),
            Some(("argument", name)) => named(name).map(Self::ToolArgument),
            _ => Err(KeySourceError(text.to_owned())),
        }
    }
}

/// The key and the source it came from.
pub(crate) struct Found {
    pub(crate) key: Result<IdempotencyKey, KeyError>,
    pub(crate) used: Option<KeySource>,
}

pub(crate) fn find_key(
    headers: &HeaderMap,
    params: &RawObject,
    is_tool: bool,
    sources: &[KeySource],
) -> Found {
    for source in sources {
        let raw = match source {
            KeySource::Header => match IdempotencyKey::from_headers(headers) {
                Err(KeyError::Missing) => continue,
                key => {
                    return Found {
                        key,
                        used: Some(source.clone()),
                    };
                }
            },
            KeySource::Meta(name) => member(params, "_meta", name),
            KeySource::ToolArgument(name) if is_tool => member(params, "arguments", name),
            KeySource::MessageId if !is_tool => member(params, "message", "messageId"),
            KeySource::ToolArgument(_) | KeySource::MessageId => None,
        };
        let Some(raw) = raw else { continue };
        // A key that is not a JSON string is as invalid as a malformed one.
        let key = string(&raw)
            .ok_or(KeyError::InvalidCharacter)
            .and_then(|text| IdempotencyKey::from_raw(&text));
        return Found {
            key,
            used: Some(source.clone()),
        };
    }
    Found {
        key: Err(KeyError::Missing),
        used: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_sources_read_back_what_they_write() {
        for source in KeySource::defaults() {
            assert_eq!(source.to_string().parse::<KeySource>(), Ok(source));
        }
        for bad in ["", "meta:", "argument", "Header", "query:k", "message-id:x"] {
            assert!(bad.parse::<KeySource>().is_err(), "{bad:?}");
        }
    }
}

//! Which answers of a guarded call are kept, as one pure rule ([`settle`]):
//! a `result` is stored, an `error` released, a tool's `isError: true`
//! released unless it marks itself final ([`FINAL_META`]). It answers with
//! the guard's engine's own [`Settle`] without payload.

use idempotency_guard::engine::Settle;

/// The `_meta` member a tool sets to `true` on an `isError: true` result to
/// have it stored (a decision, not a failure) instead of released.
pub const FINAL_META: &str = "io.idempotency/final";

/// The pure rule: a response with a `result` is kept unless it is a tool
/// result with `isError: true` whose `_meta` does not set [`FINAL_META`];
/// anything else (an `error`, neither member, not JSON) is released. Never
/// abandoned: an answer that came is known.
pub(crate) fn settle(response: &[u8]) -> Settle<(), ()> {
    #[derive(serde::Deserialize)]
    struct Response {
        result: Option<ToolResult>,
    }
    #[derive(serde::Deserialize)]
    struct ToolResult {
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
        #[serde(rename = "_meta", default)]
        meta: Option<serde_json::Map<String, serde_json::Value>>,
    }
    let Ok(Response {
        result: Some(result),
    }) = serde_json::from_slice::<Response>(response)
    else {
        return Settle::RELEASE;
    };
    let is_final = result
        .meta
        .as_ref()
        .and_then(|meta| meta.get(FINAL_META))
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    if result.is_error == Some(true) && !is_final {
        Settle::RELEASE
    } else {
        Settle::KEEP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_kept_truth_table() {
        let cases = [
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
                Settle::KEEP,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":false}}"#,
                Settle::KEEP,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true}}"#,
                Settle::RELEASE,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true,"_meta":{"io.idempotency/final":true}}}"#,
                Settle::KEEP,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#,
                Settle::RELEASE,
            ),
            ("not json", Settle::RELEASE),
            (r#"{"jsonrpc":"2.0","id":1}"#, Settle::RELEASE),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task"}}"#,
                Settle::KEEP,
            ),
        ];
        for (response, expected) in cases {
            assert_eq!(settle(response.as_bytes()), expected, "{response}");
        }
    }
}

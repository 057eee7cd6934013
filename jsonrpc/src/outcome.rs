//! Which answers of a guarded call are kept, as one pure rule ([`settle`]):
//! a `result` is stored, an `error` released, a tool's `isError: true`
//! released unless it marks itself final ([`FINAL_META`]), a result that
//! marks its outcome unknown ([`OUTCOME_UNKNOWN_META`], [`step_error_result`])
//! abandoned. It answers with the guard's engine's own [`Settle`] without
//! payload.

use idempotency_guard::engine::{Settle, StepError};

/// The `_meta` member a tool sets to `true` on an `isError: true` result to
/// have it stored (a decision, not a failure) instead of released.
pub const FINAL_META: &str = "io.idempotency/final";

/// The `_meta` member a tool sets to `true` on a result when it lost track
/// of its work (a step did not return): nothing is stored and the key is
/// left abandoned with the steps its run recorded; a retry gets
/// `outcome-unknown`, or resumes under `AbandonedPolicy::Resume`.
pub const OUTCOME_UNKNOWN_META: &str = "io.idempotency/outcome-unknown";

/// The tool result (MCP `CallToolResult`, as JSON) of a step that did not
/// return: `isError: true`, the error's text, and `_meta` marking the
/// outcome unknown ([`OUTCOME_UNKNOWN_META`]: the key is left abandoned
/// with its steps) and naming the adapter kit's problem for it
/// (`io.idempotency/problem`: `step-mismatch`, `outcome-unknown`,
/// `store-unavailable` or `handler-failed`, as
/// [`step_problem`](idempotency_guard::adapter::step_problem) says).
///
/// ```
/// use idempotency_guard::engine::StepError;
///
/// let result = idempotency_jsonrpc::step_error_result(&StepError::Unsupported("here"));
/// assert_eq!(result["isError"], true);
/// assert_eq!(result["_meta"]["io.idempotency/outcome-unknown"], true);
/// assert_eq!(result["_meta"]["io.idempotency/problem"], "handler-failed");
/// ```
pub fn step_error_result(error: &StepError) -> serde_json::Value {
    let problem = idempotency_guard::adapter::step_problem(error);
    tracing::error!(error = %error, "a step did not return; the key is left abandoned");
    serde_json::json!({
        "isError": true,
        "content": [{"type": "text", "text": error.to_string()}],
        "_meta": {OUTCOME_UNKNOWN_META: true, "io.idempotency/problem": problem.name},
    })
}

/// The pure rule: a tool result whose `_meta` sets [`OUTCOME_UNKNOWN_META`]
/// is abandoned; else a response with a `result` is kept unless it is a
/// tool result with `isError: true` whose `_meta` does not set
/// [`FINAL_META`]; anything else (an `error`, neither member, not JSON) is
/// released.
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
    let marked = |name: &str| {
        result
            .meta
            .as_ref()
            .and_then(|meta| meta.get(name))
            .and_then(serde_json::Value::as_bool)
            == Some(true)
    };
    if marked(OUTCOME_UNKNOWN_META) {
        return Settle::ABANDON;
    }
    let is_final = marked(FINAL_META);
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
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true,"_meta":{"io.idempotency/outcome-unknown":true}}}"#,
                Settle::ABANDON,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{"io.idempotency/outcome-unknown":true,"io.idempotency/final":true}}}"#,
                Settle::ABANDON,
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

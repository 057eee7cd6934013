//! [`Running`]: the guarded calls running now, by MCP session and JSON-RPC
//! id, so that an agent's `notifications/cancelled` for one of them is
//! answered here and not passed on to the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use http::HeaderMap;
use serde_json::value::RawValue;

/// The guarded calls running now, by MCP session (`Mcp-Session-Id`) and
/// JSON-RPC id.
///
/// MCP SDK clients send `notifications/cancelled` when they stop waiting
/// for a call (after their own timeout). A server that honours it stops
/// answering (rmcp drops the answer and lets the tool finish), and the key
/// would be abandoned: the agent's retry would get `outcome-unknown` for
/// the whole retention although the tool finished. So a cancellation of a
/// guarded call that still runs is answered `202 Accepted` here and not
/// passed on (MCP lets a receiver ignore a cancellation): the tool's result
/// is captured and stored, and the retry gets it (`request-in-flight`
/// while it runs, the replay after). Calls without a session (a stateless
/// server) are not tracked: their cancellation cannot reach the call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Running(Arc<Mutex<HashMap<(String, String), usize>>>);

/// The MCP session header.
const MCP_SESSION_ID: &str = "mcp-session-id";

/// The method of an MCP cancellation.
const CANCELLED: &str = "notifications/cancelled";

impl Running {
    /// Notes a guarded call with `id` in the request's session, until the
    /// answer is dropped.
    pub(crate) fn enter(&self, headers: &HeaderMap, id: &RawValue) -> Option<RunningCall> {
        let session = headers.get(MCP_SESSION_ID)?.to_str().ok()?.to_owned();
        let entry = (session, normal_id(id.get())?);
        let mut calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *calls.entry(entry.clone()).or_default() += 1;
        Some(RunningCall {
            running: self.clone(),
            entry,
        })
    }

    /// Whether `body` is a `notifications/cancelled` for a guarded call
    /// running in the request's session.
    pub(crate) fn holds_cancelled(&self, headers: &HeaderMap, body: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct Notification<'a> {
            #[serde(borrow)]
            method: std::borrow::Cow<'a, str>,
            params: Option<Params<'a>>,
            id: Option<serde::de::IgnoredAny>,
        }
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(rename = "requestId", borrow)]
            request_id: &'a RawValue,
        }
        if self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
        {
            return false;
        }
        let Some(session) = headers.get(MCP_SESSION_ID).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Ok(Notification {
            method,
            params: Some(params),
            id: None,
        }) = serde_json::from_slice::<Notification<'_>>(body)
        else {
            return false;
        };
        let Some(id) = normal_id(params.request_id.get()) else {
            return false;
        };
        method == CANCELLED
            && self
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&(session.to_owned(), id))
    }
}

/// An id in one written form (`1` and `1.0` stay apart, as JSON-RPC ids).
fn normal_id(id: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(id)
        .ok()
        .map(|value| value.to_string())
}

/// One guarded call in [`Running`]; leaves it when dropped.
#[derive(Debug)]
pub(crate) struct RunningCall {
    running: Running,
    entry: (String, String),
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        let mut calls = self
            .running
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = calls.get_mut(&self.entry) {
            *count -= 1;
            if *count == 0 {
                calls.remove(&self.entry);
            }
        }
    }
}

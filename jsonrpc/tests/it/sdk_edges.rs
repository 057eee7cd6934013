//! The error paths as the official MCP SDK clients (Python `mcp`,
//! TypeScript `@modelcontextprotocol/sdk`) meet them: every refusal
//! reaches the agent as a JSON-RPC error whose `error.data.type` it can
//! read (sent with HTTP 200); a call the agent cancelled after its own
//! timeout is finished and stored, so its retry gets the result; and a
//! guarded call's event stream carries no resumption ids, so an answer cut
//! after its first event is never resumed (the server cannot resume a
//! finished stream) but retried and replayed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use idempotency_guard::{Engine, Store};
use idempotency_jsonrpc::JsonRpcLayer;
use idempotency_tests::mcp_sdk;
use serde_json::{Value, json};

use crate::email::{Form, Outbox, layer, router_with};
use crate::tool_calls::serve;

/// An official SDK client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sdk {
    Python,
    TypeScript,
}

impl Sdk {
    /// The scope the client's bearer names (see `email::layer`).
    fn scope(self) -> &'static str {
        match self {
            Self::Python => "python-sdk",
            Self::TypeScript => "typescript-sdk",
        }
    }
}

/// What the server saw, from outside the layer.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// `notifications/cancelled` posted.
    pub(crate) cancellations: AtomicU64,
    /// Answers to a guarded call (`send_email`) sent as an event stream.
    pub(crate) guarded_streams: AtomicU64,
    /// Of those, the ones with an `id:` or `retry:` field.
    pub(crate) resumable_streams: AtomicU64,
    /// `GET`s with `Last-Event-ID` (a client resuming a stream).
    pub(crate) resumptions: AtomicU64,
}

/// The middleware that fills a [`Watch`].
async fn watch(State(watch): State<Arc<Watch>>, request: Request, next: Next) -> Response {
    if request.headers().contains_key("last-event-id") {
        watch.resumptions.fetch_add(1, Ordering::SeqCst);
    }
    if request.method() != http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 64 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).into_owned();
    if text.contains("notifications/cancelled") {
        watch.cancellations.fetch_add(1, Ordering::SeqCst);
    }
    let guarded = text.contains("tools/call") && text.contains("send_email");
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let sse = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !(guarded && sse) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, 64 * 1024 * 1024)
        .await
        .unwrap_or_default();
    watch.guarded_streams.fetch_add(1, Ordering::SeqCst);
    let resumable = String::from_utf8_lossy(&body)
        .split(['\n', '\r'])
        .any(|line| line.starts_with("id:") || line.starts_with("retry:"));
    if resumable {
        watch.resumable_streams.fetch_add(1, Ordering::SeqCst);
    }
    Response::from_parts(parts, Body::from(body))
}

/// The example's MCP server behind `layer`, watched from outside.
pub(crate) async fn watched_server<S: Store>(
    layer: JsonRpcLayer<S>,
    outbox: Arc<Outbox>,
    form: Form,
) -> (SocketAddr, Arc<Watch>) {
    let seen = Arc::new(Watch::default());
    let app: Router = router_with(layer, outbox, form).layer(axum::middleware::from_fn_with_state(
        Arc::clone(&seen),
        watch,
    ));
    (serve(app).await, seen)
}

/// Runs `python_call.py` or `typescript_call.mjs`: one session, `send_email`
/// with `arguments`, retried on the session up to `retries` times while it
/// fails; one JSON line per attempt.
async fn call(
    sdk: Sdk,
    address: SocketAddr,
    arguments: &Value,
    timeout: f64,
    retries: u32,
) -> Vec<Value> {
    let (program, script) = match sdk {
        Sdk::Python => (mcp_sdk::python(), "python_call.py"),
        Sdk::TypeScript => {
            mcp_sdk::typescript();
            (PathBuf::from("node"), "typescript_call.mjs")
        }
    };
    let output = tokio::process::Command::new(program)
        .arg(mcp_sdk::dir().join(script))
        .arg(format!("http://{address}/mcp"))
        .arg(arguments.to_string())
        .arg(timeout.to_string())
        .arg(retries.to_string())
        .current_dir(mcp_sdk::dir())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .unwrap_or_else(|_| panic!("the {sdk:?} client did not finish in 120 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {sdk:?} client failed: {}\n{stdout}\n{stderr}",
        output.status
    );
    stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|_| panic!("not a JSON line: {line}\n{stderr}"))
        })
        .collect()
}

/// `send_email`'s arguments with `key` (none when `None`).
fn email(to: &str, key: Option<&str>) -> Value {
    let mut arguments = json!({"to": to, "subject": "hi", "body": "hello"});
    if let Some(key) = key {
        arguments["idempotency_key"] = key.into();
    }
    arguments
}

/// Posts `send_email` as the SDK's principal would, without an SDK (the
/// first call of a pair), to a stateless server.
async fn raw_call(sdk: Sdk, address: SocketAddr, arguments: &Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "send_email", "arguments": arguments}});
    let response = reqwest::Client::new()
        .post(format!("http://{address}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {}", sdk.scope()))
        .header("mcp-protocol-version", "2025-06-18")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The one line a refused call printed: its error, checked against the
/// problem `name` and `code`; returns `error.data`.
fn refused(lines: &[Value], sdk: Sdk, name: &str, code: i64) -> Value {
    assert_eq!(lines.len(), 1, "{sdk:?}: {lines:?}");
    let error = &lines[0]["error"];
    assert_eq!(
        error["data"]["type"],
        format!("urn:idempotency:{name}"),
        "{sdk:?} reads the refusal's type: {lines:?}"
    );
    assert_eq!(error["code"], code, "{sdk:?}: {lines:?}");
    error["data"].clone()
}

async fn in_flight(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::held());
    let (address, _) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Json,
    )
    .await;
    let arguments = email("a@example.com", Some("in-flight-1"));
    let first = tokio::spawn({
        let arguments = arguments.clone();
        async move { raw_call(sdk, address, &arguments).await }
    });
    while outbox.started() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = call(sdk, address, &arguments, 10.0, 0).await;
    outbox.release();
    let data = refused(&lines, sdk, "request-in-flight", -32090);
    assert!(data["retry_after"].as_u64().unwrap() >= 1, "{data}");
    let first = first.await.unwrap();
    assert!(first["result"].is_object(), "{first}");
    assert_eq!(outbox.count(), 1);
}

async fn key_reused(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::default());
    let (address, _) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Json,
    )
    .await;
    raw_call(sdk, address, &email("a@example.com", Some("reused-1"))).await;
    let lines = call(
        sdk,
        address,
        &email("b@example.com", Some("reused-1")),
        10.0,
        0,
    )
    .await;
    let data = refused(&lines, sdk, "key-reused", -32091);
    assert_eq!(data["key"], "reused-1");
    assert_eq!(outbox.count(), 1, "the second email was not sent");
}

async fn store_unavailable(sdk: Sdk) {
    let db = idempotency_tests::postgres().await;
    let outbox = Arc::new(Outbox::default());
    let (address, _) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Json,
    )
    .await;
    db.break_store().await;
    let lines = call(
        sdk,
        address,
        &email("a@example.com", Some("down-1")),
        10.0,
        0,
    )
    .await;
    let data = refused(&lines, sdk, "store-unavailable", -32093);
    assert!(data["retry_after"].as_u64().unwrap() >= 1, "{data}");
    assert_eq!(outbox.count(), 0, "fail closed");
}

async fn body_too_large(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::default());
    let layer = layer(Engine::new(db.store.clone())).with_body_limit(16 * 1024);
    let (address, _) = watched_server(layer, Arc::clone(&outbox), Form::Json).await;
    let mut arguments = email("a@example.com", Some("large-1"));
    arguments["body"] = "x".repeat(20 * 1024).into();
    let lines = call(sdk, address, &arguments, 10.0, 0).await;
    let data = refused(&lines, sdk, "body-too-large", -32600);
    assert_eq!(data["limit"], 16 * 1024);
    assert_eq!(outbox.count(), 0);
}

async fn key_missing(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::default());
    let (address, _) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Json,
    )
    .await;
    let lines = call(sdk, address, &email("a@example.com", None), 10.0, 0).await;
    refused(&lines, sdk, "key-missing", -32094);
    assert_eq!(outbox.count(), 0);
}

async fn key_invalid(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::default());
    let (address, _) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Json,
    )
    .await;
    let lines = call(
        sdk,
        address,
        &email("a@example.com", Some("not a key")),
        10.0,
        0,
    )
    .await;
    refused(&lines, sdk, "key-invalid", -32095);
    assert_eq!(outbox.count(), 0);
}

async fn outcome_unknown(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::default());
    // Every answer is over the stored-response limit: the first call's
    // answer reaches it, its key is abandoned.
    let layer = layer(Engine::new(db.store.clone())).with_stored_response_limit(16);
    let (address, _) = watched_server(layer, Arc::clone(&outbox), Form::Json).await;
    let arguments = email("a@example.com", Some("unknown-1"));
    let first = raw_call(sdk, address, &arguments).await;
    assert!(first["result"].is_object(), "{first}");
    let lines = call(sdk, address, &arguments, 10.0, 0).await;
    let data = refused(&lines, sdk, "outcome-unknown", -32092);
    assert_eq!(data["key"], "unknown-1");
    assert_eq!(outbox.count(), 1, "never run again blindly");
}

/// The agent stops waiting (its timeout, 0.5 s) for an email that takes
/// 2 s and cancels it; the SDK's `notifications/cancelled` is not passed
/// to the server, the email is finished and stored, and the agent's retry
/// on the same session gets it (after `request-in-flight` while it runs).
async fn cancelled_then_retried(sdk: Sdk) {
    let db = idempotency_tests::sqlite().await;
    let outbox = Arc::new(Outbox::slow(Duration::from_secs(2)));
    let (address, seen) = watched_server(
        layer(Engine::new(db.store.clone())),
        Arc::clone(&outbox),
        Form::Sessions,
    )
    .await;
    let lines = call(
        sdk,
        address,
        &email("a@example.com", Some("cancel-1")),
        0.5,
        40,
    )
    .await;
    let last = lines.last().unwrap();
    assert!(lines.len() >= 2, "the first attempt timed out: {lines:?}");
    assert!(
        lines[0].get("error").is_some() || lines[0].get("failure").is_some(),
        "{lines:?}"
    );
    assert!(
        last["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sent email #1 "),
        "the retry got the email's result: {lines:?}"
    );
    assert_eq!(last["replayed"], true, "{lines:?}");
    for line in &lines[1..lines.len() - 1] {
        let kind = &line["error"]["data"]["type"];
        assert!(
            kind == "urn:idempotency:request-in-flight" || line["error"]["code"] == -32001,
            "a retry while it runs is told to wait (or times out itself): {lines:?}"
        );
    }
    assert!(
        seen.cancellations.load(Ordering::SeqCst) >= 1,
        "the SDK cancelled the call"
    );
    assert_eq!(outbox.count(), 1);
}

macro_rules! per_sdk {
    ($($name:ident: $check:ident,)*) => {
        mod python {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $check(Sdk::Python).await;
                }
            )*
        }
        mod typescript {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $check(Sdk::TypeScript).await;
                }
            )*
        }
    };
}

per_sdk! {
    reads_request_in_flight: in_flight,
    reads_key_reused: key_reused,
    reads_store_unavailable: store_unavailable,
    reads_body_too_large: body_too_large,
    reads_key_missing: key_missing,
    reads_key_invalid: key_invalid,
    reads_outcome_unknown: outcome_unknown,
    gets_the_result_of_a_call_it_cancelled: cancelled_then_retried,
}

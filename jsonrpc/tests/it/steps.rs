//! Steps and resume through the JSON-RPC layer: an MCP tool (`rmcp`)
//! and an A2A endpoint (axum) read the run's handle from their HTTP
//! request's extensions, record a step, lose track on their first run (the
//! key is left abandoned with the step), and the agent's retry with the
//! same key resumes the call (the step is not run again) under
//! `AbandonedPolicy::Resume`, or is refused `outcome-unknown` without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idempotency_guard::engine::Run;
use idempotency_guard::{AbandonedPolicy, Engine, OutcomeUnknown, Store};
use idempotency_jsonrpc::JsonRpcLayer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, schemars, tool, tool_handler, tool_router};
use serde_json::{Value, json};

use crate::tool_calls::serve;

/// Runs of the tool (or endpoint), and runs of its `charge` step.
#[derive(Debug, Default)]
struct Counts {
    runs: AtomicU64,
    charges: AtomicU64,
}

/// The arguments of `charge`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Charge {
    /// The amount.
    amount: u64,
    /// The guard reads it; the tool does not.
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// An MCP server whose `charge` tool records the step `charge`.
#[derive(Debug, Clone)]
struct ChargeServer {
    counts: Arc<Counts>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl ChargeServer {
    fn new(counts: Arc<Counts>) -> Self {
        Self {
            counts,
            tool_router: Self::tool_router(),
        }
    }

    /// Records the step `charge` through the run's handle; on its first run
    /// it then loses track (a result marked outcome unknown, not an error).
    #[tool(description = "Charge a card. Pass idempotency_key and reuse it on retries.")]
    async fn charge(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(charge): Parameters<Charge>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let _ = charge.idempotency_key;
        let run = parts
            .extensions
            .get::<Run>()
            .cloned()
            .ok_or_else(|| rmcp::ErrorData::internal_error("no run", None))?;
        let executions = self.counts.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let counts = Arc::clone(&self.counts);
        let result = match run
            .step("charge", || async move {
                counts.charges.fetch_add(1, Ordering::SeqCst) + 1
            })
            .await
        {
            // A result the layer would store: the marker abandons it.
            Ok(charge_run) if executions == 1 => json!({
                "content": [{"type": "text", "text": format!("lost track of charge {charge_run}")}],
                "_meta": {idempotency_jsonrpc::OUTCOME_UNKNOWN_META: true},
            }),
            Ok(charge_run) => json!({
                "content": [{"type": "text", "text": format!(
                    "charged {} (charge run {charge_run}, tool run {executions})", charge.amount
                )}],
            }),
            Err(error) => idempotency_jsonrpc::step_error_result(&error),
        };
        Ok(serde_json::from_value(result).unwrap())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ChargeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// The MCP server (stateless, JSON answers) behind the layer over `engine`.
async fn mcp_server<S: Store>(engine: Engine<S>) -> (SocketAddr, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let server_counts = Arc::clone(&counts);
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    let mcp = StreamableHttpService::new(
        move || Ok(ChargeServer::new(Arc::clone(&server_counts))),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = Router::new()
        .route_service("/mcp", mcp)
        .route_layer(JsonRpcLayer::new(engine).with_tool("charge"));
    (serve(app).await, counts)
}

/// Posts one JSON-RPC message; the answer's `idempotent-replayed` and body.
async fn post_rpc(address: SocketAddr, body: &Value) -> (bool, Value) {
    let response = reqwest::Client::new()
        .post(format!("http://{address}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "JSON-RPC answers are HTTP 200");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (replayed, response.json().await.unwrap())
}

fn charge(id: u32, key: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "charge", "arguments": {"amount": 700, "idempotency_key": key}},
    })
}

fn text_of(message: &Value) -> &str {
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {message}"))
}

async fn an_abandoned_tool_call_resumes_with_its_recorded_step<S: Store>(store: S) {
    let engine = Engine::new(store).with_abandoned(AbandonedPolicy::Resume);
    let (address, counts) = mcp_server(engine).await;
    let key = format!("charge-{}", uuid::Uuid::new_v4());
    let (_, lost) = post_rpc(address, &charge(1, &key)).await;
    assert_eq!(text_of(&lost), "lost track of charge 1", "{lost}");
    assert_eq!(counts.charges.load(Ordering::SeqCst), 1);

    let (replayed, resumed) = post_rpc(address, &charge(2, &key)).await;
    assert!(!replayed, "resumed, not replayed");
    assert_eq!(resumed["id"], 2);
    assert_eq!(text_of(&resumed), "charged 700 (charge run 1, tool run 2)");
    assert_eq!(
        counts.charges.load(Ordering::SeqCst),
        1,
        "the recorded step did not run again"
    );

    let (replayed, again) = post_rpc(address, &charge(3, &key)).await;
    assert!(replayed, "the resumed answer is stored");
    assert_eq!(text_of(&again), text_of(&resumed));
    assert_eq!(counts.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_tool_call_resumes_with_its_recorded_step_on_postgres() {
    let db = idempotency_tests::postgres().await;
    an_abandoned_tool_call_resumes_with_its_recorded_step(db.store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_tool_call_resumes_with_its_recorded_step_on_redis() {
    let db = idempotency_tests::redis().await;
    an_abandoned_tool_call_resumes_with_its_recorded_step(db.store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resume_the_retry_of_an_abandoned_tool_call_is_refused() {
    let db = idempotency_tests::sqlite().await;
    let (address, counts) = mcp_server(Engine::new(db.store.clone())).await;
    let key = format!("charge-{}", uuid::Uuid::new_v4());
    let (_, lost) = post_rpc(address, &charge(1, &key)).await;
    assert_eq!(text_of(&lost), "lost track of charge 1", "{lost}");
    let (_, refused) = post_rpc(address, &charge(2, &key)).await;
    assert_eq!(
        refused["error"]["data"]["type"], "urn:idempotency:outcome-unknown",
        "{refused}"
    );
    assert_eq!(
        counts.runs.load(Ordering::SeqCst),
        1,
        "the tool did not run again"
    );
    assert_eq!(counts.charges.load(Ordering::SeqCst), 1);
}

/// An A2A `message/send` endpoint (axum) that extracts `run: Run`, records
/// the step `book`, and on its first run answers marked
/// [`OutcomeUnknown`] (it lost track).
async fn a2a_server<S: Store>(engine: Engine<S>) -> (SocketAddr, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let endpoint_counts = Arc::clone(&counts);
    let endpoint = post(move |run: Run, axum::Json(request): axum::Json<Value>| {
        let counts = Arc::clone(&endpoint_counts);
        async move {
            let executions = counts.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let step_counts = Arc::clone(&counts);
            let booked = match run
                .step("book", || async move {
                    step_counts.charges.fetch_add(1, Ordering::SeqCst) + 1
                })
                .await
            {
                Ok(booked) => booked,
                Err(error) => return error.into_response(),
            };
            if executions == 1 {
                return (OutcomeUnknown, http::StatusCode::BAD_GATEWAY).into_response();
            }
            let task = json!({"kind": "task", "id": format!("task-{booked}-{executions}"),
                    "status": {"state": "completed"}});
            let answer: Response =
                axum::Json(json!({"jsonrpc": "2.0", "id": request["id"], "result": task}))
                    .into_response();
            answer
        }
    });
    let app = Router::new()
        .route("/mcp", endpoint)
        .route_layer(JsonRpcLayer::new(engine).with_a2a_message_send());
    (serve(app).await, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_a2a_message_resumes_with_its_recorded_step() {
    let db = idempotency_tests::sqlite().await;
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let (address, counts) = a2a_server(engine).await;
    let message_id = format!("msg-{}", uuid::Uuid::new_v4());
    let send = |id: u32| {
        json!({
            "jsonrpc": "2.0", "id": id, "method": "message/send",
            "params": {"message": {
                "role": "user", "messageId": message_id, "kind": "message",
                "parts": [{"kind": "text", "text": "book the flight"}],
            }},
        })
    };
    let (_, lost) = post_rpc(address, &send(1)).await;
    assert_eq!(
        lost["error"]["data"]["type"], "urn:idempotency:outcome-unknown",
        "{lost}"
    );
    let (replayed, resumed) = post_rpc(address, &send(2)).await;
    assert!(!replayed);
    assert_eq!(resumed["result"]["id"], "task-1-2", "{resumed}");
    assert_eq!(counts.charges.load(Ordering::SeqCst), 1, "booked once");
    let (replayed, again) = post_rpc(address, &send(3)).await;
    assert!(replayed);
    assert_eq!(again["result"]["id"], "task-1-2");
}

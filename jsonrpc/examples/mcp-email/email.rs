//! An MCP server on the official Rust SDK (`rmcp`) with a write tool,
//! `send_email`, that counts what it sent, and a read-only tool,
//! `sent_emails`; and the router that puts [`JsonRpcLayer`] in front of it.
//! Shared by the example (`main.rs`) and the crate's tests.

// Each of the two uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use idempotency_guard::{Engine, Store};
use idempotency_jsonrpc::JsonRpcLayer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, schemars, tool, tool_handler, tool_router};

/// The emails sent so far: a count, and one line per email.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    sent: AtomicU64,
    lines: std::sync::Mutex<Vec<String>>,
    /// How long sending takes, in milliseconds, past the first 20.
    extra_ms: AtomicU64,
    /// Emails begun (sent or still being sent).
    started: AtomicU64,
    /// When set, emails wait until it is closed ([`Outbox::release`]).
    gate: Option<tokio::sync::Semaphore>,
}

impl Outbox {
    /// An outbox whose emails take `time` more to send (a slow mail
    /// server: calls that outlast their client's timeout).
    pub(crate) fn slow(time: std::time::Duration) -> Self {
        let outbox = Self::default();
        let ms = u64::try_from(time.as_millis()).unwrap_or(u64::MAX);
        outbox.extra_ms.store(ms, Ordering::SeqCst);
        outbox
    }

    /// How many emails were sent.
    pub(crate) fn count(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// An outbox whose emails wait, once begun, until [`Outbox::release`].
    pub(crate) fn held() -> Self {
        Self {
            gate: Some(tokio::sync::Semaphore::new(0)),
            ..Self::default()
        }
    }

    /// Lets the emails of a [`Outbox::held`] outbox go.
    pub(crate) fn release(&self) {
        if let Some(gate) = &self.gate {
            gate.close();
        }
    }

    /// How many emails were begun (sent, or being sent now).
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Every email sent, as `to|subject`.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .map(|lines| lines.clone())
            .unwrap_or_default()
    }
}

/// The arguments of `send_email`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct SendEmail {
    /// The recipient.
    pub(crate) to: String,
    /// The subject line.
    pub(crate) subject: String,
    /// The text.
    #[serde(default)]
    pub(crate) body: String,
    /// Reuse it on every retry of this email (the guard reads it, the
    /// tool does not).
    #[serde(default)]
    pub(crate) idempotency_key: Option<String>,
}

/// The MCP server: its tools write to a shared [`Outbox`].
#[derive(Debug, Clone)]
pub(crate) struct EmailServer {
    outbox: Arc<Outbox>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl EmailServer {
    /// A server writing to `outbox`.
    pub(crate) fn new(outbox: Arc<Outbox>) -> Self {
        Self {
            outbox,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Send an email. Pass idempotency_key and reuse it on retries.")]
    async fn send_email(&self, Parameters(email): Parameters<SendEmail>) -> String {
        // A little work, so that concurrent retries overlap the first call.
        self.outbox.started.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.outbox.gate {
            // Closed on release: the wait ends then.
            let _closed = gate.acquire().await;
        }
        let extra = self.outbox.extra_ms.load(Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(20 + extra)).await;
        let n = self.outbox.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if let Ok(mut lines) = self.outbox.lines.lock() {
            lines.push(format!("{}|{}", email.to, email.subject));
        }
        format!("sent email #{n} to {} ({})", email.to, email.subject)
    }

    #[tool(description = "How many emails were sent (read-only).")]
    async fn sent_emails(&self) -> String {
        self.outbox.count().to_string()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EmailServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("Sends emails, once per idempotency key.")
    }
}

/// How the MCP server answers tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Stateless, `application/json` answers.
    Json,
    /// Stateless, `text/event-stream` answers.
    EventStream,
    /// With sessions (`Mcp-Session-Id`), event-stream answers: what the
    /// MCP SDK clients of protocol versions before 2026-07-28 use.
    Sessions,
}

/// The MCP endpoint at `/mcp`, `send_email` guarded by the layer,
/// `sent_emails` passing through.
pub(crate) fn router<S: Store>(engine: Engine<S>, outbox: Arc<Outbox>, form: Form) -> Router {
    router_with(layer(engine), outbox, form)
}

/// The layer of [`router`]: `send_email` guarded, the scope from the bearer.
pub(crate) fn layer<S: Store>(engine: Engine<S>) -> JsonRpcLayer<S> {
    JsonRpcLayer::new(engine)
        .with_tool("send_email")
        .with_scope(|parts| {
            // The principal an authentication layer established; here the
            // bearer token itself stands in for it (never the MCP session).
            parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .unwrap_or("anonymous")
                .to_owned()
        })
}

/// The MCP endpoint at `/mcp` behind `layer`.
pub(crate) fn router_with<S: Store>(
    layer: JsonRpcLayer<S>,
    outbox: Arc<Outbox>,
    form: Form,
) -> Router {
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_legacy_session_mode(form == Form::Sessions)
        .with_json_response(form == Form::Json)
        .with_sse_keep_alive(None);
    let mcp = StreamableHttpService::new(
        move || Ok(EmailServer::new(Arc::clone(&outbox))),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new().route_service("/mcp", mcp).route_layer(layer)
}

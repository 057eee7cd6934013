//! A complete MCP server whose `send_email` runs once per idempotency key:
//! the official Rust SDK (`rmcp`), `JsonRpcLayer` in front of it, a store
//! chosen by `DATABASE_URL` (PostgreSQL or SQLite), the guard's bounded
//! server, and the drain on shutdown. `jsonrpc/README.md` shows this file
//! whole (a test checks that they are the same).

use std::time::Duration;

use axum::Router;
use idempotency_guard::server::{BodyTimeoutLayer, Server};
use idempotency_guard::{Engine, purge_periodically, store::AnyStore};
use idempotency_jsonrpc::JsonRpcLayer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, schemars, tool, tool_handler, tool_router};

/// The arguments of `send_email`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Email {
    to: String,
    subject: String,
    /// Read by the guard (reuse it on every retry), not by the tool; in
    /// the schema so that agents send it.
    #[serde(default)]
    #[expect(dead_code, reason = "the guard reads it, the tool does not")]
    idempotency_key: Option<String>,
}

/// The MCP server and its one write tool.
#[derive(Debug, Clone)]
struct Mailer {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Mailer {
    #[tool(description = "Send an email. Pass idempotency_key and reuse it on retries.")]
    async fn send_email(&self, Parameters(email): Parameters<Email>) -> String {
        format!("sent to {} ({})", email.to, email.subject)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Mailer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // postgres://… or sqlite://…; each needs its store feature.
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| String::from("sqlite://mcp.db?mode=rwc"));
    let store = AnyStore::connect(&url).await?;
    store.migrate().await?;
    // Records past their retention (24 h) are deleted only by this (or by a
    // key-status service on the same store).
    tokio::spawn(purge_periodically(
        store.clone(),
        Duration::from_secs(60),
        1000,
    ));
    let engine = Engine::new(store);
    // On shutdown: let the calls whose clients already left finish and
    // store their answer.
    let drain = engine.drain();

    // Sessions and event-stream answers: what MCP clients use today. rmcp
    // answers with plain JSON only without sessions:
    // `.with_legacy_session_mode(false).with_json_response(true)`.
    let config = StreamableHttpServerConfig::default();
    let mcp = StreamableHttpService::new(
        || {
            Ok(Mailer {
                tool_router: Mailer::tool_router(),
            })
        },
        LocalSessionManager::default().into(),
        config,
    );
    let guard = JsonRpcLayer::new(engine)
        .with_tool("send_email")
        .with_scope(principal);
    let app = Router::new()
        .route_service("/mcp", mcp)
        .route_layer(guard)
        .layer(BodyTimeoutLayer::new(Duration::from_secs(30)));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    Server::new()
        .serve(listener, move |_client| app.clone(), shutdown)
        .await;
    drain.wait().await;
    Ok(())
}

/// The authenticated caller, never the MCP session (a client that lost its
/// connection retries in a new one). Here the bearer token stands in for
/// what your authentication established.
fn principal(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("anonymous")
        .to_owned()
}

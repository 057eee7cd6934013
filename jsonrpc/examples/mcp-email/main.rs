//! An MCP server (the official Rust SDK, `rmcp`, Streamable HTTP) whose
//! `send_email` tool is guarded by `JsonRpcLayer`: a retried call with the
//! same key sends one email and gets the first call's result.
//!
//! ```text
//! cargo run -p idempotency-jsonrpc --example mcp-email
//! ```
//!
//! Reads `DATABASE_URL` (default an SQLite file `mcp-email.db`) and `LISTEN`
//! (default `127.0.0.1:3001`). Serves through the guard's bounded server
//! (`idempotency_guard::server`), as every binary of the project does, and
//! drains the engine on shutdown.

mod email;

use std::sync::Arc;
use std::time::Duration;

use idempotency_guard::server::{BodyTimeoutLayer, Server};
use idempotency_guard::{Engine, store::AnyStore};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| String::from("sqlite://mcp-email.db?mode=rwc"));
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| String::from("127.0.0.1:3001"));
    let store = AnyStore::connect(&url).await?;
    store.migrate().await?;
    let engine = Engine::new(store);
    let drain = engine.drain();
    let outbox = Arc::new(email::Outbox::default());
    let app = email::router(engine, outbox, email::Form::Sessions)
        .layer(BodyTimeoutLayer::new(Duration::from_secs(30)));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("MCP server on http://{listen}/mcp (send_email guarded)");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    Server::new()
        .serve(listener, move |_client| app.clone(), shutdown)
        .await;
    drain.wait().await;
    Ok(())
}

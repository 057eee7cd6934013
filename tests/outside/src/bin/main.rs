use std::time::Duration;

use axum::{Router, http::StatusCode, routing::post};
use idempotency_guard::{IdempotencyLayer, purge_periodically, store::AnyStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The records: an SQLite file here; `postgres://…` with the `postgres` feature.
    let store = AnyStore::connect("sqlite://app.db").await?;
    store.migrate().await?;
    // Records past their retention (24 h by default) are deleted only by this.
    tokio::spawn(purge_periodically(
        store.clone(),
        Duration::from_secs(60),
        1000,
    ));

    // Retention must exceed the maximum handler time (10 min) plus the lease (60 s).
    let layer = IdempotencyLayer::new(store).with_scope(|parts| {
        let tenant = parts.headers.get("x-tenant").and_then(|v| v.to_str().ok());
        tenant.unwrap_or("default").to_owned()
    });
    let drain = layer.drain();
    let app = Router::new()
        .route(
            "/payments",
            post(|body: String| async { (StatusCode::CREATED, body) }),
        )
        .route_layer(layer);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let ctrl_c = async { tokio::signal::ctrl_c().await.unwrap_or(()) };
    axum::serve(listener, app)
        .with_graceful_shutdown(ctrl_c)
        .await?;
    // Runs whose clients left finish and store their answers before exit.
    drain.wait().await;
    Ok(())
}

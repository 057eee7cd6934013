//! The peer crate `idempotent` 2.0.0 serving the benchmark's route: the
//! same trivial write handler as `idempotency-bench serve` (`POST /orders`,
//! 201 with a 70-byte JSON body) behind the peer's own axum layer
//! (`idempotent::middleware::IdempotencyLayer`) on its Valkey/Redis store.
//!
//! The layer keeps its defaults, which match the harness's other apps: a
//! 1 MiB cap on the request and the cached response body, a day of
//! retention for completed responses, keys from `Idempotency-Key`. It is
//! mounted with `route_layer`, as our guard is.
//!
//! ```text
//! idempotency-bench-peer2 --redis-url redis://127.0.0.1:6379 --prefix idem-bench-x
//! ```
//!
//! Prints `listening <address>` on its first line of stdout (the harness
//! reads it), then serves until killed.

use std::io::Write as _;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use idempotent::middleware::IdempotencyLayer;
use idempotent::valkey::ValkeyStore;

/// The guarded route (as `bench/src/server.rs`).
const PATH: &str = "/orders";
/// The handler's answer (as `bench/src/server.rs`).
const RESPONSE_BODY: &[u8] =
    br#"{"id":"ord_8f14e45f","status":"created","amount":100,"currency":"EUR"}"#;

/// The trivial write handler: reads the body, answers 201 with a small JSON body.
async fn create_order(_body: Bytes) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        RESPONSE_BODY,
    )
}

/// The command line: `--redis-url URL` and `--prefix PREFIX`.
struct Args {
    redis_url: String,
    prefix: String,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Self {
            redis_url: "redis://127.0.0.1:6379".to_owned(),
            prefix: "idem-bench-peer2".to_owned(),
        };
        let mut given = std::env::args().skip(1);
        while let Some(flag) = given.next() {
            let value = given
                .next()
                .ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--redis-url" => args.redis_url = value,
                "--prefix" => args.prefix = value,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(args)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse()?;
    let store = ValkeyStore::with_url(args.redis_url)
        .prefix(args.prefix)
        .try_build()
        .await?;
    let app = Router::new()
        .route(PATH, post(create_order))
        .route_layer(IdempotencyLayer::new(store));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening {address}")?;
        stdout.flush()?;
    }
    axum::serve(listener, app).await?;
    Ok(())
}

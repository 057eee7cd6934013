//! The server under test: a trivial write handler (201 with a small JSON
//! body), bare, behind our guard (its stored responses sealed or not), or
//! behind a peer; or, with `--forward-to`, the guarded handler forwarding to
//! an upstream (the axum layer as a reverse proxy); or behind the
//! hand-written guard a user would write instead (`handwritten.rs`). Started as a child process; prints `listening <address>`
//! on its first line of stdout. With `--metrics`, a guard's server also
//! installs a Prometheus recorder and serves its text at `GET /metrics`
//! (outside the guard).

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotency_guard::store::encrypted::{EncryptedStore, EncryptionKeys};
use idempotency_guard::store::nats::NatsStore;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::store::tiered::TieredStore;
use idempotency_guard::{IdempotencyLayer, Store, Tx};

use crate::cli::{App, ServeArgs, StoreName};

/// The guarded route.
pub(crate) const PATH: &str = "/orders";
/// The request body every client sends (a new order).
pub(crate) const REQUEST_BODY: &[u8] = br#"{"amount":100,"currency":"EUR","customer":"cus_42"}"#;
/// The handler's answer.
pub(crate) const RESPONSE_BODY: &[u8] =
    br#"{"id":"ord_8f14e45f","status":"created","amount":100,"currency":"EUR"}"#;

/// The trivial write handler: reads the body, answers 201 with a small JSON body.
async fn create_order(_body: Bytes) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        RESPONSE_BODY,
    )
}

/// The same handler behind the hand-written guard (`handwritten.rs`), as
/// a user would write it inside the handler.
async fn create_order_handwritten(
    State(table): State<crate::handwritten::Table>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    crate::handwritten::guarded(&table, &headers, body, |body| async {
        create_order(body).await.into_response()
    })
    .await
}

/// The same handler in transactional mode: it takes the guard's
/// transaction (which begins it) and writes nothing of its own.
async fn create_order_tx(_tx: Tx, _body: Bytes) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        RESPONSE_BODY,
    )
}

/// The handler of `--forward-to`: the guarded route as a reverse proxy,
/// as a Rust team would write it with the axum layer in front of a backend
/// in another language: the body POSTed to the upstream through a pooled
/// HTTP/1.1 client, the upstream's answer (status, headers, body) returned.
#[derive(Clone)]
struct Forward {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: http::Uri,
}

impl Forward {
    fn new(url: &str) -> anyhow::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri: url.parse().context("--forward-to is not a URL")?,
        })
    }
}

async fn forward_order(State(forward): State<Forward>, body: Bytes) -> Response {
    let request = http::Request::post(forward.uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body));
    let Ok(request) = request else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let Ok(answer) = forward.client.request(request).await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let (parts, body) = answer.into_parts();
    match body.collect().await {
        Ok(body) => Response::from_parts(parts, Body::from(body.to_bytes())),
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

fn bare() -> Router {
    Router::new().route(PATH, post(create_order))
}

/// The encryption key of the sealed runs (a fixed test key: the figures
/// are the same for any key).
const BENCH_KEYS: &str = "bench:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// The replay cache of the `guard-cached` app, in MiB (at least).
const GUARD_CACHED_MIB: usize = 64;

/// How a guarded app answers: by itself, or through an upstream.
#[derive(Clone)]
struct Guarded {
    keys: Option<EncryptionKeys>,
    replay_cache_mib: Option<usize>,
    forward: Option<Forward>,
}

impl Guarded {
    /// The guarded app over `store`, its responses sealed when keys are
    /// given.
    fn over<S: Store>(&self, store: S) -> Router {
        match &self.keys {
            Some(keys) => self.route(EncryptedStore::new(store, keys.clone())),
            None => self.route(store),
        }
    }

    fn route<S: Store>(&self, store: S) -> Router {
        let mut layer = IdempotencyLayer::new(store);
        layer = match self.replay_cache_mib {
            None => layer,
            Some(0) => layer.without_replay_cache(),
            Some(mib) => layer.with_replay_cache(mib << 20, Duration::from_secs(60)),
        };
        let handler = match &self.forward {
            Some(forward) => post(forward_order).with_state(forward.clone()),
            None => post(create_order),
        };
        Router::new().route(PATH, handler).route_layer(layer)
    }
}

/// The Redis store of the guard apps. `BENCH_REDIS_BATCHING=on` turns its
/// batcher on (`PIPELINED_BATCHING`; off is the default), for the A/B of
/// batching against the multiplexed connection's own pipelining
/// (scripts/cost-per-request's `guard-batched`); `BENCH_REDIS_NATIVE_FENCE=off`
/// completes by the fenced script even on a server with `SET … IFEQ`
/// (`guard-scripted`: what a completion costs the server, and the server's
/// idleness the guard's process, on Valkey).
async fn redis_store(args: &ServeArgs) -> anyhow::Result<RedisStore> {
    let store = RedisStore::connect(&args.redis_url, &args.prefix).await?;
    let store = match std::env::var("BENCH_REDIS_NATIVE_FENCE").as_deref() {
        Ok("off") => store.with_native_fence(false),
        Ok("on") | Err(_) => store,
        Ok(other) => anyhow::bail!("BENCH_REDIS_NATIVE_FENCE: on or off, not {other:?}"),
    };
    Ok(match std::env::var("BENCH_REDIS_BATCHING").as_deref() {
        Ok("on") => store.with_batching(idempotency_guard::store::redis::PIPELINED_BATCHING),
        Ok("off") | Err(_) => store,
        Ok(other) => anyhow::bail!("BENCH_REDIS_BATCHING: on or off, not {other:?}"),
    })
}

/// Where a server started with `--metrics` serves its Prometheus text.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// Serves the app `args` names until killed.
pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Installed before the guard's layer is built, so it sees every metric.
    let metrics = if args.metrics && args.app != App::Peer2 {
        Some(idempotency_guard::telemetry::install_prometheus()?)
    } else {
        None
    };
    let cache = if args.app == App::GuardCached {
        Some(args.replay_cache_mib.unwrap_or(0).max(GUARD_CACHED_MIB))
    } else {
        args.replay_cache_mib
    };
    let mut app = match args.app {
        App::Bare => bare(),
        App::Guard | App::GuardEncrypted | App::GuardCached => {
            let store = args.store.context("--store is needed with the guard")?;
            let guarded = Guarded {
                keys: (args.app == App::GuardEncrypted)
                    .then(|| EncryptionKeys::parse(BENCH_KEYS))
                    .transpose()?,
                replay_cache_mib: cache,
                forward: args.forward_to.as_deref().map(Forward::new).transpose()?,
            };
            match store {
                StoreName::Postgres => guarded.over(postgres(&args).await?),
                StoreName::Sqlite => guarded.over(SqliteStore::connect(&args.database_url).await?),
                StoreName::Redis => guarded.over(redis_store(&args).await?),
                StoreName::RedisCluster => guarded.over(cluster(&args).await?),
                StoreName::Tiered => guarded.over(TieredStore::new(
                    postgres(&args).await?,
                    RedisStore::connect(&args.redis_url, &args.prefix).await?,
                )),
                StoreName::Nats => guarded.over(
                    NatsStore::connect_with_replicas(
                        &args.nats_url,
                        &args.prefix,
                        args.nats_replicas,
                    )
                    .await?,
                ),
            }
        }
        App::GuardReplicaAcks => {
            anyhow::ensure!(
                args.store == Some(StoreName::Redis),
                "--app guard-replica-acks runs on --store redis"
            );
            let store = RedisStore::connect(&args.redis_url, &args.prefix)
                .await?
                .with_replica_acks(1, Duration::from_secs(1));
            Guarded {
                keys: None,
                replay_cache_mib: cache,
                forward: None,
            }
            .over(store)
        }
        App::GuardTx => Router::new()
            .route(PATH, post(create_order_tx))
            .route_layer(
                IdempotencyLayer::new(postgres(&args).await?).with_transactional_mode(true),
            ),
        App::GuardSingleCommit => Router::new()
            .route(PATH, post(create_order_tx))
            .route_layer(
                IdempotencyLayer::new(postgres(&args).await?)
                    .with_transactional_mode(true)
                    .with_single_commit(true),
            ),
        App::Handwritten => {
            let table = match args.store {
                Some(StoreName::Postgres) => {
                    crate::handwritten::Table::postgres(&args.database_url, args.pool_size).await?
                }
                Some(StoreName::Sqlite) => {
                    crate::handwritten::Table::sqlite(&args.database_url).await?
                }
                _ => anyhow::bail!("--app handwritten runs on --store postgres or sqlite"),
            };
            Router::new()
                .route(PATH, post(create_order_handwritten))
                .with_state(table)
        }
        App::Peer => {
            let peer = crate::peer::Peer::connect(&args.redis_url, &args.prefix).await?;
            Router::new().route(PATH, post(create_order)).route_layer(
                axum::middleware::from_fn_with_state(peer, crate::peer::guard),
            )
        }
        App::Peer2 => {
            return Err(crate::peer2::exec(
                &args.peer2_bin,
                &args.redis_url,
                &args.prefix,
            ));
        }
    };
    if let Some(handle) = metrics {
        app = app.route(METRICS_PATH, get(move || async move { handle.render() }));
    }
    if crate::allocations::counts().is_some() {
        app = app.route(
            crate::allocations::PATH,
            get(|| async { crate::allocations::counts().unwrap_or_default() }),
        );
    }
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

/// The PostgreSQL store of the guard apps. `BENCH_PG_BATCHING=off` turns
/// its batcher off, `BENCH_PG_BATCHING=<n>` lets `n` statements of each
/// kind be on their way at once (the default is 2), for the A/B of group
/// commit against PostgreSQL's own grouping at its WAL flush.
async fn postgres(args: &ServeArgs) -> anyhow::Result<PostgresStore> {
    let store = PostgresStore::connect(&args.database_url, args.pool_size).await?;
    Ok(match std::env::var("BENCH_PG_BATCHING").as_deref() {
        Ok("off") => store.with_batching(idempotency_guard::store::batch::BatchLimits::OFF),
        Ok(n) => store.with_batching(idempotency_guard::store::batch::BatchLimits {
            max_in_flight: n.parse().context("BENCH_PG_BATCHING: off or a number")?,
            ..idempotency_guard::store::postgres::DEFAULT_BATCHING
        }),
        Err(_) => store,
    })
}

async fn cluster(args: &ServeArgs) -> anyhow::Result<RedisStore> {
    let nodes: Vec<&str> = args.redis_cluster_urls.iter().map(String::as_str).collect();
    Ok(RedisStore::connect_cluster(&nodes, &args.prefix).await?)
}

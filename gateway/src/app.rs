//! The gateway's router: one guarded proxy route per configured route
//! (scope middleware, then [`IdempotencyLayer`], then the forwarder; for a
//! `jsonrpc` route the JSON-RPC layer instead, see [`crate::jsonrpc`]), the
//! gateway's own `/healthz`, `/readyz` and `/metrics`, and a fallback that
//! passes every other request through, streaming.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{any, get};
use http::{Method, Response, header};
use idempotency_guard::adapter::BodyBudget;
use idempotency_guard::problem::types;
use idempotency_guard::store::{AnyStore, StoreOptions};
use idempotency_guard::{
    AbandonedPolicy, Drain, Engine, FinalResponse, IDEMPOTENCY_KEY, IdempotencyLayer,
    InFlightPolicy, Store,
};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::{Abandoned, Config, ConfigError, InFlight, OWN_PATHS, RouteKind};
use crate::forward::{RouteMetrics, Upstream};
use crate::scope::{Scope, ScopeGate, ScopeSource, establish_scope};

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store cannot be opened.
    #[error("cannot open the store")]
    Store(#[source] idempotency_guard::StoreError),
    /// The store's migrations failed.
    #[error("cannot migrate the store")]
    Migrate(#[source] idempotency_guard::MigrationError),
}

/// A configured gateway: store, engine, upstream client, scope source.
#[derive(Clone)]
pub struct Gateway {
    config: Arc<Config>,
    engine: Engine<AnyStore>,
    upstream: Upstream,
    scope: Arc<ScopeSource>,
    metrics: Option<PrometheusHandle>,
    /// The proxy metrics of requests no route names.
    unguarded: RouteMetrics,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstream", &self.config.upstream)
            .field("routes", &self.config.routes.len())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Opens the configured store (applying its migrations unless
    /// `migrate = false`) and builds the gateway.
    ///
    /// # Errors
    ///
    /// See [`GatewayError`].
    pub async fn open(
        config: Config,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self, GatewayError> {
        Self::check(&config)?;
        let mut options = StoreOptions::sql(&config.store);
        options.kind = config.store_kind;
        options.redis_url = config.redis.as_deref();
        options.redis_prefix = &config.redis_prefix;
        options.nats = config.nats_options();
        let keys = config.encryption_keys()?;
        options.encryption = keys.as_ref();
        options.require_sealed = config.require_sealed;
        let store = AnyStore::open(&options)
            .await
            .map_err(GatewayError::Store)?;
        if config.migrate {
            store.migrate().await.map_err(GatewayError::Migrate)?;
        }
        Self::with_store(config, store, metrics)
    }

    /// Everything that can be checked without a server or the upstream:
    /// [`Config::check`] and the scope source (the JWT key file or secret
    /// included). `idempotency-gateway --check` and [`Gateway::open`] run it.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] found.
    pub fn check(config: &Config) -> Result<(), ConfigError> {
        config.check()?;
        ScopeSource::from_config(&config.scope)?;
        Ok(())
    }

    /// Builds the gateway over a store opened beforehand.
    ///
    /// # Errors
    ///
    /// [`GatewayError::Config`] when the configuration is unusable.
    pub fn with_store(
        config: Config,
        store: AnyStore,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self, GatewayError> {
        config.validate()?;
        let p = &config.policy;
        let in_flight = match p.in_flight {
            InFlight::Wait => InFlightPolicy::Wait(p.in_flight_wait),
            InFlight::Reject => InFlightPolicy::Reject,
        };
        let abandoned = match p.abandoned {
            Abandoned::RunAgain => AbandonedPolicy::RunAgain,
            Abandoned::Reject => AbandonedPolicy::Reject,
        };
        let engine = Engine::new(store)
            .with_lease(p.lease)
            .with_retention(p.retention)
            .with_max_handler_time(p.max_handler_time)
            .with_in_flight(in_flight)
            .with_abandoned(abandoned)
            .with_retry_after(p.retry_after);
        Ok(Self {
            upstream: Upstream::new(&config)?,
            scope: Arc::new(ScopeSource::from_config(&config.scope)?),
            config: Arc::new(config),
            engine,
            metrics,
            unguarded: RouteMetrics::new("unguarded"),
        })
    }

    /// The store the records are in.
    pub fn store(&self) -> &AnyStore {
        self.engine.store()
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle that waits, on shutdown, for every guarded upstream request
    /// still running (their clients may have gone).
    pub fn drain(&self) -> Drain {
        self.engine.drain()
    }

    /// The upstream client and the proxy metrics of requests no route
    /// names, for the accept loop's pass-through path.
    pub(crate) fn pass_through(&self) -> (Upstream, RouteMetrics) {
        (self.upstream.clone(), self.unguarded.clone())
    }

    /// The gateway's router. Tests call it with `oneshot`; `serve` binds it
    /// (with `ConnectInfo`, for `X-Forwarded-For`).
    pub fn router(&self) -> Router {
        let mut app = Router::new();
        let limits = &self.config.limits;
        // One budget for every guarded route's buffered bodies.
        let budget = BodyBudget::new(limits.buffered_body_bytes);
        for route in &self.config.routes {
            if route.kind == RouteKind::Jsonrpc {
                let guarded = crate::jsonrpc::router(
                    route,
                    &self.engine,
                    &self.upstream,
                    &self.scope,
                    limits,
                    &budget,
                );
                app = app.merge(guarded);
                continue;
            }
            let methods: Arc<[Method]> = route.guarded_methods().into();
            let layer = IdempotencyLayer::with_engine(self.engine.clone())
                .with_methods(methods.iter().cloned())
                .with_key_required(route.key_required)
                .with_scope(|parts| {
                    // Set by `establish_scope`, which runs first; without
                    // it the empty scope is refused by the layer.
                    parts
                        .extensions
                        .get::<Scope>()
                        .map(|scope| scope.0.clone())
                        .unwrap_or_default()
                })
                .with_body_limit(limits.body_bytes)
                .with_body_budget(budget.clone())
                .with_stored_response_limit(limits.stored_response_bytes)
                .with_mismatch_status(self.config.policy.mismatch_status);
            let proxy = GuardedProxy {
                metrics: RouteMetrics::new(&route.path),
                upstream: self.upstream.clone(),
                methods: Arc::clone(&methods),
                keep: limits.stored_response_bytes,
                final_client_errors: self.config.policy.store_client_errors,
            };
            let gate = ScopeGate {
                source: Arc::clone(&self.scope),
                methods,
            };
            let guarded = Router::new()
                .route(&route.path, any(guarded_proxy).with_state(proxy))
                .route_layer(layer)
                .route_layer(from_fn_with_state(gate, establish_scope));
            app = app.merge(guarded);
        }
        let [healthz_path, readyz_path, metrics_path] = OWN_PATHS;
        let ops = Router::new()
            .route(healthz_path, get(healthz))
            .route(readyz_path, get(readyz))
            .route(metrics_path, get(render_metrics))
            .fallback(pass_through)
            .with_state(self.clone());
        app.merge(ops)
    }
}

/// The forwarder of one guarded route.
#[derive(Clone)]
struct GuardedProxy {
    metrics: RouteMetrics,
    upstream: Upstream,
    methods: Arc<[Method]>,
    keep: usize,
    final_client_errors: bool,
}

/// Forwards a request of a guarded route (the guard already claimed its
/// key, or passed it through: another method, or no key where optional).
async fn guarded_proxy(State(proxy): State<GuardedProxy>, request: Request) -> Response<Body> {
    let guarded = proxy.methods.contains(request.method())
        && request.headers().contains_key(&IDEMPOTENCY_KEY);
    let mut response = proxy
        .upstream
        .forward(request, &proxy.metrics, guarded, proxy.keep)
        .await;
    if guarded && proxy.final_client_errors {
        // The upstream's 4xx is its decision, not an extractor's: stored.
        response.extensions_mut().insert(FinalResponse);
    }
    response
}

/// Forwards any request no route names: streamed both ways, untouched
/// (but for hop-by-hop and forwarding headers).
async fn pass_through(State(gateway): State<Gateway>, request: Request) -> Response<Body> {
    gateway
        .upstream
        .forward(request, &gateway.unguarded, false, 0)
        .await
}

async fn healthz() -> Response<Body> {
    json_ok()
}

fn json_ok() -> Response<Body> {
    let mut response = Response::new(Body::from(r#"{"status":"ok"}"#));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// The scope and key `/readyz` reads to prove the store answers.
static READINESS_PROBE: std::sync::LazyLock<(
    idempotency_guard::Scope,
    idempotency_guard::IdempotencyKey,
)> = std::sync::LazyLock::new(|| {
    (
        idempotency_guard::Scope::new("readyz").expect("a valid scope"),
        idempotency_guard::IdempotencyKey::from_raw("readyz").expect("a valid key"),
    )
});

/// 200 when the store answers and the upstream accepts connections; 503
/// naming which does not.
async fn readyz(State(gateway): State<Gateway>) -> Response<Body> {
    let (scope, key) = &*READINESS_PROBE;
    let store = tokio::time::timeout(Duration::from_secs(2), gateway.store().get(scope, key));
    let (store, upstream) = tokio::join!(store, gateway.upstream.reachable());
    let store = matches!(store, Ok(Ok(_)));
    if store && upstream {
        return json_ok();
    }
    let detail = match (store, upstream) {
        (false, false) => "Neither the store nor the upstream answers.",
        (false, true) => "The store does not answer.",
        _ => "The upstream does not accept connections.",
    };
    types::NOT_READY
        .problem(detail)
        .with("store", store)
        .with("upstream", upstream)
        .into_response()
}

async fn render_metrics(State(gateway): State<Gateway>) -> Response<Body> {
    let text = gateway
        .metrics
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

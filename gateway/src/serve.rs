//! The accept loop, the dispatch of each request (the guarded routes and the
//! gateway's own paths to the axum router, every other request straight to
//! the upstream), and the graceful shutdown that drains detached runs.
//!
//! The pass-through path skips axum: a request whose path no route names
//! is matched once (the same `matchit` patterns axum uses) and forwarded
//! from hyper's connection task, without the router's extensions, boxed
//! handler futures and per-request `ConnectInfo`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use http::{Method, Request, Response};
use idempotency_guard::IDEMPOTENCY_KEY;
use idempotency_guard::problem::{ProblemType, types};
use idempotency_guard::server::{BodyTimeoutLayer, Server};
use tokio::net::TcpListener;

use crate::app::Gateway;
use crate::config::{ConfigError, OWN_PATHS, RouteNotGuarded};
use crate::forward::{ClientAddress, RouteMetrics, Upstream};
use crate::target;

/// What every connection's service shares.
struct Dispatch {
    /// The guarded routes and the gateway's own paths.
    router: Router,
    /// The paths that go to the router (the configured route patterns).
    guarded: matchit::Router<()>,
    /// Every method some route guards.
    guarded_methods: Vec<Method>,
    /// Whether a keyed request on a guarded method that no route names is
    /// refused (`policy.route_not_guarded = "refuse"`).
    refuse_unguarded_keys: bool,
    upstream: Upstream,
    unguarded: RouteMetrics,
}

impl Dispatch {
    /// Whether `path` is the router's (a guarded route or an own path).
    fn routed(&self, path: &str) -> bool {
        OWN_PATHS.contains(&path) || self.guarded.at(path).is_ok()
    }

    /// The refusal of a request the gateway does not forward: `CONNECT`, a
    /// guarded method in another case, a non-canonical target or a keyed
    /// request to no guarded route on a guarded method (see
    /// [`crate::target`]).
    fn refusal<B>(&self, request: &Request<B>) -> Option<Response<Body>> {
        let method = request.method();
        if method == Method::CONNECT {
            return Some(
                types::METHOD_NOT_SUPPORTED
                    .problem("The gateway does not open tunnels (CONNECT).")
                    .into_response(),
            );
        }
        let name = method.as_str();
        let guarded = if self.guarded_methods.contains(method) {
            true
        } else if name.bytes().any(|b| b.is_ascii_lowercase())
            && self
                .guarded_methods
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(name))
        {
            return Some(bad_request(
                types::METHOD_NOT_CANONICAL,
                "Methods are case-sensitive: a guarded method is spelled in capitals.",
            ));
        } else {
            false
        };
        if !guarded {
            return None;
        }
        let path = request.uri().path();
        let keyed = request.headers().contains_key(&IDEMPOTENCY_KEY);
        if let Err(reason) = target::check(path) {
            if keyed || self.routed(&target::normalise(path)) {
                return Some(bad_request(types::TARGET_NOT_CANONICAL, reason.detail()));
            }
            return None;
        }
        if keyed && self.refuse_unguarded_keys && !self.routed(path) {
            return Some(bad_request(
                types::ROUTE_NOT_GUARDED,
                "The request carries Idempotency-Key but no guarded route has this path and method; it was not forwarded.",
            ));
        }
        None
    }
}

/// A refusal of a request the gateway will not forward (a 400 type).
fn bad_request(kind: ProblemType, detail: &str) -> Response<Body> {
    kind.problem(detail).into_response()
}

/// One connection's service: the shared dispatch and the client's address
/// (formatted once for the forwarding headers).
#[derive(Clone)]
struct ConnectionService {
    dispatch: Arc<Dispatch>,
    client: SocketAddr,
    address: Arc<ClientAddress>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl tower::Service<Request<Body>> for ConnectionService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        if let Some(refusal) = self.dispatch.refusal(&request) {
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        if self.dispatch.routed(request.uri().path()) {
            request.extensions_mut().insert(ConnectInfo(self.client));
            // The router is always ready.
            let mut router = self.dispatch.router.clone();
            return Box::pin(tower::Service::call(&mut router, request));
        }
        let dispatch = Arc::clone(&self.dispatch);
        let address = Arc::clone(&self.address);
        Box::pin(async move {
            Ok(dispatch
                .upstream
                .forward_from(request, Some(&address), &dispatch.unguarded, false, 0)
                .await)
        })
    }
}

/// Serves `gateway` on `listener` until `shutdown` completes, then stops
/// accepting, lets open requests finish, and waits for every guarded
/// upstream request still running (its client may be gone) so its outcome
/// is stored or released, not lost. Returns whether every run ended in time.
///
/// Each connection is bounded by the guard's [`Server`] (header-read, idle
/// and HTTP/2 keep-alive deadlines, the connection cap, 414/431 for
/// oversized heads: `[server]`); a guarded route's request body must
/// arrive within `server.body_seconds` (408 `body-timeout`).
///
/// # Errors
///
/// [`std::io::Error`] from the listener; a configuration error as
/// [`std::io::ErrorKind::InvalidInput`].
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<bool> {
    let invalid = |error: ConfigError| std::io::Error::new(std::io::ErrorKind::InvalidInput, error);
    let config = gateway.config();
    let server = &config.server;
    let router = gateway.router().layer(BodyTimeoutLayer::new(server.body));
    let mut guarded = matchit::Router::new();
    for route in &config.routes {
        guarded.insert(route.path.as_str(), ()).map_err(|error| {
            invalid(ConfigError::Invalid(format!(
                "route {}: {error}",
                route.path
            )))
        })?;
    }
    let (upstream, unguarded) = gateway.pass_through();
    let mut guarded_methods: Vec<Method> = Vec::new();
    for route in &config.routes {
        for method in route.guarded_methods() {
            if !guarded_methods.contains(&method) {
                guarded_methods.push(method);
            }
        }
    }
    let bounds = Server::new()
        .with_header_read_timeout(server.header_read)
        .with_idle_timeout(server.idle)
        .with_http2_keep_alive(server.http2_ping, server.http2_ping_timeout)
        .with_max_connections(server.max_connections.max(1))
        .with_max_uri_bytes(server.max_uri_bytes)
        .with_max_header_bytes(server.max_header_bytes);
    let dispatch = Arc::new(Dispatch {
        router,
        guarded,
        guarded_methods,
        refuse_unguarded_keys: config.policy.route_not_guarded == RouteNotGuarded::Refuse,
        upstream,
        unguarded,
    });
    let drain = gateway.drain();
    tracing::info!(
        listen = %listener.local_addr()?,
        upstream = %gateway.config().upstream,
        store = gateway.store().kind(),
        encrypted = gateway.store().is_encrypted(),
        routes = gateway.config().routes.len(),
        "gateway listening"
    );
    bounds
        .serve(
            listener,
            move |client: SocketAddr| ConnectionService {
                dispatch: Arc::clone(&dispatch),
                client,
                address: Arc::new(ClientAddress::new(client.ip())),
            },
            shutdown,
        )
        .await;
    let running = drain.running();
    tracing::info!(running, "stopped accepting; draining guarded runs");
    Ok(drain.wait().await)
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

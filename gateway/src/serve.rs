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
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use idempotency_guard::IDEMPOTENCY_KEY;
use idempotency_guard::problem::Problem;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;

use crate::app::{Gateway, OWN_PATHS};
use crate::config::{ConfigError, seconds};
use crate::connections::{
    BusyBody, Connections, DeadlineBody, Slot, connection_cap, raise_descriptor_limit,
};
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
    /// The deadline of a guarded route's request body.
    body_deadline: Duration,
    upstream: Upstream,
    unguarded: RouteMetrics,
    connections: Arc<Connections>,
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
                Problem::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "method-not-supported",
                    "Method not supported",
                    "The gateway does not open tunnels (CONNECT).",
                )
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
                "method-not-canonical",
                "Method not canonical",
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
                return Some(bad_request(
                    "target-not-canonical",
                    "Target not canonical",
                    reason.detail(),
                ));
            }
            return None;
        }
        if keyed && self.refuse_unguarded_keys && !self.routed(path) {
            return Some(bad_request(
                "route-not-guarded",
                "Route not guarded",
                "The request carries Idempotency-Key but no guarded route has this path and method; it was not forwarded.",
            ));
        }
        None
    }
}

fn bad_request(name: &str, title: &str, detail: &str) -> Response<Body> {
    Problem::new(StatusCode::BAD_REQUEST, name, title, detail).into_response()
}

/// One connection's service: the shared dispatch and the client's address
/// (formatted once for the forwarding headers).
#[derive(Clone)]
struct ConnectionService {
    dispatch: Arc<Dispatch>,
    client: SocketAddr,
    address: Arc<ClientAddress>,
    slot: Arc<Slot>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = self.dispatch.connections.busy(&self.slot);
        let track = move |response: Response<Body>| {
            Ok(response.map(|inner| Body::new(BusyBody { inner, _busy: busy })))
        };
        if let Some(refusal) = self.dispatch.refusal(&request) {
            return Box::pin(std::future::ready(track(refusal)));
        }
        if self.dispatch.routed(request.uri().path()) {
            let expired = Arc::new(AtomicBool::new(false));
            let deadline = self.dispatch.body_deadline;
            let flag = Arc::clone(&expired);
            let mut request = request
                .map(move |body| Body::new(DeadlineBody::new(Body::new(body), deadline, flag)));
            request.extensions_mut().insert(ConnectInfo(self.client));
            let mut router = self.dispatch.router.clone();
            return Box::pin(async move {
                let Ok(response) = tower::Service::call(&mut router, request).await;
                if expired.load(Ordering::Acquire) {
                    let mut late = Problem::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "body-timeout",
                        "Body timeout",
                        "The request body did not arrive in time; nothing was run.",
                    )
                    .into_response();
                    late.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    return track(late);
                }
                track(response)
            });
        }
        let dispatch = Arc::clone(&self.dispatch);
        let address = Arc::clone(&self.address);
        Box::pin(async move {
            let response = dispatch
                .upstream
                .forward_from(
                    request.map(Body::new),
                    Some(&address),
                    &dispatch.unguarded,
                    false,
                    0,
                )
                .await;
            track(response)
        })
    }
}

/// Serves `gateway` on `listener` until `shutdown` completes, then stops
/// accepting, lets open requests finish, and waits for every guarded
/// upstream request still running (its client may be gone) so its outcome
/// is stored or released, not lost. Returns whether every run ended in time.
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
    let router = gateway.router().map_err(invalid)?;
    let mut guarded = matchit::Router::new();
    for route in &gateway.config().routes {
        guarded.insert(route.path.as_str(), ()).map_err(|error| {
            invalid(ConfigError::Invalid(format!(
                "route {}: {error}",
                route.path
            )))
        })?;
    }
    let (upstream, unguarded) = gateway.pass_through();
    let config = gateway.config();
    let server = &config.server;
    let mut guarded_methods: Vec<Method> = Vec::new();
    for route in &config.routes {
        for method in route.parsed_methods().map_err(invalid)? {
            if !guarded_methods.contains(&method) {
                guarded_methods.push(method);
            }
        }
    }
    let descriptors = raise_descriptor_limit();
    let cap = connection_cap(server.max_connections, descriptors);
    let idle = seconds("server.idle_seconds", server.idle_seconds).map_err(invalid)?;
    let connections = Connections::new(cap, idle);
    connections.spawn_sweeper();
    let dispatch = Arc::new(Dispatch {
        router,
        guarded,
        guarded_methods,
        refuse_unguarded_keys: config.policy.route_not_guarded == "refuse",
        body_deadline: seconds("server.body_seconds", server.body_seconds).map_err(invalid)?,
        upstream,
        unguarded,
        connections: Arc::clone(&connections),
    });
    let drain = gateway.drain();
    tracing::info!(
        listen = %listener.local_addr()?,
        upstream = %gateway.config().upstream,
        store = gateway.store().kind(),
        encrypted = gateway.store().is_encrypted(),
        routes = gateway.config().routes.len(),
        descriptors,
        max_connections = cap,
        "gateway listening"
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(
            seconds("server.header_read_seconds", server.header_read_seconds).map_err(invalid)?,
        );
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(
            seconds("server.http2_ping_seconds", server.http2_ping_seconds).map_err(invalid)?,
        )
        .keep_alive_timeout(
            seconds(
                "server.http2_ping_timeout_seconds",
                server.http2_ping_timeout_seconds,
            )
            .map_err(invalid)?,
        );
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or a connection reset before it
                    // was accepted: wait a little, as axum's loop does.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(admitted) = connections.admit() else {
            // Every open connection is answering a request: this one waits
            // for nothing, it is closed.
            tracing::warn!(%client, cap, "connection cap reached; closing the new connection");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = ConnectionService {
            dispatch: Arc::clone(&dispatch),
            client,
            address: Arc::new(ClientAddress::new(client.ip())),
            slot: Arc::clone(&admitted.slot),
        };
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let mut admitted = admitted;
            tokio::select! {
                ended = connection => {
                    if let Err(error) = ended {
                        tracing::trace!(error = %error, "connection ended");
                    }
                }
                _ = &mut admitted.close => tracing::debug!("idle connection closed"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
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

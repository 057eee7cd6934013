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
use futures_util::future::Either;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::app::{Gateway, OWN_PATHS};
use crate::config::ConfigError;
use crate::forward::{ClientAddress, RouteMetrics, Upstream};

/// What every connection's service shares.
struct Dispatch {
    /// The guarded routes and the gateway's own paths.
    router: Router,
    /// The paths that go to the router (the configured route patterns).
    guarded: matchit::Router<()>,
    upstream: Upstream,
    unguarded: RouteMetrics,
}

impl Dispatch {
    /// Whether `path` is the router's (a guarded route or an own path).
    fn routed(&self, path: &str) -> bool {
        OWN_PATHS.contains(&path) || self.guarded.at(path).is_ok()
    }
}

/// One connection's service: the shared dispatch and the client's address
/// (formatted once for the forwarding headers).
#[derive(Clone)]
struct ConnectionService {
    dispatch: Arc<Dispatch>,
    client: SocketAddr,
    address: Arc<ClientAddress>,
}

type PassThrough = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<axum::routing::future::RouteFuture<Infallible>, PassThrough>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if self.dispatch.routed(request.uri().path()) {
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(ConnectInfo(self.client));
            let mut router = self.dispatch.router.clone();
            return Either::Left(tower::Service::call(&mut router, request));
        }
        let dispatch = Arc::clone(&self.dispatch);
        let address = Arc::clone(&self.address);
        Either::Right(Box::pin(async move {
            Ok(dispatch
                .upstream
                .forward_from(
                    request.map(Body::new),
                    Some(&address),
                    &dispatch.unguarded,
                    false,
                    0,
                )
                .await)
        }))
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
    let dispatch = Arc::new(Dispatch {
        router,
        guarded,
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
    let builder = auto::Builder::new(TokioExecutor::new());
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
        let _ = stream.set_nodelay(true);
        let service = ConnectionService {
            dispatch: Arc::clone(&dispatch),
            client,
            address: Arc::new(ClientAddress::new(client.ip())),
        };
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(error = %error, "connection ended");
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

//! A server that bounds every client connection (feature `server`): the
//! accept loop both shipped binaries (the gateway and the status service)
//! and the payments example run, so slow, idle and oversized clients meet
//! the same deadlines and caps everywhere.
//!
//! [`Server::serve`] serves any tower service (an axum `Router`, say) on
//! a listener until a shutdown future completes, with:
//!
//! | bound | default | past it |
//! |---|---|---|
//! | header read ([`Server::with_header_read_timeout`]) | 10 s | the connection is closed, no answer (HTTP/1.1) |
//! | idle connection ([`Server::with_idle_timeout`]) | 60 s | the connection is closed |
//! | open connections ([`Server::with_max_connections`]) | 10,000, lowered to fit the descriptor limit | a new connection closes the oldest idle one; when all are busy, the new one is closed |
//! | HTTP/2 keep-alive ([`Server::with_http2_keep_alive`]) | a ping every 20 s, 20 s to answer | the connection is closed |
//! | request target ([`Server::with_max_uri_bytes`]) | 8 KiB | 414 `uri-too-long` (problem+json) |
//! | header names and values ([`Server::with_max_header_bytes`]) | 32 KiB | 431 `headers-too-large` (problem+json) |
//! | request body ([`BodyTimeoutLayer`], a layer the app adds where bodies are read) | none here (30 s in the binaries) | 408 `body-timeout` (problem+json) |
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit, and the
//! connection cap is lowered to half of what that limit leaves after 64
//! descriptors (a proxy's client connection may hold an upstream one).
//!
//! # What hyper answers itself
//!
//! hyper parses a head before any of this code sees it, and answers some
//! heads itself, always with an **empty body** (hyper 1.x, h2 0.4):
//!
//! - HTTP/1.1 head (request line and fields) longer than the hard bound,
//!   `max_uri_bytes + 2 × max_header_bytes + 400` (74,128 bytes with the
//!   defaults; hyper's read buffer, `max_buf_size`, is set to it): 431,
//!   connection closed;
//! - more than 100 header fields: 431, connection closed;
//! - a target over 65,534 bytes that fits the hard bound: 414;
//! - a malformed head (method, target, version or a header field that does
//!   not parse): 400, connection closed;
//! - HTTP/2 header list over the hard bound (`SETTINGS_MAX_HEADER_LIST_SIZE`):
//!   431 with no body, the stream reset;
//! - a head not complete within the header-read timeout: no answer, the
//!   connection is closed.
//!
//! Everything over the checked limits but under hyper's bounds gets the
//! 414 or 431 problem above.
//!
//! # Why here
//!
//! This module lives in the guard crate behind a feature, not in a crate of
//! its own: the payments example (in this crate) serves with it, its
//! refusals are the guard's [`Problem`](crate::problem::Problem)s. The
//! feature is on by default (the README's first command, the payments
//! example, serves with it); it adds hyper's server, hyper-util's connection
//! builder and rustix's `getrlimit`, which any axum server already has but
//! rustix. A crate that mounts only the layer can leave it out
//! (`default-features = false`).
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use idempotency_guard::server::{BodyTimeoutLayer, Server};
//!
//! # async fn run() -> std::io::Result<()> {
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "paid" }))
//!     .layer(BodyTimeoutLayer::new(Duration::from_secs(30)));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! Server::new()
//!     .serve(listener, move |_client| app.clone(), std::future::pending())
//!     .await;
//! # Ok(()) }
//! ```

mod body;
mod connections;
mod head;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::util::Oneshot;
use tower::{Service, ServiceExt as _};

pub use body::{BodyTimeout, BodyTimeoutFuture, BodyTimeoutLayer, body_timeout_response};

use crate::response::BoxError;
use connections::{Busy, BusyBody, Connections, Slot, connection_cap, raise_descriptor_limit};
use head::HeadLimits;

/// The accept loop with its connection bounds; see the [module docs](self).
///
/// Built with [`Server::new`] and the `with_*` methods; each default says
/// why it is the default.
#[derive(Debug, Clone)]
pub struct Server {
    /// 10 s: a real client sends its head at once (nginx's
    /// `client_header_timeout` is 60 s, which lets a trickling client hold
    /// a socket for a minute).
    header_read: Duration,
    /// 60 s: above the usual API client's keep-alive (nginx's
    /// `keepalive_timeout` is 75 s).
    idle: Duration,
    /// 20 s between HTTP/2 pings, and 20 s (hyper's default) to answer one.
    http2_ping: (Duration, Duration),
    /// 10,000: far above one process's useful concurrency; the descriptor
    /// limit usually lowers it.
    max_connections: usize,
    /// 8 KiB and 32 KiB: nginx's `large_client_header_buffers` (4 × 8k).
    head: HeadLimits,
}

impl Default for Server {
    fn default() -> Self {
        Self::new()
    }
}

impl Server {
    /// A server with every bound at its default.
    pub fn new() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            http2_ping: (Duration::from_secs(20), Duration::from_secs(20)),
            max_connections: 10_000,
            head: HeadLimits {
                max_uri_bytes: 8 * 1024,
                max_header_bytes: 32 * 1024,
            },
        }
    }

    /// Sets how long a client may take to send a request head (HTTP/1.1);
    /// the connection is closed past it, without an answer.
    ///
    /// The default value is 10 seconds.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new().with_header_read_timeout(Duration::from_secs(5));
    /// ```
    pub fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read = timeout;
        self
    }

    /// Sets how long a connection may stay open with no request being
    /// answered on it (fresh, or between keep-alive requests).
    ///
    /// The default value is 60 seconds.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new().with_idle_timeout(Duration::from_secs(30));
    /// ```
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle = timeout;
        self
    }

    /// Sets the interval of HTTP/2 keep-alive pings and how long one may go
    /// unanswered before the connection is closed.
    ///
    /// The default value is a ping every 20 seconds, 20 seconds to answer.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new()
    ///     .with_http2_keep_alive(Duration::from_secs(30), Duration::from_secs(10));
    /// ```
    pub fn with_http2_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.http2_ping = (interval, timeout);
        self
    }

    /// Sets the most client connections open at once; at start it is
    /// lowered to fit the descriptor limit. At the cap a new connection
    /// closes the oldest idle one.
    ///
    /// The default value is 10,000.
    ///
    /// ```
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new().with_max_connections(2_000);
    /// ```
    ///
    /// # Panics
    ///
    /// When `max` is 0.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        assert!(max > 0, "a server takes at least one connection");
        self.max_connections = max;
        self
    }

    /// Sets the longest request target (path and query) accepted, in
    /// bytes; a longer one gets 414 `uri-too-long`.
    ///
    /// The default value is 8 KiB (8,192 bytes).
    ///
    /// ```
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new().with_max_uri_bytes(4096);
    /// ```
    pub fn with_max_uri_bytes(mut self, bytes: usize) -> Self {
        self.head.max_uri_bytes = bytes;
        self
    }

    /// Sets the most bytes of header names and values a request may carry,
    /// together; more gets 431 `headers-too-large`.
    ///
    /// The default value is 32 KiB (32,768 bytes).
    ///
    /// ```
    /// # use idempotency_guard::server::Server;
    /// let server = Server::new().with_max_header_bytes(16 * 1024);
    /// ```
    pub fn with_max_header_bytes(mut self, bytes: usize) -> Self {
        self.head.max_header_bytes = bytes;
        self
    }

    /// Serves on `listener` until `shutdown` completes, then stops
    /// accepting and lets open requests finish (idle connections close at
    /// once). `service` makes each connection's service from the client's
    /// address.
    ///
    /// Accept errors (out of descriptors, a connection reset before it was
    /// accepted) are logged and retried after 100 ms, as `axum::serve`
    /// does: serving itself never fails.
    pub async fn serve<M, S, B>(
        &self,
        listener: TcpListener,
        mut service: M,
        shutdown: impl Future<Output = ()>,
    ) where
        M: FnMut(SocketAddr) -> S,
        S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let descriptors = raise_descriptor_limit();
        let cap = connection_cap(self.max_connections, descriptors);
        let connections = Connections::new(cap, self.idle);
        connections.spawn_sweeper();
        tracing::info!(
            listen = ?listener.local_addr().ok(),
            descriptors,
            max_connections = cap,
            "serving with connection bounds"
        );
        let hard = self.head.hard_limit();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read)
            .max_buf_size(hard);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.http2_ping.0)
            .keep_alive_timeout(self.http2_ping.1)
            .max_header_list_size(u32::try_from(hard).unwrap_or(u32::MAX));
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, client) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Some(admitted) = connections.admit() else {
                // Every open connection is answering a request: this one
                // waits for nothing, it is closed.
                tracing::warn!(%client, cap, "connection cap reached; closing the new connection");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let tracked = Tracked {
                inner: service(client),
                slot: Arc::clone(&admitted.slot),
                connections: Arc::clone(&connections),
                head: self.head,
            };
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), tracked)
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
    }
}

/// One connection's service: the head check, the app's service, and the
/// slot kept busy until the response body is done.
struct Tracked<S> {
    inner: S,
    slot: Arc<Slot>,
    connections: Arc<Connections>,
    head: HeadLimits,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BusyBody>;
    type Error = S::Error;
    type Future = TrackedFuture<Oneshot<S, Request<Body>>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = Some(self.connections.busy(&self.slot));
        let state = match self.head.refusal(&request) {
            Some(refusal) => State::Refused {
                response: Some(refusal),
            },
            None => State::Called {
                future: self.inner.clone().oneshot(request.map(Body::new)),
            },
        };
        TrackedFuture { state, busy }
    }
}

pin_project_lite::pin_project! {
    #[project = StateProjection]
    enum State<F> {
        Called { #[pin] future: F },
        Refused { response: Option<Response<Body>> },
    }
}

pin_project_lite::pin_project! {
    /// The answer of a [`Tracked`] service: its response body keeps the
    /// connection busy.
    struct TrackedFuture<F> {
        #[pin]
        state: State<F>,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<BusyBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.state.project() {
            StateProjection::Called { future } => ready!(future.poll(cx))?.map(Body::new),
            StateProjection::Refused { response } => response.take().unwrap_or_default(),
        };
        let busy = this.busy.take();
        Poll::Ready(Ok(response.map(|inner| BusyBody { inner, _busy: busy })))
    }
}

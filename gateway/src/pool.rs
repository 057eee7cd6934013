//! The HTTP/1.1 upstream connections: a pool of idle keep-alive
//! connections to the one upstream, and the request's own task driving the
//! connection it uses.
//!
//! hyper-util's pooled client costs every request a hashed pool key (its
//! `(scheme, authority)`, hashed and compared on checkout and on return)
//! and a second task per connection, which the request and its answer
//! cross by channel. The gateway has one upstream, so its pool is a list;
//! and an HTTP/1.1 connection serves one request at a time, so the task
//! that waits for the answer can as well drive the connection:
//!
//! 1. **Checkout.** The newest idle connection is popped (connections idle
//!    longer than the idle timeout are closed on the way), or a new one
//!    opened (`TCP_NODELAY`, the connect timeout).
//! 2. **Send.** The request is queued on the connection
//!    ([`SendRequest::try_send_request`]) and the request's future polls the
//!    connection until the answer's head arrives, or the connection's own
//!    timer (moved to this request's deadline) fires. A connection that was
//!    pooled and turns out closed (the upstream's keep-alive timeout)
//!    hands the request back unsent: it is sent again on another
//!    connection, as hyper-util does. A request sent on a new connection
//!    is never sent twice.
//! 3. **Stream.** The answer's body ([`PooledBody`]) owns the connection
//!    and polls it while it is read.
//! 4. **Return.** When the body has ended and the connection is ready for
//!    another request, it goes back to the pool; an answer dropped before
//!    its end (the client left) closes its connection.
//!
//! 5. **Sweep.** Once a second a task (started with the first connection
//!    returned, ended with the pool) closes the idle connections that the
//!    upstream closed (each polled once, quietly) or that were idle longer
//!    than the idle timeout, so a quiet gateway holds no socket in
//!    `CLOSE_WAIT` and no idle connection past its timeout. Between sweeps,
//!    an upstream's close is noticed at checkout (step 2).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::TrySendError;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// One upstream connection: the handle that sends on it and the state
/// machine that reads and writes it.
struct Pooled {
    sender: SendRequest<Body>,
    connection: Connection<TokioIo<TcpStream>, Body>,
    /// When it went back to the pool.
    idle_since: Instant,
    /// The answer timeout, one per connection and moved later at each
    /// request: a later deadline only updates the registered timer (a
    /// compare-and-swap), where a new timer per request is inserted into
    /// and removed from the runtime's timer wheel.
    deadline: Pin<Box<Sleep>>,
}

/// A failure's cause, boxed: only failures pay for it.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no answer head.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be opened (or its handshake failed): nothing
    /// was sent.
    Connect(BoxError),
    /// The connection failed after the request was (or may have been)
    /// sent.
    Failed(BoxError),
    /// No answer head within the timeout (the request may have run).
    Timeout,
}

/// The idle HTTP/1.1 connections to the upstream.
pub(crate) struct Http1Pool {
    /// Boxed: a connection moves from the list to the request to its
    /// answer's body and back, a pointer each time.
    #[allow(clippy::vec_box)]
    idle: Mutex<Vec<Box<Pooled>>>,
    /// `host:port`, as `TcpStream::connect` takes it.
    address: String,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    /// How long the answer's head may take.
    timeout: Duration,
    /// Whether the sweep task runs (started with the first return).
    sweeping: AtomicBool,
}

/// How often idle connections are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Http1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Pool")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Http1Pool {
    /// A pool of connections to `authority` (port 80 when it names none),
    /// keeping at most `max_idle` idle ones, each at most `idle_timeout`;
    /// an answer's head may take `timeout`.
    pub(crate) fn new(
        authority: &Authority,
        max_idle: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            max_idle,
            idle_timeout,
            connect_timeout,
            timeout,
            sweeping: AtomicBool::new(false),
        }
    }

    /// Sends `request` (its URI in origin form, its `Host` set) and waits
    /// for the answer's head, at most the timeout from `started` (when the
    /// request came; opening a connection also has its own); the answer's
    /// body drives the connection and returns it to the pool at its end.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
        started: Instant,
    ) -> Result<Response<Body>, SendError> {
        // From the caller's clock reading: one fewer per request.
        let deadline = tokio::time::Instant::from_std(started) + self.timeout;
        loop {
            let (pooled, reused) = match self.checkout(started) {
                Some(pooled) => (pooled, true),
                None => (self.connect().await?, false),
            };
            match exchange(pooled, request, deadline).await {
                Exchanged::TimedOut => return Err(SendError::Timeout),
                Exchanged::Answer(answer, pooled) => {
                    let (parts, body) = answer.into_parts();
                    let body = PooledBody {
                        inner: body,
                        pooled,
                        pool: Arc::clone(self),
                    };
                    return Ok(Response::from_parts(parts, Body::new(body)));
                }
                Exchanged::Failed(mut error) => match error.take_message() {
                    // Handed back unsent by a pooled connection that had
                    // closed: another connection gets it.
                    Some(unsent) if reused => request = unsent,
                    // A new connection that closed before sending.
                    Some(_) => {
                        return Err(SendError::Connect((*error).into_error().into()));
                    }
                    None => return Err(SendError::Failed((*error).into_error().into())),
                },
            }
        }
    }

    /// The newest idle connection young enough to use, closing those
    /// idle too long (the oldest are at the bottom of the list).
    fn checkout(&self, now: Instant) -> Option<Box<Pooled>> {
        let young =
            |pooled: &Pooled| now.saturating_duration_since(pooled.idle_since) < self.idle_timeout;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if !young(idle.first()?) {
            idle.retain(|pooled| young(pooled));
        }
        idle.pop()
    }

    /// Puts a connection ready for another request back, unless the pool
    /// is full (then it closes).
    fn give_back(self: &Arc<Self>, mut pooled: Box<Pooled>) {
        pooled.idle_since = Instant::now();
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < self.max_idle {
                idle.push(pooled);
            }
        }
        // Started from within a runtime only (an answer's body may be
        // dropped outside one); until then the checkout closes what ended.
        if !self.sweeping.load(Ordering::Relaxed)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !self.sweeping.swap(true, Ordering::AcqRel)
        {
            runtime.spawn(sweep(Arc::downgrade(self)));
        }
    }

    /// Closes the idle connections the upstream closed or that were idle
    /// too long; returns how many.
    fn close_ended(&self, now: Instant) -> usize {
        let mut quiet = Context::from_waker(Waker::noop());
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let before = idle.len();
        idle.retain_mut(|pooled| {
            now.saturating_duration_since(pooled.idle_since) < self.idle_timeout
                && Pin::new(&mut pooled.connection)
                    .poll(&mut quiet)
                    .is_pending()
        });
        before - idle.len()
    }

    /// How many connections are idle in the pool.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Opens a connection and makes the HTTP/1.1 handshake (which sends
    /// nothing).
    async fn connect(&self) -> Result<Box<Pooled>, SendError> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Err(SendError::Connect(error.into())),
                Err(_) => return Err(SendError::Connect("connect timeout".into())),
            };
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| SendError::Connect(error.into()))?;
        Ok(Box::new(Pooled {
            sender,
            connection,
            idle_since: Instant::now(),
            deadline: Box::pin(tokio::time::sleep(self.timeout)),
        }))
    }
}

/// Sweeps `pool`'s idle connections every [`SWEEP_EVERY`] until the pool
/// is dropped.
async fn sweep(pool: Weak<Http1Pool>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let closed = pool.close_ended(Instant::now());
        if closed > 0 {
            tracing::debug!(closed, "closed idle upstream connections");
        }
    }
}

/// Sends `request` on `pooled`, polling its connection until the answer's
/// head arrives or `deadline` passes; the connection comes back with the
/// answer unless it ended.
async fn exchange(
    mut pooled: Box<Pooled>,
    request: Request<Body>,
    deadline: tokio::time::Instant,
) -> Exchanged {
    pooled.deadline.as_mut().reset(deadline);
    let mut answer = std::pin::pin!(pooled.sender.try_send_request(request));
    let mut pooled = Some(pooled);
    let mut first = true;
    std::future::poll_fn(move |cx| {
        // The answer comes only from the connection, polled here, so it is
        // polled with a waker that does nothing. Once woken, the
        // connection too is polled quietly first: the turn that brings the
        // answer's head usually hands the body's data over as well, and a
        // waker it kept would be woken when the body is read, a needless
        // second turn of the task. Only a turn that brings nothing is
        // repeated with the real waker, to be woken by the socket or the
        // deadline.
        let mut quiet = Context::from_waker(Waker::noop());
        if !std::mem::take(&mut first) {
            turn(&mut pooled, &mut quiet);
            if let Poll::Ready(answer) = answer.as_mut().poll(&mut quiet) {
                return Poll::Ready(exchanged(answer, pooled.take()));
            }
        }
        turn(&mut pooled, cx);
        if let Poll::Ready(answer) = answer.as_mut().poll(&mut quiet) {
            return Poll::Ready(exchanged(answer, pooled.take()));
        }
        match pooled.as_mut() {
            Some(connection) => match connection.deadline.as_mut().poll(cx) {
                // Dropping the connection abandons the request on it.
                Poll::Ready(()) => Poll::Ready(Exchanged::TimedOut),
                Poll::Pending => Poll::Pending,
            },
            // Cannot happen (a dropped connection answers every request
            // it held); wait on the real waker to be safe.
            None => match answer.as_mut().poll(cx) {
                Poll::Ready(answer) => Poll::Ready(exchanged(answer, None)),
                Poll::Pending => Poll::Pending,
            },
        }
    })
    .await
}

/// Polls the connection once, dropping it when it has ended (which hands
/// back a request still queued on it).
fn turn(pooled: &mut Option<Box<Pooled>>, cx: &mut Context<'_>) {
    if let Some(connection) = pooled.as_mut()
        && Pin::new(&mut connection.connection).poll(cx).is_ready()
    {
        *pooled = None;
    }
}

/// How an exchange ended.
enum Exchanged {
    /// The answer's head, and the connection to read its body from
    /// (`None` if it ended).
    Answer(Response<Incoming>, Option<Box<Pooled>>),
    /// The failure (boxed: it carries the request, and only failures pay
    /// for it).
    Failed(Box<TrySendError<Request<Body>>>),
    /// No head in time.
    TimedOut,
}

fn exchanged(
    answer: Result<Response<Incoming>, TrySendError<Request<Body>>>,
    pooled: Option<Box<Pooled>>,
) -> Exchanged {
    match answer {
        Ok(answer) => Exchanged::Answer(answer, pooled),
        Err(error) => Exchanged::Failed(Box::new(error)),
    }
}

/// An upstream answer's body, driving its connection while it is read and
/// returning it to the pool at its end.
pub(crate) struct PooledBody {
    inner: Incoming,
    /// `None` once the connection ended or went back to the pool.
    pooled: Option<Box<Pooled>>,
    pool: Arc<Http1Pool>,
}

impl PooledBody {
    /// Returns the connection to the pool once the answer has ended, if it
    /// is ready for another request.
    fn finish(&mut self) {
        let Some(mut pooled) = self.pooled.take() else {
            return;
        };
        // One more turn lets the connection settle into its idle state.
        let mut quiet = Context::from_waker(Waker::noop());
        if Pin::new(&mut pooled.connection)
            .poll(&mut quiet)
            .is_pending()
            && pooled.sender.is_ready()
        {
            self.pool.give_back(pooled);
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        // The data arrive only from the connection, polled here: as in
        // `exchange`, quietly first, and with the real waker only when
        // that brought nothing.
        let mut quiet = Context::from_waker(Waker::noop());
        let mut frame = Pin::new(&mut this.inner).poll_frame(&mut quiet);
        if frame.is_pending() {
            turn(&mut this.pooled, &mut quiet);
            frame = Pin::new(&mut this.inner).poll_frame(&mut quiet);
        }
        if frame.is_pending() {
            turn(&mut this.pooled, cx);
            frame = Pin::new(&mut this.inner).poll_frame(cx);
        }
        match &frame {
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.finish(),
            Poll::Ready(Some(Err(_))) => this.pooled = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // An answer read to its end whose reader did not ask for the end.
        if self.inner.is_end_stream() {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An upstream on a free port that answers one request on one
    /// connection with keep-alive, then, if `close_after` is given, closes
    /// the connection that long after.
    async fn upstream(close_after: Option<Duration>) -> Authority {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0_u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let read = socket.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the request ended early");
                request.extend_from_slice(&buffer[..read]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            match close_after {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        });
        Authority::try_from(address.to_string()).unwrap()
    }

    fn pool(authority: &Authority) -> Arc<Http1Pool> {
        Arc::new(Http1Pool::new(
            authority,
            8,
            Duration::from_secs(60),
            Duration::from_secs(2),
            Duration::from_secs(5),
        ))
    }

    /// Sends one request and reads its answer to the end (which returns
    /// the connection to the pool).
    async fn exchange_once(pool: &Arc<Http1Pool>, authority: &Authority) {
        let request = Request::get("/")
            .header(http::header::HOST, authority.as_str())
            .body(Body::empty())
            .unwrap();
        let answer = pool.send(request, Instant::now()).await.unwrap();
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
    }

    #[tokio::test]
    async fn the_sweep_closes_an_idle_connection_the_upstream_closed() {
        let authority = upstream(Some(Duration::from_millis(100))).await;
        let pool = pool(&authority);
        exchange_once(&pool, &authority).await;
        assert_eq!(pool.idle_count(), 1, "the connection was kept alive");
        tokio::time::sleep(SWEEP_EVERY * 2 + Duration::from_millis(300)).await;
        assert_eq!(
            pool.idle_count(),
            0,
            "the connection the upstream closed is no longer pooled (not left in CLOSE_WAIT)"
        );
    }

    #[tokio::test]
    async fn the_sweep_keeps_an_idle_connection_that_is_still_open() {
        let authority = upstream(None).await;
        let pool = pool(&authority);
        exchange_once(&pool, &authority).await;
        tokio::time::sleep(SWEEP_EVERY * 2 + Duration::from_millis(300)).await;
        assert_eq!(pool.idle_count(), 1, "an open connection stays pooled");
    }
}

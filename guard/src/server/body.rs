//! The request-body deadline: [`BodyTimeoutLayer`] gives each request's
//! body a time to arrive in; a route that reads a body past it gets an
//! error, and the client a 408 `body-timeout` problem.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use tower::{Layer, Service};

use crate::problem::types;
use crate::response::BoxError;

/// A request body that fails once its deadline passes, and says so.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

/// The error of a body whose deadline passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within its deadline")]
struct BodyDeadline;

impl DeadlineBody {
    /// `inner` with `within` to arrive; `expired` is set when it does not.
    fn new(inner: Body, within: Duration, expired: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(within)),
            expired,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyDeadline))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The answer to a request whose body did not arrive in time: 408
/// `body-timeout`, and the connection closes (HTTP/1.1).
pub fn body_timeout_response() -> Response<Body> {
    types::BODY_TIMEOUT
        .problem("The request body did not arrive in time; nothing was run.")
        .into_response()
}

/// A layer that gives every request body `within` to arrive, counted from
/// when the request reaches the layer (its head was read). A route that
/// reads the body past it gets an error from the body, and the client gets
/// 408 `body-timeout` (problem+json) instead of the route's answer.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use idempotency_guard::server::BodyTimeoutLayer;
///
/// let app: Router = Router::new()
///     .route("/payments", post(|body: String| async move { body }))
///     .layer(BodyTimeoutLayer::new(Duration::from_secs(30)));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeoutLayer {
    within: Duration,
}

impl BodyTimeoutLayer {
    /// A deadline of `within` for each request body.
    pub fn new(within: Duration) -> Self {
        Self { within }
    }
}

impl<S> Layer<S> for BodyTimeoutLayer {
    type Service = BodyTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyTimeout {
            inner,
            within: self.within,
        }
    }
}

/// The service of [`BodyTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct BodyTimeout<S> {
    inner: S,
    within: Duration,
}

impl<S, B, R> Service<Request<B>> for BodyTimeout<S>
where
    S: Service<Request<Body>, Response = Response<R>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BodyTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let expired = Arc::new(AtomicBool::new(false));
        let (within, flag) = (self.within, Arc::clone(&expired));
        let request =
            request.map(move |body| Body::new(DeadlineBody::new(Body::new(body), within, flag)));
        BodyTimeoutFuture {
            inner: self.inner.call(request),
            expired,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`BodyTimeout`].
    pub struct BodyTimeoutFuture<F> {
        #[pin]
        inner: F,
        expired: Arc<AtomicBool>,
    }
}

impl<F> std::fmt::Debug for BodyTimeoutFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyTimeoutFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for BodyTimeoutFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        if this.expired.load(Ordering::Acquire) {
            return Poll::Ready(Ok(body_timeout_response()));
        }
        Poll::Ready(Ok(response.map(Body::new)))
    }
}

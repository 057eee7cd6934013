//! [`ResponseFuture`]: the future [`IdempotencyService`](super::IdempotencyService)
//! answers with, one boxed future per request (the guarded path awaits the
//! store, the engine and the route, so it cannot be named).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use http::Response;

/// The response future of [`IdempotencyService`](super::IdempotencyService).
pub struct ResponseFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

impl<E> ResponseFuture<E> {
    /// Wraps the boxed future of one request.
    pub(super) fn new(
        inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
    ) -> Self {
        Self { inner }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

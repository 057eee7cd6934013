//! [`WebhookService`]: reads a delivery's body (under the layer's limit,
//! with the guard's own body reader), verifies it, and hands the key on as
//! the `Idempotency-Key` of the guard behind.

use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::IntoResponse;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use idempotency_guard::IDEMPOTENCY_KEY;
use idempotency_guard::adapter::{BodyReadError, read_body};

use super::{WebhookLayer, WebhookRejection};

impl<I> tower::Layer<I> for WebhookLayer {
    type Service = WebhookService<I>;

    fn layer(&self, inner: I) -> Self::Service {
        WebhookService {
            layer: self.clone(),
            inner,
        }
    }
}

/// The service of [`WebhookLayer`].
#[derive(Clone, Debug)]
pub struct WebhookService<I> {
    layer: WebhookLayer,
    inner: I,
}

/// The future of [`WebhookService`].
pub struct ResponseFuture<E>(BoxFuture<'static, Result<Response<Body>, E>>);

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<E> std::future::Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<I> tower::Service<Request<Body>> for WebhookService<I>
where
    I: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let layer = self.layer.clone();
        // The ready clone serves this request; a fresh clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture(Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            // A declared length over the limit is refused before any byte
            // is read; a body that breaks off before its end is unreadable
            // (the sender's connection failed: it retries), not too large.
            let body = match read_body(body, &parts.headers, layer.body_limit(), None).await {
                Ok((body, _)) => body,
                Err(BodyReadError::TooLarge { .. }) => {
                    return Ok(WebhookRejection::BodyTooLarge.into_response());
                }
                // No budget is given, so the buffer is never full.
                Err(_) => return Ok(WebhookRejection::BodyUnreadable.into_response()),
            };
            let id = match layer.verify(&parts.headers, &body) {
                Ok(id) => id,
                Err(rejection) => {
                    tracing::warn!(rejection = ?rejection, "webhook delivery refused before anything was stored");
                    return Ok(rejection.into_response());
                }
            };
            // The delivery id is the key; a key the sender set is not trusted.
            parts.headers.remove(&IDEMPOTENCY_KEY);
            match HeaderValue::from_str(&id) {
                Ok(value) => {
                    parts.headers.insert(IDEMPOTENCY_KEY.clone(), value);
                }
                Err(_) => return Ok(WebhookRejection::IdMissing.into_response()),
            }
            inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await
        }))
    }
}

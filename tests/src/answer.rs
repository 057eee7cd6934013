//! Sending a request to a router and reading the whole answer.

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// Sends `request` through `router` (no socket) and reads the answer.
///
/// # Panics
///
/// When the body cannot be read.
pub async fn call(router: &Router, request: Request<Body>) -> Answer {
    let response = match router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    Answer::read(response).await
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// Reads a response whole.
    ///
    /// # Panics
    ///
    /// When the body fails.
    pub async fn read(response: Response<Body>) -> Self {
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .expect("the body is readable")
            .to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The body as JSON.
    ///
    /// # Panics
    ///
    /// When the body is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem's name (after `urn:idempotency:`), after checking that
    /// the answer is a well-formed problem: its content type, and `status`,
    /// `title` and `detail` members.
    ///
    /// # Panics
    ///
    /// When the answer is not such a problem.
    pub fn problem(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "not a problem: {} {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        let json = self.json();
        assert_eq!(json["status"], self.status.as_u16(), "problem status");
        assert!(
            json["title"].is_string() && json["detail"].is_string(),
            "title and detail"
        );
        json["type"]
            .as_str()
            .and_then(|t| t.strip_prefix("urn:idempotency:"))
            .unwrap_or_else(|| panic!("problem type: {json}"))
            .to_owned()
    }

    /// A header as text.
    ///
    /// # Panics
    ///
    /// When the header is not visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("a text header"))
    }

    /// Whether the answer is a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

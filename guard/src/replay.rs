//! Per-route replay policy: what of a handler's response is kept for
//! replay, so that a response that mints a secret (an API key, a session
//! token, a card number) does not sit in the store for the whole retention
//! and go back to anyone who replays its key.
//!
//! A [`ReplayPolicy`] is pure: [`ReplayPolicy::prepare_for_storage`] turns
//! the response the first caller got into what the store keeps (call it
//! before `Store::complete`), and [`ReplayPolicy::replay`] turns a stored
//! response into the replay (call it instead of the plain replay). The
//! first caller always gets the handler's response untouched.
//!
//! Three tools, from the strongest:
//!
//! - **Store status only** ([`ReplayPolicy::status_only`]): the stored
//!   response keeps its status and nothing else; a replay answers that
//!   status with a problem body `urn:idempotency:response-not-replayable`
//!   saying the request ran but its response is not kept. Use it on **secret-minting endpoints** (create an API key, issue
//!   a token, reveal a card number): a retry learns that the request ran and
//!   with which status, never the secret, and the client fetches what it
//!   may see through the resource's own, authorized endpoint.
//! - **A header allow-list** ([`ReplayPolicy::with_replayed_headers`]): only
//!   the named headers are stored and replayed (`Content-Type` always is).
//!   Use it where headers carry credentials (`Authorization`-like tokens,
//!   signed URLs in `Location`) but the body may be replayed.
//! - **JSON field redaction** ([`ReplayPolicy::with_redacted_fields`], JSON
//!   pointers with `*` for every element, or [`ReplayPolicy::with_redaction`],
//!   a function): the named fields' values are replaced by `"[redacted]"`
//!   before storage. Use it when the response is mostly replayable and the
//!   secret sits in known fields (`/api_key`, `/cards/*/number`). A body
//!   that cannot be redacted (not JSON, or invalid JSON) is stored as
//!   status only: the policy fails closed. A redacted replay is not the
//!   original bytes; an unchanged one is.
//!
//! Encryption at rest protects a stored secret from whoever reads the
//! store; only these policies protect it from whoever replays the key.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};

use crate::problem::types;
use crate::record::StoredResponse;
use axum::response::IntoResponse;

/// The stored header that marks a status-only response (a store keeps it
/// with the record, so a replay knows even if the route's policy changed
/// since): `idempotency-stored: status-only`.
pub(crate) static STATUS_ONLY_MARKER: HeaderName = HeaderName::from_static("idempotency-stored");

/// The value of [`STATUS_ONLY_MARKER`].
const STATUS_ONLY: &str = "status-only";

/// What replaces a redacted JSON value.
pub(crate) const REDACTED: &str = "[redacted]";

/// A function that redacts a JSON body in place before it is stored.
pub type RedactFn = Arc<dyn Fn(&mut serde_json::Value) + Send + Sync>;

/// What of a route's responses is stored for replay. The default value
/// stores everything (the status, the headers the layer keeps, the body).
#[derive(Clone, Default)]
pub struct ReplayPolicy {
    status_only: bool,
    replayed_headers: Option<Vec<HeaderName>>,
    redacted_fields: Vec<String>,
    redaction: Option<RedactFn>,
}

impl std::fmt::Debug for ReplayPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayPolicy")
            .field("status_only", &self.status_only)
            .field("replayed_headers", &self.replayed_headers)
            .field("redacted_fields", &self.redacted_fields)
            .field("redaction", &self.redaction.as_ref().map(|_| "fn"))
            .finish()
    }
}

impl ReplayPolicy {
    /// Stores and replays everything (the status, the headers the layer
    /// keeps, the body): the guard's behaviour without a policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores the status only; a replay answers that status with a
    /// `response-not-replayable` problem. For secret-minting endpoints.
    ///
    /// ```
    /// use idempotency_guard::ReplayPolicy;
    /// let policy = ReplayPolicy::status_only();
    /// assert!(policy.is_status_only());
    /// ```
    pub fn status_only() -> Self {
        Self {
            status_only: true,
            ..Self::default()
        }
    }

    /// Whether the policy stores the status only.
    pub fn is_status_only(&self) -> bool {
        self.status_only
    }

    /// Stores and replays only these headers (`Content-Type` always, as it
    /// describes the body). The default value keeps every header the layer
    /// stores.
    ///
    /// ```
    /// use idempotency_guard::ReplayPolicy;
    /// use http::header;
    /// let policy = ReplayPolicy::new().with_replayed_headers([header::LOCATION]);
    /// ```
    pub fn with_replayed_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replayed_headers = Some(names.into_iter().collect());
        self
    }

    /// Replaces the values at these JSON pointers (RFC 6901; a `*` segment
    /// matches every element of an array or member of an object) with
    /// `"[redacted]"` before the body is stored. The default value redacts
    /// nothing.
    ///
    /// ```
    /// use idempotency_guard::ReplayPolicy;
    /// let policy = ReplayPolicy::new().with_redacted_fields(["/api_key", "/cards/*/number"]);
    /// ```
    pub fn with_redacted_fields(
        mut self,
        pointers: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.redacted_fields = pointers.into_iter().map(Into::into).collect();
        self
    }

    /// Runs `redact` on the JSON body before it is stored (after the
    /// pointers of [`ReplayPolicy::with_redacted_fields`]). The default value
    /// has no function.
    ///
    /// ```
    /// use idempotency_guard::ReplayPolicy;
    /// let policy = ReplayPolicy::new().with_redaction(|body| {
    ///     if let Some(token) = body.get_mut("token") {
    ///         *token = serde_json::Value::Null;
    ///     }
    /// });
    /// ```
    pub fn with_redaction(
        mut self,
        redact: impl Fn(&mut serde_json::Value) + Send + Sync + 'static,
    ) -> Self {
        self.redaction = Some(Arc::new(redact));
        self
    }

    fn redacts(&self) -> bool {
        !self.redacted_fields.is_empty() || self.redaction.is_some()
    }

    fn keeps_header(&self, name: &HeaderName) -> bool {
        match &self.replayed_headers {
            None => true,
            Some(allowed) => name == header::CONTENT_TYPE || allowed.contains(name),
        }
    }

    /// What the store keeps of `response` (call it on the response the
    /// layer captured, before `Store::complete`): the status only, or the
    /// allowed headers and the body with its fields redacted.
    pub fn prepare_for_storage(&self, response: StoredResponse) -> StoredResponse {
        if self.status_only {
            return status_only(response.status);
        }
        // The default policy keeps every header: the map is kept as it is,
        // not copied.
        let mut headers = response.headers;
        headers.retain_allowed(self);
        let body = match response.body {
            Some(body) if self.redacts() && !body.is_empty() => match self.redact(&body) {
                Redacted::Unchanged => Some(body),
                Redacted::Changed(redacted) => {
                    // The stored length would be stale.
                    headers.remove(header::CONTENT_LENGTH);
                    Some(redacted)
                }
                // Fail closed: what cannot be redacted is not stored.
                Redacted::NotJson => return status_only(response.status),
            },
            body => body,
        };
        StoredResponse {
            status: response.status,
            headers,
            body,
        }
    }

    fn redact(&self, body: &Bytes) -> Redacted {
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) else {
            return Redacted::NotJson;
        };
        let mut changed = false;
        for pointer in &self.redacted_fields {
            changed |= redact_pointer(&mut value, pointer);
        }
        if let Some(redaction) = &self.redaction {
            let before = value.clone();
            redaction(&mut value);
            changed |= value != before;
        }
        if !changed {
            return Redacted::Unchanged;
        }
        match serde_json::to_vec(&value) {
            Ok(bytes) => Redacted::Changed(Bytes::from(bytes)),
            Err(_) => Redacted::NotJson,
        }
    }

    /// The replay of a stored response (call it instead of the plain
    /// replay, with the key the request named): a status-only response
    /// answers its status with a `response-not-replayable` problem; any
    /// other answers its stored status, allowed headers and body. Either
    /// carries `Idempotent-Replayed: true`.
    ///
    /// A response stored as status only is replayed as such whatever this
    /// policy says (the marker is in the record); a stored body is replayed
    /// as stored (redaction happens at storage, never at replay).
    pub fn replay(&self, stored: &StoredResponse, key: &str) -> Response<Body> {
        self.replay_owned(stored.clone(), key)
    }

    /// [`ReplayPolicy::replay`] of a stored response the caller owns: its
    /// headers and body become the answer's, uncopied.
    pub(crate) fn replay_owned(&self, stored: StoredResponse, key: &str) -> Response<Body> {
        let mut response = if is_status_only(&stored) {
            not_replayable(stored.status, key)
        } else {
            let mut headers = stored.headers;
            headers.retain_allowed(self);
            let mut response = Response::new(Body::from(stored.body.unwrap_or_default()));
            *response.status_mut() = stored.status;
            *response.headers_mut() = headers;
            response
        };
        response.headers_mut().insert(
            crate::response::IDEMPOTENT_REPLAYED.clone(),
            HeaderValue::from_static("true"),
        );
        response
    }
}

/// Whether `stored` was stored as status only.
pub(crate) fn is_status_only(stored: &StoredResponse) -> bool {
    stored
        .headers
        .get(&STATUS_ONLY_MARKER)
        .is_some_and(|v| v == STATUS_ONLY)
}

fn status_only(status: StatusCode) -> StoredResponse {
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(
        STATUS_ONLY_MARKER.clone(),
        HeaderValue::from_static(STATUS_ONLY),
    );
    StoredResponse {
        status,
        headers,
        body: Some(Bytes::new()),
    }
}

/// The replay of a status-only response: the stored status, and a
/// `response-not-replayable` problem body (none for the statuses that
/// cannot carry one: 204, 205, 304).
///
/// ```json
/// {"type": "urn:idempotency:response-not-replayable",
///  "title": "Response not replayable", "status": 201,
///  "detail": "The request with this key already ran and answered 201. ...",
///  "key": "order-1"}
/// ```
pub(crate) fn not_replayable(status: StatusCode, key: &str) -> Response<Body> {
    if matches!(status.as_u16(), 204 | 205 | 304) {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = status;
        return response;
    }
    let detail = format!(
        "The request with this key already ran and answered {}. Its response is not kept for replay \
         (this route stores the status only, as it may hold secrets): read the resource through its \
         own endpoint instead of resending.",
        status.as_u16()
    );
    types::RESPONSE_NOT_REPLAYABLE
        .problem(detail)
        .with_status(status)
        .with("key", key)
        .into_response()
}

enum Redacted {
    Unchanged,
    Changed(Bytes),
    NotJson,
}

trait RetainAllowed {
    fn retain_allowed(&mut self, policy: &ReplayPolicy);
}

impl RetainAllowed for HeaderMap {
    fn retain_allowed(&mut self, policy: &ReplayPolicy) {
        if policy.replayed_headers.is_none() {
            return;
        }
        let mut kept = HeaderMap::with_capacity(self.len());
        for (name, value) in self.iter() {
            if policy.keeps_header(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        *self = kept;
    }
}

/// Replaces the value(s) at `pointer` with [`REDACTED`]; `*` matches every
/// element or member. Returns whether anything was replaced. A pointer that
/// is not `""` or does not start with `/` matches nothing.
fn redact_pointer(value: &mut serde_json::Value, pointer: &str) -> bool {
    if pointer.is_empty() {
        *value = serde_json::Value::String(REDACTED.to_owned());
        return true;
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    let segments: Vec<String> = rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    redact_segments(value, &segments)
}

fn redact_segments(value: &mut serde_json::Value, segments: &[String]) -> bool {
    let Some((first, rest)) = segments.split_first() else {
        *value = serde_json::Value::String(REDACTED.to_owned());
        return true;
    };
    let mut changed = false;
    match value {
        serde_json::Value::Object(map) if first == "*" => {
            for child in map.values_mut() {
                changed |= redact_segments(child, rest);
            }
        }
        serde_json::Value::Object(map) => {
            if let Some(child) = map.get_mut(first) {
                changed |= redact_segments(child, rest);
            }
        }
        serde_json::Value::Array(items) if first == "*" => {
            for child in items {
                changed |= redact_segments(child, rest);
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(child) = first.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                changed |= redact_segments(child, rest);
            }
        }
        _ => {}
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const SECRET: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

    fn minted() -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::LOCATION, HeaderValue::from_static("/keys/7"));
        headers.insert("x-api-key", HeaderValue::from_static(SECRET));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        let body = format!(
            r#"{{"id":7,"api_key":"{SECRET}","cards":[{{"number":"4242424242424242","last4":"4242"}},{{"number":"5555555555554444","last4":"4444"}}]}}"#
        );
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body: Some(Bytes::from(body)),
        }
    }

    async fn body_of(response: Response<Body>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
    }

    #[tokio::test]
    async fn status_only_stores_no_body_or_header_and_replays_a_problem() {
        let policy = ReplayPolicy::status_only();
        let stored = policy.prepare_for_storage(minted());
        assert_eq!(stored.status, StatusCode::CREATED);
        assert_eq!(stored.body.as_deref(), Some(&b""[..]));
        assert!(is_status_only(&stored));
        assert_eq!(stored.headers.len(), 1, "only the marker");
        assert!(!contains(&stored.encode_headers(), SECRET));

        let replay = policy.replay(&stored, "order-1");
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(
            replay.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert!(replay.headers().get(header::LOCATION).is_none());
        let body = body_of(replay).await;
        assert!(!contains(&body, SECRET), "the secret is never replayed");
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["type"], "urn:idempotency:response-not-replayable");
        assert_eq!(problem["status"], 201);
        assert_eq!(problem["key"], "order-1");
    }

    #[tokio::test]
    async fn a_status_only_record_stays_so_whatever_the_policy_at_replay() {
        let stored = ReplayPolicy::status_only().prepare_for_storage(minted());
        let replay = ReplayPolicy::new().replay(&stored, "k");
        assert_eq!(replay.status(), StatusCode::CREATED);
        let body = body_of(replay).await;
        assert!(contains(&body, types::RESPONSE_NOT_REPLAYABLE.name));
    }

    #[tokio::test]
    async fn statuses_without_a_body_replay_bare() {
        let mut response = minted();
        response.status = StatusCode::NO_CONTENT;
        let stored = ReplayPolicy::status_only().prepare_for_storage(response);
        let replay = ReplayPolicy::status_only().replay(&stored, "k");
        assert_eq!(replay.status(), StatusCode::NO_CONTENT);
        assert!(body_of(replay).await.is_empty());
    }

    #[tokio::test]
    async fn the_header_allow_list_keeps_only_named_headers_and_content_type() {
        let policy = ReplayPolicy::new().with_replayed_headers([header::LOCATION]);
        let stored = policy.prepare_for_storage(minted());
        let mut names: Vec<&str> = stored.headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "location"]);
        assert_eq!(stored.body, minted().body, "the body is untouched");

        // Records stored before the policy changed are filtered at replay.
        let replay = policy.replay(&minted(), "k");
        assert!(replay.headers().get("x-api-key").is_none());
        assert_eq!(replay.headers()[header::LOCATION], "/keys/7");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(body_of(replay).await, minted().body.unwrap());
    }

    #[tokio::test]
    async fn redaction_replaces_pointed_fields_and_runs_the_hook() {
        let policy = ReplayPolicy::new()
            .with_redacted_fields(["/api_key", "/cards/*/number", "/absent/field"])
            .with_redaction(|body| {
                if let Some(id) = body.get_mut("id") {
                    *id = serde_json::json!("hidden");
                }
            });
        let stored = policy.prepare_for_storage(minted());
        let body = stored.body.clone().unwrap();
        assert!(!contains(&body, SECRET));
        assert!(!contains(&body, "4242424242424242"));
        assert!(!contains(&body, "5555555555554444"));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["api_key"], REDACTED);
        assert_eq!(json["cards"][1]["number"], REDACTED);
        assert_eq!(json["cards"][1]["last4"], "4444", "other fields stay");
        assert_eq!(json["id"], "hidden");
        assert!(
            stored.headers.get(header::CONTENT_LENGTH).is_none(),
            "a stale length is not stored"
        );
        let replay = policy.replay(&stored, "k");
        assert_eq!(body_of(replay).await, body);
    }

    #[test]
    fn redaction_that_changes_nothing_keeps_the_bytes_and_bad_json_fails_closed() {
        let policy = ReplayPolicy::new().with_redacted_fields(["/nothing"]);
        let mut response = minted();
        response.body = Some(Bytes::from_static(b"{ \"a\" : 1 }"));
        let stored = policy.prepare_for_storage(response.clone());
        assert_eq!(stored.body, response.body, "byte for byte");
        assert!(stored.headers.get(header::CONTENT_LENGTH).is_some());

        response.body = Some(Bytes::from(format!("token={SECRET}")));
        let stored = policy.prepare_for_storage(response);
        assert!(
            is_status_only(&stored),
            "what cannot be redacted is not stored"
        );
        assert!(!contains(stored.body.as_deref().unwrap(), SECRET));
    }

    #[test]
    fn pointers_follow_rfc_6901_escapes_and_indexes() {
        let mut value = serde_json::json!({"a/b": 1, "m~n": 2, "list": [1, 2, 3]});
        assert!(redact_pointer(&mut value, "/a~1b"));
        assert!(redact_pointer(&mut value, "/m~0n"));
        assert!(redact_pointer(&mut value, "/list/1"));
        assert!(!redact_pointer(&mut value, "/list/9"));
        assert!(!redact_pointer(&mut value, "no-slash"));
        assert_eq!(
            value,
            serde_json::json!({"a/b": REDACTED, "m~n": REDACTED, "list": [1, REDACTED, 3]})
        );
    }

    #[tokio::test]
    async fn the_default_policy_stores_and_replays_everything() {
        let policy = ReplayPolicy::new();
        let stored = policy.prepare_for_storage(minted());
        assert_eq!(stored, minted());
        let replay = policy.replay(&stored, "k");
        assert_eq!(replay.headers()["x-api-key"], SECRET);
        assert_eq!(body_of(replay).await, minted().body.unwrap());
    }
}

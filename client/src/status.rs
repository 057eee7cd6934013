//! The key-status API: its wire types, and [`StatusClient`], which asks the
//! service whether a key already ran before a write is sent again.
//!
//! ```no_run
//! use idempotency_client::status::{Status, StatusClient};
//!
//! # async fn run() -> Result<(), idempotency_client::status::StatusError> {
//! let client = StatusClient::new("http://127.0.0.1:8080", "token-of-tenant-a");
//! match client.status("order-42").await? {
//!     Status::Ran(code) => println!("it ran ({code}): resend with the same key to get the stored response"),
//!     Status::RanNotStored(code) => println!("it ran ({code}), its answer too large to keep: reconcile"),
//!     Status::Running(wait) => println!("still running: ask again in {wait:?}"),
//!     Status::Unknown => println!("outcome unknown: reconcile before resending"),
//!     Status::NotFound => println!("it never ran: resending with the same key is safe"),
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The state of a key's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// A request holds the key and its handler is running.
    InFlight,
    /// The handler finished and its response is stored.
    Completed,
    /// The handler started but never finished: its outcome is unknown.
    Abandoned,
    /// The handler started and never finished, but its run resumes: the
    /// route keeps its request for the completer, which finishes it from
    /// its recorded steps (so does the client's retry). Ask again after
    /// `retry_after_seconds`; `steps` says how far it got.
    Resuming,
}

/// What a client that lost its answer should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Advice {
    /// It is running: ask again after `retry_after_seconds`.
    Wait,
    /// It ran: send the same request with the same key to get the stored
    /// response. Never send it with a new key.
    Replay,
    /// Its outcome is unknown (or its response was not stored): do not
    /// resend blindly; reconcile by other means first.
    Reconcile,
    /// No record: it never ran, or was released. Sending it again with the
    /// same key is safe.
    Retry,
}

/// What the service knows about one key (`GET /v1/keys/{key}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyStatus {
    /// The key.
    pub key: String,
    /// The record's state.
    pub state: KeyState,
    /// What to do next.
    pub advice: Advice,
    /// The fingerprint of the request that claimed the key, `sha256:<hex>`.
    /// Absent, like `method`, `path`, `created_at` and `expires_at`, while
    /// a single-commit run holds the key: nothing of it is committed yet,
    /// the service knows only that it runs (`in_flight`, `wait`).
    #[cfg_attr(feature = "openapi", schema(pattern = "^sha256:[0-9a-f]{64}$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The method of that request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The path and query of that request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The stored response's status (when completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// Whether the response body was stored for replay (when completed):
    /// `false` when it exceeded the stored-response limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_stored: Option<bool>,
    /// When the key was claimed (RFC 3339, UTC).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub created_at: Option<OffsetDateTime>,
    /// When the response was stored (when completed).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub completed_at: Option<OffsetDateTime>,
    /// When the record will be purged and the key freed (RFC 3339, UTC).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub expires_at: Option<OffsetDateTime>,
    /// How long to wait before asking again (when in flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Whether the query's `fingerprint` equals the record's (when the
    /// query gave one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_matches: Option<bool>,
    /// `true` in lookup results; absent in `GET /v1/keys/{key}` answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<bool>,
    /// The names of the steps its run recorded, in order (absent when it
    /// recorded none): the last is the step it reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<String>>,
}

/// The body of `POST /v1/keys/lookup`: 1 to 1000 keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LookupRequest {
    /// The keys to look up (1 to 1000), in the order results should come back.
    #[cfg_attr(feature = "openapi", schema(schema_with = key_list))]
    pub keys: Vec<String>,
}

/// The schema of a lookup's keys: 1 to 1000 keys of 1 to 255 visible ASCII
/// characters.
#[cfg(feature = "openapi")]
fn key_list() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(255))
        .pattern(Some("^[!-~]+$"));
    ArrayBuilder::new()
        .items(key)
        .min_items(Some(1))
        .max_items(Some(1000))
        .build()
}

/// The answer of `POST /v1/keys/lookup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LookupResponse {
    /// One result per requested key, in order.
    pub results: Vec<LookupResult>,
}

/// One key's result in a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum LookupResult {
    /// The key has a record (`"found": true`).
    Found(KeyStatus),
    /// The key has no record in this scope (`"found": false`).
    Missing(MissingKey),
}

/// A key without a record, in a lookup. Exactly `key` and `found`, so a
/// found result can never be read as a missing one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MissingKey {
    /// The key.
    pub key: String,
    /// Always `false`.
    pub found: bool,
}

/// A key's status, reduced to what a retrying caller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It ran and answered this status; the advice is [`Advice::Replay`].
    Ran(u16),
    /// It ran and answered this status, but the answer was too large to
    /// store: a resend gets 409 `response-not-stored`, never the answer;
    /// the advice is [`Advice::Reconcile`].
    RanNotStored(u16),
    /// It is running; ask again after this long.
    Running(Duration),
    /// It started and never finished: the outcome is unknown.
    Unknown,
    /// No record: it never ran (or was released); resending is safe.
    NotFound,
}

impl Status {
    /// The advice that goes with this status.
    pub fn advice(self) -> Advice {
        match self {
            Self::Ran(_) => Advice::Replay,
            Self::RanNotStored(_) => Advice::Reconcile,
            Self::Running(_) => Advice::Wait,
            Self::Unknown => Advice::Reconcile,
            Self::NotFound => Advice::Retry,
        }
    }
}

impl From<&KeyStatus> for Status {
    fn from(status: &KeyStatus) -> Self {
        match status.state {
            KeyState::Completed if status.response_stored == Some(false) => {
                Self::RanNotStored(status.response_status.unwrap_or(0))
            }
            KeyState::Completed => Self::Ran(status.response_status.unwrap_or(0)),
            KeyState::InFlight | KeyState::Resuming => {
                Self::Running(Duration::from_secs(status.retry_after_seconds.unwrap_or(1)))
            }
            KeyState::Abandoned => Self::Unknown,
        }
    }
}

/// Why a status request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The service could not be reached or did not answer in time.
    #[error("the status service could not be reached")]
    Transport(#[source] reqwest::Error),
    /// The token was refused (401).
    #[error("the status service refused the token")]
    Unauthorized,
    /// The service refused the request (400), for example an invalid key.
    #[error("the status service refused the request: {0}")]
    BadRequest(String),
    /// The service answered something else (its status and body).
    #[error("the status service answered {status}: {body}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// The body, as text.
        body: String,
    },
}

/// Everything but unreserved characters is percent-encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A client of the key-status service, for one scope (one token).
#[derive(Debug, Clone)]
pub struct StatusClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl StatusClient {
    /// A client of the service at `base_url` (for example
    /// `http://127.0.0.1:8080`) that authenticates with `token`, with a
    /// 2 s timeout per request.
    pub fn new(base_url: impl Into<String>, token: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        Self::with_http(http, base_url, token)
    }

    /// Like [`StatusClient::new`], over a `reqwest::Client` of your own.
    pub fn with_http(
        http: reqwest::Client,
        base_url: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            http,
            base: base_url.into().trim_end_matches('/').to_owned(),
            token: token.into(),
        }
    }

    /// Asks what became of `key`.
    ///
    /// # Errors
    ///
    /// See [`StatusError`].
    pub async fn status(&self, key: &str) -> Result<Status, StatusError> {
        Ok(self
            .details(key, None)
            .await?
            .as_ref()
            .map_or(Status::NotFound, Status::from))
    }

    /// Asks what became of `key`, with every field the service gives;
    /// `None` when the key has no record. With `fingerprint`, the answer
    /// says whether the record was made by the same request.
    ///
    /// # Errors
    ///
    /// See [`StatusError`].
    pub async fn details(
        &self,
        key: &str,
        fingerprint: Option<&str>,
    ) -> Result<Option<KeyStatus>, StatusError> {
        let mut url = format!(
            "{}/v1/keys/{}",
            self.base,
            utf8_percent_encode(key, SEGMENT)
        );
        if let Some(fingerprint) = fingerprint {
            url = format!(
                "{url}?fingerprint={}",
                utf8_percent_encode(fingerprint, SEGMENT)
            );
        }
        let request = self.http.get(url).bearer_auth(&self.token);
        let response = request.send().await.map_err(StatusError::Transport)?;
        match response.status().as_u16() {
            200 => response
                .json()
                .await
                .map(Some)
                .map_err(StatusError::Transport),
            404 => Ok(None),
            _ => Err(Self::failure(response).await),
        }
    }

    /// Looks up many keys at once (1 to 1000), for reconciliation.
    ///
    /// # Errors
    ///
    /// See [`StatusError`].
    pub async fn lookup(&self, keys: &[&str]) -> Result<Vec<LookupResult>, StatusError> {
        let body = LookupRequest {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        let response = self
            .http
            .post(format!("{}/v1/keys/lookup", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(StatusError::Transport)?;
        if response.status().as_u16() != 200 {
            return Err(Self::failure(response).await);
        }
        let answer: LookupResponse = response.json().await.map_err(StatusError::Transport)?;
        Ok(answer.results)
    }

    async fn failure(response: reqwest::Response) -> StatusError {
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        match status {
            401 => StatusError::Unauthorized,
            400 => StatusError::BadRequest(body),
            _ => StatusError::Unexpected { status, body },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_as_one_path_segment() {
        let encoded = utf8_percent_encode("a/b?c#d%e f", SEGMENT).to_string();
        assert_eq!(encoded, "a%2Fb%3Fc%23d%25e%20f");
    }

    #[test]
    fn lookup_results_tell_found_from_missing() {
        let json = r#"{"results":[
            {"key":"a","found":false},
            {"key":"b","found":true,"state":"completed","advice":"replay","fingerprint":"sha256:00",
             "method":"POST","path":"/p","response_status":201,"response_stored":true,
             "created_at":"2026-01-01T00:00:00Z","completed_at":"2026-01-01T00:00:01Z",
             "expires_at":"2026-01-02T00:00:00Z"}]}"#;
        let answer: LookupResponse = serde_json::from_str(json).unwrap();
        assert!(matches!(&answer.results[0], LookupResult::Missing(m) if m.key == "a" && !m.found));
        let LookupResult::Found(status) = &answer.results[1] else {
            panic!("b was found")
        };
        assert_eq!(Status::from(status), Status::Ran(201));
        assert_eq!(status.advice, Advice::Replay);
        // The same record whose answer was too large to store: reconcile,
        // as the service advises.
        let too_large = KeyStatus {
            response_stored: Some(false),
            advice: Advice::Reconcile,
            ..status.clone()
        };
        assert_eq!(Status::from(&too_large), Status::RanNotStored(201));
        assert_eq!(Status::from(&too_large).advice(), too_large.advice);
        // What is read is written back the same.
        let again: LookupResponse =
            serde_json::from_str(&serde_json::to_string(&answer).unwrap()).unwrap();
        assert_eq!(again, answer);
    }

    #[test]
    fn statuses_map_to_advice() {
        assert_eq!(Status::Ran(201).advice(), Advice::Replay);
        assert_eq!(Status::RanNotStored(201).advice(), Advice::Reconcile);
        assert_eq!(
            Status::Running(Duration::from_secs(1)).advice(),
            Advice::Wait
        );
        assert_eq!(Status::Unknown.advice(), Advice::Reconcile);
        assert_eq!(Status::NotFound.advice(), Advice::Retry);
    }
}

//! The admin API's extractors: each parses a part of the request into
//! typed values or refuses it with the admin problem (400 `bad-request`,
//! the detail saying what is wrong), so the handlers start from a
//! [`Scope`] and an [`IdempotencyKey`], never from strings to check.
//!
//! | extractor | from | yields |
//! |---|---|---|
//! | [`AdminTarget`] | the path `{scope}/{key}` | the scope and the key |
//! | [`Listing`] | the query of a listing or an export ([`KeysQuery`]) | the scope, its [`Filters`] and cursor |
//! | [`AdminQuery`] | any other query | the query type |

use axum::extract::{FromRequestParts, Path, Query};
use http::Uri;
use http::request::Parts;
use idempotency_guard::store::admin::UnknownStateFilter;
use idempotency_guard::{IdempotencyKey, Scope, ScopeError};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::problem::AdminProblem;
use super::query::{Filters, KeysQuery, StateParam};

/// The record an action is on: the path's `{scope}` and `{key}`, parsed.
#[derive(Debug, Clone)]
pub(crate) struct AdminTarget {
    /// The scope: 1 to 255 bytes, no control character.
    pub scope: Scope,
    /// The key: 1 to 255 visible ASCII characters.
    pub key: IdempotencyKey,
}

impl<S: Send + Sync> FromRequestParts<S> for AdminTarget {
    type Rejection = AdminProblem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminProblem> {
        let Path((scope, key)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
        Ok(Self {
            scope: scope_of(scope)?,
            key: IdempotencyKey::from_raw(&key)
                .map_err(|error| AdminProblem::BadRequest(format!("invalid key: {error}")))?,
        })
    }
}

/// What a listing or an export reads: its query's scope, filters and
/// cursor, parsed and checked (in that order).
#[derive(Debug, Clone)]
pub(crate) struct Listing {
    /// The scope to read.
    pub scope: Scope,
    /// The filters.
    pub filters: Filters,
    /// Only keys after this one (1 to 255 bytes, no control characters).
    pub after: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Listing {
    type Rejection = AdminProblem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, AdminProblem> {
        let query: KeysQuery = Query::try_from_uri(&parts.uri)
            .map(|Query(query)| query)
            .map_err(|rejection| {
                unknown_state(&parts.uri)
                    .unwrap_or_else(|| AdminProblem::BadRequest(rejection.body_text()))
            })?;
        let scope = scope_of(query.scope.clone())?;
        if let Some(after) = &query.after
            && (after.is_empty() || after.len() > 255 || after.chars().any(char::is_control))
        {
            return Err(AdminProblem::BadRequest(
                "after is the next of an earlier page: 1 to 255 bytes, no control characters"
                    .to_owned(),
            ));
        }
        Ok(Self {
            filters: Filters::of(&query)?,
            scope,
            after: query.after,
        })
    }
}

/// A query whose malformed fields answer the admin problem (400
/// `bad-request`, axum's words for what failed in the detail).
#[derive(Debug, Clone)]
pub(crate) struct AdminQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for AdminQuery<T> {
    type Rejection = AdminProblem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, AdminProblem> {
        Query::try_from_uri(&parts.uri)
            .map(|Query(query)| Self(query))
            .map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))
    }
}

/// A scope as the store can hold it: 1 to 255 bytes, no control character
/// (PostgreSQL refuses a NUL in text: checked here, it is a 400, not a
/// store failure).
fn scope_of(scope: String) -> Result<Scope, AdminProblem> {
    Scope::new(scope).map_err(|error| {
        AdminProblem::BadRequest(
            if error == ScopeError::ControlCharacter {
                "a scope has no control characters"
            } else {
                "a scope is 1 to 255 bytes"
            }
            .to_owned(),
        )
    })
}

/// The answer to an unknown `state`, when that is what failed: the state
/// filter's own words, as before the state was parsed by serde (whose
/// words, prefixed by the path of the field, would be another detail).
fn unknown_state(uri: &Uri) -> Option<AdminProblem> {
    /// The query's `state` alone.
    #[derive(Deserialize)]
    struct StateOnly {
        #[serde(rename = "state")]
        _state: Option<StateParam>,
    }
    Query::<StateOnly>::try_from_uri(uri)
        .is_err()
        .then(|| AdminProblem::BadRequest(UnknownStateFilter.to_string()))
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    /// Answers `GET uri` through a route that extracts `AdminTarget` (on
    /// `/t/{scope}/{key}`) or `Listing` (on `/l`): the status, the content
    /// type and the body.
    async fn answer(uri: &str) -> (StatusCode, String, String) {
        let router = Router::new()
            .route(
                "/t/{scope}/{key}",
                get(|target: AdminTarget| async move {
                    format!("{} {}", target.scope.as_str(), target.key.as_str())
                }),
            )
            .route(
                "/l",
                get(|listing: Listing| async move {
                    format!("{} {:?}", listing.scope.as_str(), listing.filters.state)
                }),
            );
        let response = router
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    /// The problem+json of a 400 `bad-request` with `detail`.
    fn bad_request(detail: &str) -> serde_json::Value {
        serde_json::to_value(
            idempotency_guard::problem::types::BAD_REQUEST.problem(detail.to_owned()),
        )
        .unwrap()
    }

    async fn refused(uri: &str, detail: &str) {
        let (status, content_type, body) = answer(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(content_type, "application/problem+json", "{uri}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body, bad_request(detail), "{uri}");
    }

    #[tokio::test]
    async fn a_target_is_a_scope_and_a_key() {
        let (status, _, body) = answer("/t/tenant%20a/pay-1").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "tenant a pay-1"));
    }

    #[tokio::test]
    async fn a_bad_scope_or_key_in_the_path_is_a_bad_request() {
        refused("/t/a%00b/pay-1", "a scope has no control characters").await;
        let long = "s".repeat(256);
        refused(&format!("/t/{long}/pay-1"), "a scope is 1 to 255 bytes").await;
        refused(
            "/t/tenant-a/pay%201",
            "invalid key: the idempotency key holds a character outside visible ASCII (0x21 to 0x7E)",
        )
        .await;
        let long = "k".repeat(256);
        refused(
            &format!("/t/tenant-a/{long}"),
            "invalid key: the idempotency key is longer than 255 characters",
        )
        .await;
    }

    #[tokio::test]
    async fn a_listing_parses_its_scope_state_and_cursor() {
        let (status, _, body) = answer("/l?scope=tenant-a&state=in_flight").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "tenant-a InFlight")
        );
        let (_, _, body) = answer("/l?scope=tenant-a").await;
        assert_eq!(body, "tenant-a Any");
        refused("/l?scope=a%00b", "a scope has no control characters").await;
        refused("/l?scope=", "a scope is 1 to 255 bytes").await;
        refused(
            "/l?scope=tenant-a&after=",
            "after is the next of an earlier page: 1 to 255 bytes, no control characters",
        )
        .await;
        refused(
            "/l?state=any",
            "Failed to deserialize query string: missing field `scope`",
        )
        .await;
    }

    /// An unknown state answers what it answered when `state` was a
    /// string checked after parsing.
    #[tokio::test]
    async fn an_unknown_state_is_the_same_bad_request_as_before() {
        for state in ["stuck", "Any", "in-flight", ""] {
            refused(
                &format!("/l?scope=tenant-a&state={state}"),
                "unknown state: expected any, in_flight, completed or abandoned",
            )
            .await;
        }
        refused(
            "/l?scope=tenant-a&needs_decision=maybe",
            "Failed to deserialize query string: needs_decision: provided string was not `true` or `false`",
        )
        .await;
    }
}

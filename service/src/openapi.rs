//! The OpenAPI 3.1 document, generated from the handlers and types.

use idempotency_client::status::{
    Advice, KeyState, KeyStatus, LookupRequest, LookupResponse, LookupResult, MissingKey,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::problem::Problem;
use crate::routes::{self, Health};

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Idempotency key-status service",
        description = "A client that timed out, got a 502/504 or lost its connection asks here whether its \
                       idempotency key already ran, before it retries. Every `/v1` endpoint needs a bearer \
                       token; each token belongs to one scope, and keys of other scopes look absent."
    ),
    paths(
        routes::get_key,
        routes::get_key_named_lookup,
        routes::lookup,
        routes::healthz,
        routes::readyz,
        routes::render_metrics,
        routes::openapi_json,
        crate::admin::list_keys,
        crate::admin::forget_key,
        crate::admin::release_key
    ),
    components(schemas(KeyStatus, KeyState, Advice, LookupRequest, LookupResponse, LookupResult, MissingKey, Problem, Health, crate::admin::AdminRecord, crate::admin::AdminPage, crate::admin::AdminAction)),
    modifiers(&BearerAuth),
    tags(
        (name = "keys", description = "What became of a key"),
        (name = "admin", description = "Operators: list a scope's records, forget or release one (admin tokens only)"),
        (name = "operations", description = "Health, readiness, metrics and this document")
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON text.
pub fn document() -> String {
    ApiDoc::openapi().to_json().unwrap_or_default()
}

//! The OpenAPI 3.1 document, generated from the handlers and types, and
//! the handler that serves it (`GET /openapi.json`).

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use idempotency_client::status::{
    Advice, KeyState, KeyStatus, LookupRequest, LookupResponse, LookupResult, MissingKey,
};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::{Modify, OpenApi};

use crate::admin::dto::{
    AdminAction, AdminBody, AdminDecision, AdminEvent, AdminHeader, AdminIdentity, AdminPage,
    AdminRecord, AdminRecordDetail, AdminResponse, AdminTrail, CompleterAccount,
};
use crate::admin::reconciled::Reconciliation;
use crate::admin::{export, handlers as admin, record, sign_in};
use crate::keys;
use crate::ops::{self, Health};
use crate::problem::Problem;

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
        keys::get_key,
        keys::get_key_named_lookup,
        keys::lookup,
        ops::healthz,
        ops::readyz,
        ops::render_metrics,
        openapi_json,
        admin::list_keys,
        admin::forget_key,
        admin::release_key,
        admin::give_up_key,
        export::export_keys,
        record::show_key,
        record::reconcile_key,
        record::key_decisions,
        record::whoami,
        sign_in::sign_in,
        sign_in::sign_out
    ),
    components(schemas(KeyStatus, KeyState, Advice, LookupRequest, LookupResponse, LookupResult, MissingKey, Problem, Health, AdminRecord, AdminPage, AdminAction, Reconciliation, AdminRecordDetail, AdminResponse, AdminHeader, AdminBody, AdminEvent, AdminIdentity, AdminDecision, AdminTrail, CompleterAccount)),
    modifiers(&BearerAuth),
    tags(
        (name = "keys", description = "What became of a key"),
        (name = "admin", description = "Operators: list a scope's records (those needing a decision first), show one and its decisions, forget, release or mark it reconciled (with a reason, kept in the audit trail), export as CSV (admin tokens only)"),
        (name = "operations", description = "Health, readiness, metrics and this document")
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme, and the console's session
/// cookie (`console_session`) as the other way into every admin endpoint
/// but the sign-in.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "console_session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                "idempotency-console",
                "The console's session (`POST /v1/admin/session`, when `CONSOLE=true`); its writes need the console's `Origin`",
            ))),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/admin/") {
                continue;
            }
            let signing_in = path == "/v1/admin/session";
            for (operation, is_post) in [
                (&mut item.get, false),
                (&mut item.post, true),
                (&mut item.delete, false),
            ] {
                if let Some(operation) = operation
                    && !(signing_in && is_post)
                {
                    operation
                        .security
                        .get_or_insert_with(Vec::new)
                        .push(SecurityRequirement::new(
                            "console_session",
                            Vec::<String>::new(),
                        ));
                }
            }
        }
    }
}

/// The document as JSON text.
pub(crate) fn document() -> String {
    ApiDoc::openapi().to_json().unwrap_or_default()
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object))
)]
pub(crate) async fn openapi_json() -> Response {
    let mut response = document().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

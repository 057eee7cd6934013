//! `GET /v1/admin/keys.csv`: a scope's records that pass the filters, as
//! CSV for finance, cut at [`EXPORT_MAX_ROWS`].

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use idempotency_guard::store::admin::MAX_PAGE;

use super::AdminState;
use super::audit::audited;
use super::dto::AdminRecord;
use super::extract::Listing;
use super::handlers::{Scanned, scan};
use super::problem::AdminProblem;
use super::query::KeysQuery;
use super::tokens::Admin;

/// The most rows one CSV export holds (`x-next-after` names where the
/// next one starts).
pub(crate) const EXPORT_MAX_ROWS: usize = 100_000;

/// One cell of a CSV line: quoted, quotes doubled, and a leading `=`,
/// `+`, `-`, `@`, tab or CR prefixed with `'` so that a spreadsheet does
/// not run it as a formula (a key or a path is client input).
fn csv_cell(value: &str) -> String {
    let guarded = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    format!("\"{}\"", guarded.replace('"', "\"\""))
}

/// The CSV columns, in order.
const CSV_COLUMNS: [&str; 15] = [
    "scope",
    "key",
    "state",
    "needs_decision",
    "method",
    "path",
    "fingerprint",
    "response_status",
    "created_at",
    "completed_at",
    "lease_expires_at",
    "expires_at",
    "reconciled_at",
    "reconciled_by",
    "reconcile_reason",
];

fn csv_line(record: &AdminRecord) -> String {
    let status = record
        .response_status
        .map(|s| s.to_string())
        .unwrap_or_default();
    let mark = record.reconciled.as_ref();
    let cells = [
        record.scope.as_str(),
        &record.key,
        &record.state,
        if record.needs_decision {
            "true"
        } else {
            "false"
        },
        &record.method,
        &record.path,
        &record.fingerprint,
        &status,
        &record.created_at,
        record.completed_at.as_deref().unwrap_or(""),
        &record.lease_expires_at,
        &record.expires_at,
        mark.map_or("", |m| m.at.as_str()),
        mark.map_or("", |m| m.by.as_str()),
        mark.map_or("", |m| m.reason.as_str()),
    ];
    let mut line = cells.map(csv_cell).join(",");
    line.push_str("\r\n");
    line
}

/// Exports a scope's records that pass the filters as CSV (RFC 4180, a
/// header line first): with `needs_decision=true`, the list finance needs
/// after an incident. At most [`EXPORT_MAX_ROWS`] rows; when more remain,
/// the `x-next-after` header names the `after` of the rest.
#[utoipa::path(
    get,
    path = "/v1/admin/keys.csv",
    tag = "admin",
    params(KeysQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The records as CSV, one line each after the header line", body = String, content_type = "text/csv",
            headers(("x-next-after" = String, description = "Present when the export was cut at its row limit: the `after` of the rest"))),
        (status = 400, description = "Invalid scope, filter or cursor", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn export_keys(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    Listing {
        scope,
        filters,
        after,
    }: Listing,
) -> Result<Response, AdminProblem> {
    audited(&admin, "export", scope.as_str(), "-", async {
        let mut text = CSV_COLUMNS.join(",");
        text.push_str("\r\n");
        let mut rows = 0;
        let mut cursor = after;
        loop {
            let room = u32::try_from(EXPORT_MAX_ROWS - rows)
                .unwrap_or(MAX_PAGE)
                .min(MAX_PAGE);
            let Scanned { records, next, .. } =
                scan(&state, &scope, &filters, cursor.as_deref(), room, 1).await?;
            rows += records.len();
            for record in &records {
                text.push_str(&csv_line(record));
            }
            cursor = next;
            if cursor.is_none() || rows >= EXPORT_MAX_ROWS {
                break;
            }
        }
        let mut response = (
            [
                (http::header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (
                    http::header::CONTENT_DISPOSITION,
                    "attachment; filename=\"keys.csv\"",
                ),
            ],
            text,
        )
            .into_response();
        if let Some(next) = cursor
            && let Ok(value) = http::HeaderValue::from_str(&next)
        {
            response.headers_mut().insert("x-next-after", value);
        }
        Ok((response, "ok"))
    })
    .await
}

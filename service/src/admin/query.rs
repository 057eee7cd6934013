//! The admin API's queries: the one query of a listing and an export
//! ([`KeysQuery`], a listing adding [`PageQuery`]), its `state` a
//! [`StateParam`], its filters checked into [`Filters`]; and the actions'
//! reasons.

use idempotency_guard::Record;
use idempotency_guard::store::admin::StateFilter;
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::IntoParams;

use super::dto::AdminRecord;
use super::problem::AdminProblem;

/// How many records a listing returns when `limit` is not given.
pub(crate) const DEFAULT_PAGE: u32 = 100;

/// The query of `GET /v1/admin/keys` and `GET /v1/admin/keys.csv`: the
/// scope, the filters and where to start (a listing adds its
/// [`PageQuery`]; an export returns every matching record, up to
/// [`EXPORT_MAX_ROWS`](super::export::EXPORT_MAX_ROWS)).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct KeysQuery {
    /// The scope to list or export (1 to 255 bytes, no control
    /// characters).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub scope: String,
    /// `any` (the default), `in_flight`, `completed` or `abandoned`.
    #[param(
        value_type = Option<String>,
        pattern = "^(any|in_flight|completed|abandoned)$"
    )]
    pub state: Option<StateParam>,
    /// `true`: only the records that need a decision (abandoned, not
    /// marked reconciled: finance's list); `false`: only the others.
    pub needs_decision: Option<bool>,
    /// Only records whose request had this method (`POST`).
    #[param(min_length = 1, max_length = 32, pattern = "^[!-~]+$")]
    pub method: Option<String>,
    /// Only records whose request's path (and query) starts with this
    /// (`/payments`).
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub path_prefix: Option<String>,
    /// Only records claimed at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_after: Option<String>,
    /// Only records claimed before this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_before: Option<String>,
    /// Only keys after this one: a listing's `next`, or the
    /// `x-next-after` header of a cut export (1 to 255 bytes, no control
    /// characters).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub after: Option<String>,
}

/// What a listing adds to [`KeysQuery`]: the size of its page.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// At most this many records (1 to 1000; default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// The `state` of a listing or an export: the names of
/// [`StateFilter`], as the admin API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StateParam {
    /// Every record (the default).
    #[default]
    Any,
    /// Records whose handler is running.
    InFlight,
    /// Records with a stored response.
    Completed,
    /// Records whose lease lapsed before their handler finished.
    Abandoned,
}

impl From<StateParam> for StateFilter {
    fn from(state: StateParam) -> Self {
        match state {
            StateParam::Any => Self::Any,
            StateParam::InFlight => Self::InFlight,
            StateParam::Completed => Self::Completed,
            StateParam::Abandoned => Self::Abandoned,
        }
    }
}

/// The query of `release` and `reconcile`: the operator's reason.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReasonQuery {
    /// Why the operator acts (required: 1 to 500 characters, no control
    /// characters; otherwise 422 `reason-required`): written to the audit
    /// line and the audit trail (and a reconcile's mark).
    #[param(
        required = true,
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub reason: Option<String>,
}

/// The query of `DELETE /v1/admin/keys/{scope}/{key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ForgetQuery {
    /// Also forget an abandoned record (lease lapsed, outcome unknown). A
    /// live lease is never overridden.
    pub force: Option<bool>,
    /// Why the operator acts (required: 1 to 500 characters, no control
    /// characters; otherwise 422 `reason-required`): written to the audit
    /// line and the audit trail.
    #[param(
        required = true,
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub reason: Option<String>,
}

/// The most characters a reason holds.
pub(crate) const MAX_REASON_CHARS: usize = 500;

/// An operator's reason for a state-changing call: required, 1 to 500
/// characters, no control characters (an audit line stays one line);
/// otherwise 422 `reason-required`.
pub(super) fn required_reason(reason: Option<&str>) -> Result<&str, AdminProblem> {
    let refused = |detail: &str| Err(AdminProblem::ReasonRequired(detail.to_owned()));
    match reason {
        None | Some("") => refused(
            "This call changes a record: say why with ?reason= (1 to 500 characters). It is kept in the audit trail.",
        ),
        Some(reason) if reason.chars().count() > MAX_REASON_CHARS => {
            refused("reason is at most 500 characters")
        }
        Some(reason) if reason.chars().any(char::is_control) => {
            refused("reason holds no control characters (no line breaks)")
        }
        Some(reason) => Ok(reason),
    }
}

fn parse_time(name: &str, value: Option<&str>) -> Result<Option<OffsetDateTime>, AdminProblem> {
    value
        .map(|value| {
            OffsetDateTime::parse(value, &Rfc3339).map_err(|_| {
                AdminProblem::BadRequest(format!(
                    "{name} is an RFC 3339 time (2026-01-31T12:00:00Z)"
                ))
            })
        })
        .transpose()
}

/// The filters of a listing or an export, checked.
#[derive(Debug, Clone)]
pub(crate) struct Filters {
    /// The state the store filters by.
    pub(super) state: StateFilter,
    /// No record can pass (`needs_decision=true` with a state other than
    /// `any` or `abandoned`).
    pub(super) nothing: bool,
    needs_decision: Option<bool>,
    method: Option<String>,
    path_prefix: Option<String>,
    created_after: Option<OffsetDateTime>,
    created_before: Option<OffsetDateTime>,
}

impl Filters {
    /// The filters of `query`, checked.
    pub(super) fn of(query: &KeysQuery) -> Result<Self, AdminProblem> {
        let mut state = StateFilter::from(query.state.unwrap_or_default());
        let needs_decision = query.needs_decision;
        let method = query.method.as_deref();
        let path_prefix = query.path_prefix.as_deref();
        // The records that need a decision are abandoned ones: with
        // another state, nothing passes both filters.
        let mut nothing = false;
        if needs_decision == Some(true) {
            match state {
                StateFilter::Any | StateFilter::Abandoned => state = StateFilter::Abandoned,
                StateFilter::InFlight | StateFilter::Completed => nothing = true,
            }
        }
        if let Some(method) = method
            && (method.is_empty()
                || method.len() > 32
                || !method.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(AdminProblem::BadRequest(
                "method is 1 to 32 printable ASCII characters".to_owned(),
            ));
        }
        if let Some(prefix) = path_prefix
            && (prefix.is_empty()
                || prefix.chars().count() > 1024
                || prefix.chars().any(char::is_control))
        {
            return Err(AdminProblem::BadRequest(
                "path_prefix is 1 to 1024 characters, no control characters".to_owned(),
            ));
        }
        Ok(Self {
            state,
            nothing,
            needs_decision,
            method: method.map(str::to_owned),
            path_prefix: path_prefix.map(str::to_owned),
            created_after: parse_time("created_after", query.created_after.as_deref())?,
            created_before: parse_time("created_before", query.created_before.as_deref())?,
        })
    }

    /// Whether `record` passes the filters the store does not apply.
    pub(super) fn accepts(&self, record: &AdminRecord, raw: &Record) -> bool {
        self.needs_decision
            .is_none_or(|needs| needs == record.needs_decision)
            && self
                .method
                .as_deref()
                .is_none_or(|method| raw.method.eq_ignore_ascii_case(method))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| raw.path.starts_with(prefix))
            && self.created_after.is_none_or(|at| raw.created_at >= at)
            && self.created_before.is_none_or(|at| raw.created_at < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_of(query: &str) -> Result<Option<StateParam>, String> {
        serde_json::from_value::<StateParam>(serde_json::Value::String(query.to_owned()))
            .map(Some)
            .map_err(|error| error.to_string())
    }

    /// The state reads the names it read as a string, each to the filter
    /// of the same name, and nothing else.
    #[test]
    fn the_state_reads_the_filters_names() {
        for filter in [
            StateFilter::Any,
            StateFilter::InFlight,
            StateFilter::Completed,
            StateFilter::Abandoned,
        ] {
            let state = state_of(filter.as_str()).unwrap().unwrap();
            assert_eq!(StateFilter::from(state), filter);
        }
        for unknown in ["stuck", "Any", "in-flight", "inflight", ""] {
            assert!(state_of(unknown).is_err(), "{unknown}");
        }
        assert_eq!(StateFilter::from(StateParam::default()), StateFilter::Any);
    }

    #[test]
    fn needs_decision_narrows_the_state_to_abandoned() {
        let query = |state: Option<StateParam>| KeysQuery {
            scope: "tenant-a".to_owned(),
            state,
            needs_decision: Some(true),
            method: None,
            path_prefix: None,
            created_after: None,
            created_before: None,
            after: None,
        };
        let filters = Filters::of(&query(None)).unwrap();
        assert_eq!(
            (filters.state, filters.nothing),
            (StateFilter::Abandoned, false)
        );
        let filters = Filters::of(&query(Some(StateParam::Completed))).unwrap();
        assert!(filters.nothing, "completed records never need a decision");
    }
}

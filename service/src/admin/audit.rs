//! The audit log: one `INFO` line on [`AUDIT_TARGET`] and one count in
//! [`ADMIN_ACTIONS_TOTAL`] for every admin action, allowed or refused (the
//! decisions are also kept with the store: see `trail`).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::problem::AdminProblem;
use super::tokens::Admin;

/// Admin actions, by action and result.
pub(super) const ADMIN_ACTIONS_TOTAL: &str = "idempotency_admin_actions_total";

/// The log target of audit lines.
pub const AUDIT_TARGET: &str = "idempotency::audit";

/// Writes the audit line of one action and counts it.
pub(super) fn audit(
    admin: &Admin,
    action: &'static str,
    scope: &str,
    key: &str,
    reason: &str,
    result: &'static str,
) {
    let at = OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default();
    tracing::info!(
        target: AUDIT_TARGET,
        who = %admin.name,
        action,
        scope,
        key,
        reason,
        result,
        at = %at,
        "admin action"
    );
    metrics::counter!(ADMIN_ACTIONS_TOTAL, "action" => action, "result" => result).increment(1);
}

/// Runs one audited read (`list`, `show`, `export`, `decisions`): checks
/// the scope, runs `work`, and writes the audit line of whatever came of
/// it (its reason `-`). A decision goes through
/// [`decided`](super::decision::decided) instead.
pub(super) async fn audited<T>(
    admin: &Admin,
    action: &'static str,
    scope: &str,
    key: &str,
    work: impl Future<Output = Result<(T, &'static str), AdminProblem>>,
) -> Result<T, AdminProblem> {
    let reason = "-";
    if !admin.scopes.allows(scope) {
        let problem = AdminProblem::ScopeForbidden {
            scope: scope.to_owned(),
        };
        audit(admin, action, scope, key, reason, problem.result());
        return Err(problem);
    }
    match work.await {
        Ok((value, result)) => {
            audit(admin, action, scope, key, reason, result);
            Ok(value)
        }
        Err(problem) => {
            audit(admin, action, scope, key, reason, problem.result());
            Err(problem)
        }
    }
}

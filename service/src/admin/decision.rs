//! A decision: one state-changing admin action (`release`, `forget`,
//! `reconcile`) with its operator's reason, kept in the audit trail with
//! the store ([`super::trail`]) as well as in the audit line.

use idempotency_guard::Store as _;
use time::OffsetDateTime;

use super::AdminState;
use super::audit::audit;
use super::bounded::store_call;
use super::dto::rfc3339;
use super::extract::AdminTarget;
use super::problem::AdminProblem;
use super::tokens::Admin;
use super::trail::{self, Decision, TRAIL_PREFIX, TRAIL_RETENTION};

/// Runs one decision, its `reason` already checked
/// ([`required_reason`](super::query::required_reason)):
///
/// 1. a scope of the trail itself is refused (400): no admin action
///    changes the trail;
/// 2. a scope the token may not act on is refused (403), the refusal
///    kept in the trail as well (best effort: a store failure then is
///    only logged);
/// 3. the decision's entry is written to the trail before `work` runs: a
///    store that cannot take it refuses the action (503), so no record
///    is changed without its entry;
/// 4. `work` runs; its result completes the entry (an entry whose
///    completion fails reads back as `unknown`, the audit line holding
///    the result) and is written to the audit line.
pub(super) async fn decided<T>(
    state: &AdminState,
    admin: &Admin,
    action: &'static str,
    target: &AdminTarget,
    reason: &str,
    work: impl Future<Output = Result<(T, &'static str), AdminProblem>>,
) -> Result<T, AdminProblem> {
    let (scope, key) = (target.scope.as_str(), target.key.as_str());
    if trail::is_reserved(scope) {
        return Err(AdminProblem::BadRequest(format!(
            "scopes starting with {TRAIL_PREFIX} hold the audit trail: no admin action changes them"
        )));
    }
    let decision = Decision {
        at: rfc3339(OffsetDateTime::now_utc()),
        who: admin.name.clone(),
        action: action.to_owned(),
        scope: scope.to_owned(),
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    if !admin.scopes.allows(scope) {
        let problem = AdminProblem::ScopeForbidden {
            scope: scope.to_owned(),
        };
        let kept = async {
            let lease = store_call(trail::open(
                &state.store,
                &target.scope,
                &target.key,
                &decision,
                TRAIL_RETENTION,
            ))
            .await?;
            store_call(trail::close(&state.store, &lease, problem.result())).await
        };
        if kept.await.is_err() {
            tracing::warn!(
                action,
                scope,
                key,
                "a refused decision is not in the audit trail"
            );
        }
        audit(admin, action, scope, key, reason, problem.result());
        return Err(problem);
    }
    let opened = async {
        let record = store_call(state.store.get(&target.scope, &target.key)).await?;
        let retention = trail::retention_for(record.as_ref());
        store_call(trail::open(
            &state.store,
            &target.scope,
            &target.key,
            &decision,
            retention,
        ))
        .await
    };
    let lease = match opened.await {
        Ok(lease) => lease,
        Err(problem) => {
            audit(admin, action, scope, key, reason, problem.result());
            return Err(problem);
        }
    };
    let outcome = work.await;
    let result = match &outcome {
        Ok((_, result)) => *result,
        Err(problem) => problem.result(),
    };
    if store_call(trail::close(&state.store, &lease, result))
        .await
        .is_err()
    {
        tracing::warn!(
            action,
            scope,
            key,
            result,
            "the decision's result is not in the audit trail: its entry reads `unknown`"
        );
    }
    audit(admin, action, scope, key, reason, result);
    outcome.map(|(value, _)| value)
}

//! Transactional mode (PostgreSQL) for guarded methods: the method writes
//! through the run's transaction, and the guard commits those writes
//! together with the stored answer, as the HTTP guard does.
//!
//! Turn it on on the engine (`Engine::new(postgres).with_transactional_mode(true)`)
//! and take the transaction in the method with [`tx`]:
//!
//! ```ignore
//! async fn create_payment(&self, request: Request<CreatePaymentRequest>)
//!     -> Result<Response<Payment>, Status>
//! {
//!     let mut tx = idempotency_grpc::tx(&request).await?;
//!     sqlx::query("insert into payments (account) values ($1)")
//!         .bind(&request.get_ref().account)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| Status::internal("the payment was not written"))?;
//!     drop(tx); // before the method returns
//!     Ok(Response::new(payment))
//! }
//! ```
//!
//! What becomes of the writes follows [`crate::outcome::settle`]: a stored
//! answer commits them with the record; a released one (`UNAVAILABLE`,
//! `INTERNAL`, …, an `INVALID_ARGUMENT` not marked final) rolls them back
//! and frees the key, so the retry runs on a clean slate. A method cut off
//! at the maximum handler time after it took its transaction is rolled
//! back too, and answers `UNAVAILABLE` `handler-timeout` + `RetryInfo`
//! (safe to resend) instead of an unknown outcome. Writes that do not go
//! through the transaction (a call to another service) get none of this.
//!
//! Only for the layer's guarded methods: [`crate::run`] (a key in the
//! request message) hands its work no transaction.

use std::sync::Arc;
use std::time::Duration;

use idempotency_guard::IdempotencyKey;
use idempotency_guard::engine::{Refusal, RunContext};
use idempotency_guard::transaction::Tx;
use tonic::{Request, Status};

use crate::refusal::to_status;

/// The run of a guarded call, in its request's extensions (for [`tx`]).
#[derive(Clone)]
pub(crate) struct CallRun {
    context: Arc<RunContext>,
    key: IdempotencyKey,
    retry_after: Duration,
}

impl CallRun {
    pub(crate) fn new(context: RunContext, key: IdempotencyKey, retry_after: Duration) -> Self {
        Self {
            context: Arc::new(context),
            key,
            retry_after,
        }
    }
}

/// The transaction of the guarded call `request` belongs to, begun on
/// first use; its writes commit together with the stored answer (see the
/// module docs). Drop it before the method returns: a transaction still
/// held then is rolled back and the call fails with its key released.
///
/// # Errors
///
/// `INTERNAL` `transaction-unavailable` when the method is not guarded by
/// a layer whose engine is in transactional mode, or the transaction is
/// already taken; `UNAVAILABLE` `store-unavailable` + `RetryInfo` when it
/// cannot begin. Return the status as it is: it releases the key.
pub async fn tx<M>(request: &Request<M>) -> Result<Tx, Status> {
    let Some(run) = request.extensions().get::<CallRun>() else {
        return Err(to_status(&Refusal::TransactionUnavailable));
    };
    run.context.tx().await.map_err(|rejection| {
        tracing::error!(error = %rejection, "transactional mode: no transaction for the method");
        to_status(&rejection.refusal(Some(run.key.clone()), run.retry_after))
    })
}

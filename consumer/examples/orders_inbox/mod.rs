//! What the two order-consumer examples share: the engine, which is the
//! transactional inbox in single-commit mode when the records are in
//! PostgreSQL, and the order's effect.
//!
//! On PostgreSQL each order is a row of `handled_orders`, written in the
//! run's transaction: the key's claim, the row and the outcome commit once,
//! together, so a consumer killed mid-order leaves nothing behind and the
//! redelivery runs it, once; nothing is parked. Elsewhere (SQLite, Redis)
//! the effect is the printed line alone, and a kill between the claim and
//! the ack parks the order as `outcome-unknown` for a person.

use std::time::Duration;

use idempotency_consumer::Incoming;
use idempotency_guard::Engine;
use idempotency_guard::engine::RunContext;
use idempotency_guard::store::{AnyStore, TransactionalStore as _};
use idempotency_guard::transaction::TxRejection;

/// The orders handled, on PostgreSQL (the primary key refuses a second run).
const CREATE: &str = "create table if not exists handled_orders (
    order_id text primary key,
    payload bytea not null,
    handled_at timestamptz not null default now())";

/// The engine over `store`: in single-commit transactional mode when its
/// records are in PostgreSQL (not sealed), with `lease` otherwise.
pub(crate) async fn engine(store: AnyStore, lease: Duration) -> anyhow::Result<Engine<AnyStore>> {
    let postgres = store.postgres().cloned();
    let engine = Engine::new(store).with_lease(lease);
    Ok(match postgres {
        Some(postgres) => {
            sqlx::query(CREATE).execute(postgres.pool()).await?;
            println!("records in PostgreSQL: the transactional inbox, one commit per order");
            engine
                .with_transactional_mode(true)
                .with_single_commit(true)
        }
        None => engine,
    })
}

/// Handles one order: on PostgreSQL its row commits with the record; the
/// printed line is outside any transaction (a killed run prints again).
pub(crate) async fn handle(order: Incoming, run: RunContext) -> Result<(), String> {
    match run.tx().await {
        Ok(mut tx) => {
            sqlx::query("insert into handled_orders (order_id, payload) values ($1, $2)")
                .bind(&order.key)
                .bind(order.payload.to_vec())
                .execute(&mut *tx)
                .await
                .map_err(|error| format!("record the order: {error}"))?;
        }
        Err(TxRejection::NotTransactional) => {}
        Err(error) => return Err(error.to_string()),
    }
    println!(
        "order {} handled: {}",
        order.key,
        String::from_utf8_lossy(&order.payload)
    );
    Ok(())
}

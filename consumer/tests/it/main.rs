//! The consumer adapters' integration tests, in one binary, against real
//! brokers (RabbitMQ at `TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`; NATS at `TEST_NATS_URL`,
//! default `127.0.0.1:4222`, with JetStream) and real stores (PostgreSQL
//! and Redis, as the guard's tests). Every test uses queues or streams of
//! its own, named after a fresh uuid, and deletes them at its end.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod brokers;
mod nats;
mod rabbitmq;
mod webhook;

/// Instantiates a generic test body once per store.
macro_rules! per_store {
    ($name:ident, $body:path) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let db = idempotency_tests::postgres().await;
                $body(db.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis() {
                let db = idempotency_tests::redis().await;
                $body(db.store.clone()).await;
            }
        }
    };
}

per_store!(
    rabbit_resume,
    crate::rabbitmq::a_run_that_fails_after_a_step_resumes_on_the_next_copy
);
per_store!(
    rabbit_race,
    crate::rabbitmq::two_consumers_racing_on_duplicates_apply_one_effect
);
per_store!(
    rabbit_ack_loss,
    crate::rabbitmq::a_lost_ack_is_answered_from_the_stored_outcome
);
per_store!(
    rabbit_poison,
    crate::rabbitmq::a_poison_message_is_dead_lettered_and_the_queue_flows
);
per_store!(
    rabbit_long_scope,
    crate::rabbitmq::an_over_long_scope_is_dead_lettered_not_redelivered
);
per_store!(
    rabbit_parked,
    crate::rabbitmq::an_abandoned_key_is_parked_not_run
);
per_store!(
    nats_race,
    crate::nats::two_consumers_racing_on_duplicates_apply_one_effect
);
per_store!(
    nats_ack_loss,
    crate::nats::a_lost_ack_is_answered_from_the_stored_outcome
);
per_store!(
    nats_poison,
    crate::nats::a_poison_message_is_dead_lettered_and_the_stream_flows
);
per_store!(
    webhook_once,
    crate::webhook::a_valid_delivery_runs_once_and_replays
);
per_store!(
    webhook_refused,
    crate::webhook::refused_deliveries_store_nothing
);
per_store!(
    webhook_github_fresh_id,
    crate::webhook::a_github_delivery_resent_under_a_fresh_id_does_not_run_again
);
per_store!(
    webhook_standard_fresh_id,
    crate::webhook::a_standard_webhooks_delivery_resent_under_a_fresh_id_is_refused
);
per_store!(
    webhook_stripe,
    crate::webhook::a_stripe_delivery_runs_once_and_forged_or_stale_ones_are_refused
);
per_store!(
    webhook_stripe_rotation,
    crate::webhook::a_second_stripe_secret_verifies_while_one_is_rolled
);
per_store!(
    rabbit_twin,
    crate::rabbitmq::a_copy_behind_its_twin_waits_without_holding_a_slot
);
per_store!(
    nats_kept_alive,
    crate::nats::a_message_in_hand_is_kept_alive_past_its_ack_wait
);
per_store!(
    nats_dead_consumer,
    crate::nats::a_dead_consumers_messages_come_back_within_the_ack_wait
);

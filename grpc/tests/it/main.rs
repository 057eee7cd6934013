//! The gRPC adapter's integration tests, in one binary: a real tonic
//! server with the layer in front, real clients (tonic's, Python's
//! `grpcio`, a raw `h2` client for the frames), and real stores
//! (PostgreSQL, SQLite and Redis, as the guard's tests find or start them).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod calls;
mod clients;
mod counting;
mod framing;
mod matrix;
mod python;
mod server;
mod status;
mod steps;
mod transactional;

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
            async fn sqlite() {
                let db = idempotency_tests::sqlite().await;
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
    concurrent_calls,
    crate::calls::concurrent_identical_calls_run_once
);
per_store!(
    replay,
    crate::calls::a_replay_returns_the_same_message_metadata_and_trailers
);
per_store!(
    key_reused,
    crate::calls::another_message_under_the_same_key_is_refused
);
per_store!(
    outcome_rows,
    crate::calls::each_outcome_row_is_stored_or_released
);
per_store!(
    deadline,
    crate::calls::a_client_deadline_shorter_than_the_handler_gets_the_replay_on_retry
);
per_store!(
    refusals,
    crate::calls::a_missing_or_invalid_key_is_refused_before_the_method_runs
);
per_store!(streaming, crate::calls::a_streaming_method_passes_through);
per_store!(
    request_id,
    crate::calls::an_aip_155_request_id_runs_the_typed_handler_once
);
per_store!(
    cut_off,
    crate::calls::a_run_cut_off_at_the_maximum_handler_time_is_outcome_unknown
);
per_store!(
    resume,
    crate::steps::an_abandoned_call_resumes_with_its_recorded_step
);
per_store!(
    abandoned_refused,
    crate::steps::without_resume_the_retry_is_refused_outcome_unknown
);
per_store!(
    status_service,
    crate::status::the_status_service_answers_for_grpc_keys
);
per_store!(grpcio, crate::python::grpcio_retries_run_each_payment_once);
per_store!(
    frames,
    crate::framing::each_answer_is_framed_as_tonic_frames_it
);
per_store!(
    grpcio_retry_policy,
    crate::python::a_retry_policy_absorbs_in_flight_and_never_resends_an_unknown_outcome
);

/// The client matrix needs a store it can break (for `store-unavailable`):
/// SQLite and PostgreSQL.
mod grpcio_matrix {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        let db = idempotency_tests::sqlite().await;
        crate::matrix::every_path_reads_the_same_through_grpcio_and_tonic(db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        let db = idempotency_tests::postgres().await;
        crate::matrix::every_path_reads_the_same_through_grpcio_and_tonic(db).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_mode_on_postgres() {
    let db = idempotency_tests::postgres().await;
    crate::transactional::the_methods_writes_commit_with_its_stored_answer(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counted_once() {
    let db = idempotency_tests::sqlite().await;
    crate::counting::each_guarded_call_is_counted_once(db.store.clone()).await;
}

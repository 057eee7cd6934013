//! The retry storm at a small size: with the guard, every payment runs once
//! and every client ends with its own answer; without it, the same harness
//! sees the duplicates (so it can see them).

use idempotency_tests::programs::{self, Program};
use idempotency_tests::storm::{self, StormConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_guard_a_retry_storm_runs_every_payment_once() {
    let config = StormConfig {
        clients: 6,
        payments: 25,
        ..StormConfig::default()
    };
    let report = storm::run(
        &config,
        &programs::path(Program::Payments),
        &programs::path(Program::StatusService),
    )
    .await;
    println!("with the guard:\n{report}");
    assert!(
        report.answers_dropped > 10,
        "the storm happened: {} answers dropped",
        report.answers_dropped
    );
    assert!(report.retries > 0 && report.status_lookups > 0);
    assert_eq!(report.duplicate_rows, 0, "no payment ran twice");
    assert_eq!(report.rows, report.payments, "every payment ran");
    assert_eq!(
        report.completed, report.payments,
        "every client ended with its payment's answer"
    );
    assert_eq!(report.wrong_answers, 0);
    assert!(report.replays > 0, "lost answers were recovered as replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_the_same_storm_duplicates_payments() {
    let config = StormConfig {
        clients: 6,
        payments: 25,
        guard: false,
        ..StormConfig::default()
    };
    let report = storm::run(
        &config,
        &programs::path(Program::Payments),
        &programs::path(Program::StatusService),
    )
    .await;
    println!("without the guard:\n{report}");
    assert!(
        report.duplicate_rows > 0,
        "the harness sees duplicates when there are some"
    );
    assert_eq!(report.rows, report.payments + report.duplicate_rows);
}

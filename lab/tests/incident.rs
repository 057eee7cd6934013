//! The incident lab at CI size: a short window at a low rate, both runs
//! over the same seed, the real programs (the payments example and the
//! status service) on SQLite.

use std::time::Duration;

use idempotency_lab::{IncidentConfig, Programs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_same_faults_the_naive_run_double_charges_and_the_guarded_run_does_not() {
    let mut config = IncidentConfig::new(7);
    config.rate = 12.0;
    config.writes = 0.4;
    config.duration = Duration::from_secs(12);
    config.schedule.start = Duration::from_secs(2);
    config.schedule.window = Duration::from_secs(8);
    // The app killed once, mid-debit, before the window: the guarded run
    // is left with an abandoned key (the console's test looks for one).
    config.crash_at = Some(Duration::from_secs(1));
    let out = tempfile::tempdir().expect("a temporary directory");
    let store = out.path().join("store");
    let incident = idempotency_lab::incident(
        &config,
        &Programs::of_the_workspace(),
        out.path(),
        Some(&store),
    )
    .await
    .expect("both runs");
    let (naive, guarded) = (&incident.naive, &incident.guarded);
    println!("{}", idempotency_lab::report::table(naive, guarded));

    // The same traffic, the same faults for the first attempts.
    assert_eq!(naive.writes.operations, guarded.writes.operations);
    assert!(naive.writes.operations > 20, "{naive:?}");
    assert!(
        naive.delayed + naive.dropped + naive.reset > 0,
        "the window injected faults: {naive:?}"
    );
    // The naive SDK resends what already ran: more requests than calls,
    // and the ledger shows it.
    assert!(naive.writes.amplification() > 1.0, "{naive:?}");
    assert!(naive.executions_per_debit() > 1.0, "{naive:?}");
    // The guard runs every debit at most once, whatever the retries.
    assert_eq!(guarded.double_charged, 0, "{guarded:?}");
    assert!(guarded.most_executions <= 1, "{guarded:?}");
    assert!(guarded.executions <= guarded.debits, "{guarded:?}");
    // A debit the crash cut off is abandoned (never run again, one to
    // reconcile); none is left in flight past its lease.
    let unsettled = guarded.unsettled.expect("the guarded run asks the store");
    assert_eq!(unsettled.in_flight_past_lease, 0, "{guarded:?}");

    let page = std::fs::read_to_string(&incident.table).expect("the table");
    assert!(page.contains("| **double charges** (debits executed more than once) |"));
    let svg = std::fs::read_to_string(&incident.plot).expect("the plot");
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    assert!(store.join("guarded.db").is_file(), "the store is kept");
}

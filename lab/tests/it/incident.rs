//! The incident lab at CI size: the same traffic and faults for both
//! runs; the naive one double-charges, the guarded one never does, and
//! the crash leaves it keys to reconcile, each traced to its debit.

use crate::lab_run::{lab_run, overload_run, resume_run};

#[test]
fn through_the_same_faults_the_naive_run_double_charges_and_the_guarded_run_does_not() {
    let run = lab_run();
    let incident = &run.incident;
    let (naive, guarded) = (&incident.naive, &incident.guarded);

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
    assert!(naive.double_charged > 0, "{naive:?}");
    // The guard runs every debit at most once, whatever the retries.
    assert_eq!(guarded.double_charged, 0, "{guarded:?}");
    assert_eq!(guarded.extra_executions, 0, "{guarded:?}");
    assert!(guarded.most_executions <= 1, "{guarded:?}");
    assert!(guarded.executions <= guarded.debits, "{guarded:?}");
    // A debit the crash cut off is abandoned: never run again, its outcome
    // unknown, a key for a person to reconcile; none is left in flight
    // past its lease.
    let unsettled = guarded.unsettled.expect("the guarded run asks the store");
    assert!(
        unsettled.abandoned >= 1,
        "the crash leaves at least one abandoned key: {guarded:?}"
    );
    assert_eq!(unsettled.in_flight_past_lease, 0, "{guarded:?}");
    assert_eq!(guarded.abandoned.len() as u64, unsettled.abandoned);
    for abandoned in &guarded.abandoned {
        let debit = abandoned
            .debit
            .unwrap_or_else(|| panic!("{abandoned:?} is traced to a debit of the run"));
        assert!(
            !debit.handler_time.is_zero(),
            "a debit of the crash run: {debit:?}"
        );
    }
    // The naive run has no key to ask about.
    assert_eq!(naive.unsettled, None);
    assert!(naive.abandoned.is_empty());

    let page = std::fs::read_to_string(&incident.table).expect("the table");
    assert!(page.contains("| **double charges** (debits executed more than once) |"));
    assert!(page.contains("Keys left to reconcile"), "{page}");
    for abandoned in &guarded.abandoned {
        assert!(page.contains(&format!("| `{}` |", abandoned.key)), "{page}");
    }
    let svg = std::fs::read_to_string(&incident.plot).expect("the plot");
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    assert!(run.store.is_file(), "the store is kept");
}

/// Issue 53, jitter: the guarded client gives up no more reads and no
/// more writes than the naive one (the crashed debit's `outcome-unknown`
/// aside: the naive run has no key to be told that about), retries no
/// more, never for the budget, and charges nobody twice. At this size a
/// run has about a hundred operations in its window, so each side gives
/// up a handful at most; the default size's three seeds are in
/// docs/lab/issue-53.md.
#[test]
fn through_the_jitter_the_guarded_client_gives_up_no_more_than_the_naive_one() {
    let incident = &lab_run().incident;
    let (naive, guarded) = (&incident.naive, &incident.guarded);
    let crashed = guarded
        .gave_up_by
        .get("outcome-unknown")
        .map_or(0, |gave_up| gave_up.writes);
    assert!(
        guarded.reads.gave_up <= naive.reads.gave_up,
        "reads given up: guarded {:?} against naive {:?}",
        guarded.gave_up_by,
        naive.gave_up_by
    );
    assert!(
        guarded.writes.gave_up - crashed <= naive.writes.gave_up,
        "writes given up: guarded {:?} against naive {:?}",
        guarded.gave_up_by,
        naive.gave_up_by
    );
    assert!(
        guarded.blended().amplification() <= naive.blended().amplification(),
        "amplification: guarded {:?} against naive {:?}",
        guarded.blended(),
        naive.blended()
    );
    assert!(
        !guarded.gave_up_by.contains_key("budget-exhausted"),
        "{:?}",
        guarded.gave_up_by
    );
    assert_eq!(guarded.double_charged, 0, "{guarded:?}");
}

/// Issue 53's inequalities for the overload: the naive client storms
/// (amplification above 1.5 in the window), the guarded one stays at or
/// below 1.1 there, completes at least as many operations per second, and
/// never charges twice.
#[test]
fn past_its_capacity_the_naive_client_storms_and_the_guarded_one_does_not() {
    let incident = &overload_run().incident;
    let (naive, guarded) = (&incident.naive, &incident.guarded);
    assert_eq!(naive.writes.operations, guarded.writes.operations);
    assert!(naive.shed > 0 && guarded.shed > 0, "the API refused some");
    assert_eq!(
        naive.delayed + naive.dropped + naive.reset,
        0,
        "no network faults"
    );
    assert!(
        naive.window.amplification() > 1.5,
        "the naive storm: {:?}",
        naive.window
    );
    assert!(
        guarded.window.amplification() <= 1.1,
        "the guarded client: {:?}, given up {:?}",
        guarded.window,
        guarded.gave_up_by
    );
    assert!(
        guarded.window.goodput() >= naive.window.goodput(),
        "goodput {:?} against {:?}",
        guarded.window,
        naive.window
    );
    assert_eq!(guarded.double_charged, 0, "{guarded:?}");
    let page = std::fs::read_to_string(&incident.table).expect("the table");
    assert!(page.starts_with("# The overload lab"), "{page}");
    assert!(incident.plot.ends_with("overload.svg"));
}

/// Issue 52: the crash on the resumable route leaves nothing to
/// reconcile. The guarded run's debits go to `POST /debits` (reserve,
/// charge at the fake PSP with the step's derived key, record); the app is
/// killed mid-debit and started again; the client's retry resumes the
/// crashed debit. No key is left to reconcile, no debit is charged twice
/// or lost, and the PSP charged each debit exactly once.
#[test]
fn a_crash_on_the_resumable_route_leaves_no_key_to_reconcile_and_charges_each_debit_once() {
    let incident = &resume_run().incident;
    let (naive, guarded) = (&incident.naive, &incident.guarded);
    assert!(guarded.writes.operations > 20, "{guarded:?}");
    let unsettled = guarded.unsettled.expect("the guarded run asks the store");
    assert_eq!(
        (unsettled.abandoned, unsettled.in_flight_past_lease),
        (0, 0),
        "no key left to reconcile: {guarded:?}"
    );
    assert!(guarded.abandoned.is_empty(), "{guarded:?}");
    assert_eq!(guarded.double_charged, 0, "{guarded:?}");
    assert_eq!(guarded.lost, 0, "{guarded:?}");
    assert_eq!(
        guarded.writes.gave_up, 0,
        "every debit answered: {guarded:?}"
    );
    assert_eq!(guarded.not_executed, 0, "{guarded:?}");
    let psp = guarded.psp.expect("the resumable route charges the PSP");
    assert_eq!(psp.charges, guarded.debits, "{guarded:?}");
    assert_eq!(psp.most_charges, 1, "{guarded:?}");
    assert_eq!(guarded.charges_per_debit(), Some(1.0));
    // The naive run stays on `POST /payments`: no PSP.
    assert_eq!(naive.psp, None);
    let page = std::fs::read_to_string(&incident.table).expect("the table");
    assert!(page.contains("| **PSP charges per debit**"), "{page}");
    assert!(page.contains("| **debits lost**"), "{page}");
    assert!(page.contains("resumable route"), "{page}");
}

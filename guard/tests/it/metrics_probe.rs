//! Reads the guard's metrics in tests: a debugging recorder, installed once
//! for the whole test binary.

use std::sync::{Mutex, OnceLock, PoisonError};

use metrics::Key;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in the test binary");
        snapshotter
    })
}

/// Starts recording (call before the code under test runs).
pub(crate) fn install() {
    let _ = snapshotter();
}

/// The sum of counter `name` over series whose labels include every pair
/// in `labels`, since the recorder was installed.
///
/// A snapshot of the debugging recorder resets its counters (and tests
/// running in parallel take snapshots), so every snapshot's counts are added
/// to running totals, which are what this reads.
pub(crate) fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    static TOTALS: Mutex<Vec<(Key, u64)>> = Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().unwrap_or_else(PoisonError::into_inner);
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let key = key.key().clone();
        match totals.iter_mut().find(|(k, _)| *k == key) {
            Some((_, total)) => *total += n,
            None => totals.push((key, n)),
        }
    }
    totals
        .iter()
        .filter(|(key, _)| key.name() == name)
        .filter(|(key, _)| {
            labels.iter().all(|(label, value)| {
                key.labels()
                    .any(|l| l.key() == *label && l.value() == *value)
            })
        })
        .map(|(_, total)| total)
        .sum()
}

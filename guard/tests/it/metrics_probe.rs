//! Reads the guard's metrics in tests: a debugging recorder, installed once
//! for the whole test binary.

use std::sync::OnceLock;

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
/// in `labels`.
pub(crate) fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter(|(key, ..)| {
            labels.iter().all(|(label, value)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == *label && l.value() == *value)
            })
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

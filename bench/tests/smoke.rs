//! The harness's smoke run (`--smoke`): every path a full run takes (each
//! store, the raw runs, the peer 0.3.0, growth, the report and the plot),
//! for a few seconds, no figure asserted. It runs the binary the
//! workspace's test build made (a `cargo run -p idempotency-bench` would
//! resolve the bench's features alone and build the guard and its
//! dependents again), on the servers the other tests find
//! (`idempotency-tests`: the `TEST_*` variables, the shared servers, or
//! private ones).

use std::process::Command;

use idempotency_tests::fixtures::{postgres_url, redis_cluster_urls, redis_url};

#[test]
fn a_smoke_run_takes_every_path_and_writes_the_report_and_the_plot() {
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_idempotency-bench"))
        .arg("--smoke")
        .args(["--postgres-url", &postgres_url()])
        .args(["--redis-url", &redis_url()])
        .args(["--redis-cluster-urls", &redis_cluster_urls().join(",")])
        .arg("--out-dir")
        .arg(out.path())
        .output()
        .expect("the bench binary starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the smoke run failed ({}):\n{stderr}",
        output.status
    );
    let report = std::fs::read_to_string(out.path().join("BENCHMARKS.md"))
        .expect("the smoke run writes BENCHMARKS.md");
    for store in ["postgres", "sqlite", "redis", "tiered"] {
        assert!(
            report.to_lowercase().contains(store),
            "the report names no {store} row:\n{report}"
        );
    }
    let plot = std::fs::metadata(out.path().join("benchmarks.png"));
    assert!(
        plot.is_ok_and(|plot| plot.len() > 0) || stderr.contains("no plot"),
        "neither a plot nor the reason it is missing:\n{stderr}"
    );
}

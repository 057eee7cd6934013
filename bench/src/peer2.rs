//! The peer crate `idempotent` 2.0.0: its own axum layer and Valkey/Redis
//! store, in the separate crate `bench/peer2` (outside the workspace: it
//! declares `rust-version = "1.98"` and builds on our 1.95 only with
//! `--ignore-rust-version`). A full run builds it first; `serve --app
//! peer2` replaces itself with that binary, so the harness measures its
//! CPU and peak RSS like any other child's.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Where `cargo build --release` of `bench/peer2` puts the binary.
pub(crate) const DEFAULT_BIN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/peer2/target/release/idempotency-bench-peer2"
);

/// The manifest of `bench/peer2`.
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peer2/Cargo.toml");

/// Builds `bench/peer2` in release mode (with `--ignore-rust-version`) and
/// returns the path of its binary.
pub(crate) async fn build() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "building the peer idempotent 2.0.0: cargo build --release --ignore-rust-version --manifest-path {MANIFEST}"
    );
    let status = tokio::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "--ignore-rust-version",
            "--manifest-path",
        ])
        .arg(MANIFEST)
        // Where DEFAULT_BIN looks, whatever CARGO_TARGET_DIR says.
        .arg("--target-dir")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/peer2/target"))
        .stdin(std::process::Stdio::null())
        .status()
        .await
        .context("run cargo to build bench/peer2")?;
    anyhow::ensure!(
        status.success(),
        "building bench/peer2 failed ({status}); --no-peer2 leaves the peer 2.0.0 out"
    );
    Ok(PathBuf::from(DEFAULT_BIN))
}

/// Replaces this process with the peer's server (`bin`) on the Redis at
/// `redis_url`, its keys under `prefix`; returns only on failure.
pub(crate) fn exec(bin: &Path, redis_url: &str, prefix: &str) -> anyhow::Error {
    use std::os::unix::process::CommandExt as _;
    let error = std::process::Command::new(bin)
        .arg("--redis-url")
        .arg(redis_url)
        .arg("--prefix")
        .arg(prefix)
        .exec();
    anyhow::Error::new(error).context(format!(
        "start {} (build it: cargo build --release --ignore-rust-version --manifest-path {MANIFEST})",
        bin.display()
    ))
}

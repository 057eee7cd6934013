//! The workspace's own programs, for end-to-end tests that start them as
//! real processes: the service (`idempotency-service`), the guard's
//! payments example, and the consumer's redelivery-storm and orders
//! examples.
//!
//! Each stays in its own crate (this crate compiles none of their files);
//! the first call builds them with `cargo test --workspace --no-run`, in
//! the profile and target directory of the program asking, and returns the
//! path of the one asked for. That is the README's test command without
//! running anything: a no-op after `cargo test --workspace` (which builds
//! every binary and example), with the same features. A `cargo build` of
//! the programs alone would resolve the features without the other
//! packages' dev-dependencies and build the guard and what depends on it
//! again, and the next `cargo test` would build them back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A program of the workspace that end-to-end tests start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `idempotency-service` (the service crate's binary).
    StatusService,
    /// The guard's payments example (`guard/examples/payments.rs`).
    Payments,
    /// The consumer's redelivery-storm process
    /// (`consumer/examples/storm-consumer.rs`).
    StormConsumer,
    /// The consumer's RabbitMQ orders example
    /// (`consumer/examples/orders-consumer.rs`).
    OrdersConsumer,
    /// The gRPC payments example (`grpc/examples/payments-grpc.rs`).
    PaymentsGrpc,
}

impl Program {
    /// The file name cargo gives it, under the profile's directory.
    fn relative_path(self) -> &'static str {
        match self {
            Self::StatusService => "idempotency-service",
            Self::Payments => "examples/payments",
            Self::StormConsumer => "examples/storm-consumer",
            Self::OrdersConsumer => "examples/orders-consumer",
            Self::PaymentsGrpc => "examples/payments-grpc",
        }
    }
}

/// The profile directory (`target/debug`, `target/release`) of the running
/// program: a test binary lives in its `deps/`, a binary in it.
fn profile_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|error| format!("current_exe: {error}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    let dir = if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    Ok(dir.to_path_buf())
}

/// Builds the programs once per process.
fn build(profile_dir: &Path) -> Result<(), String> {
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", profile_dir.display()))?;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["test", "--workspace", "--no-run", "--quiet"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir);
    // Without what cargo set for this test process: a build script that
    // reads one of them (ring's reads `CARGO_MANIFEST_DIR`) would see
    // another value than in the `cargo test` that built everything, run
    // again, and make the guard and all that depends on it build again.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_tests) {
            command.env_remove(name);
        }
    }
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    let output = command
        .output()
        .map_err(|error| format!("cannot run cargo to build the test programs: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build of the test programs failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Whether cargo sets the variable `name` for the test processes it runs
/// (<https://doc.rust-lang.org/cargo/reference/environment-variables.html>).
fn set_by_cargo_for_tests(name: &str) -> bool {
    ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
            "OUT_DIR",
        ]
        .contains(&name)
}

/// The path of `program`, built on first use.
///
/// # Panics
///
/// When cargo cannot build the programs (its output is in the message).
pub fn path(program: Program) -> String {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let dir = profile_dir()?;
        build(&dir)?;
        Ok(dir)
    });
    match built {
        Ok(dir) => {
            let path = dir.join(program.relative_path());
            assert!(path.is_file(), "{} was not built", path.display());
            path.display().to_string()
        }
        Err(message) => panic!("{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_tests;

    #[test]
    fn only_what_cargo_sets_for_a_test_process_is_left_out() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_storm",
            "CARGO_CRATE_NAME",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_tests(name), "{name}");
        }
        // What the user or CI set for every build is kept.
        for name in [
            "CARGO_HOME",
            "CARGO_INCREMENTAL",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_DEV_DEBUG",
            "RUSTC_WORKSPACE_WRAPPER",
            "CLIPPY_ARGS",
            "PATH",
        ] {
            assert!(!set_by_cargo_for_tests(name), "{name}");
        }
    }
}

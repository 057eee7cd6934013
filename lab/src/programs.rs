//! The two programs a run starts, the payments example and the status
//! service, as this package's own binaries (`lab-payments`,
//! `lab-status-service`): found next to the lab's executable, and built
//! alone (`cargo build -p idempotency-lab --bins`) when they are not there
//! or when the lab runs under `cargo run`. Never the workspace's test
//! suites: `idempotency_tests::programs::path` builds those (every test
//! binary of the workspace) to find the programs the end-to-end tests
//! start, which took minutes before the lab's first request.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// This package's binary built from the guard's payments example.
const PAYMENTS: &str = "lab-payments";
/// This package's binary built from the service's `main.rs`.
const STATUS_SERVICE: &str = "lab-status-service";

/// The paths of the programs a run starts.
#[derive(Debug, Clone)]
pub struct Programs {
    /// The guard's payments example.
    pub payments: String,
    /// `idempotency-service`.
    pub status_service: String,
}

impl Programs {
    /// The lab's own builds of both, next to its executable.
    ///
    /// Under `cargo run` (cargo then sets `CARGO` for the program), cargo
    /// builds them first, with the lab's features: a no-op, or the two
    /// binaries' own files, as `cargo run` just built everything they
    /// depend on. Run directly (`target/release/idempotency-lab`, after
    /// `cargo build --release --workspace --bins`), the lab takes the ones
    /// built with it, and builds them only when they are missing.
    ///
    /// # Errors
    ///
    /// When the lab's executable cannot be located, or cargo fails to
    /// build the two programs (its output is in the message).
    pub fn next_to_the_lab() -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locate the lab's executable")?;
        let dir = exe
            .parent()
            .with_context(|| format!("{} has no directory", exe.display()))?;
        let paths = [PAYMENTS, STATUS_SERVICE].map(|name| dir.join(executable(name)));
        let under_cargo = std::env::var_os("CARGO").is_some();
        if under_cargo || !paths.iter().all(|path| path.is_file()) {
            build(dir)?;
        }
        for path in &paths {
            anyhow::ensure!(path.is_file(), "{} was not built", path.display());
        }
        let [payments, status_service] = paths.map(|path| path.display().to_string());
        Ok(Self {
            payments,
            status_service,
        })
    }
}

/// The file name of a binary on this platform.
fn executable(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

/// Builds this package's binaries into `profile_dir` (`target/debug` or
/// `target/release`, the lab's own).
fn build(profile_dir: &Path) -> anyhow::Result<()> {
    let target_dir = profile_dir
        .parent()
        .with_context(|| format!("{} has no parent directory", profile_dir.display()))?;
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "-p", "idempotency-lab", "--bins"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    // Without what `cargo run` set for the lab: a build script that reads
    // one of them would see another value than in the build that made the
    // lab, run again, and rebuild what depends on it.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
    eprintln!("idempotency-lab: building {PAYMENTS} and {STATUS_SERVICE}...");
    let output = command
        .output()
        .context("run cargo to build the lab's programs")?;
    anyhow::ensure!(
        output.status.success(),
        "cargo build of the lab's programs failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Whether cargo sets the variable `name` for the programs it runs
/// (<https://doc.rust-lang.org/cargo/reference/environment-variables.html>).
fn set_by_cargo_run(name: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::set_by_cargo_run;

    #[test]
    fn only_what_cargo_sets_for_a_program_is_left_out() {
        assert!(set_by_cargo_run("CARGO_PKG_NAME"));
        assert!(set_by_cargo_run("CARGO_MANIFEST_DIR"));
        assert!(set_by_cargo_run("OUT_DIR"));
        assert!(!set_by_cargo_run("CARGO_HOME"));
        assert!(!set_by_cargo_run("CARGO_TARGET_DIR"));
        assert!(!set_by_cargo_run("PATH"));
    }
}

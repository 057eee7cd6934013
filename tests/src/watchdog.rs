//! Cleanup that runs when the test process exits, however it exits.
//!
//! A test binary never drops its statics, and a crashed or killed one runs
//! no code at all, so the servers it starts for itself cannot be stopped
//! from Rust. Instead each gets a watchdog: a small `sh` child that polls
//! whether its parent (the test process) is still alive and, once it is
//! gone, runs a cleanup script (kill the servers, remove their directory).
//! It ignores SIGINT, SIGHUP and SIGTERM, so a Ctrl-C that ends the tests
//! does not end the watchdog before it has cleaned up.

use std::process::{Command, Stdio};

/// How often the watchdog checks that the test process is alive (seconds).
const POLL_SECONDS: &str = "0.3";

/// Starts a watchdog that runs `cleanup` (a POSIX shell script) once this
/// process has exited. Start it before the servers it cleans up after, so
/// that no window leaves them behind.
///
/// # Panics
///
/// When `sh` cannot be started.
pub(crate) fn run_at_exit(cleanup: &str) {
    let script = format!(
        "trap '' INT HUP TERM\n\
         while kill -0 \"$PPID\" 2>/dev/null; do sleep {POLL_SECONDS}; done\n\
         {cleanup}\n"
    );
    // Not waited for: it outlives this process by design (its exit status
    // is collected by whoever adopts it).
    let _watchdog = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start the cleanup watchdog (sh: {error})"));
}

/// Quotes `text` for a POSIX shell (single quotes).
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

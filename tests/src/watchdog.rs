//! Cleanup that runs when the test process exits, however it exits.
//!
//! A test binary never drops its statics, and a crashed or killed one runs
//! no code at all, so the servers it starts for itself cannot be stopped
//! from Rust. Instead each gets a watchdog: a small background `sh` that
//! polls whether the test process is still alive and, once it is gone,
//! runs a cleanup script (kill the servers, remove their directory).
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
    // A background subshell of a shell that exits at once: the watchdog is
    // nobody's child to wait for, and ignores the signals a Ctrl-C sends.
    let pid = std::process::id();
    let script = format!(
        "(\n\
           trap '' INT HUP TERM\n\
           while kill -0 {pid} 2>/dev/null; do sleep {POLL_SECONDS}; done\n\
           {cleanup}\n\
         ) </dev/null >/dev/null 2>&1 &\n"
    );
    let started = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|error| panic!("cannot start the cleanup watchdog (sh: {error})"));
    assert!(
        started.success(),
        "the cleanup watchdog did not start: {started}"
    );
}

/// Quotes `text` for a POSIX shell (single quotes).
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

//! The operators' console's browser: headless Chromium from Debian's
//! packages (`/usr/bin/chromium`) driven by `playwright-core` (npm,
//! pinned), under `service/console-tests/` with the scripts that drive the
//! console. `scripts/console-browser` installs both; the first test that
//! misses one runs it (it needs apt and npm), and one still missing after
//! it fails the test, naming it. Used by the service's console test and by
//! the lab's (an abandoned key of a lab run, released in the console).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `service/console-tests/`, with `playwright-core` installed and
/// Chromium present (installed once per test process when missing): run
/// its scripts with `node` from there.
///
/// # Panics
///
/// When Chromium or `playwright-core` is missing and
/// `scripts/console-browser` cannot install them.
pub fn dir() -> PathBuf {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    READY
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let dir = root.join("service/console-tests");
            let installed = || {
                dir.join("node_modules/playwright-core/package.json")
                    .exists()
                    && Path::new("/usr/bin/chromium").exists()
            };
            if !installed() {
                let script = root.join("scripts/console-browser");
                let status = std::process::Command::new(&script).status();
                assert!(
                    matches!(status, Ok(s) if s.success()) && installed(),
                    "Chromium (/usr/bin/chromium) or playwright-core ({}) is missing and {} could not install them: run it by hand (it needs apt and npm)",
                    dir.display(),
                    script.display()
                );
            }
            dir
        })
        .clone()
}

//! The official MCP SDKs the tests use, clients and servers nobody here
//! wrote: the Python SDK (`mcp` on PyPI) in a venv and the TypeScript SDK
//! (`@modelcontextprotocol/sdk` on npm), at pinned versions under
//! `jsonrpc/sdk-clients/`. `scripts/mcp-sdk-clients` installs them; the
//! first test that misses one runs it (it needs python3 with venv, and
//! npm), and one still missing after it fails the test, naming it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `jsonrpc/sdk-clients/`, where the SDKs are installed.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../jsonrpc/sdk-clients")
}

/// The venv's Python, with the MCP Python SDK (`mcp`) importable.
///
/// # Panics
///
/// When the SDK is not installed and `scripts/mcp-sdk-clients` cannot
/// install it.
pub fn python() -> PathBuf {
    installed(dir().join(".venv/bin/python"), "the MCP Python SDK (mcp)")
}

/// The TypeScript SDK's `package.json` (run the clients with `node` in
/// [`dir`]).
///
/// # Panics
///
/// When the SDK is not installed and `scripts/mcp-sdk-clients` cannot
/// install it.
pub fn typescript() -> PathBuf {
    installed(
        dir().join("node_modules/@modelcontextprotocol/sdk/package.json"),
        "the MCP TypeScript SDK (@modelcontextprotocol/sdk)",
    )
}

/// Runs `scripts/mcp-sdk-clients` once per test process (it checks the
/// pinned versions, and installs only what is missing: a venv whose `mcp`
/// is absent or of another version is repaired, not just one whose Python
/// is missing), then fails with what to run when `path` is still not there.
fn installed(path: PathBuf, what: &str) -> PathBuf {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/mcp-sdk-clients");
            let status = std::process::Command::new(&script).status();
            assert!(
                status.as_ref().is_ok_and(|status| status.success()),
                "{} failed ({status:?}): it needs python3 with venv (Debian: python3-venv) and npm (Debian: npm)",
                script.display()
            );
    });
    assert!(
        path.exists(),
        "{what} is not installed ({} is missing): run scripts/mcp-sdk-clients",
        path.display()
    );
    path
}

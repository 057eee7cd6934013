//! Clients nobody here wrote: the official MCP SDKs for Python (`mcp` on
//! PyPI) and TypeScript (`@modelcontextprotocol/sdk` on npm) call
//! `send_email` on the example's MCP server through a proxy that drops 30 %
//! of the answers after the server sent them, retrying each call with the
//! same key: every email is sent once, every call answered with its own
//! email's result (the SDKs match answers by request id: a replay under
//! another id would never reach them).
//!
//! The SDKs are installed by `scripts/mcp-sdk-clients` (pinned versions,
//! into `jsonrpc/sdk-clients/`), which the first test that misses one runs
//! (it needs python3 with venv, and npm); one still missing after it fails
//! the test, naming it (see [`idempotency_tests::mcp_sdk`]).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idempotency_guard::Engine;
use idempotency_tests::{Faults, FaultyProxy, mcp_sdk};
use serde_json::Value;

use crate::email::{Form, Outbox, router};
use crate::tool_calls::serve;

/// How many emails each client sends.
const EMAILS: usize = 15;

fn sdk_clients() -> PathBuf {
    mcp_sdk::dir()
}

/// Runs one client against the server through the lossy proxy and checks
/// every email was sent once and answered with its own result.
async fn storm_through_a_lossy_proxy(program: PathBuf, script: &str, name: &str, seed: u64) {
    let db = idempotency_tests::postgres().await;
    let outbox = Arc::new(Outbox::default());
    let server = serve(router(
        Engine::new(db.store.clone()),
        Arc::clone(&outbox),
        Form::Sessions,
    ))
    .await;
    let proxy = FaultyProxy::start(server, Faults::new(seed).with_dropped_responses(0.3)).await;
    let url = format!("http://{}/mcp", proxy.address);
    let mut command = tokio::process::Command::new(program);
    command
        .arg(sdk_clients().join(script))
        .arg(&url)
        .arg(EMAILS.to_string())
        .current_dir(sdk_clients())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .unwrap_or_else(|_| panic!("the {name} client did not finish in 300 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {name} client failed: {}\n{stdout}\n{stderr}",
        output.status
    );
    let answers: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), EMAILS, "{stdout}");
    let mut numbers = BTreeSet::new();
    for (index, answer) in answers.iter().enumerate() {
        assert_eq!(answer["index"], index);
        assert_eq!(answer["is_error"], false);
        let text = answer["text"].as_str().unwrap();
        let suffix = format!(" to user{index}@example.com ({name} {index})");
        assert!(
            text.ends_with(&suffix),
            "email {index} answered with another's result: {text}"
        );
        let number: u64 = text
            .strip_prefix("sent email #")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(
            numbers.insert(number),
            "two emails share the result #{number}"
        );
    }
    let lines = outbox.lines();
    let distinct: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(
        outbox.count(),
        EMAILS as u64,
        "every email sent exactly once: {lines:?}"
    );
    assert_eq!(distinct.len(), EMAILS);
    let counts = proxy.counts();
    assert!(
        counts.responses_dropped > 0,
        "the proxy dropped answers: {counts:?}"
    );
    let replayed = answers.iter().filter(|a| a["replayed"] == true).count();
    let retried = answers
        .iter()
        .filter(|a| a["attempts"].as_u64() > Some(1))
        .count();
    println!(
        "{name}: {EMAILS} emails, {retried} retried, {replayed} answered by a replay, proxy {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_retrying_through_a_lossy_proxy_sends_every_email_once() {
    let python = mcp_sdk::python();
    storm_through_a_lossy_proxy(python, "python_client.py", "python", 29).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_retrying_through_a_lossy_proxy_sends_every_email_once() {
    mcp_sdk::typescript();
    storm_through_a_lossy_proxy(
        PathBuf::from("node"),
        "typescript_client.mjs",
        "typescript",
        31,
    )
    .await;
}

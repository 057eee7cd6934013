//! A `jsonrpc` route: an MCP server in another language (the official
//! Python SDK's `MCPServer`, FastMCP's successor, in `mcp_server.py`)
//! behind the gateway, its `send_email` tool writing one line per email to
//! a file. 200 concurrent identical calls with one key send one email and
//! are answered under their own ids; the Python SDK's client, retrying
//! through a proxy that drops 30 % of the answers, sends every email once;
//! an upstream that dies mid-call leaves the key abandoned; the guard's
//! counters on `/metrics` count each call once. The SDK is installed by
//! `scripts/mcp-sdk-clients` (see [`idempotency_tests::mcp_sdk`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency_gateway::Config;
use idempotency_tests::{Faults, FaultyProxy, Process, mcp_sdk};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::start_gateway;

/// The route the tests configure: `send_email` guarded, `sent_emails`
/// (read-only) not named.
const ROUTE: &str = "[[routes]]\npath = \"/mcp\"\ntype = \"jsonrpc\"\ntools = [\"send_email\"]\n";

const BOTH: &str = "application/json, text/event-stream";

/// The Python MCP server, the gateway in front of it, and their files.
struct McpStack {
    server: Option<Process>,
    gateway: Process,
    outbox: PathBuf,
    _dir: TempDir,
}

fn server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_server.py")
}

/// Starts the Python MCP server with `env` and a gateway whose
/// configuration adds `more` after [`ROUTE`].
async fn mcp_stack(env: &[(&str, &str)], more: &str) -> McpStack {
    let python = mcp_sdk::python();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let outbox = dir.path().join("outbox.txt");
    let script = server_script();
    let mut all = vec![("OUTBOX", outbox.to_str().expect("a UTF-8 path"))];
    all.extend_from_slice(env);
    let server = Process::start_with_args(
        python.to_str().expect("a UTF-8 path"),
        &[script.to_str().expect("a UTF-8 path")],
        &all,
        "/healthz",
    )
    .await;
    let store_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let config = format!("{ROUTE}{more}");
    let gateway = start_gateway(&dir, server.address, &store_url, &config, &[]).await;
    McpStack {
        server: Some(server),
        gateway,
        outbox,
        _dir: dir,
    }
}

impl McpStack {
    fn url(&self) -> String {
        format!("http://{}/mcp", self.gateway.address)
    }

    /// The emails the server sent, one `to|subject` line each.
    fn sent(&self) -> Vec<String> {
        match std::fs::read_to_string(&self.outbox) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The gateway's `/metrics`.
    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.gateway.address))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

/// The value of the `idempotency_requests_total` series whose labels
/// include every one of `labels` (summed over the others).
fn requests_total(metrics: &str, labels: &[(&str, &str)]) -> u64 {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("idempotency_requests_total{"))
        .filter(|line| {
            labels
                .iter()
                .all(|(name, value)| line.contains(&format!("{name}=\"{value}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn send_email(id: u64, to: &str, key: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {
            "name": "send_email",
            "arguments": {"to": to, "subject": "hello", "body": "hi", "idempotency_key": key},
            "_meta": {"progressToken": format!("p-{id}")},
        },
    })
}

/// One answer of the gateway: whether it was a replay, and the JSON-RPC
/// response (the last response of an event stream).
struct Answer {
    replayed: bool,
    message: Value,
}

async fn post(http: &reqwest::Client, url: &str, body: &Value, attempt: u32) -> Answer {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", BOTH)
        .header("mcp-protocol-version", "2025-06-18")
        .header("x-retry-attempt", attempt.to_string())
        .json(body)
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(response.status(), 200, "JSON-RPC answers are HTTP 200");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let text = response.text().await.expect("a body");
    let message = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .chain(std::iter::once(text.as_str()))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("result").is_some() || message.get("error").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC response in {text}"));
    Answer { replayed, message }
}

fn text_of(message: &Value) -> &str {
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {message}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_identical_calls_to_a_python_mcp_server_send_one_email() {
    // Stateless: each POST stands alone, no session to open first.
    let stack = mcp_stack(
        &[("MCP_STATELESS", "1"), ("SEND_DELAY_MS", "300")],
        "[policy]\nin_flight = \"wait\"\nin_flight_wait_seconds = 20.0\n",
    )
    .await;
    let http = reqwest::Client::new();
    let url = stack.url();
    let calls = (0..200u64).map(|n| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let answer = post(&http, &url, &send_email(n, "a@example.com", "storm-1"), 0).await;
            (n, answer)
        })
    });
    let mut first = 0;
    for joined in futures_util::future::join_all(calls).await {
        let (n, answer) = joined.expect("the call's task");
        assert_eq!(answer.message["id"], n, "every answer has its own id");
        assert_eq!(
            text_of(&answer.message),
            "sent email #1 to a@example.com (hello)",
            "{}",
            answer.message
        );
        if answer.replayed {
            assert_eq!(
                answer.message["result"]["_meta"]["io.idempotency/replayed"],
                true
            );
        } else {
            first += 1;
        }
    }
    assert_eq!(first, 1, "one call ran, 199 got its replay");
    assert_eq!(stack.sent(), ["a@example.com|hello"], "one email sent");

    // The same key with other arguments: refused, nothing sent.
    let reused = post(&http, &url, &send_email(500, "b@example.com", "storm-1"), 1).await;
    assert_eq!(reused.message["id"], 500);
    assert_eq!(
        reused.message["error"]["code"], -32091,
        "{}",
        reused.message
    );
    assert_eq!(
        reused.message["error"]["data"]["type"],
        "urn:idempotency:key-reused"
    );
    // No key: refused (key_required defaults to true), nothing sent.
    let mut keyless = send_email(501, "c@example.com", "x");
    keyless["params"]["arguments"]
        .as_object_mut()
        .expect("arguments")
        .remove("idempotency_key");
    let refused = post(&http, &url, &keyless, 0).await;
    assert_eq!(
        refused.message["error"]["code"], -32094,
        "{}",
        refused.message
    );
    // The read-only tool passes through, never stored.
    let count = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "sent_emails", "arguments": {}}});
    for _ in 0..2 {
        let answer = post(&http, &url, &count, 0).await;
        assert!(!answer.replayed, "a read-only tool is never replayed");
        assert_eq!(text_of(&answer.message), "1");
    }
    assert_eq!(stack.sent().len(), 1, "still one email");

    // Each call counted once, as HTTP requests are.
    let metrics = stack.metrics().await;
    let count_of = |outcome: &str, attempt: &str| {
        requests_total(
            &metrics,
            &[
                ("route", "send_email"),
                ("outcome", outcome),
                ("attempt", attempt),
            ],
        )
    };
    assert_eq!(count_of("executed", "0"), 1, "{metrics}");
    assert_eq!(count_of("replayed", "0"), 199, "{metrics}");
    assert_eq!(count_of("key-reused", "1"), 1, "{metrics}");
    assert_eq!(count_of("rejected", "0"), 1, "the keyless call: {metrics}");
    assert_eq!(
        requests_total(&metrics, &[("route", "send_email")]),
        202,
        "nothing else, nothing twice: {metrics}"
    );
    assert_eq!(
        requests_total(&metrics, &[("route", "sent_emails")]),
        0,
        "a tool not named is not counted: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_retrying_through_a_lossy_proxy_and_the_gateway_sends_every_email_once() {
    const EMAILS: usize = 10;
    // Sessions (the SDK's default), answers as event streams.
    let stack = mcp_stack(&[("SEND_DELAY_MS", "10")], "").await;
    let proxy = FaultyProxy::start(
        stack.gateway.address,
        Faults::new(2029).with_dropped_responses(0.3),
    )
    .await;
    let mut command = tokio::process::Command::new(mcp_sdk::python());
    command
        .arg(mcp_sdk::dir().join("python_client.py"))
        .arg(format!("http://{}/mcp", proxy.address))
        .arg(EMAILS.to_string())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the Python client finishes in 120 s")
        .expect("the Python client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python client failed: {}\n{stdout}\n{stderr}",
        output.status
    );
    let answers: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(answers.len(), EMAILS, "{stdout}");
    let mut numbers = BTreeSet::new();
    for (index, answer) in answers.iter().enumerate() {
        assert_eq!(answer["index"], index);
        assert_eq!(answer["is_error"], false, "{answer}");
        let text = answer["text"].as_str().expect("a text result");
        let suffix = format!(" to user{index}@example.com (python {index})");
        assert!(
            text.ends_with(&suffix),
            "email {index} answered with another's result: {text}"
        );
        let number: u64 = text
            .strip_prefix("sent email #")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("the email's number");
        assert!(numbers.insert(number), "two emails share #{number}");
    }
    let sent = stack.sent();
    let distinct: BTreeSet<&String> = sent.iter().collect();
    assert_eq!(
        sent.len(),
        EMAILS,
        "every email sent exactly once: {sent:?}"
    );
    assert_eq!(distinct.len(), EMAILS, "{sent:?}");
    let counts = proxy.counts();
    assert!(
        counts.responses_dropped > 0,
        "answers were dropped: {counts:?}"
    );
    let replayed = answers.iter().filter(|a| a["replayed"] == true).count();
    println!(
        "python behind the gateway: {EMAILS} emails, {replayed} answered by a replay, proxy {counts:?}"
    );
}

/// Kills the server while `send_email` runs: the email may have gone out,
/// so the retry with the same key is refused `outcome-unknown`, not run.
/// `json`: the server answers as JSON, so nothing of the answer was sent
/// when it dies (the gateway answers the JSON-RPC error `outcome-unknown`,
/// HTTP 200, not its 502 `upstream-failed`); else as an
/// event stream whose head it had sent (the stream breaks off before the
/// call's response).
async fn an_upstream_dying_mid_call(json: bool) {
    let mut env = vec![("MCP_STATELESS", "1"), ("SEND_DELAY_MS", "5000")];
    if json {
        env.push(("MCP_JSON_RESPONSE", "1"));
    }
    let mut stack = mcp_stack(&env, "").await;
    let http = reqwest::Client::new();
    let url = stack.url();
    let call = send_email(1, "d@example.com", "dies-1");
    let pending = {
        let (http, url, call) = (http.clone(), url.clone(), call.clone());
        tokio::spawn(async move {
            let response = http
                .post(url)
                .header("content-type", "application/json")
                .header("accept", BOTH)
                .json(&call)
                .send()
                .await
                .expect("the gateway answers");
            let status = response.status();
            (status, response.text().await.unwrap_or_default())
        })
    };
    // The call reached the server and runs; the server dies before it answers.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stack.server.take().expect("the server").kill().await;
    let (status, body) = pending.await.expect("the call's task");
    if json {
        // A JSON-RPC error with HTTP 200, as every refusal (an SDK client
        // drops `error.data` of a non-2xx answer): the email may have gone.
        assert_eq!(status, 200, "a JSON-RPC error, not a 502: {body}");
        let answer: Value = serde_json::from_str(&body).expect("a JSON-RPC response");
        assert_eq!(answer["id"], 1, "{body}");
        assert_eq!(answer["error"]["code"], -32092, "{body}");
        assert_eq!(
            answer["error"]["data"]["type"],
            "urn:idempotency:outcome-unknown"
        );
        assert_eq!(
            answer["error"]["data"]["upstream"],
            "urn:idempotency:upstream-failed"
        );
    } else {
        assert_eq!(status, 200, "the stream's head had come: {body}");
        assert!(!body.contains("\"result\""), "no response came: {body}");
    }
    let retry = post(&http, &url, &send_email(2, "d@example.com", "dies-1"), 1).await;
    assert_eq!(retry.message["id"], 2);
    assert_eq!(retry.message["error"]["code"], -32092, "{}", retry.message);
    assert_eq!(
        retry.message["error"]["data"]["type"],
        "urn:idempotency:outcome-unknown"
    );
    let metrics = stack.metrics().await;
    let count_of =
        |outcome: &str| requests_total(&metrics, &[("route", "send_email"), ("outcome", outcome)]);
    assert_eq!(count_of("abandoned"), 1, "{metrics}");
    assert_eq!(count_of("rejected"), 1, "the retry: {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_dies_before_its_json_answer_leaves_the_key_abandoned() {
    an_upstream_dying_mid_call(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_whose_event_stream_breaks_off_leaves_the_key_abandoned() {
    an_upstream_dying_mid_call(false).await;
}

/// An error and its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

fn config(route: &str) -> Result<(), String> {
    Config::from_toml(&format!(
        "upstream = \"http://127.0.0.1:9000\"\nstore = \"sqlite::memory:\"\n[[routes]]\npath = \"/mcp\"\n{route}"
    ))
    .map_err(|e| chain(&e))?
    .validate()
    .map_err(|e| chain(&e))
}

#[test]
fn jsonrpc_routes_name_what_they_guard_and_http_routes_do_not() {
    config("type = \"jsonrpc\"\ntools = [\"send_email\"]\n").expect("a tool");
    config("type = \"jsonrpc\"\nrpc_methods = [\"message/send\"]\nkey_sources = [\"header\", \"message-id\"]\nkey_required = false\n")
        .expect("A2A");
    for (route, why) in [
        ("type = \"jsonrpc\"\n", "names tools or rpc_methods"),
        (
            "type = \"jsonrpc\"\ntools = [\"a\"]\nmethods = [\"POST\"]\n",
            "not methods",
        ),
        (
            "type = \"jsonrpc\"\nrpc_methods = [\"tools/call\"]\n",
            "guarded per tool",
        ),
        (
            "type = \"jsonrpc\"\ntools = [\"a\"]\nkey_sources = [\"cookie\"]\n",
            "key source \"cookie\"",
        ),
        (
            "type = \"jsonrpc\"\ntools = [\"a\"]\nkey_sources = []\n",
            "empty",
        ),
        ("tools = [\"a\"]\n", "for type = \"jsonrpc\" routes"),
        ("type = \"grpc\"\n", "unknown variant"),
    ] {
        let error = config(route).expect_err(route);
        assert!(error.contains(why), "{route}: {error}");
    }
}

/// The example configuration as docker-compose mounts it
/// (`gateway/gateway.example.toml`) in front of the compose file's sample
/// backend (`backend.py`, whose `/mcp` is a minimal stateless MCP server):
/// the `/mcp` route guards `send_email`. A call runs once, its retry is
/// replayed under its own id, and the official Python SDK's client,
/// calling twice with one key, gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_configurations_mcp_route_guards_the_sample_backend() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let backend_db = dir.path().join("backend.db");
    let backend = crate::support::start_backend(&backend_db, None).await;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.example.toml");
    let store = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let upstream = format!("http://{}", backend.address);
    let gateway = Process::start(
        env!("CARGO_BIN_EXE_idempotency-gateway"),
        &[
            ("GATEWAY_CONFIG", example.to_str().expect("a UTF-8 path")),
            ("UPSTREAM_URL", upstream.as_str()),
            ("DATABASE_URL", store.as_str()),
            ("RUST_LOG", "warn"),
        ],
        "/healthz",
    )
    .await;
    let url = format!("http://{}/mcp", gateway.address);
    let http = reqwest::Client::new();
    let first = post(&http, &url, &send_email(1, "e@example.com", "example-1"), 1).await;
    assert!(!first.replayed);
    assert!(
        text_of(&first.message).starts_with("sent email #"),
        "{}",
        first.message
    );
    let retry = post(&http, &url, &send_email(2, "e@example.com", "example-1"), 2).await;
    assert!(retry.replayed, "the retry is a replay");
    assert_eq!(retry.message["id"], 2, "under its own id");
    assert_eq!(text_of(&retry.message), text_of(&first.message));
    // The official Python SDK: initialize (passed through), then the call
    // twice with one key.
    let arguments = json!({"to": "f@example.com", "subject": "hi", "idempotency_key": "example-2"});
    let mut replayed = Vec::new();
    for _ in 0..2 {
        let output = tokio::process::Command::new(mcp_sdk::python())
            .arg(mcp_sdk::dir().join("python_call.py"))
            .arg(&url)
            .arg(arguments.to_string())
            .current_dir(mcp_sdk::dir())
            .kill_on_drop(true)
            .output()
            .await
            .expect("the Python SDK client runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "one JSON line: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        assert!(
            line["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("sent email #")),
            "{line}"
        );
        replayed.push(line["replayed"] == true);
    }
    assert_eq!(
        replayed,
        [false, true],
        "the SDK's second call is the replay"
    );
    let pool = crate::support::sqlite(&backend_db).await;
    let sent: i64 = sqlx::query_scalar("select count(*) from payments where path = '/mcp'")
        .fetch_one(&pool)
        .await
        .expect("count emails");
    pool.close().await;
    assert_eq!(sent, 2, "each key's email ran once");
}

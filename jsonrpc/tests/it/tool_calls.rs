//! Tool calls through the layer to the example's MCP server (`rmcp`, JSON
//! and event-stream answers) and to a small A2A endpoint: storms, key
//! reuse, replays under the retry's own id, read-only tools, releases.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::routing::post;
use idempotency_guard::{Engine, Store};
use idempotency_jsonrpc::JsonRpcLayer;
use idempotency_tests::names;
use serde_json::{Value, json};

use crate::email::{Form, Outbox, router};

/// Serves `app` on a free loopback port.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// The example's MCP server behind the layer.
async fn email_server<S: Store>(store: S, form: Form) -> (SocketAddr, Arc<Outbox>) {
    let outbox = Arc::new(Outbox::default());
    let address = serve(router(Engine::new(store), Arc::clone(&outbox), form)).await;
    (address, outbox)
}

/// One answer: whether it was replayed, its form, and the JSON-RPC message.
#[derive(Debug)]
struct Answer {
    replayed: bool,
    sse: bool,
    message: Value,
}

/// Posts one JSON-RPC message with `accept`; reads the final message of an
/// event stream.
async fn post_rpc(address: SocketAddr, body: &Value, accept: &str) -> Answer {
    let response = reqwest::Client::new()
        .post(format!("http://{address}/mcp"))
        .header("content-type", "application/json")
        .header("accept", accept)
        .header("authorization", "Bearer agent-1")
        .header("mcp-protocol-version", "2025-06-18")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "JSON-RPC answers are HTTP 200");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let sse = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let text = response.text().await.unwrap();
    let message = if sse {
        // The last `data:` line that holds a response.
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .rfind(|message| message.get("result").is_some() || message.get("error").is_some())
            .unwrap_or_else(|| panic!("no response in the stream: {text}"))
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
    };
    Answer {
        replayed,
        sse,
        message,
    }
}

const BOTH: &str = "application/json, text/event-stream";

fn send_email(id: Value, to: &str, key: &str) -> Value {
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

fn text_of(message: &Value) -> &str {
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {message}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_identical_calls_send_one_email() {
    let db = idempotency_tests::postgres().await;
    let (address, outbox) = email_server(db.store.clone(), Form::Json).await;
    let calls = (0..200).map(|n| {
        tokio::spawn(async move {
            let answer = post_rpc(
                address,
                &send_email(json!(n), "a@example.com", "storm-1"),
                BOTH,
            )
            .await;
            (n, answer)
        })
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut results = 0;
    let mut in_flight = Vec::new();
    for joined in answers {
        let (n, answer) = joined.unwrap();
        assert_eq!(
            answer.message["id"],
            json!(n),
            "every answer has its own id"
        );
        if answer.message.get("result").is_some() {
            assert_eq!(
                text_of(&answer.message),
                "sent email #1 to a@example.com (hello)"
            );
            results += 1;
        } else {
            let data = &answer.message["error"]["data"];
            assert_eq!(
                data["type"], "urn:idempotency:request-in-flight",
                "{}",
                answer.message
            );
            assert_eq!(answer.message["error"]["code"], -32090);
            assert!(data["retry_after"].as_u64().unwrap() >= 1);
            in_flight.push(n);
        }
    }
    assert!(results >= 1, "the first call got its result");
    // The calls told to wait get the stored result once it is in.
    for n in in_flight {
        let answer = post_rpc(
            address,
            &send_email(json!(n), "a@example.com", "storm-1"),
            BOTH,
        )
        .await;
        assert!(answer.replayed);
        assert_eq!(answer.message["id"], json!(n));
        assert_eq!(
            text_of(&answer.message),
            "sent email #1 to a@example.com (hello)"
        );
    }
    assert_eq!(outbox.count(), 1, "one email for one key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_other_arguments_is_refused_key_reused_and_sends_nothing() {
    let db = idempotency_tests::sqlite().await;
    let (address, outbox) = email_server(db.store.clone(), Form::Json).await;
    let first = post_rpc(
        address,
        &send_email(json!(1), "a@example.com", "reuse-1"),
        BOTH,
    )
    .await;
    assert_eq!(
        text_of(&first.message),
        "sent email #1 to a@example.com (hello)"
    );
    let other = post_rpc(
        address,
        &send_email(json!(2), "b@example.com", "reuse-1"),
        BOTH,
    )
    .await;
    assert_eq!(other.message["id"], 2);
    assert_eq!(other.message["error"]["code"], -32091);
    assert_eq!(
        other.message["error"]["data"]["type"],
        "urn:idempotency:key-reused"
    );
    assert_eq!(other.message["error"]["data"]["key"], "reuse-1");
    assert_eq!(outbox.count(), 1, "nothing sent for the reused key");
}

async fn stored_and_replayed_in_the_form_asked(form: Form) {
    let db = idempotency_tests::sqlite().await;
    let (address, outbox) = email_server(db.store.clone(), form).await;
    let first = post_rpc(
        address,
        &send_email(json!("first"), "a@example.com", "form-1"),
        BOTH,
    )
    .await;
    assert!(!first.replayed, "a first execution is not marked replayed");
    assert_eq!(
        first.sse,
        form == Form::EventStream,
        "the server's own form"
    );
    assert_eq!(first.message["id"], "first");
    let expected = text_of(&first.message).to_owned();
    for (id, accept, sse) in [
        ("json-retry", "application/json", false),
        ("sse-retry", "text/event-stream", true),
        ("both-retry", BOTH, form == Form::EventStream),
    ] {
        let retry = post_rpc(
            address,
            &send_email(json!(id), "a@example.com", "form-1"),
            accept,
        )
        .await;
        assert!(retry.replayed, "{id}: Idempotent-Replayed: true");
        assert_eq!(retry.sse, sse, "{id}: the form its Accept asks for");
        assert_eq!(retry.message["id"], id, "{id}: the retry's own id");
        assert_eq!(text_of(&retry.message), expected);
        assert_eq!(
            retry.message["result"]["_meta"]["io.idempotency/replayed"],
            true
        );
    }
    assert_eq!(outbox.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_are_stored_and_replayed_in_the_form_asked() {
    stored_and_replayed_in_the_form_asked(Form::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_answers_are_stored_and_replayed_in_the_form_asked() {
    stored_and_replayed_in_the_form_asked(Form::EventStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_is_never_stored() {
    let db = idempotency_tests::sqlite().await;
    let (address, _outbox) = email_server(db.store.clone(), Form::Json).await;
    let count = |id: u32| {
        json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "sent_emails", "arguments": {"idempotency_key": "read-1"}},
        })
    };
    assert_eq!(
        text_of(&post_rpc(address, &count(1), BOTH).await.message),
        "0"
    );
    post_rpc(
        address,
        &send_email(json!(2), "a@example.com", "write-1"),
        BOTH,
    )
    .await;
    let again = post_rpc(address, &count(3), BOTH).await;
    assert!(!again.replayed);
    assert_eq!(text_of(&again.message), "1", "it ran again, fresh");
    assert!(
        db.store
            .get(names::scope("agent-1"), names::key("read-1"))
            .await
            .unwrap()
            .is_none(),
        "no record for a read-only tool's key"
    );
    assert!(
        db.store
            .get(names::scope("agent-1"), names::key("write-1"))
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_call_without_a_key_is_refused_and_sends_nothing() {
    let db = idempotency_tests::sqlite().await;
    let (address, outbox) = email_server(db.store.clone(), Form::Json).await;
    let body = json!({
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "send_email", "arguments": {"to": "a@example.com", "subject": "s"}},
    });
    let answer = post_rpc(address, &body, BOTH).await;
    assert_eq!(answer.message["id"], 9);
    assert_eq!(answer.message["error"]["code"], -32094);
    assert_eq!(
        answer.message["error"]["data"]["type"],
        "urn:idempotency:key-missing"
    );
    assert_eq!(outbox.count(), 0);
}

/// A small A2A JSON-RPC endpoint: `message/send` counts its executions and
/// answers with a task; the first `fail_first` executions answer a tool
/// result with `isError: true`.
async fn a2a_server<S: Store>(store: S, fail_first: u64) -> (SocketAddr, Arc<AtomicU64>) {
    a2a_server_with(JsonRpcLayer::new(Engine::new(store)), fail_first).await
}

/// [`a2a_server`] behind `layer` (A2A's `message/send` added).
async fn a2a_server_with<S: Store>(
    layer: JsonRpcLayer<S>,
    fail_first: u64,
) -> (SocketAddr, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&runs);
    let endpoint = post(move |axum::Json(request): axum::Json<Value>| {
        let counter = Arc::clone(&counter);
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let result = if n <= fail_first {
                json!({"isError": true, "content": [{"type": "text", "text": "mail server down"}]})
            } else {
                json!({"kind": "task", "id": format!("task-{n}"), "status": {"state": "completed"}})
            };
            axum::Json(json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
        }
    });
    let app = Router::new()
        .route("/mcp", endpoint)
        .route_layer(layer.with_a2a_message_send());
    (serve(app).await, runs)
}

fn message_send(id: u32, message_id: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "message/send",
        "params": {"message": {
            "role": "user", "messageId": message_id, "kind": "message",
            "parts": [{"kind": "text", "text": "book the flight"}],
        }},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_message_send_with_one_message_id_sent_twice_runs_once() {
    let db = idempotency_tests::postgres().await;
    let (address, runs) = a2a_server(db.store.clone(), 0).await;
    let first = post_rpc(address, &message_send(1, "msg-1"), BOTH).await;
    assert_eq!(first.message["result"]["id"], "task-1");
    let second = post_rpc(address, &message_send(2, "msg-1"), BOTH).await;
    assert!(second.replayed);
    assert_eq!(second.message["id"], 2);
    assert_eq!(second.message["result"]["id"], "task-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_with_is_error_releases_the_key_so_the_retry_runs() {
    let db = idempotency_tests::sqlite().await;
    let (address, runs) = a2a_server(db.store.clone(), 1).await;
    let failed = post_rpc(address, &message_send(1, "msg-err"), BOTH).await;
    assert_eq!(failed.message["result"]["isError"], true);
    let retry = post_rpc(address, &message_send(2, "msg-err"), BOTH).await;
    assert!(!retry.replayed, "released: the retry ran");
    assert_eq!(retry.message["result"]["id"], "task-2");
    let third = post_rpc(address, &message_send(3, "msg-err"), BOTH).await;
    assert!(third.replayed, "the success is stored");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_refuses_store_unavailable_and_sends_nothing() {
    let db = idempotency_tests::postgres().await;
    let (address, outbox) = email_server(db.store.clone(), Form::Json).await;
    db.break_store().await;
    let answer = post_rpc(
        address,
        &send_email(json!(1), "a@example.com", "down-1"),
        BOTH,
    )
    .await;
    assert_eq!(answer.message["id"], 1);
    assert_eq!(answer.message["error"]["code"], -32093);
    let data = &answer.message["error"]["data"];
    assert_eq!(data["type"], "urn:idempotency:store-unavailable");
    assert!(data["retry_after"].as_u64().unwrap() >= 1);
    assert_eq!(outbox.count(), 0, "fail closed: the tool did not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_under_its_own_id_and_never_kept() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = idempotency_tests::sqlite().await;
    let (address, outbox) = email_server(db.store.clone(), Form::Json).await;
    // The id last, as the TypeScript SDK writes it: found past the limit.
    let big = "a".repeat(1024 * 1024 + 1);
    let body = format!(
        r#"{{"method":"tools/call","params":{{"name":"send_email","arguments":{{"to":"{big}","subject":"s","idempotency_key":"big-1"}}}},"jsonrpc":"2.0","id":"call-9"}}"#
    );
    let check = |answer: &Value| {
        assert_eq!(answer["id"], "call-9", "{answer}");
        assert_eq!(answer["error"]["code"], -32600);
        assert_eq!(
            answer["error"]["data"]["type"],
            "urn:idempotency:body-too-large"
        );
        assert_eq!(answer["error"]["data"]["limit"], 1024 * 1024);
    };
    // A declared length over the limit: nothing is kept, the id is found
    // in the body read past it.
    let response = reqwest::Client::new()
        .post(format!("http://{address}/mcp"))
        .header("content-type", "application/json")
        .header("accept", BOTH)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "a JSON-RPC error, HTTP 200");
    assert_eq!(response.headers()["content-type"], "application/json");
    check(&response.json().await.unwrap());
    // Chunked: no declared length, found over the limit as it is read.
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = "POST /mcp HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\naccept: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.as_bytes().chunks(64 * 1024) {
        let size = format!("{:x}\r\n", chunk.len());
        stream.write_all(size.as_bytes()).await.unwrap();
        stream.write_all(chunk).await.unwrap();
        stream.write_all(b"\r\n").await.unwrap();
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let (_, json) = answer.split_once("\r\n\r\n").unwrap();
    check(&serde_json::from_str(json).unwrap());
    assert_eq!(outbox.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_buffer_budget_is_refused_until_the_held_one_goes() {
    use idempotency_guard::adapter::BodyBudget;
    use tokio::io::AsyncWriteExt;

    let db = idempotency_tests::sqlite().await;
    let budget = BodyBudget::new(900);
    let layer = JsonRpcLayer::new(Engine::new(db.store.clone())).with_body_budget(budget.clone());
    let (address, runs) = a2a_server_with(layer, 0).await;
    // A POST that announces 800 bytes and sends 10: its 800 are reserved.
    let mut held = tokio::net::TcpStream::connect(address).await.unwrap();
    held.write_all(
        b"POST /mcp HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 800\r\n\r\n{\"jsonrpc\"",
    )
    .await
    .unwrap();
    for _ in 0..100 {
        if budget.in_use() == 800 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(budget.in_use(), 800, "the declared length is reserved");
    // A call of some 200 bytes does not fit beside it.
    let response = reqwest::Client::new()
        .post(format!("http://{address}/mcp"))
        .header("content-type", "application/json")
        .header("accept", BOTH)
        .json(&message_send(1, "msg-budget"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idempotency:body-buffer-full");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    // The held body goes: its bytes come back, and the call runs.
    drop(held);
    for _ in 0..100 {
        if budget.in_use() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(budget.in_use(), 0, "the reservation was returned");
    let answer = post_rpc(address, &message_send(2, "msg-budget"), BOTH).await;
    assert_eq!(answer.message["result"]["id"], "task-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

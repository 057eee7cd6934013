//! Hostile and malformed input, as a table: each row names what is sent,
//! the status it must get and the problem type (or none, when the HTTP
//! parser or the handler answers). Nothing may crash a process, answer
//! 500, or leave a record behind.

use idempotency_tests::programs::{self, Program};
use std::net::SocketAddr;

use idempotency_tests::Process;
use idempotency_tests::raw_http::{self, RawAnswer};
use serde_json::json;

const TOKEN: &str = "token-of-the-default-scope-01";
const ACME_TOKEN: &str = "token-of-the-acme-scope-0001";
const PAYMENT: &str = r#"{"amount":100,"currency":"EUR"}"#;

/// How a row's request is sent.
enum Send {
    /// Head and body at once; optionally half-close after the body.
    Whole {
        head: Vec<u8>,
        body: Vec<u8>,
        close_write: bool,
    },
    /// A chunked body of this many 1 MiB chunks, without a length.
    Endless { head: Vec<u8>, mebibytes: usize },
}

struct Row {
    name: &'static str,
    to: SocketAddr,
    send: Send,
    status: u16,
    problem: Option<&'static str>,
}

/// `POST /payments` with the given raw `Idempotency-Key` fields.
fn pay_head(keys: &[&[u8]], content_length: Option<usize>) -> Vec<u8> {
    let mut head =
        b"POST /payments HTTP/1.1\r\nhost: test\r\ncontent-type: application/json".to_vec();
    for key in keys {
        head.extend_from_slice(b"\r\nidempotency-key: ");
        head.extend_from_slice(key);
    }
    if let Some(length) = content_length {
        head.extend_from_slice(format!("\r\ncontent-length: {length}").as_bytes());
    }
    head
}

fn pay(keys: &[&[u8]], body: &[u8]) -> Send {
    Send::Whole {
        head: pay_head(keys, Some(body.len())),
        body: body.to_vec(),
        close_write: false,
    }
}

fn status_get(path: &str, authorization: Option<&str>) -> Send {
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: test").into_bytes();
    if let Some(value) = authorization {
        head.extend_from_slice(format!("\r\nauthorization: {value}").as_bytes());
    }
    Send::Whole {
        head,
        body: Vec::new(),
        close_write: false,
    }
}

fn lookup(keys: usize) -> Send {
    let body =
        json!({ "keys": (0..keys).map(|i| format!("k{i}")).collect::<Vec<_>>() }).to_string();
    let head = format!(
        "POST /v1/keys/lookup HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}",
        body.len()
    );
    Send::Whole {
        head: head.into_bytes(),
        body: body.into_bytes(),
        close_write: false,
    }
}

async fn run(row: &Row) -> RawAnswer {
    match &row.send {
        Send::Whole {
            head,
            body,
            close_write,
        } => raw_http::send(row.to, head, body, *close_write).await,
        Send::Endless { head, mebibytes } => {
            raw_http::send_endless(row.to, head, 1024 * 1024, *mebibytes)
                .await
                .0
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clear_errors_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let app = Process::start(
        &programs::path(Program::Payments),
        &[("DATABASE_URL", url.as_str())],
        "/metrics",
    )
    .await;
    let tokens = format!("default {TOKEN};acme {ACME_TOKEN}");
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("TOKENS", tokens.as_str()),
        ("MIGRATE_ON_START", "false"),
    ];
    let service = Process::start(&programs::path(Program::StatusService), &env, "/readyz").await;
    // A key in another scope, to ask about.
    let acme = raw_http::send(
        app.address,
        &[
            pay_head(&[b"acme-secret"], Some(PAYMENT.len())),
            b"\r\nx-tenant: acme".to_vec(),
        ]
        .concat(),
        PAYMENT.as_bytes(),
        false,
    )
    .await;
    assert_eq!(acme.status, 201);

    let long_key = "k".repeat(256);
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let nested_inside = format!(r#"{{"amount":1,"currency":"EUR","extra":{nested}}}"#);
    let ten_mb_number = format!(
        r#"{{"amount":{},"currency":"EUR"}}"#,
        "9".repeat(10 * 1024 * 1024)
    );
    let long_query = format!("/v1/keys/k?fingerprint={}", "a".repeat(10 * 1024));
    let huge_query = format!("/v1/keys/k?fingerprint={}", "a".repeat(100 * 1024));
    let bearer = format!("Bearer {TOKEN}");
    let (a, s) = (app.address, service.address);
    #[rustfmt::skip]
    let rows = vec![
        Row { name: "key: empty", to: a, send: pay(&[b""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: 256 characters", to: a, send: pay(&[long_key.as_bytes()], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a control character (refused by the HTTP parser)", to: a, send: pay(&[b"a\x01b"], PAYMENT.as_bytes()), status: 400, problem: None },
        Row { name: "key: a tab inside", to: a, send: pay(&[b"a\tb"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: non-ASCII", to: a, send: pay(&["café".as_bytes()], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: spaces", to: a, send: pay(&[b"a b"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a lone quote", to: a, send: pay(&[b"\""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a quote inside an sf-string", to: a, send: pay(&[b"\"ab\"cd\""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a malformed sf-string", to: a, send: pay(&[b"\"unterminated"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a well-formed sf-string", to: a, send: pay(&[b"\"quoted-ok\""], PAYMENT.as_bytes()), status: 201, problem: None },
        Row { name: "key: two Idempotency-Key fields", to: a, send: pay(&[b"one", b"two"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: SQL metacharacters", to: a, send: pay(&[b"';DROP_TABLE_payments;--"], PAYMENT.as_bytes()), status: 201, problem: None },
        Row { name: "body: invalid JSON (the handler answers)", to: a, send: pay(&[b"invalid-json"], br#"{"amount": "#), status: 400, problem: None },
        Row { name: "body: an array nested 100000 deep (the handler answers)", to: a, send: pay(&[b"nested"], nested.as_bytes()), status: 422, problem: None },
        Row { name: "body: a valid payment with a field nested 100000 deep", to: a, send: pay(&[b"nested-inside"], nested_inside.as_bytes()), status: 201, problem: None },
        Row { name: "body: 10 MB of digits in one number", to: a, send: pay(&[b"ten-mb-number"], ten_mb_number.as_bytes()), status: 413, problem: Some("body-too-large") },
        Row { name: "body: duplicate object keys (the handler answers)", to: a, send: pay(&[b"duplicate-keys"], br#"{"amount":1,"amount":2,"currency":"EUR"}"#), status: 422, problem: None },
        Row { name: "body: 100 MB chunked, no length", to: a, send: Send::Endless { head: pay_head(&[b"endless"], None), mebibytes: 100 }, status: 413, problem: Some("body-too-large") },
        Row { name: "body: Content-Length says 1000, 10 bytes come", to: a, send: Send::Whole { head: pay_head(&[b"short-body"], Some(1000)), body: b"{\"amount\":".to_vec(), close_write: true }, status: 400, problem: Some("body-unreadable") },
        Row { name: "body: Content-Length of 10 MB, nothing sent", to: a, send: Send::Whole { head: pay_head(&[b"declared-huge"], Some(10 * 1024 * 1024)), body: Vec::new(), close_write: false }, status: 413, problem: Some("body-too-large") },
        Row { name: "status: a percent-encoded slash in the key", to: s, send: status_get("/v1/keys/a%2Fb", Some(&bearer)), status: 404, problem: Some("key-not-found") },
        Row { name: "status: a raw slash in the key", to: s, send: status_get("/v1/keys/a/b", Some(&bearer)), status: 404, problem: Some("not-found") },
        Row { name: "status: percent-encoded non-ASCII", to: s, send: status_get("/v1/keys/caf%C3%A9", Some(&bearer)), status: 400, problem: Some("bad-request") },
        Row { name: "status: another scope's key", to: s, send: status_get("/v1/keys/acme-secret", Some(&bearer)), status: 404, problem: Some("key-not-found") },
        Row { name: "status: no token", to: s, send: status_get("/v1/keys/acme-secret", None), status: 401, problem: Some("unauthorized") },
        Row { name: "status: Bearer without a token", to: s, send: status_get("/v1/keys/acme-secret", Some("Bearer")), status: 401, problem: Some("unauthorized") },
        Row { name: "status: a malformed Authorization", to: s, send: status_get("/v1/keys/acme-secret", Some("\u{1}garbage")), status: 400, problem: None },
        Row { name: "status: a wrong token", to: s, send: status_get("/v1/keys/acme-secret", Some("Bearer token-of-nobody-000000000")), status: 401, problem: Some("unauthorized") },
        Row { name: "status: a lookup of 1001 keys", to: s, send: lookup(1001), status: 400, problem: Some("bad-request") },
        // Past the server's 8 KiB bound on the target (issue 25): our problem, before the handler.
        Row { name: "status: a 10 KB query string", to: s, send: status_get(&long_query, Some(&bearer)), status: 414, problem: Some("uri-too-long") },
        Row { name: "status: a 100 KB query string (refused by the HTTP parser)", to: s, send: status_get(&huge_query, Some(&bearer)), status: 414, problem: None },
    ];

    let mut mismatches = Vec::new();
    for row in &rows {
        let answer = run(row).await;
        let problem = answer.problem();
        assert_ne!(answer.status, 500, "{}: a 500", row.name);
        if answer.status != row.status || problem.as_deref() != row.problem {
            mismatches.push(format!(
                "{}: expected {} {:?}, got {} {:?}: {}",
                row.name,
                row.status,
                row.problem,
                answer.status,
                problem,
                String::from_utf8_lossy(&answer.body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "rows that did not answer as expected:\n{}",
        mismatches.join("\n")
    );

    // Both processes are alive and well.
    let alive = raw_http::send(
        service.address,
        b"GET /healthz HTTP/1.1\r\nhost: t",
        b"",
        false,
    )
    .await;
    assert_eq!(alive.status, 200);
    let alive = raw_http::send(app.address, b"GET /metrics HTTP/1.1\r\nhost: t", b"", false).await;
    assert_eq!(alive.status, 200);
    // The endless body was refused without being buffered.
    let peak = app.peak_rss_kib().unwrap_or(0);
    assert!(peak < 128 * 1024, "the app's peak memory is {peak} KiB");

    // Only the rows whose handler ran left a record: the Json extractor's
    // rejections (400, 422 for invalid JSON, deep nesting, duplicate keys)
    // happen before the handler starts, so they are not stored and their
    // keys are free for the corrected request (Stripe's rule). Only the
    // three valid payments and the other scope's payment exist.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let payments: i64 = sqlx::query_scalar("select count(*) from payments")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(payments, 4, "no hostile row made a payment");
    let mut keys: Vec<String> =
        sqlx::query_scalar("select key from idempotency_records order by key")
            .fetch_all(&pool)
            .await
            .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "';DROP_TABLE_payments;--",
            "acme-secret",
            "nested-inside",
            "quoted-ok"
        ],
        "records exist only for requests whose handler ran"
    );
}

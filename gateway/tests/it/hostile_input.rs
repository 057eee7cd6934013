//! The layer's hostile-input table (`tests/e2e/hostile_input.rs`), sent
//! to the gateway in front of the Python backend: each row names what is
//! sent, the status it must get and the problem type (or none, when the
//! HTTP parser or the backend answers). Nothing may crash the gateway,
//! answer 500, or leave a record behind for a request the backend never
//! saw.

use idempotency_tests::raw_http::{self, RawAnswer};

use crate::support::stack;

const PAYMENT: &str = r#"{"amount":100,"currency":"EUR"}"#;

enum Send {
    Whole {
        head: Vec<u8>,
        body: Vec<u8>,
        close_write: bool,
    },
    Endless {
        head: Vec<u8>,
        mebibytes: usize,
    },
}

struct Row {
    name: &'static str,
    send: Send,
    status: u16,
    problem: Option<&'static str>,
}

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

async fn run(to: std::net::SocketAddr, send: &Send) -> RawAnswer {
    match send {
        Send::Whole {
            head,
            body,
            close_write,
        } => raw_http::send(to, head, body, *close_write).await,
        Send::Endless { head, mebibytes } => {
            raw_http::send_endless(to, head, 1024 * 1024, *mebibytes)
                .await
                .0
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_through_the_gateway_gets_clear_errors_and_leaves_nothing_behind() {
    let stack = stack("[[routes]]\npath = \"/payments\"\n", &[]).await;
    let long_key = "k".repeat(256);
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let nested_inside = format!(r#"{{"amount":1,"currency":"EUR","extra":{nested}}}"#);
    let ten_mb_number = format!(
        r#"{{"amount":{},"currency":"EUR"}}"#,
        "9".repeat(10 * 1024 * 1024)
    );
    #[rustfmt::skip]
    let rows = vec![
        Row { name: "key: missing", send: pay(&[], PAYMENT.as_bytes()), status: 400, problem: Some("key-missing") },
        Row { name: "key: empty", send: pay(&[b""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: 256 characters", send: pay(&[long_key.as_bytes()], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a control character (refused by the HTTP parser)", send: pay(&[b"a\x01b"], PAYMENT.as_bytes()), status: 400, problem: None },
        Row { name: "key: a tab inside", send: pay(&[b"a\tb"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: non-ASCII", send: pay(&["café".as_bytes()], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: spaces", send: pay(&[b"a b"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a lone quote", send: pay(&[b"\""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a quote inside an sf-string", send: pay(&[b"\"ab\"cd\""], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a malformed sf-string", send: pay(&[b"\"unterminated"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: a well-formed sf-string", send: pay(&[b"\"quoted-ok\""], PAYMENT.as_bytes()), status: 201, problem: None },
        Row { name: "key: two Idempotency-Key fields", send: pay(&[b"one", b"two"], PAYMENT.as_bytes()), status: 400, problem: Some("key-invalid") },
        Row { name: "key: SQL metacharacters", send: pay(&[b"';DROP_TABLE_payments;--"], PAYMENT.as_bytes()), status: 201, problem: None },
        Row { name: "body: invalid JSON (the backend answers)", send: pay(&[b"invalid-json"], br#"{"amount": "#), status: 400, problem: None },
        Row { name: "body: an array nested 100000 deep (the backend answers)", send: pay(&[b"nested"], nested.as_bytes()), status: 422, problem: None },
        Row { name: "body: a payment with a field nested 100000 deep (the backend answers)", send: pay(&[b"nested-inside"], nested_inside.as_bytes()), status: 422, problem: None },
        Row { name: "body: 10 MB of digits in one number", send: pay(&[b"ten-mb-number"], ten_mb_number.as_bytes()), status: 413, problem: Some("body-too-large") },
        Row { name: "body: duplicate object keys (the backend answers)", send: pay(&[b"duplicate-keys"], br#"{"amount":1,"amount":2,"currency":"EUR"}"#), status: 422, problem: None },
        Row { name: "body: 100 MB chunked, no length", send: Send::Endless { head: pay_head(&[b"endless"], None), mebibytes: 100 }, status: 413, problem: Some("body-too-large") },
        Row { name: "body: Content-Length says 1000, 10 bytes come", send: Send::Whole { head: pay_head(&[b"short-body"], Some(1000)), body: b"{\"amount\":".to_vec(), close_write: true }, status: 400, problem: Some("body-unreadable") },
        Row { name: "body: Content-Length of 10 MB, nothing sent", send: Send::Whole { head: pay_head(&[b"declared-huge"], Some(10 * 1024 * 1024)), body: Vec::new(), close_write: false }, status: 413, problem: Some("body-too-large") },
    ];

    let mut mismatches = Vec::new();
    for row in &rows {
        let answer = run(stack.gateway.address, &row.send).await;
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

    let alive = raw_http::send(
        stack.gateway.address,
        b"GET /healthz HTTP/1.1\r\nhost: t",
        b"",
        false,
    )
    .await;
    assert_eq!(alive.status, 200, "the gateway is alive");
    let peak = stack.gateway.peak_rss_kib().unwrap_or(0);
    assert!(peak < 64 * 1024, "the gateway's peak memory is {peak} KiB");

    // Only the two valid payments ran; the backend's own 4xx answers are
    // stored like any answer; nothing the gateway refused left a record.
    assert_eq!(
        stack.executions("/payments").await,
        2,
        "no hostile row made a payment"
    );
    let mut keys: Vec<String> = stack
        .records()
        .await
        .into_iter()
        .map(|(_, key, _)| key)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "';DROP_TABLE_payments;--",
            "duplicate-keys",
            "invalid-json",
            "nested",
            "nested-inside",
            "quoted-ok"
        ],
        "records exist only for requests that reached the backend"
    );
}

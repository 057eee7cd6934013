//! Hostile clients against the gateway binary: spellings of a guarded
//! request that a lenient backend runs as the guarded one, requests the
//! gateway must not forward, and slow or idle connections under a low
//! descriptor limit.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idempotency_tests::raw_http::{self, closed_within, slow_head};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Stack, stack};

const PAYMENT: &str = r#"{"amount":100,"currency":"EUR"}"#;

/// A raw keyed payment: `<method> <target>` with `key`.
async fn raw_pay(to: SocketAddr, method: &str, target: &str, key: &str) -> raw_http::RawAnswer {
    let head = format!(
        "{method} {target} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\ncontent-length: {}",
        PAYMENT.len()
    );
    raw_http::send(to, head.as_bytes(), PAYMENT.as_bytes(), false).await
}

/// The path spellings a lenient backend routes to `/payments`.
const SPELLINGS: [&str; 10] = [
    "/payments/",
    "/payments;v=1",
    "/payments/.",
    "/payments/../payments",
    "/payments%2F",
    "/payments%2f",
    "//payments",
    "/p%61yments",
    "/x/../payments",
    "/payments\\",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_guarded_request_runs_it_a_second_time() {
    let stack = stack("[[routes]]\npath = \"/payments\"\n", &[]).await;

    // The backend is lenient: each spelling, sent to it directly, runs
    // its payments handler (so a gateway that forwarded it would run the
    // payment again).
    for (n, target) in SPELLINGS.iter().enumerate() {
        let answer = raw_pay(
            stack.backend_address,
            "POST",
            target,
            &format!("direct-{n}"),
        )
        .await;
        assert_eq!(answer.status, 201, "the backend runs POST {target}");
    }
    for method in ["post", "Post"] {
        let answer = raw_pay(stack.backend_address, method, "/payments", "direct-method").await;
        assert_eq!(answer.status, 201, "the backend runs {method} /payments");
    }
    let direct = stack.executions("/payments").await;
    assert_eq!(direct, SPELLINGS.len() as i64 + 2);

    let first = raw_pay(stack.gateway.address, "POST", "/payments", "once").await;
    assert_eq!(first.status, 201, "the canonical request runs");
    let mut ran_again = Vec::new();
    for target in SPELLINGS {
        for key in ["once", "another-key"] {
            let answer = raw_pay(stack.gateway.address, "POST", target, key).await;
            if answer.status != 400 || answer.problem().as_deref() != Some("target-not-canonical") {
                ran_again.push(format!(
                    "POST {target} ({key}): {} {:?}",
                    answer.status,
                    answer.problem()
                ));
            }
        }
        // Without a key too: the route requires one, so a spelling must
        // not turn a 400 key-missing into an unguarded run.
        let head = format!(
            "POST {target} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}",
            PAYMENT.len()
        );
        let answer = raw_http::send(
            stack.gateway.address,
            head.as_bytes(),
            PAYMENT.as_bytes(),
            false,
        )
        .await;
        if answer.status != 400 {
            ran_again.push(format!("POST {target} (no key): {}", answer.status));
        }
    }
    for method in ["post", "Post", "pOST"] {
        let answer = raw_pay(stack.gateway.address, method, "/payments", "once").await;
        if answer.status != 400 || answer.problem().as_deref() != Some("method-not-canonical") {
            ran_again.push(format!(
                "{method} /payments: {} {:?}",
                answer.status,
                answer.problem()
            ));
        }
    }
    // HTTP/2 (h2c, prior knowledge): the same refusal.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    for method in ["post", "Post"] {
        let request = http::Request::builder()
            .method(http::Method::from_bytes(method.as_bytes()).expect("a method"))
            .uri(stack.url("/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", "once")
            .body(Full::new(Bytes::from_static(PAYMENT.as_bytes())))
            .expect("a request");
        let response = client.request(request).await.expect("an h2c answer");
        assert_eq!(response.version(), http::Version::HTTP_2);
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        if status != 400 || !String::from_utf8_lossy(&body).contains("method-not-canonical") {
            ran_again.push(format!("h2c {method} /payments: {status}"));
        }
    }
    assert!(
        ran_again.is_empty(),
        "not refused:\n{}",
        ran_again.join("\n")
    );
    assert_eq!(
        stack.executions("/payments").await,
        direct + 1,
        "through the gateway the payment ran once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_to_no_guarded_route_is_refused_and_connect_is_not_forwarded() {
    let stack = stack("[[routes]]\npath = \"/payments\"\n", &[]).await;
    let answer = raw_pay(
        stack.gateway.address,
        "POST",
        "/slow?seconds=0",
        "misrouted",
    )
    .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem().as_deref(), Some("route-not-guarded"));
    assert_eq!(stack.executions("/slow").await, 0, "nothing ran unguarded");
    // Without a key, or on an unguarded method, it passes through.
    let head = b"POST /slow?seconds=0 HTTP/1.1\r\nhost: test\r\ncontent-length: 0";
    assert_eq!(
        raw_http::send(stack.gateway.address, head, b"", false)
            .await
            .status,
        201
    );

    let connect = raw_http::send(
        stack.gateway.address,
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443",
        b"",
        false,
    )
    .await;
    assert_eq!(connect.status, 501);
    assert_eq!(connect.problem().as_deref(), Some("method-not-supported"));

    let passing = crate::support::stack(
        "[[routes]]\npath = \"/payments\"\n[policy]\nroute_not_guarded = \"pass\"\n",
        &[],
    )
    .await;
    let answer = raw_pay(
        passing.gateway.address,
        "POST",
        "/slow?seconds=0",
        "let-through",
    )
    .await;
    assert_eq!(answer.status, 201, "the setting lets it pass");
    assert_eq!(passing.executions("/slow").await, 1);
}

/// Starts the gateway binary with its descriptor limit at `limit` (soft
/// and hard), through `sh -c 'ulimit -n'`.
async fn gateway_with_descriptor_limit(
    stack: &Stack,
    limit: u32,
    rest: &str,
) -> idempotency_tests::Process {
    let dir = stack._dir.path();
    let script = dir.join("limited-gateway.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nulimit -n {limit} || exit 1\nexec '{}'\n",
            env!("CARGO_BIN_EXE_idempotency-gateway")
        ),
    )
    .expect("write the wrapper");
    let _ = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status();
    let config = dir.join("limited.toml");
    let store = format!("sqlite://{}?mode=rwc", dir.join("limited.db").display());
    std::fs::write(
        &config,
        format!(
            "upstream = \"http://{}\"\nstore = \"{store}\"\n{rest}",
            stack.backend_address
        ),
    )
    .expect("write the configuration");
    idempotency_tests::Process::start(
        script.to_str().expect("a UTF-8 path"),
        &[("GATEWAY_CONFIG", config.to_str().expect("a UTF-8 path"))],
        "/healthz",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_starve_a_client_under_a_low_descriptor_limit() {
    let stack = stack("[[routes]]\npath = \"/payments\"\n", &[]).await;
    let gateway = gateway_with_descriptor_limit(
        &stack,
        256,
        "[[routes]]\npath = \"/payments\"\n[server]\nheader_read_seconds = 2\nidle_seconds = 3\n",
    )
    .await;
    let to = gateway.address;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(to).await.expect("connect"));
    }
    let mut slow = Vec::new();
    for _ in 0..50 {
        slow.push(slow_head(to).await);
    }
    // A normal client is answered promptly (a functional deadline: with
    // no cap it got no answer within 10 s, the descriptors being gone).
    let answer = tokio::time::timeout(
        Duration::from_secs(1),
        raw_pay(to, "POST", "/payments", "normal-client"),
    )
    .await
    .expect("a normal client is answered within 1 s");
    assert_eq!(answer.status, 201);
    assert_eq!(stack.executions("/payments").await, 1);

    // Every idle and slow connection is closed: the oldest at once (the
    // cap), the rest after their deadline (3 s idle, 2 s for a head).
    let closes = idle
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, Duration::from_secs(15))))
        .collect::<Vec<_>>();
    let mut open_idle = 0;
    for close in closes {
        open_idle += usize::from(!close.await.expect("joined"));
    }
    let closes = slow
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, Duration::from_secs(15))))
        .collect::<Vec<_>>();
    let mut open_slow = 0;
    for close in closes {
        open_slow += usize::from(!close.await.expect("joined"));
    }
    assert_eq!(
        (open_idle, open_slow),
        (0, 0),
        "idle and slow connections left open"
    );

    // Under the cap, too, each is closed by its own deadline.
    let idle = TcpStream::connect(to).await.expect("connect");
    let slow = slow_head(to).await;
    assert!(
        closed_within(idle, Duration::from_secs(15)).await,
        "an idle connection is closed"
    );
    assert!(
        closed_within(slow, Duration::from_secs(15)).await,
        "a slow head is closed"
    );
    let answer = raw_pay(to, "POST", "/payments", "after").await;
    assert_eq!(answer.status, 201, "the gateway still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_101_is_an_upstream_failure_and_its_key_is_abandoned() {
    let stack = stack("[[routes]]\npath = \"/switch\"\n", &[]).await;
    let first = raw_pay(stack.gateway.address, "POST", "/switch", "switched").await;
    assert_eq!(first.status, 502);
    assert_eq!(first.problem().as_deref(), Some("upstream-failed"));
    let again = raw_pay(stack.gateway.address, "POST", "/switch", "switched").await;
    assert_eq!(again.status, 409, "not replayed, not run again");
    assert_eq!(again.problem().as_deref(), Some("outcome-unknown"));
    assert_eq!(stack.executions("/switch").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_body_slower_than_its_deadline_is_a_408_and_runs_nothing() {
    let stack = stack(
        "[[routes]]\npath = \"/payments\"\n[server]\nbody_seconds = 1\n",
        &[],
    )
    .await;
    // 10 of the 31 bytes announced, then nothing: the deadline ends it.
    let head = format!(
        "POST /payments HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nidempotency-key: slow-body\r\ncontent-length: {}",
        PAYMENT.len()
    );
    let answer = raw_http::send(
        stack.gateway.address,
        head.as_bytes(),
        &PAYMENT.as_bytes()[..10],
        false,
    )
    .await;
    assert_eq!(answer.status, 408);
    assert_eq!(answer.problem().as_deref(), Some("body-timeout"));
    assert_eq!(stack.executions("/payments").await, 0);
    let retry = raw_pay(stack.gateway.address, "POST", "/payments", "slow-body").await;
    assert_eq!(retry.status, 201, "nothing was stored: the retry runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_414_and_431_problems_and_hyper_answers_the_rest_itself() {
    let stack = stack("[[routes]]\npath = \"/payments\"\n", &[]).await;
    raw_http::assert_default_head_bounds(stack.gateway.address, "/healthz").await;
    // HTTP/2 (h2c): the same 431 problem for header bytes over the limit.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = http::Request::get(stack.url("/healthz"))
        .header("x-padding", "p".repeat(33 * 1024))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("an h2c answer");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 431);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("urn:idempotency:headers-too-large"),
        "{body:?}"
    );
    // The route was never asked.
    assert_eq!(stack.executions("/payments").await, 0);
}

/// A connection that sends a guarded head announcing `length` bytes and,
/// unless it is answered within 300 ms, all but the last byte of the
/// body, then holds; the answer it got early, if any, and the stream.
async fn held_body(to: SocketAddr, key: &str, length: usize) -> (Option<u16>, TcpStream) {
    let mut stream = TcpStream::connect(to).await.expect("connect");
    let head = format!(
        "POST /payments HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\ncontent-length: {length}\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("write the head");
    let mut early = [0u8; 12];
    match tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut early)).await {
        Ok(Ok(_)) => {
            let status = std::str::from_utf8(&early[9..12])
                .ok()
                .and_then(|s| s.parse().ok());
            (status, stream)
        }
        Ok(Err(error)) => panic!("the gateway closed a held body: {error}"),
        Err(_) => {
            stream
                .write_all(&vec![b'7'; length - 1])
                .await
                .expect("write the body");
            (None, stream)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_guarded_bodies_are_bounded_by_the_buffer_budget() {
    // A 16 MiB budget: 16 bodies of the 1 MiB limit at once.
    let stack = stack(
        "[[routes]]\npath = \"/payments\"\n[limits]\nbuffered_body_bytes = 16777216\n",
        &[],
    )
    .await;
    let to = stack.gateway.address;
    let warm = raw_pay(to, "POST", "/payments", "warm-up").await;
    assert_eq!(warm.status, 201);
    let before = stack.gateway.rss_kib().expect("the gateway's VmRSS");

    let mut held = Vec::new();
    let mut refused = 0;
    for n in 0..50 {
        let (early, stream) = held_body(to, &format!("held-{n}"), 1024 * 1024).await;
        match early {
            None => held.push(stream),
            Some(503) => refused += 1,
            Some(other) => panic!("held body {n} answered {other}"),
        }
    }
    assert_eq!((held.len(), refused), (16, 34), "16 bodies fit the budget");
    // Let the gateway read what was sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = stack.gateway.rss_kib().expect("the gateway's VmRSS");
    let grown = during.saturating_sub(before);
    println!("VmRSS {before} KiB before, {during} KiB with 16 held bodies (+{grown} KiB)");
    // The bound documented in GUARANTEES.md: 1.5 × the budget plus 8 MiB.
    assert!(
        grown < (24 + 8) * 1024,
        "the gateway grew by {grown} KiB holding bodies in a 16 MiB budget"
    );
    // The refusal, whole: a problem with Retry-After.
    let answer = raw_pay(to, "POST", "/payments", "while-full").await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.problem().as_deref(), Some("body-buffer-full"));
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(
        stack.executions("/payments").await,
        1,
        "nothing ran but the warm-up"
    );

    // The held bodies go: their bytes come back.
    drop(held);
    let mut status = 0;
    for _ in 0..50 {
        status = raw_pay(to, "POST", "/payments", "after").await.status;
        if status == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 201, "the budget came back");
}

#[test]
fn a_buffer_budget_below_the_body_limit_and_zero_head_limits_are_configuration_errors() {
    use idempotency_gateway::Config;
    let base = "upstream = \"http://127.0.0.1:8000\"\n[[routes]]\npath = \"/payments\"\n";
    let defaults = Config::from_toml(base).expect("it parses");
    assert_eq!(defaults.limits.buffered_body_bytes, 64 * 1024 * 1024);
    assert_eq!(defaults.server.max_uri_bytes, 8192);
    assert_eq!(defaults.server.max_header_bytes, 32768);
    defaults.validate().expect("the defaults validate");
    for (rest, names) in [
        (
            "[limits]\nbody_bytes = 2048\nbuffered_body_bytes = 1024\n",
            "limits.buffered_body_bytes",
        ),
        ("[server]\nmax_uri_bytes = 0\n", "server.max_uri_bytes"),
        (
            "[server]\nmax_header_bytes = 0\n",
            "server.max_header_bytes",
        ),
    ] {
        let config = Config::from_toml(&format!("{base}{rest}")).expect("it parses");
        let error = config.validate().expect_err("refused").to_string();
        assert!(error.contains(names), "{rest}: {error}");
    }
}

//! Unguarded requests pass through byte for byte, streamed both ways, with
//! hop-by-hop headers dropped and forwarding headers added.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idempotency_tests::raw_http;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{stack, start_gateway};

const ROUTES: &str = "[[routes]]\npath = \"/payments\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_download_streams_through_byte_for_byte_in_bounded_memory() {
    let stack = stack(ROUTES, &[]).await;
    let size: u64 = 100 * 1024 * 1024;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client");
    let answer = http
        .get(stack.url(&format!("/download?bytes={size}")))
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.content_length(),
        Some(size),
        "the length passes through"
    );
    let mut stream = answer.bytes_stream();
    let mut offset: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("the body streams");
        for (i, byte) in chunk.iter().enumerate() {
            let at = offset + i as u64;
            assert_eq!(u64::from(*byte), at % 256, "byte {at}");
        }
        offset += chunk.len() as u64;
    }
    assert_eq!(offset, size, "every byte came");
    let peak = stack.gateway.peak_rss_kib().expect("the gateway's VmHWM");
    println!("gateway peak RSS after a 100 MiB download: {} KiB", peak);
    assert!(peak < 64 * 1024, "the gateway's peak memory is {peak} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_streams_through_byte_for_byte() {
    let stack = stack(ROUTES, &[]).await;
    let body: Vec<u8> = (0..20 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let expected = format!("{:x}", Sha256::digest(&body));
    let http = reqwest::Client::new();
    let answer = http
        .post(stack.url("/upload"))
        .body(body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 200);
    let json: serde_json::Value = answer.json().await.expect("JSON");
    assert_eq!(json["length"], 20 * 1024 * 1024);
    assert_eq!(json["sha256"], expected.as_str());
    assert!(
        stack.records().await.is_empty(),
        "an unguarded route stores nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_added_and_hop_by_hop_ones_dropped() {
    let stack = stack(ROUTES, &[]).await;
    let head = b"GET /echo?x=1 HTTP/1.1\r\nhost: api.example\r\nx-custom: kept\r\nx-private: per-connection\r\nconnection: x-private\r\nkeep-alive: timeout=5\r\nte: trailers\r\nx-forwarded-for: 10.0.0.1";
    let answer = raw_http::send(stack.gateway.address, head, b"", false).await;
    assert_eq!(answer.status, 200);
    let json: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
    assert_eq!(json["path"], "/echo?x=1", "the path and query pass through");
    let headers: Vec<(String, String)> = json["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap_or("").to_owned(),
                pair[1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("x-custom"), Some("kept"));
    for gone in ["x-private", "keep-alive", "te"] {
        assert_eq!(get(gone), None, "{gone} is hop-by-hop");
    }
    assert_eq!(
        get("host"),
        Some(stack.backend_address.to_string().as_str()),
        "rewritten to the upstream's"
    );
    assert_eq!(get("x-forwarded-host"), Some("api.example"));
    assert_eq!(get("x-forwarded-proto"), Some("http"));
    assert_eq!(get("x-forwarded-for"), Some("10.0.0.1, 127.0.0.1"));
    assert_eq!(
        get("forwarded"),
        Some("for=127.0.0.1;host=\"api.example\";proto=http")
    );
}

/// An upstream that answers one request per connection with keep-alive
/// (no `Connection: close`), then closes the connection: what a server's
/// keep-alive timeout does to an idle pooled connection. The answer's body
/// is the connection's number.
async fn closing_upstream(connections: Arc<AtomicU64>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let number = connections.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = number.to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                // Closed a little later, once the gateway has pooled the
                // connection, as a backend's keep-alive timeout does.
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_upstream_closed_is_replaced_and_the_request_sent_again() {
    let connections = Arc::new(AtomicU64::new(0));
    let upstream = closing_upstream(Arc::clone(&connections)).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let gateway = start_gateway(&dir, upstream, &store_url, ROUTES, &[]).await;
    let http = reqwest::Client::new();
    for expected in 1..=3 {
        let answer = http
            .get(format!("http://{}/items/{expected}", gateway.address))
            .send()
            .await
            .expect("an answer");
        assert_eq!(answer.status(), 200, "request {expected}");
        assert_eq!(
            answer.text().await.expect("a body"),
            expected.to_string(),
            "request {expected} went on a new connection"
        );
        // The upstream's close reaches the gateway while the connection
        // is idle in its pool.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

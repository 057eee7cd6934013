//! HTTP/1.1 by hand, for requests no well-behaved client would send: two
//! fields of one header, control characters, lying lengths, endless bodies.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read off the wire.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    /// The status code.
    pub status: u16,
    /// The header fields, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The problem name (after `urn:idempotency:`), when the answer is a problem.
    pub fn problem(&self) -> Option<String> {
        if self.header("content-type") != Some("application/problem+json") {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json["type"]
            .as_str()?
            .strip_prefix("urn:idempotency:")
            .map(str::to_owned)
    }
}

/// Sends `head` (request line and fields, without the final blank line),
/// then `body`, with `Connection: close`, and reads the answer. With
/// `close_write`, the client half-closes after the body (as a client that
/// sent less than it announced and gave up).
///
/// # Panics
///
/// When the server cannot be reached or answers something unparsable
/// within 30 s.
pub async fn send(address: SocketAddr, head: &[u8], body: &[u8], close_write: bool) -> RawAnswer {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let mut request = head.to_vec();
    request.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    request.extend_from_slice(body);
    // The server may answer (and close) before reading everything.
    let _ = stream.write_all(&request).await;
    if close_write {
        let _ = stream.shutdown().await;
    }
    read_answer(&mut stream).await
}

/// Sends a chunked body of `chunks` chunks of `chunk_size` bytes, without a
/// length, stopping as soon as the server answers; returns the answer and
/// how many body bytes were written before it came.
///
/// # Panics
///
/// As [`send`].
pub async fn send_endless(
    address: SocketAddr,
    head: &[u8],
    chunk_size: usize,
    chunks: usize,
) -> (RawAnswer, usize) {
    let stream = TcpStream::connect(address).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let mut start = head.to_vec();
    start.extend_from_slice(b"\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    let writing = tokio::spawn(async move {
        let mut written = 0;
        if writer.write_all(&start).await.is_err() {
            return written;
        }
        let chunk = format!("{chunk_size:x}\r\n{}\r\n", "7".repeat(chunk_size));
        for _ in 0..chunks {
            if writer.write_all(chunk.as_bytes()).await.is_err() {
                return written;
            }
            written += chunk_size;
        }
        let _ = writer.write_all(b"0\r\n\r\n").await;
        written
    });
    let answer = read_answer(&mut reader).await;
    writing.abort();
    let written = writing.await.unwrap_or(usize::MAX);
    (answer, written)
}

/// Sends `bytes` (a head that is never finished, say) and reads the
/// answer without sending more, so the server has read everything sent
/// before it answers and closes (a close with unread bytes would reset the
/// connection, and the answer could be lost).
///
/// # Panics
///
/// As [`send`].
pub async fn send_unfinished(address: SocketAddr, bytes: &[u8]) -> RawAnswer {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let _ = stream.write_all(bytes).await;
    read_answer(&mut stream).await
}

/// Opens a connection that sends a request head (`POST /payments`) one
/// byte every 200 ms, until the server closes it; returns the half to read
/// from.
///
/// # Panics
///
/// When the server cannot be reached.
pub async fn slow_head(to: SocketAddr) -> tokio::net::tcp::OwnedReadHalf {
    let stream = TcpStream::connect(to).await.expect("connect");
    let (reader, mut writer) = stream.into_split();
    tokio::spawn(async move {
        let head = b"POST /payments HTTP/1.1\r\nhost: test\r\nx-padding: ";
        if writer.write_all(head).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if writer.write_all(b"a").await.is_err() {
                return;
            }
        }
    });
    reader
}

/// Whether the server closes `stream` within `within` (EOF or an error;
/// anything it sends first, such as a 408, is read past).
pub async fn closed_within(mut stream: impl AsyncReadExt + Unpin, within: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

async fn read_answer(stream: &mut (impl AsyncReadExt + Unpin)) -> RawAnswer {
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buffer[..n]),
            }
            if complete(&raw) {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 30 s");
    parse(&raw).unwrap_or_else(|| panic!("not an HTTP answer: {:?}", String::from_utf8_lossy(&raw)))
}

/// Whether `raw` holds a whole response (by its length or chunked end).
fn complete(raw: &[u8]) -> bool {
    parse(raw).is_some_and(|answer| {
        let head_end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |p| p + 4);
        match answer
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            Some(length) => raw.len() >= head_end + length,
            None => {
                answer.header("transfer-encoding") == Some("chunked") && raw.ends_with(b"0\r\n\r\n")
            }
        }
    })
}

fn parse(raw: &[u8]) -> Option<RawAnswer> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut body = raw[head_end + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked")
    {
        body = dechunk(&body)?;
    }
    Some(RawAnswer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).ok()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        let start = line_end + 2;
        body.extend_from_slice(raw.get(start..start + size)?);
        raw = raw.get(start + size + 2..)?;
    }
}

/// The length of the longest head the servers read with their default
/// bounds (`guard::server`: 8 KiB target + 2 × 32 KiB header bytes + 400).
pub const DEFAULT_HARD_HEAD_BYTES: usize = 8 * 1024 + 2 * 32 * 1024 + 400;

/// Checks the head bounds of a server at their defaults (8 KiB target,
/// 32 KiB of header names and values) on `path`, a `GET` that answers 200:
/// at each limit it answers, one byte over it answers 414 `uri-too-long`
/// or 431 `headers-too-large` (problem+json), and past hyper's own bounds
/// (101 fields, a head longer than [`DEFAULT_HARD_HEAD_BYTES`]) hyper
/// answers 431 with an empty body.
///
/// # Panics
///
/// When an answer is not the one expected.
pub async fn assert_default_head_bounds(address: SocketAddr, path: &str) {
    let get = |target: &str, fields: &str| format!("GET {target} HTTP/1.1\r\nhost: t{fields}");
    // The target, path and query, at 8192 bytes and at 8193.
    let at_limit = format!("{path}?pad={}", "a".repeat(8192 - path.len() - 5));
    let answer = send(address, get(&at_limit, "").as_bytes(), b"", false).await;
    assert_eq!(answer.status, 200, "a target at the limit is served");
    let over = format!("{at_limit}a");
    let answer = send(address, get(&over, "").as_bytes(), b"", false).await;
    assert_eq!(answer.status, 414, "a target over the limit");
    assert_eq!(answer.problem().as_deref(), Some("uri-too-long"));
    // Header names and values: `host` (5), `connection: close` (15) and
    // `x-padding` (9) plus its value; at 32768 bytes and at 32769.
    let padding = |bytes: usize| format!("\r\nx-padding: {}", "p".repeat(bytes));
    let fits = 32 * 1024 - 5 - 15 - 9;
    let answer = send(address, get(path, &padding(fits)).as_bytes(), b"", false).await;
    assert_eq!(answer.status, 200, "header bytes at the limit are served");
    let answer = send(
        address,
        get(path, &padding(fits + 1)).as_bytes(),
        b"",
        false,
    )
    .await;
    assert_eq!(answer.status, 431, "header bytes over the limit");
    assert_eq!(answer.problem().as_deref(), Some("headers-too-large"));
    // hyper's own: more than 100 fields, and a head past the read buffer.
    let fields: String = (0..101).map(|n| format!("\r\nx-f{n}: v")).collect();
    let answer = send(address, get(path, &fields).as_bytes(), b"", false).await;
    assert_eq!(answer.status, 431, "101 fields are hyper's 431");
    assert!(answer.body.is_empty(), "hyper's 431 has no body");
    let mut endless = get(path, "\r\nx-padding: ").into_bytes();
    endless.resize(DEFAULT_HARD_HEAD_BYTES, b'p');
    let answer = send_unfinished(address, &endless).await;
    assert_eq!(
        answer.status, 431,
        "a head past hyper's buffer is hyper's 431"
    );
    assert!(answer.body.is_empty(), "hyper's 431 has no body");
}

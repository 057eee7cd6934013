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

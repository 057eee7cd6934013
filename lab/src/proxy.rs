//! The fault-injecting proxy of the lab: HTTP/1.1, one request per
//! connection, in front of the payments app. Every request is forwarded
//! and its whole answer read (the write ran); then the answer meets its
//! fate from the [`FaultSchedule`]: passed on, held, dropped or replaced
//! by a reset. Each exchange is logged, with what the client got, so the
//! lab counts requests, retries and their successes in one place for
//! both runs, whatever client sent them.
//!
//! The request's identity comes from its `X-Lab-Operation` and
//! `X-Retry-Attempt` headers; the proxy adds `Connection: close` to what
//! it forwards (the answer ends when the upstream closes). Unlike the test
//! suite's `idempotency_tests::proxy` (faults by connection number, no
//! delays), its faults follow a window in time and the request's identity,
//! so the two runs of a seed meet the same ones.
//!
//! In the overload scenario the proxy also stands for the API's capacity
//! ([`Capacity`]): a request past it is answered `503` with `Retry-After`
//! by the proxy itself and never reaches the app.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::capacity::{Capacity, SHED_RETRY_AFTER};
use crate::schedule::{Fate, FaultSchedule};
use crate::traffic::Kind;

/// The largest request head the proxy reads.
const HEAD_LIMIT: usize = 64 * 1024;

/// How long a dropped answer's connection is held open at most, waiting
/// for the client to give up.
const DROP_HOLD: Duration = Duration::from_secs(60);

/// One request through the proxy and what became of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    /// When the request arrived, from the proxy's origin.
    pub at: Duration,
    /// `GET` is a read, anything else a write.
    pub kind: Kind,
    /// The logical operation (`X-Lab-Operation`; `u64::MAX` when absent).
    pub operation: u64,
    /// The attempt number (`X-Retry-Attempt`; 0 when absent).
    pub attempt: u32,
    /// What the proxy did with the answer.
    pub fate: Fate,
    /// The upstream's status, when it answered.
    pub status: Option<u16>,
    /// Whether the answer was a replay (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// Whether the whole answer reached a client still waiting for it.
    pub delivered: bool,
    /// Whether the API's capacity refused it (`503`, never at the app).
    pub shed: bool,
}

impl Exchange {
    /// Whether the client got a successful answer: delivered, and 200 for
    /// a read, 201 (first or replayed) for a write.
    pub fn succeeded(&self) -> bool {
        let wanted = match self.kind {
            Kind::Read => 200,
            Kind::Write => 201,
        };
        self.delivered && self.status == Some(wanted)
    }

    /// Whether this request ran the write: a 201 that is not a replay.
    pub fn executed(&self) -> bool {
        self.kind == Kind::Write && self.status == Some(201) && !self.replayed
    }
}

/// The first attempts of writes (a new key: the handler runs) the proxy
/// has sent on and not yet had answered, by operation, with when each was
/// sent: a handle that stays valid while the proxy runs.
#[derive(Debug, Clone, Default)]
pub struct WritesAtUpstream(Arc<Mutex<HashMap<u64, Instant>>>);

impl WritesAtUpstream {
    /// How long the oldest of them has been waiting for its answer.
    pub fn oldest(&self) -> Option<Duration> {
        let sent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        sent.values().map(Instant::elapsed).max()
    }

    fn set(&self, operation: u64, at_upstream: bool) {
        let mut sent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if at_upstream {
            sent.insert(operation, Instant::now());
        } else {
            sent.remove(&operation);
        }
    }
}

/// A running proxy; it stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// The address clients connect to.
    pub address: SocketAddr,
    log: Arc<Mutex<Vec<Exchange>>>,
    at_upstream: WritesAtUpstream,
    accepting: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards to `target`,
    /// with the window of `schedule` counted from `origin`, and, with a
    /// `capacity`, refuses what is past it.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(
        target: SocketAddr,
        schedule: FaultSchedule,
        origin: Instant,
        capacity: Option<Capacity>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::clone(&log);
        let at_upstream = WritesAtUpstream::default();
        let counter = at_upstream.clone();
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: let connections close first.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let log = Arc::clone(&shared);
                let counter = counter.clone();
                let capacity = capacity.clone();
                tokio::spawn(async move {
                    let at = origin.elapsed();
                    let relayed = relay(client, target, &schedule, at, &counter, capacity).await;
                    if let Ok(exchange) = relayed {
                        log.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(exchange);
                    }
                });
            }
        });
        Ok(Self {
            address,
            log,
            at_upstream,
            accepting,
        })
    }

    /// A handle on the count of first attempts of writes sent on and not
    /// yet answered.
    pub fn writes_at_upstream(&self) -> WritesAtUpstream {
        self.at_upstream.clone()
    }

    /// The exchanges finished so far, in the order they finished.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Carries one request to the target, reads the whole answer, and passes
/// it on, or not, by its fate.
async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    schedule: &FaultSchedule,
    at: Duration,
    at_upstream: &WritesAtUpstream,
    capacity: Option<Capacity>,
) -> io::Result<Exchange> {
    let (head, rest) = read_head(&mut client).await?;
    let request = RequestHead::parse(&head);
    let fate = schedule.fate(at, request.operation, request.attempt);
    let mut exchange = Exchange {
        at,
        kind: request.kind,
        operation: request.operation,
        attempt: request.attempt,
        fate,
        status: None,
        replayed: false,
        delivered: false,
        shed: false,
    };
    if capacity.is_some_and(|capacity| !capacity.admit(Instant::now())) {
        exchange.fate = Fate::Forward;
        exchange.status = Some(503);
        exchange.shed = true;
        exchange.delivered = pass_on(&mut client, &shed_answer()).await;
        // Read what is left of the request until the client closes, so
        // that closing does not reset the connection under the answer.
        let _ = tokio::time::timeout(Duration::from_secs(1), closed(&mut client)).await;
        return Ok(exchange);
    }
    let write = request.kind == Kind::Write && request.attempt == 0;
    if write {
        at_upstream.set(request.operation, true);
    }
    let forwarded = forward(&mut client, target, &head, &rest).await;
    if write {
        at_upstream.set(request.operation, false);
    }
    let answer = match forwarded {
        Ok(answer) => answer,
        Err(_) => {
            reset(client)?;
            return Ok(exchange);
        }
    };
    exchange.status = status_of(&answer);
    exchange.replayed = replayed(&answer);
    exchange.delivered = match fate {
        Fate::Forward => still_there(&mut client).await && pass_on(&mut client, &answer).await,
        Fate::Delay(delay) => {
            tokio::select! {
                () = tokio::time::sleep(delay) => {
                    still_there(&mut client).await && pass_on(&mut client, &answer).await
                }
                () = closed(&mut client) => false,
            }
        }
        Fate::Drop => {
            let _ = tokio::time::timeout(DROP_HOLD, closed(&mut client)).await;
            reset(client)?;
            false
        }
        Fate::Reset => {
            reset(client)?;
            false
        }
    };
    Ok(exchange)
}

/// Sends the request on with `Connection: close`, and reads the answer to
/// its end (the upstream closes after it).
async fn forward(
    client: &mut TcpStream,
    target: SocketAddr,
    head: &[u8],
    rest: &[u8],
) -> io::Result<Vec<u8>> {
    let mut upstream = TcpStream::connect(target).await?;
    upstream.write_all(&close_after_answer(head)).await?;
    upstream.write_all(rest).await?;
    let mut answer = Vec::new();
    let (mut from_client, _) = client.split();
    let (mut from_upstream, mut to_upstream) = upstream.split();
    // The rest of the request body, as the client sends it, while the
    // answer comes back.
    let body = tokio::io::copy(&mut from_client, &mut to_upstream);
    let read = from_upstream.read_to_end(&mut answer);
    tokio::pin!(body, read);
    let mut body_done = false;
    loop {
        tokio::select! {
            result = &mut read => {
                result?;
                break;
            }
            _ = &mut body, if !body_done => body_done = true,
        }
    }
    if answer.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(answer)
}

/// The API's refusal past its capacity.
fn shed_answer() -> Vec<u8> {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {SHED_RETRY_AFTER}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

/// Writes the answer and closes; whether it all went out.
async fn pass_on(client: &mut TcpStream, answer: &[u8]) -> bool {
    client.write_all(answer).await.is_ok() && client.shutdown().await.is_ok()
}

/// Whether the client has not closed its side: a read that is not ready
/// at once means it is still waiting.
async fn still_there(client: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    tokio::select! {
        biased;
        read = client.read(&mut byte) => matches!(read, Ok(n) if n > 0),
        () = std::future::ready(()) => true,
    }
}

/// Resolves when the client closes its side (or its connection fails).
async fn closed(client: &mut TcpStream) {
    let mut buffer = [0u8; 1024];
    while matches!(client.read(&mut buffer).await, Ok(n) if n > 0) {}
}

/// Closes a connection with a reset (RST), as a crashed peer would.
fn reset(stream: TcpStream) -> io::Result<()> {
    stream.set_zero_linger()?;
    drop(stream);
    Ok(())
}

/// What the proxy reads from a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RequestHead {
    kind: Kind,
    operation: u64,
    attempt: u32,
}

impl RequestHead {
    fn parse(head: &[u8]) -> Self {
        let text = String::from_utf8_lossy(head);
        let mut lines = text.split("\r\n");
        let method = lines
            .next()
            .and_then(|line| line.split(' ').next())
            .unwrap_or_default();
        let kind = if method == "GET" {
            Kind::Read
        } else {
            Kind::Write
        };
        let mut parsed = Self {
            kind,
            operation: u64::MAX,
            attempt: 0,
        };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("x-lab-operation") {
                parsed.operation = value.parse().unwrap_or(u64::MAX);
            } else if name.eq_ignore_ascii_case("x-retry-attempt") {
                parsed.attempt = value.parse().unwrap_or(0);
            }
        }
        parsed
    }
}

/// The status code of an HTTP/1.1 answer.
fn status_of(answer: &[u8]) -> Option<u16> {
    std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()
}

/// Whether the answer's head has `Idempotent-Replayed: true`.
fn replayed(answer: &[u8]) -> bool {
    let end = find(answer, b"\r\n\r\n").unwrap_or(answer.len());
    String::from_utf8_lossy(&answer[..end])
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .any(|(name, value)| {
            name.eq_ignore_ascii_case("idempotent-replayed") && value.trim() == "true"
        })
}

/// Reads up to the end of the request head; returns the head (without its
/// final blank line) and whatever was read after it.
async fn read_head(client: &mut TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            buffer.truncate(end);
            return Ok((buffer, rest));
        }
        if buffer.len() > HEAD_LIMIT {
            return Err(io::Error::other("request head too large"));
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The request head with `Connection: close` instead of the client's
/// `Connection` and `Keep-Alive` headers, and its blank line.
fn close_after_answer(head: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + 24);
    for (i, line) in head.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let name = line.split(|b| *b == b':').next().unwrap_or_default();
        let hop =
            name.eq_ignore_ascii_case(b"connection") || name.eq_ignore_ascii_case(b"keep-alive");
        if i > 0 && hop {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_names_the_operation_and_the_attempt() {
        let head =
            b"POST /payments HTTP/1.1\r\nhost: x\r\nX-Lab-Operation: 17\r\nx-retry-attempt: 2";
        assert_eq!(
            RequestHead::parse(head),
            RequestHead {
                kind: Kind::Write,
                operation: 17,
                attempt: 2
            }
        );
        let read = RequestHead::parse(b"GET /payments/3 HTTP/1.1\r\nhost: x");
        assert_eq!(
            (read.kind, read.operation, read.attempt),
            (Kind::Read, u64::MAX, 0)
        );
    }

    #[test]
    fn the_answer_tells_its_status_and_whether_it_is_a_replay() {
        let first = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}";
        let again = b"HTTP/1.1 201 Created\r\nIdempotent-Replayed: true\r\n\r\n{}";
        assert_eq!(status_of(first), Some(201));
        assert!(!replayed(first));
        assert!(replayed(again));
        let body_only = b"HTTP/1.1 200 OK\r\n\r\nidempotent-replayed: true";
        assert!(!replayed(body_only), "only the head counts");
    }
}

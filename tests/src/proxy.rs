//! A fault-injecting TCP proxy for HTTP/1.1: it listens on loopback,
//! forwards each connection to a target, and on chosen connections either
//! resets the connection before the request is forwarded, or forwards the
//! request, reads the whole answer, and drops it (the write ran; the
//! client never hears of it), or passes on only the answer's head and first
//! event before the reset (an event stream cut after its first event: what
//! a client that may resume a stream sees when the network fails).
//!
//! Fates are drawn per connection from a seed: the `n`-th connection
//! accepted always gets the same fate for the same seed (what differs
//! between runs is only which request arrives `n`-th).
//!
//! # Limitations
//!
//! One request per connection. The proxy adds `Connection: close` to the
//! request it forwards (removing the client's `Connection` and
//! `Keep-Alive` headers), so the upstream closes after its answer and the
//! answer is whatever it sent before closing; the client, seeing
//! `connection: close` on the answer, does not reuse the connection.
//! Clients that pipeline, send `Expect: 100-continue`, upgrade, or speak
//! HTTP/2 or TLS are not supported. The request head must fit in 64 KiB.
//!
//! ```no_run
//! use idempotency_tests::proxy::{Faults, FaultyProxy};
//!
//! # async fn run(upstream: std::net::SocketAddr) {
//! let proxy = FaultyProxy::start(upstream, Faults::new(7).with_dropped_responses(0.3)).await;
//! // ... send requests to proxy.address ...
//! let counts = proxy.counts();
//! println!("{} of {} answers dropped", counts.responses_dropped, counts.forwarded);
//! # }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The largest request head the proxy reads.
const HEAD_LIMIT: usize = 64 * 1024;

/// Which faults the proxy injects, and the seed that picks the
/// connections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    seed: u64,
    dropped_responses: f64,
    resets: f64,
    cut_responses: f64,
}

impl Faults {
    /// No faults yet; `seed` picks which connections get the faults added
    /// with the other methods.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            dropped_responses: 0.0,
            resets: 0.0,
            cut_responses: 0.0,
        }
    }

    /// Sets the probability that a forwarded request's answer is read from
    /// the upstream and then dropped: the client's connection is reset
    /// instead.
    ///
    /// The default value is 0.
    #[must_use]
    pub fn with_dropped_responses(mut self, probability: f64) -> Self {
        self.dropped_responses = probability;
        self
    }

    /// Sets the probability that a forwarded request's answer is read from
    /// the upstream and only its head and the body's first event (up to
    /// and with its first blank line; the body's first line end too when
    /// the body is chunked) are passed on before the connection is reset.
    /// A body without a blank line (JSON) is not passed on at all. Drawn
    /// among the connections neither reset nor dropped.
    ///
    /// The default value is 0.
    #[must_use]
    pub fn with_cut_responses(mut self, probability: f64) -> Self {
        self.cut_responses = probability;
        self
    }

    /// Sets the probability that a connection is reset once its request
    /// head has arrived, before anything is forwarded.
    ///
    /// The default value is 0.
    #[must_use]
    pub fn with_resets(mut self, probability: f64) -> Self {
        self.resets = probability;
        self
    }
}

/// What happens to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Forward,
    DropResponse,
    CutResponse,
    Reset,
}

impl Faults {
    /// The fate of the `n`-th connection.
    fn fate(&self, n: u64) -> Fate {
        let mut state = self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let reset = unit(splitmix64(&mut state));
        let drop = unit(splitmix64(&mut state));
        let cut = unit(splitmix64(&mut state));
        if reset < self.resets {
            Fate::Reset
        } else if drop < self.dropped_responses {
            Fate::DropResponse
        } else if cut < self.cut_responses {
            Fate::CutResponse
        } else {
            Fate::Forward
        }
    }
}

/// SplitMix64: a tiny, well-mixed generator, enough to pick fates.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in `[0, 1)` from 64 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// What the proxy did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyCounts {
    /// Connections accepted.
    pub connections: u64,
    /// Requests forwarded to the upstream.
    pub forwarded: u64,
    /// Answers read from the upstream and not passed on.
    pub responses_dropped: u64,
    /// Answers passed on up to their first event only.
    pub responses_cut: u64,
    /// Connections reset before their request was forwarded.
    pub resets: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    forwarded: AtomicU64,
    responses_dropped: AtomicU64,
    responses_cut: AtomicU64,
    resets: AtomicU64,
}

/// A running proxy; it stops accepting when dropped.
#[derive(Debug)]
pub struct FaultyProxy {
    /// The address clients connect to.
    pub address: SocketAddr,
    counters: Arc<Counters>,
    accepting: JoinHandle<()>,
}

impl FaultyProxy {
    /// Starts a proxy on a free loopback port that forwards to `target`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(target: SocketAddr, faults: Faults) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("a local address");
        let counters = Arc::new(Counters::default());
        let shared = Arc::clone(&counters);
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: let connections close first.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let n = shared.connections.fetch_add(1, Ordering::SeqCst);
                let fate = faults.fate(n);
                let counters = Arc::clone(&shared);
                tokio::spawn(async move {
                    if let Err(error) = relay(client, target, fate, &counters).await {
                        tracing::debug!(%error, "proxy connection ended early");
                    }
                });
            }
        });
        Self {
            address,
            counters,
            accepting,
        }
    }

    /// Returns what the proxy did so far.
    pub fn counts(&self) -> ProxyCounts {
        let c = &self.counters;
        ProxyCounts {
            connections: c.connections.load(Ordering::SeqCst),
            forwarded: c.forwarded.load(Ordering::SeqCst),
            responses_dropped: c.responses_dropped.load(Ordering::SeqCst),
            responses_cut: c.responses_cut.load(Ordering::SeqCst),
            resets: c.resets.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Carries one connection's request to the target and its answer back,
/// or not, by its fate.
async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    fate: Fate,
    counters: &Counters,
) -> io::Result<()> {
    let (head, rest) = read_head(&mut client).await?;
    if fate == Fate::Reset {
        counters.resets.fetch_add(1, Ordering::SeqCst);
        return reset(client);
    }
    let mut upstream = TcpStream::connect(target).await?;
    upstream.write_all(&close_after_answer(&head)).await?;
    upstream.write_all(&rest).await?;
    counters.forwarded.fetch_add(1, Ordering::SeqCst);
    let mut answer = Vec::new();
    {
        let (mut from_client, _) = client.split();
        let (mut from_upstream, mut to_upstream) = upstream.split();
        // The rest of the request body, as the client sends it, while the
        // answer comes back; the upstream closes after its answer
        // (`Connection: close`).
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
    }
    if fate == Fate::DropResponse {
        counters.responses_dropped.fetch_add(1, Ordering::SeqCst);
        return reset(client);
    }
    if fate == Fate::CutResponse {
        counters.responses_cut.fetch_add(1, Ordering::SeqCst);
        client.write_all(first_event(&answer)).await?;
        client.flush().await?;
        return reset(client);
    }
    client.write_all(&answer).await?;
    client.shutdown().await
}

/// The answer's head and its body up to and with the first blank line
/// (and the line end after it, which ends the chunk of a chunked body);
/// the head alone when the body has no blank line.
fn first_event(answer: &[u8]) -> &[u8] {
    let Some(head) = find(answer, b"\r\n\r\n").map(|end| end + 4) else {
        return answer;
    };
    let body = &answer[head..];
    let Some(end) = find(body, b"\n\n").map(|end| end + 2) else {
        return &answer[..head];
    };
    let end = if body[end..].starts_with(b"\r\n") {
        end + 2
    } else {
        end
    };
    &answer[..head + end]
}

/// Closes a connection with a reset (RST), as a crashed peer would.
fn reset(stream: TcpStream) -> io::Result<()> {
    stream.set_zero_linger()?;
    drop(stream);
    Ok(())
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
    fn the_head_asks_the_upstream_to_close() {
        let head = b"POST /p HTTP/1.1\r\nHost: x\r\nconnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 2";
        let rewritten = String::from_utf8(close_after_answer(head)).unwrap();
        assert_eq!(
            rewritten,
            "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn a_cut_answer_keeps_its_head_and_first_event() {
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n14\r\ndata:\nid: 0\nretry: 3\n\n\r\n9\r\ndata: x\n\n\r\n0\r\n\r\n";
        assert_eq!(
            first_event(chunked),
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n14\r\ndata:\nid: 0\nretry: 3\n\n\r\n"[..]
        );
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(
            first_event(json),
            &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"[..]
        );
    }

    #[test]
    fn fates_follow_the_seed_and_the_probabilities() {
        let faults = Faults::new(42).with_dropped_responses(0.3).with_resets(0.1);
        let fates: Vec<Fate> = (0..10_000).map(|n| faults.fate(n)).collect();
        let again: Vec<Fate> = (0..10_000).map(|n| faults.fate(n)).collect();
        assert_eq!(fates, again, "the same seed, the same fates");
        let share = |fate| fates.iter().filter(|f| **f == fate).count() as f64 / 10_000.0;
        assert!(
            (share(Fate::Reset) - 0.1).abs() < 0.02,
            "{}",
            share(Fate::Reset)
        );
        // Drops are drawn among the connections not reset.
        assert!(
            (share(Fate::DropResponse) - 0.27).abs() < 0.02,
            "{}",
            share(Fate::DropResponse)
        );
        let other: Vec<Fate> = (0..100)
            .map(|n| Faults::new(43).with_resets(0.5).fate(n))
            .collect();
        let mine: Vec<Fate> = (0..100)
            .map(|n| Faults::new(42).with_resets(0.5).fate(n))
            .collect();
        assert_ne!(other, mine, "another seed, other fates");
        assert!(
            (0..1000).all(|n| Faults::new(1).fate(n) == Fate::Forward),
            "no faults by default"
        );
    }
}

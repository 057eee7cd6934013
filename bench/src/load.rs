//! The HTTP load generator: a fixed number of keep-alive HTTP/1.1
//! connections, each sending its next request as soon as the previous
//! answer is read (closed loop), for a warm-up and then a measured window.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::server::PATH;
use crate::stats::{Sample, micros};

/// Which keys the requests carry.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    /// A fresh key per request: `<prefix>-<connection>-<sequence>`.
    Fresh(Arc<str>),
    /// Keys already completed: connection `i` cycles through keys
    /// `i, i + n, i + 2n, ...` of the list (replays).
    Replay(Arc<Vec<String>>),
}

/// One load run.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) address: SocketAddr,
    pub(crate) connections: usize,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    pub(crate) keys: Keys,
    pub(crate) body: Bytes,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(address: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connect to {address}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// What one request got back.
enum Reply {
    Created,
    Replayed,
    Other(StatusCode, Bytes),
}

async fn send(sender: &mut Sender, key: &str, body: &Bytes) -> anyhow::Result<Reply> {
    let request = Request::post(PATH)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Full::new(body.clone()))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await?.to_bytes();
    Ok(match (status, replayed) {
        (StatusCode::CREATED, false) => Reply::Created,
        (StatusCode::CREATED, true) => Reply::Replayed,
        (other, _) => Reply::Other(other, body),
    })
}

/// Runs `load` and returns what was measured after the warm-up.
pub(crate) async fn run(load: &Load) -> anyhow::Result<Sample> {
    let mut senders = Vec::with_capacity(load.connections);
    for _ in 0..load.connections {
        senders.push(connect(load.address).await?);
    }
    let started = Instant::now();
    let measure_from = started + load.warmup;
    let until = measure_from + load.duration;
    let mut tasks = Vec::with_capacity(load.connections);
    for (index, sender) in senders.into_iter().enumerate() {
        let load = load.clone();
        tasks.push(tokio::spawn(connection_loop(
            load,
            index,
            sender,
            measure_from,
            until,
        )));
    }
    let mut sample = Sample {
        window: load.duration,
        ..Sample::default()
    };
    for task in tasks {
        sample.merge(task.await?);
    }
    Ok(sample)
}

async fn connection_loop(
    load: Load,
    index: usize,
    mut sender: Sender,
    measure_from: Instant,
    until: Instant,
) -> Sample {
    let mut sample = Sample::default();
    let mut sequence: usize = 0;
    let expect_replay = matches!(load.keys, Keys::Replay(_));
    loop {
        let sent = Instant::now();
        if sent >= until {
            break;
        }
        let key = match &load.keys {
            Keys::Fresh(prefix) => format!("{prefix}-{index}-{sequence}"),
            Keys::Replay(keys) => keys[(index + sequence * load.connections) % keys.len()].clone(),
        };
        sequence += 1;
        let answer = send(&mut sender, &key, &load.body).await;
        let done = Instant::now();
        sample.total += 1;
        if done < measure_from || done > until {
            if answer.is_err() {
                break; // a broken connection: nothing more from it
            }
            continue;
        }
        match answer {
            Ok(Reply::Created) if !expect_replay => sample.ok += 1,
            Ok(Reply::Replayed) if expect_replay => sample.ok += 1,
            Ok(Reply::Created | Reply::Replayed) => {
                sample.error(|| format!("key {key}: expected a replay: {expect_replay}"));
            }
            Ok(Reply::Other(status, body)) => sample.error(|| {
                format!(
                    "key {key}: {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                )
            }),
            Err(error) => {
                sample.error(|| format!("key {key}: {error:#}"));
                break;
            }
        }
        sample.latencies_us.push(micros(done - sent));
    }
    sample
}

/// Completes every key of `keys` through the app (fresh requests), over
/// `connections` connections; fails on any answer but 201.
pub(crate) async fn seed(
    address: SocketAddr,
    connections: usize,
    keys: Arc<Vec<String>>,
    body: Bytes,
    expect_replay: bool,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections.min(keys.len()).max(1) {
        let (next, keys, body) = (Arc::clone(&next), Arc::clone(&keys), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(address).await?;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(index) else {
                    return anyhow::Ok(());
                };
                match (send(&mut sender, key, &body).await?, expect_replay) {
                    (Reply::Created, false) | (Reply::Replayed, true) => {}
                    (Reply::Other(status, body), _) => anyhow::bail!(
                        "seeding key {key}: {status}: {}",
                        String::from_utf8_lossy(&body)
                    ),
                    _ => anyhow::bail!("seeding key {key}: replayed is not {expect_replay}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// The body of `GET path` on the server at `address` (fails on any answer
/// but 200).
pub(crate) async fn get(address: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut sender = connect(address).await?;
    let request = Request::get(path)
        .header(header::HOST, "127.0.0.1")
        .body(Full::new(Bytes::new()))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    anyhow::ensure!(status == StatusCode::OK, "GET {path}: {status}");
    Ok(String::from_utf8_lossy(&body).into_owned())
}

//! The raw store limit: the guard's own store calls ([`Store::claim`] and
//! [`Store::complete`], or one read) issued directly through the same store
//! object (so the same statements, scripts and pool), by a fixed number of
//! concurrent clients, without HTTP. No guard can beat it.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};
use tokio::time::Instant;

use crate::server::{PATH, REQUEST_BODY, RESPONSE_BODY};
use crate::stats::{Sample, micros};

/// The scope the guard uses by default.
static SCOPE: LazyLock<Scope> = LazyLock::new(|| Scope::new("default").expect("a valid scope"));

/// Which store calls one operation makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawOp {
    /// `claim` a fresh key, then `complete` it: what a fresh guarded request costs.
    Write,
    /// `get` a completed key: the single read a replay cannot go below.
    Read,
    /// `claim` a completed key: the call the guard makes on a replay.
    ClaimExisting,
}

/// The fingerprint the guard computes for the benchmark's request.
static FINGERPRINT: LazyLock<Fingerprint> = LazyLock::new(|| {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Fingerprint::of_request(&Method::POST, PATH, &headers, REQUEST_BODY)
});

/// The response the guard stores for the benchmark's handler.
static STORED: LazyLock<StoredResponse> = LazyLock::new(|| {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: Some(bytes::Bytes::from_static(RESPONSE_BODY)),
    }
});

fn new_record(key: &IdempotencyKey) -> NewRecord<'_> {
    NewRecord {
        scope: &SCOPE,
        key,
        fingerprint: &FINGERPRINT,
        method: "POST",
        path: PATH,
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(24 * 3600),
        transactional: false,
    }
}

/// The benchmark's keys as the store takes them.
fn typed(keys: &[String]) -> anyhow::Result<Vec<IdempotencyKey>> {
    keys.iter()
        .map(|key| IdempotencyKey::from_raw(key).map_err(anyhow::Error::from))
        .collect()
}

/// Claims and completes `key` as a guarded request would.
pub(crate) async fn write<S: Store>(store: &S, key: &IdempotencyKey) -> anyhow::Result<()> {
    match store.claim(&new_record(key)).await? {
        Claim::Acquired(lease) => Ok(store.complete(&lease, &STORED).await?),
        Claim::Existing(_) => anyhow::bail!("key {key} was already claimed"),
    }
}

async fn once<S: Store>(store: &S, op: RawOp, key: &IdempotencyKey) -> anyhow::Result<()> {
    match op {
        RawOp::Write => write(store, key).await,
        RawOp::Read => match store.get(&SCOPE, key).await? {
            Some(record) if record.response.is_some() => Ok(()),
            _ => anyhow::bail!("key {key} is not completed"),
        },
        RawOp::ClaimExisting => match store.claim(&new_record(key)).await? {
            Claim::Existing(record) if record.response.is_some() => Ok(()),
            _ => anyhow::bail!("key {key} is not completed"),
        },
    }
}

/// Completes every key of `keys` through `store`, `clients` at a time, then
/// reads each once (so a tiered store caches it, as a replay would).
pub(crate) async fn seed<S: Store>(
    store: &S,
    clients: usize,
    keys: Arc<Vec<String>>,
) -> anyhow::Result<()> {
    let keys = Arc::new(typed(&keys)?);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (store, keys, next) = (store.clone(), Arc::clone(&keys), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(key) = keys.get(index) else {
                    return anyhow::Ok(());
                };
                write(&store, key).await?;
                store.get(&SCOPE, key).await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Runs `op` from `clients` concurrent clients: warm-up, then the window.
pub(crate) async fn run<S: Store>(
    store: &S,
    op: RawOp,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    fresh_prefix: &str,
    keys: Arc<Vec<String>>,
) -> anyhow::Result<Sample> {
    // Typed once, as the guard parses a request's key once; a fresh key
    // differs from this one only in its digits.
    let keys = Arc::new(typed(&keys)?);
    IdempotencyKey::from_raw(&format!("{fresh_prefix}-0-0"))?;
    let started = Instant::now();
    let measure_from = started + warmup;
    let until = measure_from + duration;
    let mut tasks = Vec::with_capacity(clients);
    for index in 0..clients {
        let (store, keys) = (store.clone(), Arc::clone(&keys));
        let prefix = fresh_prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut sample = Sample::default();
            let mut sequence = 0usize;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let key = match op {
                    RawOp::Write => {
                        IdempotencyKey::from_raw(&format!("{prefix}-{index}-{sequence}"))
                            .expect("checked before the run")
                    }
                    RawOp::Read | RawOp::ClaimExisting => {
                        keys[(index + sequence * clients) % keys.len()].clone()
                    }
                };
                sequence += 1;
                let result = once(&store, op, &key).await;
                let done = Instant::now();
                sample.total += 1;
                if done < measure_from || done > until {
                    continue;
                }
                match result {
                    Ok(()) => sample.ok += 1,
                    Err(error) => sample.error(|| format!("{error:#}")),
                }
                sample.latencies_us.push(micros(done - sent));
            }
            sample
        }));
    }
    let mut sample = Sample {
        window: duration,
        ..Sample::default()
    };
    for task in tasks {
        sample.merge(task.await?);
    }
    Ok(sample)
}

//! The open client connections: a cap below the descriptor limit and an
//! idle deadline.
//!
//! 1. At start the soft `RLIMIT_NOFILE` is raised to the hard limit
//!    ([`raise_descriptor_limit`]); the cap on open client connections is
//!    the configured one, lowered to half of what the limit leaves after 64
//!    descriptors of the process's own (a proxy's client connection may
//!    hold an upstream one: `(limit - 64) / 2`; see [`connection_cap`]).
//! 2. Each accepted connection gets a slot ([`Connections::admit`]). A
//!    slot is busy while a request on it is being answered (its response
//!    body included), idle otherwise: fresh, between keep-alive requests,
//!    or reading a head.
//! 3. At the cap, a new connection closes the oldest idle one, so a client
//!    that sends a request is served while hundreds of sockets sit idle or
//!    trickle their heads (nginx reuses idle keep-alive connections the
//!    same way). When every slot is busy, the new connection is closed.
//! 4. A sweep closes every connection idle for longer than the idle
//!    deadline; hyper closes a connection whose head takes longer than the
//!    header-read deadline.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::oneshot;

/// Descriptors kept for the process's own use (store, logs, listener).
const RESERVED_DESCRIPTORS: u64 = 64;

/// Raises the soft limit on open descriptors to the hard limit and returns
/// the soft limit in force (`None` when it cannot be read or is unlimited).
pub(crate) fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, "cannot raise the descriptor limit");
            return limit.current;
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The cap on open client connections under a descriptor limit: the
/// configured one, at most half of what the limit leaves after 64
/// descriptors of the process's own, at least 1.
pub(crate) fn connection_cap(configured: usize, descriptors: Option<u64>) -> usize {
    let Some(descriptors) = descriptors else {
        return configured;
    };
    let room = descriptors.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    configured
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

/// The state of one connection that its requests update.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    busy: AtomicU32,
    /// When it last became idle, in milliseconds since the registry's start.
    idle_since: AtomicU64,
}

struct Entry {
    slot: Arc<Slot>,
    close: Option<oneshot::Sender<()>>,
}

/// The open client connections.
pub(crate) struct Connections {
    cap: usize,
    idle: Duration,
    started: Instant,
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Entry>>,
}

/// A connection's registration: removed when dropped.
pub(crate) struct Admitted {
    id: u64,
    connections: Arc<Connections>,
    /// The connection's state.
    pub(crate) slot: Arc<Slot>,
    /// Completes when the connection is to be closed.
    pub(crate) close: oneshot::Receiver<()>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut open) = self.connections.open.lock() {
            open.remove(&self.id);
        }
    }
}

impl Connections {
    /// A registry of at most `cap` connections, idle ones closed after `idle`.
    pub(crate) fn new(cap: usize, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            cap,
            idle,
            started: Instant::now(),
            next: AtomicU64::new(0),
            open: Mutex::new(BTreeMap::new()),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Registers a new connection, closing the oldest idle one at the cap;
    /// `None` when every open connection is busy (close the new one).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut open = self.open.lock().ok()?;
        if open.len() >= self.cap {
            let oldest_idle = open
                .iter()
                .find(|(_, entry)| entry.slot.busy.load(Ordering::Acquire) == 0)
                .map(|(id, _)| *id)?;
            if let Some(mut entry) = open.remove(&oldest_idle)
                && let Some(close) = entry.close.take()
            {
                let _ = close.send(());
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(self.now()),
        });
        let (tx, rx) = oneshot::channel();
        open.insert(
            id,
            Entry {
                slot: Arc::clone(&slot),
                close: Some(tx),
            },
        );
        Some(Admitted {
            id,
            connections: Arc::clone(self),
            slot,
            close: rx,
        })
    }

    /// Closes every connection idle for longer than the idle deadline.
    pub(crate) fn sweep(&self) {
        let now = self.now();
        let idle = u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX);
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        open.retain(|_, entry| {
            let expired = entry.slot.busy.load(Ordering::Acquire) == 0
                && now.saturating_sub(entry.slot.idle_since.load(Ordering::Acquire)) > idle;
            if expired && let Some(close) = entry.close.take() {
                let _ = close.send(());
            }
            !expired
        });
    }

    /// Marks a request on `slot` as being answered until the guard drops.
    pub(crate) fn busy(self: &Arc<Self>, slot: &Arc<Slot>) -> Busy {
        slot.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            slot: Arc::clone(slot),
            connections: Arc::clone(self),
        }
    }

    /// Sweeps every quarter of the idle deadline (at least every second)
    /// until the registry is dropped.
    pub(crate) fn spawn_sweeper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = (self.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(connections) => connections.sweep(),
                    None => break,
                }
            }
        });
    }
}

/// A request being answered on a connection (see [`Connections::busy`]).
pub(crate) struct Busy {
    slot: Arc<Slot>,
    connections: Arc<Connections>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.slot
            .idle_since
            .store(self.connections.now(), Ordering::Release);
        self.slot.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it is dropped.
pub(crate) struct BusyBody {
    pub(crate) inner: Body,
    pub(crate) _busy: Option<Busy>,
}

impl std::fmt::Debug for BusyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusyBody").finish_non_exhaustive()
    }
}

impl http_body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_upstream_connections_and_the_process() {
        assert_eq!(connection_cap(10_000, Some(256)), 96);
        assert_eq!(connection_cap(10_000, Some(1 << 20)), 10_000);
        assert_eq!(connection_cap(10_000, None), 10_000);
        assert_eq!(connection_cap(10_000, Some(10)), 1);
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_is_closed_and_busy_ones_are_kept() {
        let connections = Connections::new(2, Duration::from_secs(60));
        let mut first = connections.admit().expect("room");
        let second = connections.admit().expect("room");
        let busy = connections.busy(&second.slot);
        let third = connections.admit().expect("the first is idle");
        assert!(first.close.try_recv().is_ok(), "the oldest idle one closes");
        drop(first);
        let _busy_third = connections.busy(&third.slot);
        assert!(connections.admit().is_none(), "every open one is busy");
        drop(busy);
    }
}

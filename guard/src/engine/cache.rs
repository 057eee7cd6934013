//! The replay cache: completed records kept in the process, so a replay
//! costs no store round trip.
//!
//! An entry is made when a replay reads a completed record from the store
//! (the second request with a key), never when a run completes: a key that
//! is never replayed, which is most of them, costs the cache nothing (no
//! copy of its response, no lock, no eviction).
//!
//! A completed record never changes until it expires or an operator deletes
//! it, so a copy is safe to answer from while both hold: each entry lives
//! until its record's retention ends (measured on the store's clock when it
//! was read) or `max_age` passes, whichever is first, and is dropped at once
//! when the store's events say the record changed (a release, a deletion
//! published by another process through Redis pub/sub or PostgreSQL
//! notifications). On a store that does not publish other processes'
//! changes (SQLite, PostgreSQL without notifications), an operator's
//! deletion elsewhere is seen here within `max_age`.
//!
//! The cache is bounded by the bytes it holds; when full, it drops the
//! oldest entries first (the next replay of a dropped key reads the store).
//! Oldest-first rather than least-recently-used: every copy lives at most
//! `max_age`, so the oldest is the nearest to its end anyway, and a hit
//! (the hot path) then costs no bookkeeping at all; only a `put` records
//! its place in the order.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::fingerprint::Fingerprint;
use crate::record::StoredResponse;

/// How long a copy of a record read from the store may live: what is left
/// of its retention, on the store's clock when it was read (the cache's
/// `max_age` caps it in [`ReplayCache::put`]).
pub(crate) fn lives(
    expires_at: time::OffsetDateTime,
    observed_at: time::OffsetDateTime,
) -> Duration {
    (expires_at - observed_at).try_into().unwrap_or_default()
}

/// What the cache keeps of one completed record.
struct Entry {
    fingerprint: Fingerprint,
    response: StoredResponse,
    valid_until: Instant,
    size: usize,
    /// Its place in [`Entries::order`].
    put: u64,
}

/// The entries by scope, then key (looked up by `&str`: a hit allocates
/// nothing), and the order they were put in.
#[derive(Default)]
struct Entries {
    map: HashMap<String, HashMap<String, Entry>>,
    /// `(scope, key)` of every entry, by when it was put: the first is
    /// the oldest, the next to evict.
    order: BTreeMap<u64, (String, String)>,
    /// The place of the next entry put.
    next: u64,
    bytes: usize,
}

impl Entries {
    /// Removes the entry of `(scope, key)`, if any.
    fn remove(&mut self, scope: &str, key: &str) {
        let Some(keys) = self.map.get_mut(scope) else {
            return;
        };
        if let Some(entry) = keys.remove(key) {
            self.bytes -= entry.size;
            self.order.remove(&entry.put);
        }
        if keys.is_empty() {
            self.map.remove(scope);
        }
    }

    /// Removes the oldest entry (the cache is full); `false` when it is
    /// empty.
    fn evict_one(&mut self) -> bool {
        let Some((_, (scope, key))) = self.order.pop_first() else {
            return false;
        };
        self.remove(&scope, &key);
        true
    }
}

/// Completed records of recent runs and replays, by `(scope, key)`.
pub(crate) struct ReplayCache {
    entries: Mutex<Entries>,
    capacity: usize,
    max_age: Duration,
}

/// A cached answer for a job.
pub(crate) enum Hit {
    /// The same request: replay this.
    Replay(StoredResponse),
    /// Another request with the key.
    Reused,
}

impl ReplayCache {
    pub(crate) fn new(capacity: usize, max_age: Duration) -> Self {
        Self {
            entries: Mutex::default(),
            capacity,
            max_age,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached answer for `(scope, key)`, if a live copy is held.
    pub(crate) fn get(&self, scope: &str, key: &str, fingerprint: &Fingerprint) -> Option<Hit> {
        let mut entries = self.lock();
        let entry = entries.map.get(scope)?.get(key)?;
        if entry.valid_until <= Instant::now() {
            entries.remove(scope, key);
            return None;
        }
        Some(if entry.fingerprint == *fingerprint {
            Hit::Replay(entry.response.clone())
        } else {
            Hit::Reused
        })
    }

    /// Keeps a completed record's response for at most `lives` (what is
    /// left of its retention) and the cache's `max_age`. Responses too large
    /// to store (no body) are not kept.
    pub(crate) fn put(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        response: StoredResponse,
        lives: Duration,
    ) {
        let Some(body) = &response.body else { return };
        // What the entry holds, counted without building anything.
        let headers: usize = response
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        let size = scope.len() + key.len() + body.len() + headers + 96;
        if size > self.capacity {
            return;
        }
        let valid_until = Instant::now() + lives.min(self.max_age);
        let mut entries = self.lock();
        entries.remove(scope, key);
        while entries.bytes + size > self.capacity && entries.evict_one() {}
        let put = entries.next;
        entries.next += 1;
        entries
            .order
            .insert(put, (scope.to_owned(), key.to_owned()));
        let entry = Entry {
            fingerprint,
            response,
            valid_until,
            size,
            put,
        };
        match entries.map.get_mut(scope) {
            Some(keys) => {
                keys.insert(key.to_owned(), entry);
            }
            None => {
                let keys = HashMap::from([(key.to_owned(), entry)]);
                entries.map.insert(scope.to_owned(), keys);
            }
        }
        entries.bytes += size;
    }

    /// Drops the copy of a record that changed.
    pub(crate) fn invalidate(&self, scope: &str, key: &str) {
        self.lock().remove(scope, key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(body: &'static str) -> StoredResponse {
        StoredResponse::from_bytes(body)
    }

    #[tokio::test]
    async fn answers_replays_and_reuses_until_invalidated_or_expired() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(60));
        let (a, b) = (
            Fingerprint::from_bytes([1; 32]),
            Fingerprint::from_bytes([2; 32]),
        );
        cache.put("s", "k", a, response("ok"), Duration::from_secs(60));
        assert!(
            matches!(cache.get("s", "k", &a), Some(Hit::Replay(r)) if r.body.as_deref() == Some(&b"ok"[..]))
        );
        assert!(matches!(cache.get("s", "k", &b), Some(Hit::Reused)));
        assert!(cache.get("other", "k", &a).is_none());
        cache.invalidate("s", "k");
        assert!(cache.get("s", "k", &a).is_none());
        cache.put("s", "short", a, response("ok"), Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(cache.get("s", "short", &a).is_none(), "outlived its record");
    }

    #[test]
    fn stays_within_its_capacity() {
        let cache = ReplayCache::new(4096, Duration::from_secs(60));
        let fingerprint = Fingerprint::from_bytes([1; 32]);
        for i in 0..1000 {
            cache.put(
                "s",
                &format!("k{i}"),
                fingerprint,
                response("0123456789"),
                Duration::from_secs(60),
            );
            assert!(cache.lock().bytes <= 4096);
        }
        assert!(!cache.lock().map.is_empty());
        let huge = StoredResponse::from_bytes(vec![0_u8; 8192]);
        cache.put("s", "huge", fingerprint, huge, Duration::from_secs(60));
        assert!(cache.get("s", "huge", &fingerprint).is_none());
        let entries = cache.lock();
        let held: usize = entries.map.values().map(HashMap::len).sum();
        assert_eq!(
            entries.order.len(),
            held,
            "one place in the order per entry"
        );
    }

    /// A full cache drops the oldest entry first, across scopes, and a key
    /// put again takes a new place (its old one is not evicted for it).
    #[test]
    fn evicts_the_oldest_first() {
        let fingerprint = Fingerprint::from_bytes([1; 32]);
        let put = |cache: &ReplayCache, scope: &str, key: &str| {
            cache.put(
                scope,
                key,
                fingerprint,
                response("0123456789"),
                Duration::from_secs(60),
            );
        };
        // The size of one entry (every key below is as long).
        let probe = ReplayCache::new(1 << 20, Duration::from_secs(60));
        put(&probe, "a", "k0");
        let size = probe.lock().bytes;
        let cache = ReplayCache::new(4 * size, Duration::from_secs(60));
        for (scope, key) in [("a", "k0"), ("b", "k1"), ("a", "k2"), ("b", "k3")] {
            put(&cache, scope, key);
        }
        let held = |cache: &ReplayCache, scope: &str, key: &str| {
            cache.get(scope, key, &fingerprint).is_some()
        };
        // Full: a fifth entry drops the first one put.
        put(&cache, "c", "k4");
        assert!(!held(&cache, "a", "k0"), "the oldest went first");
        for (scope, key) in [("b", "k1"), ("a", "k2"), ("b", "k3"), ("c", "k4")] {
            assert!(held(&cache, scope, key), "{scope}/{key} kept");
        }
        // `b/k1` put again is now the newest: `a/k2` is the oldest.
        put(&cache, "b", "k1");
        put(&cache, "a", "k5");
        assert!(!held(&cache, "a", "k2"), "the oldest went first");
        for (scope, key) in [("b", "k1"), ("b", "k3"), ("c", "k4"), ("a", "k5")] {
            assert!(held(&cache, scope, key), "{scope}/{key} kept");
        }
        // An invalidated entry gives its place back.
        cache.invalidate("b", "k3");
        put(&cache, "c", "k6");
        for (scope, key) in [("b", "k1"), ("c", "k4"), ("a", "k5"), ("c", "k6")] {
            assert!(held(&cache, scope, key), "{scope}/{key} kept");
        }
        assert_eq!(cache.lock().order.len(), 4);
    }
}

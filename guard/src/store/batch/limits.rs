//! How a store groups concurrent calls of one operation ([`BatchLimits`]),
//! and what its batches counted ([`BatchCounts`], [`BatchStats`], the
//! histogram [`BATCH_SIZE`]).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a store groups concurrent calls of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most items one batch carries. `1` turns batching off: each call
    /// then goes to the store by itself, from the caller's own task.
    pub max_batch: usize,
    /// How many batches of one operation may be on their way at once.
    pub max_in_flight: usize,
}

impl BatchLimits {
    /// No batching: every call is its own statement or script.
    pub const OFF: Self = Self {
        max_batch: 1,
        max_in_flight: 1,
    };

    /// Whether calls go through a batcher at all.
    pub fn enabled(&self) -> bool {
        self.max_batch > 1
    }
}

/// The histogram of batch sizes, by `op` (`claim` or `complete`).
pub const BATCH_SIZE: &str = "idempotency_store_batch_size";

/// How many batches, and items in them, one operation has sent (for tests
/// and benchmarks; also exported as the histogram
/// `idempotency_store_batch_size{op}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Batches sent.
    pub batches: u64,
    /// Items in them.
    pub items: u64,
    /// The largest batch sent.
    pub largest: u64,
}

impl BatchCounts {
    /// The mean batch size, 0 when nothing was sent.
    pub fn mean(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.items as f64 / self.batches as f64
        }
    }
}

/// The counts of a store's batched operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Claims.
    pub claims: BatchCounts,
    /// Completions.
    pub completions: BatchCounts,
}

/// What one operation's batcher counts (the worker and lone calls record
/// into it).
#[derive(Debug, Default)]
pub(super) struct Counters {
    batches: AtomicU64,
    items: AtomicU64,
    largest: AtomicU64,
    /// `idempotency_store_batch_size{op}`, registered on the first batch.
    histogram: OnceLock<metrics::Histogram>,
}

impl Counters {
    /// Counts one batch of `size` items.
    pub(super) fn record(&self, op: &'static str, size: usize) {
        let size = size as u64;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(size, Ordering::Relaxed);
        self.largest.fetch_max(size, Ordering::Relaxed);
        self.histogram
            .get_or_init(|| metrics::histogram!(BATCH_SIZE, "op" => op))
            .record(size as f64);
    }

    /// The counts so far.
    pub(super) fn snapshot(&self) -> BatchCounts {
        BatchCounts {
            batches: self.batches.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }
}

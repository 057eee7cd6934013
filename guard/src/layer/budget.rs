//! [`BodyBudget`]: a bound on the bytes of guarded request bodies being
//! buffered at once, so many clients each holding a body open cannot take
//! the process's memory.
//!
//! A body that declares its `Content-Length` reserves all of it before a
//! byte is read (a client past the budget is told at once, before it sends
//! its body); a chunked body reserves as its chunks arrive. The reservation
//! is held while the request is guarded (its body read, the route run) and
//! returned when the guard answers. Past the budget the answer is 503
//! `body-buffer-full` with `Retry-After`, and nothing runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes of guarded request bodies that may be buffered at once,
/// shared by every layer given a clone of it (one budget for all the
/// routes of a process).
///
/// ```
/// use idempotency_guard::layer::BodyBudget;
///
/// let budget = BodyBudget::new(64 * 1024 * 1024);
/// assert_eq!(budget.total(), 64 * 1024 * 1024);
/// assert_eq!(budget.in_use(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct BodyBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                total: bytes,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.inner.total
    }

    /// The bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` from the budget, if it has them.
    fn take(&self, bytes: usize) -> bool {
        let total = self.inner.total;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= total)
            })
            .is_ok()
    }

    /// Reserves `bytes`; `None` when the budget does not have them.
    pub(crate) fn reserve(&self, bytes: usize) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`BodyBudget`], returned when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: BodyBudget,
    bytes: usize,
}

impl Reservation {
    /// Makes the reservation at least `bytes`; `false` when the budget
    /// does not have the difference.
    pub(crate) fn cover(&mut self, bytes: usize) -> bool {
        let Some(more) = bytes.checked_sub(self.bytes).filter(|&more| more > 0) else {
            return true;
        };
        if !self.budget.take(more) {
            return false;
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .inner
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned_when_dropped() {
        let budget = BodyBudget::new(100);
        let first = budget.reserve(60).expect("room");
        assert!(budget.reserve(41).is_none(), "past the budget");
        let mut second = budget.reserve(40).expect("room");
        assert_eq!(budget.in_use(), 100);
        assert!(second.cover(40), "covered already");
        assert!(!second.cover(41), "no room to grow");
        drop(first);
        assert!(second.cover(100));
        assert_eq!(budget.in_use(), 100);
        drop(second);
        assert_eq!(budget.in_use(), 0);
    }
}

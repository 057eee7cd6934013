//! A call's deadline: one time budget that its attempts, pauses and status
//! look-ups share.

use std::time::{Duration, Instant};

/// The instant a call must be done by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
}

impl Deadline {
    /// The deadline `budget` after `start`.
    pub(crate) fn after(start: Instant, budget: Duration) -> Self {
        Self {
            at: later(start, budget),
        }
    }

    /// What is left of it now (zero once it has passed).
    pub(crate) fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// `now + wait`, or a century from now when that does not fit in an
/// `Instant` (a budget of `Duration::MAX` means "no deadline").
pub(crate) fn later(now: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(wait)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_counts_down_and_never_overflows() {
        let start = Instant::now();
        let deadline = Deadline::after(start, Duration::from_secs(60));
        assert!(deadline.remaining() <= Duration::from_secs(60));
        assert!(deadline.remaining() > Duration::from_secs(50));
        assert_eq!(
            Deadline::after(start, Duration::ZERO).remaining(),
            Duration::ZERO
        );
        let endless = Deadline::after(start, Duration::MAX);
        assert!(endless.remaining() > Duration::from_secs(3600 * 24 * 365));
    }
}

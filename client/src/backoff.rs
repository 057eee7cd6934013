//! Exponential backoff with full jitter: the pause before retry `n` is drawn
//! uniformly from `[0, min(cap, base × 2^n))`, so that clients that failed
//! together do not come back together. (Equal jitter, drawn from the upper
//! half of that range, is the option for callers who want a least pause.)
//!
//! The pause is drawn from the schedule alone, never from what is left of
//! a call's deadline: when the pause and another attempt do not fit, the
//! call stops (`DeadlineExceeded`) rather than retrying sooner.

use std::time::Duration;

/// How long to pause between attempts: exponential growth from a base, up to
/// a cap, with full jitter.
///
/// ```
/// use std::time::Duration;
/// use idempotency_client::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(100)).with_cap(Duration::from_millis(300));
/// assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
/// assert_eq!(backoff.ceiling(5), Duration::from_millis(300));
/// // Full jitter: a uniform sample in [0, 1) picks the pause under the ceiling.
/// assert_eq!(backoff.delay(1, 0.5), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

/// How a pause is drawn under its ceiling (`min(cap, base × 2^retry)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform over `[0, ceiling)`: the widest spread, the least total
    /// wait (AWS's "full jitter").
    #[default]
    Full,
    /// Uniform over `[ceiling / 2, ceiling)`: every pause is at least half
    /// its ceiling (AWS's "equal jitter").
    Equal,
}

/// The cap when none is set: no single pause is longer, whatever the
/// deadline allows.
const DEFAULT_CAP: Duration = Duration::from_secs(10);

impl Backoff {
    /// A backoff whose first retry pauses up to `base`, doubling for each
    /// retry after it.
    pub fn new(base: Duration) -> Self {
        Self {
            base,
            cap: DEFAULT_CAP,
            jitter: Jitter::Full,
        }
    }

    /// Sets the longest pause, whatever the retry number.
    ///
    /// The default value is 10 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::Backoff;
    ///
    /// let backoff = Backoff::new(Duration::from_secs(1)).with_cap(Duration::from_secs(4));
    /// assert_eq!(backoff.ceiling(10), Duration::from_secs(4));
    /// ```
    #[must_use]
    pub fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Sets how pauses are drawn under their ceiling.
    ///
    /// The default value is [`Jitter::Full`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Backoff, Jitter};
    ///
    /// let backoff = Backoff::new(Duration::from_millis(100)).with_jitter(Jitter::Equal);
    /// assert_eq!(backoff.delay(0, 0.0), Duration::from_millis(50));
    /// assert_eq!(backoff.floor(1), Duration::from_millis(100));
    /// ```
    #[must_use]
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Returns how pauses are drawn.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Returns the base: the ceiling of the first retry's pause.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// Returns the cap: the longest pause.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Returns the longest pause before retry `retry` (0 for the first
    /// retry): `min(cap, base × 2^retry)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
    }

    /// Returns the shortest pause before retry `retry`: zero with full
    /// jitter, half the ceiling with equal jitter.
    pub fn floor(&self, retry: u32) -> Duration {
        match self.jitter {
            Jitter::Full => Duration::ZERO,
            Jitter::Equal => self.ceiling(retry) / 2,
        }
    }

    /// Returns the pause before retry `retry` for a uniform `sample` in
    /// `[0, 1)`: `sample × ceiling(retry)` with full jitter,
    /// `ceiling / 2 + sample × ceiling / 2` with equal jitter.
    pub fn delay(&self, retry: u32, sample: f64) -> Duration {
        let ceiling = self.ceiling(retry);
        let floor = self.floor(retry);
        floor + full_jitter(ceiling - floor, sample)
    }
}

/// A pause drawn from `[0, ceiling)` by a uniform `sample` in `[0, 1)`;
/// samples outside that range are clamped into it.
pub(crate) fn full_jitter(ceiling: Duration, sample: f64) -> Duration {
    let sample = if sample.is_finite() {
        sample.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // Float rounding may land a hair above the ceiling, and a huge ceiling
    // may not fit back in a Duration: never more than the ceiling.
    Duration::try_from_secs_f64(ceiling.as_secs_f64() * sample)
        .map_or(ceiling, |pause| pause.min(ceiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn ceilings_double_then_stop_at_the_cap() {
        let backoff = Backoff::new(500 * MS).with_cap(3000 * MS);
        let ceilings: Vec<_> = (0..6).map(|n| backoff.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [
                500 * MS,
                1000 * MS,
                2000 * MS,
                3000 * MS,
                3000 * MS,
                3000 * MS
            ]
        );
        // Huge retry numbers neither overflow nor panic.
        assert_eq!(backoff.ceiling(u32::MAX), 3000 * MS);
        assert_eq!(
            Backoff::new(Duration::MAX).ceiling(3),
            DEFAULT_CAP,
            "the cap bounds even a huge base"
        );
    }

    #[test]
    fn delays_stay_under_the_ceiling() {
        let backoff = Backoff::new(100 * MS);
        assert_eq!(backoff.delay(0, 0.0), Duration::ZERO);
        assert_eq!(backoff.delay(2, 0.25), 100 * MS);
        assert!(backoff.delay(2, 0.999_999) < 400 * MS);
        // Out-of-range samples are clamped, never a longer pause.
        assert_eq!(backoff.delay(0, 7.0), 100 * MS);
        assert_eq!(backoff.delay(0, -1.0), Duration::ZERO);
        assert_eq!(backoff.delay(0, f64::NAN), Duration::ZERO);
        // Huge ceilings neither panic nor overflow.
        assert!(full_jitter(Duration::MAX, 1.0) <= Duration::MAX);
        assert!(full_jitter(Duration::MAX, 0.5) > Duration::from_secs(u64::MAX / 4));
    }

    #[test]
    fn equal_jitter_keeps_the_upper_half() {
        let backoff = Backoff::new(100 * MS).with_jitter(Jitter::Equal);
        assert_eq!(backoff.delay(0, 0.0), 50 * MS);
        assert_eq!(backoff.delay(2, 0.5), 300 * MS);
        assert!(backoff.delay(2, 0.999_999) < 400 * MS);
        assert_eq!(backoff.floor(3), 400 * MS);
        assert_eq!(Backoff::new(100 * MS).floor(3), Duration::ZERO);
    }

    #[test]
    fn random_delays_cover_the_whole_range() {
        let backoff = Backoff::new(1000 * MS);
        let delays: Vec<Duration> = (0..2000)
            .map(|_| backoff.delay(0, rand::random::<f64>()))
            .collect();
        assert!(delays.iter().all(|d| *d < 1000 * MS));
        // Full jitter is uniform: each tenth of the range gets some.
        for tenth in 0..10u32 {
            let low = 100 * MS * tenth;
            let count = delays
                .iter()
                .filter(|d| **d >= low && **d < low + 100 * MS)
                .count();
            assert!(count > 100, "tenth {tenth} got {count} of 2000");
        }
    }
}

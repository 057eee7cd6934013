//! The API's capacity in the overload scenario: the proxy admits at most
//! `rate` requests per second (a token bucket holding half a second's
//! worth) and answers the others itself, `503` with `Retry-After: 1`, as a
//! load-shedding server does. Shedding is not free: a refused request
//! costs [`SHED_COST`] of an admitted one (its connection, its parsing,
//! its answer), so a client population that answers refusals with more
//! requests leaves fewer for the calls that would succeed: the storm.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// What a refused request costs, in admitted requests.
pub const SHED_COST: f64 = 0.25;

/// The `Retry-After` the API sends with its refusals, in seconds.
pub const SHED_RETRY_AFTER: u64 = 1;

/// A capacity shared by the proxy's connections.
#[derive(Debug, Clone)]
pub struct Capacity {
    rate: f64,
    state: Arc<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Capacity {
    /// Admits `rate` requests per second, full at start.
    pub fn new(rate: f64) -> Self {
        Self {
            rate,
            state: Arc::new(Mutex::new(Bucket {
                tokens: burst(rate),
                at: Instant::now(),
            })),
        }
    }

    /// Whether a request arriving `now` is admitted; a refusal takes its
    /// cost.
    pub fn admit(&self, now: Instant) -> bool {
        let mut bucket = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.at = now.max(bucket.at);
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(burst(self.rate));
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            bucket.tokens = (bucket.tokens - SHED_COST).max(0.0);
            false
        }
    }
}

/// Half a second's worth.
fn burst(rate: f64) -> f64 {
    (rate / 2.0).max(1.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn it_admits_its_rate_and_refusals_cost_a_share() {
        let start = Instant::now();
        let capacity = Capacity::new(10.0);
        // Half a second's worth at once.
        let admitted = (0..10).filter(|_| capacity.admit(start)).count();
        assert_eq!(admitted, 5);
        // One second later: ten more, less what the five refusals cost
        // (the bucket was empty: they cost nothing then).
        let later = start + Duration::from_secs(1);
        let admitted = (0..20).filter(|_| capacity.admit(later)).count();
        assert_eq!(admitted, 5, "the bucket holds half a second");
        // Arrivals at twice the rate: each refused one eats into what the
        // next second admits: (10 - 0.25 × 20) / 0.75 ≈ 6.7 per second.
        let mut admitted = 0;
        for n in 1..=200u32 {
            let at = later + Duration::from_millis(50) * n;
            admitted += u32::from(capacity.admit(at));
        }
        assert!((60..=75).contains(&admitted), "{admitted} over 10 s");
    }
}

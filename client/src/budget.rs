//! The retry budget: a token bucket that every call fills by a share of a
//! token and every retry drains by one, so retries can never be more than
//! that share of calls (the AWS SDKs' retry quota, gRPC's retry throttling
//! and Finagle's retry budgets work alike).
//!
//! The bucket starts full (the AWS SDKs' retry quota and gRPC's retry
//! throttling do too), so that a fresh client, a short-lived process or a
//! new instance of a fleet can retry its first calls. The bound, exactly:
//! from a fresh bucket, over its first `n` calls, retries ≤
//! `share × n + initial`; over any later run of `n` calls, retries ≤
//! `share × n + max(cap, initial)` (the most the bucket can hold when the
//! run starts). So the amplification factor (requests sent per call) stays
//! at or below `1 + share + initial / n`: with the defaults `1.1 + 10 / n`,
//! that is 1.110 over 1000 calls at 100 % failure, and `1 + share` over
//! any long window. The cap bounds how much a quiet spell saves up.
//!
//! Beside the share, a floor of retries per second (Finagle's
//! `minRetriesPerSec`, 10 by default) serves lost answers (a reset, a
//! timeout, a connect error) while the server answers at least a third of
//! the client's attempts and is not overloaded: a client with little
//! traffic can retry a blip, which the share alone (one retry per ten
//! calls) spends in seconds. A retry after a lost answer takes the floor's
//! token first, the share's when the floor has none. Retries after server
//! errors take the share only (the bound above holds for them), and
//! retries after overload answers (a 429, a 5xx with `Retry-After`) take
//! the share only and stop once the overload limiter
//! ([`crate::overload`]) says the server is overloaded.

/// How many retries a client, or one endpoint, may make: a share of its
/// calls.
///
/// ```
/// use idempotency_client::RetryBudget;
///
/// // Retries may be at most 10% of calls; at most 20 saved up for a burst.
/// let budget = RetryBudget::new(0.1).with_cap(20.0);
/// assert_eq!(budget.share(), 0.1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    share: f64,
    cap: f64,
    min_per_sec: f64,
    /// `None`: a fresh bucket is full (holds the cap).
    initial: Option<f64>,
}

/// The default budget, when none is set.
struct Defaults;

impl Defaults {
    /// One retry per ten calls: the Google SRE book's per-client retry
    /// budget; amplification stays at or below 1.1.
    const SHARE: f64 = 0.1;
    /// Ten retries saved up at most: a burst of failures after a quiet
    /// spell retries ten calls more than its share, not thousands. A fresh
    /// bucket holds as much, so a fresh client can retry.
    const CAP: f64 = 10.0;
    /// Ten retries per second after lost answers, whatever the share has
    /// earned: Finagle's `minRetriesPerSec` default. The lab's jitter row
    /// "calls given up" moves with it.
    const MIN_PER_SEC: f64 = 10.0;
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(Defaults::SHARE)
    }
}

impl RetryBudget {
    /// A budget that allows `share` retries per call (0.1: one retry per
    /// ten calls; 2.0: two retries per call). Negative or non-finite shares
    /// count as 0 (no retries).
    pub fn new(share: f64) -> Self {
        Self {
            share: non_negative(share),
            cap: Defaults::CAP,
            min_per_sec: Defaults::MIN_PER_SEC,
            initial: None,
        }
    }

    /// Sets how many retries the bucket can save up (and, unless
    /// [`RetryBudget::with_initial`] says otherwise, holds at start).
    ///
    /// The default value is 10.
    ///
    /// ```
    /// use idempotency_client::RetryBudget;
    ///
    /// let budget = RetryBudget::new(0.1).with_cap(100.0);
    /// assert_eq!(budget.cap(), 100.0);
    /// ```
    #[must_use]
    pub fn with_cap(mut self, retries: f64) -> Self {
        self.cap = non_negative(retries);
        self
    }

    /// Sets how many retries a fresh bucket holds, so that a client's first
    /// calls may retry before they have earned it. Over the first `n` calls
    /// of a fresh bucket, retries may reach `share × n + initial`; 0 makes
    /// that `share × n` exactly, at the price that a fresh client earns its
    /// first retry only after `1 / share` calls.
    ///
    /// The default value is the cap: a fresh bucket is full.
    ///
    /// ```
    /// use idempotency_client::RetryBudget;
    ///
    /// assert_eq!(RetryBudget::new(0.1).initial(), 10.0, "full at start");
    /// let budget = RetryBudget::new(0.1).with_initial(3.0);
    /// assert_eq!(budget.initial(), 3.0);
    /// ```
    #[must_use]
    pub fn with_initial(mut self, retries: f64) -> Self {
        self.initial = Some(non_negative(retries));
        self
    }

    /// Sets the floor: retries per second allowed after lost answers (a
    /// reset, a timeout, a connect error) on top of the share, while the
    /// server answers at least a third of the attempts and is not
    /// overloaded. At most one second's worth is saved up. 0 turns it off:
    /// then every retry takes the share.
    ///
    /// The default value is 10 (Finagle's `minRetriesPerSec`).
    ///
    /// ```
    /// use idempotency_client::RetryBudget;
    ///
    /// assert_eq!(RetryBudget::default().min_per_sec(), 10.0);
    /// let strict = RetryBudget::new(0.1).with_min_per_sec(0.0);
    /// assert_eq!(strict.min_per_sec(), 0.0);
    /// ```
    #[must_use]
    pub fn with_min_per_sec(mut self, retries: f64) -> Self {
        self.min_per_sec = non_negative(retries);
        self
    }

    /// Returns the floor: retries per second allowed after lost answers.
    pub fn min_per_sec(&self) -> f64 {
        self.min_per_sec
    }

    /// Returns the share: retries allowed per call.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// Returns the cap: how many retries the bucket can save up.
    pub fn cap(&self) -> f64 {
        self.cap
    }

    /// Returns how many retries a fresh bucket holds.
    pub fn initial(&self) -> f64 {
        self.initial.unwrap_or(self.cap)
    }
}

fn non_negative(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        0.0
    }
}

use std::time::Instant;

use crate::overload::OverloadLimiter;
use crate::signal::Signal;

/// A token is this many milli-tokens: integers, so that a share of 0.1 adds
/// up to exactly one token in ten calls.
const TOKEN: u64 = 1000;

fn milli(tokens: f64) -> u64 {
    // A saturating conversion: shares and caps are small, and absurd ones
    // saturate rather than wrap.
    (tokens * TOKEN as f64).round() as u64
}

/// How much the share of answered attempts moves with each attempt (an
/// exponentially weighted average over about the last twenty).
const ANSWERED_WEIGHT: f64 = 0.05;
/// The share of answered attempts below which lost answers are no blip:
/// the server answers fewer than one attempt in three.
const ANSWERED_ENOUGH: f64 = 1.0 / 3.0;

/// The state of one budget: its balance, in milli-tokens, its floor's
/// tokens, the share of attempts answered, and its overload limiter.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    balance: u64,
    deposit: u64,
    cap: u64,
    /// The floor's tokens (milli), refilled at `floor_rate` per second up
    /// to one second's worth.
    floor: u64,
    floor_rate: u64,
    floor_at: Instant,
    /// The share of recent attempts that got an answer (not overload).
    answered: f64,
    overload: OverloadLimiter,
}

/// Why the budget withheld a retry (the client's own; the guard's refusals
/// are `idempotency_guard::engine::Refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denial {
    /// The budget's share (and, for a lost answer, its floor) is spent.
    Budget,
    /// The server says it is overloaded (the overload limiter).
    Overload,
}

impl TokenBucket {
    /// A bucket for `budget`, holding its initial tokens.
    pub(crate) fn new(budget: &RetryBudget) -> Self {
        let floor_rate = milli(budget.min_per_sec);
        Self {
            balance: milli(budget.initial()),
            deposit: milli(budget.share),
            cap: milli(budget.cap),
            floor: floor_rate,
            floor_rate,
            floor_at: Instant::now(),
            answered: 1.0,
            overload: OverloadLimiter::new(),
        }
    }

    /// Counts what an attempt got.
    pub(crate) fn observe(&mut self, signal: Signal) {
        self.overload.observe(signal);
        let answered = match signal {
            Signal::Answered | Signal::ServerError => 1.0,
            Signal::LostAnswer | Signal::Overload => 0.0,
        };
        self.answered += ANSWERED_WEIGHT * (answered - self.answered);
    }

    /// Takes a retry's token after an attempt that got `signal`, or says
    /// why not.
    pub(crate) fn take_for(&mut self, signal: Signal, now: Instant) -> Result<(), Denial> {
        match signal {
            Signal::Overload if self.overload.overloaded() => return Err(Denial::Overload),
            Signal::LostAnswer
                if !self.overload.overloaded() && self.answered >= ANSWERED_ENOUGH =>
            {
                self.refill_floor(now);
                if self.floor >= TOKEN {
                    self.floor -= TOKEN;
                    return Ok(());
                }
            }
            Signal::Overload | Signal::LostAnswer | Signal::ServerError | Signal::Answered => {}
        }
        if self.has_token() {
            self.take();
            Ok(())
        } else {
            Err(Denial::Budget)
        }
    }

    fn refill_floor(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.floor_at);
        self.floor_at = now;
        let earned = (elapsed.as_secs_f64() * self.floor_rate as f64) as u64;
        self.floor = self.floor.saturating_add(earned).min(self.floor_rate);
    }

    /// A call starts: it earns its share of a retry.
    pub(crate) fn deposit(&mut self) {
        // The cap bounds savings, not the initial grant.
        let limit = self.cap.max(self.balance);
        self.balance = self.balance.saturating_add(self.deposit).min(limit);
    }

    /// Whether a retry may be taken from this bucket.
    pub(crate) fn has_token(&self) -> bool {
        self.balance >= TOKEN
    }

    /// Takes one retry's token; call only after [`TokenBucket::has_token`].
    pub(crate) fn take(&mut self) {
        self.balance = self.balance.saturating_sub(TOKEN);
    }

    /// The balance, in retries.
    #[cfg(test)]
    pub(crate) fn retries_left(&self) -> f64 {
        self.balance as f64 / TOKEN as f64
    }
}

/// Takes one retry's token from `bucket` after an attempt that got
/// `signal`, or says why not.
pub(crate) fn take_retry(
    bucket: &std::sync::Mutex<TokenBucket>,
    signal: Signal,
) -> Result<(), Denial> {
    bucket
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take_for(signal, Instant::now())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_fresh_bucket_is_full() {
        let mut bucket = TokenBucket::new(&RetryBudget::default());
        assert_eq!(bucket.retries_left(), 10.0);
        // Deposits beyond the cap are not kept.
        bucket.deposit();
        assert_eq!(bucket.retries_left(), 10.0);
    }

    #[test]
    fn a_share_of_a_tenth_earns_one_retry_per_ten_calls() {
        let mut bucket = TokenBucket::new(&RetryBudget::new(0.1).with_initial(0.0));
        for _ in 0..9 {
            bucket.deposit();
            assert!(!bucket.has_token());
        }
        bucket.deposit();
        assert!(bucket.has_token(), "ten calls earn one retry exactly");
        bucket.take();
        assert!(!bucket.has_token());
    }

    #[test]
    fn retries_never_exceed_the_share_of_calls_plus_the_start() {
        // Whatever the pattern of calls and retries, at every point of the
        // run: retries ≤ share × calls + initial (the default: initial =
        // cap = 10).
        let cases = [
            RetryBudget::default(),
            RetryBudget::new(0.1).with_initial(0.0),
            RetryBudget::new(0.25).with_initial(0.0).with_cap(50.0),
            RetryBudget::new(1.0).with_cap(50.0),
            RetryBudget::new(0.1).with_initial(3.0),
            RetryBudget::new(2.5).with_initial(1.0).with_cap(50.0),
        ];
        for budget in cases {
            let (share, initial) = (budget.share(), budget.initial());
            let mut bucket = TokenBucket::new(&budget);
            let (mut calls, mut retries) = (0u32, 0u32);
            for _ in 0..5000u32 {
                bucket.deposit();
                calls += 1;
                // Every call wants three retries (a permanent failure).
                for _ in 0..3 {
                    if bucket.has_token() {
                        bucket.take();
                        retries += 1;
                    }
                }
                let bound = share * f64::from(calls) + initial;
                assert!(
                    f64::from(retries) <= bound + 1e-9,
                    "{budget:?}: {retries} retries after {calls} calls"
                );
            }
            // And the budget is used: close to the bound, not far under it.
            let bound = share * f64::from(calls) + initial;
            assert!(f64::from(retries) >= bound - 1.0, "{budget:?}: {retries}");
        }
    }

    #[test]
    fn the_default_bucket_over_its_first_calls_at_total_failure() {
        // The short window, exactly: a fresh default bucket (10 retries,
        // 0.1 per call) whose every call wants two retries (three attempts).
        let mut bucket = TokenBucket::new(&RetryBudget::default());
        let mut retries = Vec::new();
        for _ in 0..1000 {
            bucket.deposit();
            let mut taken = 0;
            for _ in 0..2 {
                if bucket.has_token() {
                    bucket.take();
                    taken += 1;
                }
            }
            retries.push(taken);
        }
        let after = |n: usize| retries[..n].iter().sum::<u32>();
        // The first five calls retry twice each (the start allowance),
        // then one call in ten retries.
        assert_eq!(&retries[..5], &[2, 2, 2, 2, 2]);
        assert_eq!(after(10), 10);
        assert_eq!(after(100), 19);
        assert_eq!(after(1000), 109, "≤ 0.1 × 1000 + 10");
    }

    #[test]
    fn the_cap_bounds_savings() {
        let mut bucket = TokenBucket::new(&RetryBudget::new(1.0).with_cap(3.0).with_initial(0.0));
        for _ in 0..100 {
            bucket.deposit();
        }
        assert_eq!(bucket.retries_left(), 3.0);
        // An initial grant above the cap is kept until spent.
        let mut bucket = TokenBucket::new(&RetryBudget::new(1.0).with_cap(3.0).with_initial(5.0));
        bucket.deposit();
        assert_eq!(bucket.retries_left(), 5.0);
    }

    #[test]
    fn a_refused_retry_takes_nothing() {
        let bucket = Mutex::new(TokenBucket::new(&RetryBudget::new(0.5).with_initial(0.0)));
        bucket.lock().unwrap().deposit();
        assert_eq!(
            take_retry(&bucket, Signal::ServerError),
            Err(Denial::Budget)
        );
        assert_eq!(bucket.lock().unwrap().retries_left(), 0.5);
        bucket.lock().unwrap().deposit();
        assert_eq!(take_retry(&bucket, Signal::ServerError), Ok(()));
        assert_eq!(
            take_retry(&bucket, Signal::ServerError),
            Err(Denial::Budget)
        );
    }

    #[test]
    fn the_floor_serves_lost_answers_only() {
        // An empty share: only the floor can serve.
        let budget = RetryBudget::new(0.0).with_initial(0.0);
        let start = Instant::now();
        let mut bucket = TokenBucket::new(&budget);
        // A full second's worth at start: ten lost answers retried.
        for n in 0..10 {
            assert_eq!(bucket.take_for(Signal::LostAnswer, start), Ok(()), "{n}");
        }
        assert_eq!(
            bucket.take_for(Signal::LostAnswer, start),
            Err(Denial::Budget)
        );
        // Server errors and overload answers never take the floor.
        let later = start + Duration::from_secs(1);
        assert_eq!(
            bucket.take_for(Signal::ServerError, later),
            Err(Denial::Budget)
        );
        assert_eq!(
            bucket.take_for(Signal::Overload, later),
            Err(Denial::Budget)
        );
        // Half a second earns five, and no more than a second's worth is
        // kept however long the quiet.
        let mut bucket = TokenBucket::new(&budget);
        let mut taken = 0;
        while bucket.take_for(Signal::LostAnswer, start).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 10);
        let half = start + Duration::from_millis(500);
        while bucket.take_for(Signal::LostAnswer, half).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 15);
        let hour = start + Duration::from_secs(3600);
        while bucket.take_for(Signal::LostAnswer, hour).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 25);
    }

    #[test]
    fn no_floor_when_the_server_answers_too_little_or_is_overloaded() {
        let budget = RetryBudget::new(0.0).with_initial(0.0);
        let now = Instant::now();
        // A server that answers nothing (down, or hung): the share only.
        let mut bucket = TokenBucket::new(&budget);
        for _ in 0..40 {
            bucket.observe(Signal::LostAnswer);
        }
        assert_eq!(
            bucket.take_for(Signal::LostAnswer, now),
            Err(Denial::Budget)
        );
        // Jitter: two attempts in three answered: the floor serves.
        let mut bucket = TokenBucket::new(&budget);
        for n in 0..300 {
            bucket.observe(if n % 3 == 0 {
                Signal::LostAnswer
            } else {
                Signal::Answered
            });
        }
        assert_eq!(bucket.take_for(Signal::LostAnswer, now), Ok(()));
        // Overloaded: neither the floor nor a retry of an overload answer.
        let mut bucket = TokenBucket::new(&RetryBudget::default());
        for _ in 0..5 {
            bucket.observe(Signal::Overload);
        }
        assert_eq!(
            bucket.take_for(Signal::Overload, now),
            Err(Denial::Overload)
        );
        // The share still serves a lost answer (the bucket is full).
        assert_eq!(bucket.take_for(Signal::LostAnswer, now), Ok(()));
        assert_eq!(bucket.retries_left(), 9.0, "from the share, not the floor");
    }

    #[test]
    fn a_zero_floor_leaves_the_share_alone() {
        let budget = RetryBudget::new(0.1)
            .with_initial(0.0)
            .with_min_per_sec(0.0);
        let mut bucket = TokenBucket::new(&budget);
        assert_eq!(
            bucket.take_for(Signal::LostAnswer, Instant::now()),
            Err(Denial::Budget)
        );
    }

    #[test]
    fn odd_shares_mean_no_retries() {
        for share in [-1.0, f64::NAN, f64::NEG_INFINITY, 0.0] {
            let mut bucket = TokenBucket::new(&RetryBudget::new(share).with_initial(0.0));
            for _ in 0..100 {
                bucket.deposit();
            }
            assert!(!bucket.has_token(), "share {share}");
        }
    }
}

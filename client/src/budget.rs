//! The retry budget: a token bucket that every call fills by a share of a
//! token and every retry drains by one, so retries can never be more than
//! that share of calls (the AWS SDKs' retry quota, gRPC's retry throttling
//! and Finagle's retry budgets work alike).
//!
//! The bucket starts empty unless told otherwise: over any run of `n` calls,
//! retries ≤ `share × n + initial`, so the amplification factor (requests
//! sent per call) stays at or below `1 + share + initial / n`, whatever the
//! failure rate. The cap bounds how much a long quiet spell can save up for
//! a burst.

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
    initial: f64,
}

/// The default budget, when none is set.
struct Defaults;

impl Defaults {
    /// One retry per ten calls: the Google SRE book's per-client retry
    /// budget; amplification stays at or below 1.1.
    const SHARE: f64 = 0.1;
    /// Ten retries saved up at most: a burst of failures after a quiet
    /// spell retries ten calls more than its share, not thousands.
    const CAP: f64 = 10.0;
    /// Empty at start: retries never exceed the share, from the first call.
    const INITIAL: f64 = 0.0;
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
            initial: Defaults::INITIAL,
        }
    }

    /// Sets how many retries the bucket can save up.
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
    /// calls may retry before they have earned it. Over a run of `n` calls,
    /// retries may then reach `share × n + initial`.
    ///
    /// The default value is 0: a fresh client earns its first retry after
    /// `1 / share` calls.
    ///
    /// ```
    /// use idempotency_client::RetryBudget;
    ///
    /// let budget = RetryBudget::new(0.1).with_initial(3.0);
    /// assert_eq!(budget.initial(), 3.0);
    /// ```
    #[must_use]
    pub fn with_initial(mut self, retries: f64) -> Self {
        self.initial = non_negative(retries);
        self
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
        self.initial
    }
}

fn non_negative(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        0.0
    }
}

/// A token is this many milli-tokens: integers, so that a share of 0.1 adds
/// up to exactly one token in ten calls.
const TOKEN: u64 = 1000;

fn milli(tokens: f64) -> u64 {
    // A saturating conversion: shares and caps are small, and absurd ones
    // saturate rather than wrap.
    (tokens * TOKEN as f64).round() as u64
}

/// The state of one budget: its balance, in milli-tokens.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    balance: u64,
    deposit: u64,
    cap: u64,
}

impl TokenBucket {
    /// A bucket for `budget`, holding its initial tokens.
    pub(crate) fn new(budget: &RetryBudget) -> Self {
        Self {
            balance: milli(budget.initial),
            deposit: milli(budget.share),
            cap: milli(budget.cap),
        }
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

/// Which budget refused a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The client-wide budget is spent.
    Client,
    /// The endpoint's budget is spent.
    Endpoint,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Endpoint => "endpoint",
        }
    }
}

/// Takes one retry from both buckets, or from neither: a retry needs the
/// client's budget and its endpoint's. Lock order: client, then endpoint.
pub(crate) fn take_retry(
    client: &std::sync::Mutex<TokenBucket>,
    endpoint: &std::sync::Mutex<TokenBucket>,
) -> Result<(), Refusal> {
    let mut client = client
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut endpoint = endpoint
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !client.has_token() {
        return Err(Refusal::Client);
    }
    if !endpoint.has_token() {
        return Err(Refusal::Endpoint);
    }
    client.take();
    endpoint.take();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn a_share_of_a_tenth_earns_one_retry_per_ten_calls() {
        let mut bucket = TokenBucket::new(&RetryBudget::new(0.1));
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
    fn retries_never_exceed_the_share_of_calls() {
        // Whatever the pattern of calls and retries, at every point of the
        // run: retries ≤ share × calls + initial.
        for (share, initial) in [(0.1, 0.0), (0.25, 0.0), (1.0, 0.0), (0.1, 3.0), (2.5, 1.0)] {
            let budget = RetryBudget::new(share).with_initial(initial).with_cap(50.0);
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
                    "share {share}: {retries} retries after {calls} calls"
                );
            }
            // And the budget is used: close to the bound, not far under it.
            let bound = share * f64::from(calls) + initial;
            assert!(
                f64::from(retries) >= bound - 1.0,
                "share {share}: {retries}"
            );
        }
    }

    #[test]
    fn the_cap_bounds_savings() {
        let mut bucket = TokenBucket::new(&RetryBudget::new(1.0).with_cap(3.0));
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
    fn a_retry_needs_both_budgets_and_takes_from_both_or_neither() {
        let client = Mutex::new(TokenBucket::new(&RetryBudget::new(1.0)));
        let endpoint = Mutex::new(TokenBucket::new(&RetryBudget::new(0.5)));
        client.lock().unwrap().deposit();
        endpoint.lock().unwrap().deposit();
        assert_eq!(take_retry(&client, &endpoint), Err(Refusal::Endpoint));
        assert_eq!(
            client.lock().unwrap().retries_left(),
            1.0,
            "a refused retry takes nothing"
        );
        endpoint.lock().unwrap().deposit();
        assert_eq!(take_retry(&client, &endpoint), Ok(()));
        assert_eq!(take_retry(&client, &endpoint), Err(Refusal::Client));
    }

    #[test]
    fn odd_shares_mean_no_retries() {
        for share in [-1.0, f64::NAN, f64::NEG_INFINITY, 0.0] {
            let mut bucket = TokenBucket::new(&RetryBudget::new(share));
            for _ in 0..100 {
                bucket.deposit();
            }
            assert!(!bucket.has_token(), "share {share}");
        }
    }
}

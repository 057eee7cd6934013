//! Per-endpoint retry policies: how long a call may take, how its retries
//! are spaced, whether the endpoint is guarded (its writes get an
//! idempotency key), and, optionally, a retry budget of its own and a
//! circuit breaker.

use std::time::Duration;

use crate::{Backoff, CircuitBreaker, RetryBudget};

/// Which defaults a [`Policy`] starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// Reads (GET, HEAD, OPTIONS, TRACE): 500 ms backoff base, 10 s
    /// deadline.
    Read,
    /// Writes (every other method): 1 s backoff base, 10 s deadline.
    Write,
}

/// The defaults of one kind of endpoint (docs/retry-client.md, "Default
/// policy", gives each one's anchor and the lab row it moves).
struct Defaults {
    /// The bases: 500 ms for reads, 1 s for writes, which are costlier to
    /// repeat.
    base: Duration,
    /// No single pause beyond it, whatever the deadline allows.
    cap: Duration,
    /// One budget for the whole call, attempts and pauses together: a
    /// caller waits at most this long. 10 s: below the 15 s the naive SDK
    /// of the lab may take, long enough for an answer delayed by a few
    /// seconds to arrive (issue 53's jitter row; it was 3 s for reads and
    /// 2 s for writes, which gave up ten times as many calls as that SDK).
    deadline: Duration,
    /// How long the call waits for an attempt before it goes on; the
    /// attempt keeps running beside the next ones (late.rs).
    attempt_timeout: Duration,
    /// Reads: a first try and three retries, as the lab's naive SDK; with
    /// late attempts kept, they give up fewer calls than it for fewer
    /// requests. Writes: five, gRPC's cap on a retry policy's attempts: a
    /// keyed write's fetches count as attempts, and four left one write
    /// in 300 given up in the jitter where the naive SDK gave up none.
    max_attempts: u32,
}

const READ: Defaults = Defaults {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(10),
    deadline: Duration::from_secs(10),
    attempt_timeout: Duration::from_secs(2),
    max_attempts: 4,
};

const WRITE: Defaults = Defaults {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(10),
    deadline: Duration::from_secs(10),
    attempt_timeout: Duration::from_secs(2),
    max_attempts: 5,
};

/// The least a `429 Too Many Requests` makes a client wait, whatever its
/// `Retry-After` says: a server that says `0` is still overloaded.
const RETRY_AFTER_FLOOR: Duration = Duration::from_millis(500);

/// How one endpoint's calls are retried.
///
/// ```
/// use std::time::Duration;
/// use idempotency_client::{Backoff, CircuitBreaker, Kind, Policy, RetryBudget};
///
/// let policy = Policy::guarded_write()
///     .with_backoff(Backoff::new(Duration::from_millis(200)))
///     .with_deadline(Duration::from_secs(5))
///     .with_attempt_timeout(Duration::from_secs(2))
///     .with_budget(RetryBudget::new(0.2))
///     .with_circuit_breaker(CircuitBreaker::new(5));
/// assert_eq!(policy.deadline(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub(crate) kind: Kind,
    pub(crate) backoff: Backoff,
    pub(crate) deadline: Duration,
    pub(crate) attempt_timeout: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) retry_after_floor: Duration,
    pub(crate) idempotent: bool,
    pub(crate) guarded: bool,
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) breaker: Option<CircuitBreaker>,
}

impl Policy {
    /// The default policy of reads or of writes. A write endpoint is not
    /// guarded by default: its writes get no key and are retried only on
    /// `429` (see [`Policy::guarded_write`]).
    pub fn new(kind: Kind) -> Self {
        let defaults = match kind {
            Kind::Read => READ,
            Kind::Write => WRITE,
        };
        Self {
            kind,
            backoff: Backoff::new(defaults.base).with_cap(defaults.cap),
            deadline: defaults.deadline,
            attempt_timeout: defaults.attempt_timeout,
            max_attempts: defaults.max_attempts,
            retry_after_floor: RETRY_AFTER_FLOOR,
            idempotent: false,
            guarded: false,
            budget: None,
            breaker: None,
        }
    }

    /// The default policy of a write endpoint declared guarded (it sits
    /// behind the idempotency guard, or anything else that honours
    /// `Idempotency-Key`): `Policy::new(Kind::Write).with_guarded(true)`.
    ///
    /// ```
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::guarded_write();
    /// assert!(policy.guarded());
    /// assert_eq!(policy.kind(), Kind::Write);
    /// ```
    pub fn guarded_write() -> Self {
        Self::new(Kind::Write).with_guarded(true)
    }

    /// Sets the pauses between attempts.
    ///
    /// The default value is a base of 500 ms for reads and 1 s for writes,
    /// capped at 10 s, with full jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Backoff, Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Read).with_backoff(Backoff::new(Duration::from_millis(50)));
    /// assert_eq!(policy.backoff().base(), Duration::from_millis(50));
    /// ```
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the time budget of one call: its attempts, its pauses and its
    /// status look-ups share it.
    ///
    /// The default value is 3 s for reads and 2 s for writes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Read).with_deadline(Duration::from_secs(10));
    /// assert_eq!(policy.deadline(), Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets how long the call waits for one attempt before it goes on (a
    /// status look-up, a pause, the next attempt). The attempt is not cut
    /// off then: it keeps running until the deadline, and if its answer
    /// comes first, from whichever attempt, the call takes it (a slow
    /// answer is not a lost one). An attempt never starts when less than
    /// this is left of the deadline. A timeout set on the request itself
    /// cuts that attempt off, and is kept when shorter.
    ///
    /// The default value is 2 s for reads and writes (it was 1 s and
    /// 800 ms, with attempts cut off, before issue 53).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Write).with_attempt_timeout(Duration::from_millis(300));
    /// assert_eq!(policy.attempt_timeout(), Duration::from_millis(300));
    /// ```
    #[must_use]
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// Sets the most attempts one call makes (the first try included; at
    /// least 1).
    ///
    /// The default value is 3.
    ///
    /// ```
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Read).with_max_attempts(5);
    /// assert_eq!(policy.max_attempts(), 5);
    /// ```
    #[must_use]
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Sets the least wait after a `429` with `Retry-After` (a longer
    /// `Retry-After` is honoured as it is).
    ///
    /// The default value is 500 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Read).with_retry_after_floor(Duration::from_secs(1));
    /// assert_eq!(policy.retry_after_floor(), Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn with_retry_after_floor(mut self, floor: Duration) -> Self {
        self.retry_after_floor = floor;
        self
    }

    /// Marks the endpoint's writes as idempotent by nature (a `PUT` of a
    /// whole resource, a `DELETE`, a search sent as `POST`): they are
    /// retried like reads, with neither key nor status look-up.
    ///
    /// The default value is `false`.
    ///
    /// ```
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Write).with_idempotent(true);
    /// assert!(policy.idempotent());
    /// ```
    #[must_use]
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Declares whether the endpoint is guarded: whether the server
    /// honours `Idempotency-Key`, so that a write sent twice with one key
    /// runs once. A guarded endpoint's writes without a key get one (a
    /// UUID v7, made once per call and sent with every attempt) and are
    /// retried after failures that leave their outcome unknown. An
    /// undeclared endpoint's writes get no key and are retried only on a
    /// `429` with `Retry-After` (the server said it did nothing), so a
    /// server that ignores keys never runs a write twice because of this
    /// client. A write whose request carries its own key is treated as
    /// guarded whatever this says: the caller vouched for the server.
    ///
    /// # Warning
    ///
    /// Declare only endpoints that really are guarded: against a server
    /// that ignores the key, a resent write runs again.
    ///
    /// The default value is `false` ([`Policy::guarded_write`] sets it).
    ///
    /// ```
    /// use idempotency_client::{Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Write).with_guarded(true);
    /// assert!(policy.guarded());
    /// assert!(!Policy::new(Kind::Write).guarded());
    /// ```
    #[must_use]
    pub fn with_guarded(mut self, guarded: bool) -> Self {
        self.guarded = guarded;
        self
    }

    /// Gives each endpoint that follows this policy a retry budget of its
    /// own, used *instead of* the client's shared one (never both: a retry
    /// takes one token from exactly one bucket). Use it to keep a noisy
    /// endpoint from spending the retries of the others, or to give one
    /// endpoint a larger share.
    ///
    /// The default value is none: the endpoint retries from the client's
    /// shared budget ([`RetryClient::with_budget`](crate::RetryClient::with_budget)).
    ///
    /// ```
    /// use idempotency_client::{Kind, Policy, RetryBudget};
    ///
    /// assert_eq!(Policy::new(Kind::Read).budget(), None);
    /// let policy = Policy::new(Kind::Read).with_budget(RetryBudget::new(0.2));
    /// assert_eq!(policy.budget().map(|b| b.share()), Some(0.2));
    /// ```
    #[must_use]
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets a circuit breaker on the endpoint.
    ///
    /// The default value is none.
    ///
    /// ```
    /// use idempotency_client::{CircuitBreaker, Kind, Policy};
    ///
    /// let policy = Policy::new(Kind::Read).with_circuit_breaker(CircuitBreaker::new(5));
    /// assert_eq!(policy.circuit_breaker().map(|b| b.failures()), Some(5));
    /// ```
    #[must_use]
    pub fn with_circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Returns which defaults the policy started from.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Returns the backoff.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Returns the time budget of one call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Returns how long the call waits for an attempt before it goes on.
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// Returns the most attempts of one call.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Returns the least wait after a `429`.
    pub fn retry_after_floor(&self) -> Duration {
        self.retry_after_floor
    }

    /// Returns whether writes are retried like reads.
    pub fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// Returns whether the endpoint is declared guarded.
    pub fn guarded(&self) -> bool {
        self.guarded
    }

    /// Returns the endpoint's own retry budget, if it has one.
    pub fn budget(&self) -> Option<RetryBudget> {
        self.budget
    }

    /// Returns the endpoint's circuit breaker, if it has one.
    pub fn circuit_breaker(&self) -> Option<CircuitBreaker> {
        self.breaker
    }

    /// The longest an attempt may take, never more than the deadline: the
    /// room an attempt needs before it starts.
    pub(crate) fn attempt_room(&self) -> Duration {
        self.attempt_timeout.min(self.deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_issues_table() {
        // Bases from issue 17's table; deadlines, attempt timeouts and
        // attempts from issue 53's jitter row (docs/retry-client.md).
        let read = Policy::new(Kind::Read);
        assert_eq!(read.backoff().base(), Duration::from_millis(500));
        assert_eq!(read.deadline(), Duration::from_secs(10));
        let write = Policy::new(Kind::Write);
        assert_eq!(write.backoff().base(), Duration::from_secs(1));
        assert_eq!(write.deadline(), Duration::from_secs(10));
        assert_eq!(read.max_attempts(), 4);
        assert_eq!(write.max_attempts(), 5);
        assert!(Policy::guarded_write().guarded());
        for policy in [read, write] {
            assert!(!policy.guarded(), "no endpoint is guarded unless declared");
            assert!(!policy.idempotent());
            assert_eq!(policy.retry_after_floor(), Duration::from_millis(500));
            assert_eq!(policy.budget(), None, "the client's shared budget");
            assert!(policy.circuit_breaker().is_none());
            assert_eq!(policy.attempt_timeout(), Duration::from_secs(2));
            assert!(policy.attempt_timeout() < policy.deadline());
        }
    }

    #[test]
    fn an_attempt_never_needs_more_than_the_deadline() {
        let policy = Policy::new(Kind::Read)
            .with_deadline(Duration::from_millis(100))
            .with_attempt_timeout(Duration::from_secs(5));
        assert_eq!(policy.attempt_room(), Duration::from_millis(100));
    }
}

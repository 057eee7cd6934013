//! The circuit breaker: after a run of consecutive failures an endpoint
//! fails fast for a cool-down, then lets one probe through; the probe's
//! answer closes the circuit again or starts another cool-down.

use std::time::{Duration, Instant};

use crate::deadline::later;

/// When an endpoint stops being called for a while: after `failures`
/// consecutive failed attempts (connect errors, timeouts, dropped
/// connections, 408, 429 and 5xx), calls fail at once for the cool-down.
///
/// ```
/// use std::time::Duration;
/// use idempotency_client::CircuitBreaker;
///
/// let breaker = CircuitBreaker::new(5).with_cool_down(Duration::from_secs(10));
/// assert_eq!(breaker.failures(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    failures: u32,
    cool_down: Duration,
}

/// The cool-down when none is set: long enough for a restart or a failover
/// to finish, short enough that a healthy endpoint is back soon.
const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(5);

impl CircuitBreaker {
    /// A breaker that opens after `failures` consecutive failed attempts
    /// (at least 1).
    pub fn new(failures: u32) -> Self {
        Self {
            failures: failures.max(1),
            cool_down: DEFAULT_COOL_DOWN,
        }
    }

    /// Sets how long an open circuit fails fast before it lets a probe
    /// through.
    ///
    /// The default value is 5 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::CircuitBreaker;
    ///
    /// let breaker = CircuitBreaker::new(3).with_cool_down(Duration::from_millis(500));
    /// assert_eq!(breaker.cool_down(), Duration::from_millis(500));
    /// ```
    #[must_use]
    pub fn with_cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = cool_down;
        self
    }

    /// Returns how many consecutive failures open the circuit.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Returns how long an open circuit fails fast.
    pub fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    /// Calls go through; this many failures in a row so far.
    Closed { failures: u32 },
    /// Calls fail fast until then.
    Open { until: Instant },
    /// One probe went through at this instant; others fail fast until it
    /// answers (or until a cool-down passes without an answer, when the
    /// probe's caller went away).
    HalfOpen { probe_since: Instant },
}

/// One endpoint's breaker: its configuration and its circuit. Every method
/// takes the current instant, so the whole state machine is testable
/// without waiting.
#[derive(Debug)]
pub(crate) struct BreakerState {
    config: CircuitBreaker,
    circuit: Circuit,
}

impl BreakerState {
    /// A closed circuit.
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Self {
            config,
            circuit: Circuit::Closed { failures: 0 },
        }
    }

    /// Whether an attempt may start now; `Err` holds how long until one
    /// may.
    pub(crate) fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        match self.circuit {
            Circuit::Closed { .. } => Ok(()),
            Circuit::Open { until } if now < until => Err(until - now),
            Circuit::HalfOpen { probe_since }
                if now.saturating_duration_since(probe_since) < self.config.cool_down =>
            {
                Err(self.config.cool_down - now.saturating_duration_since(probe_since))
            }
            // The cool-down is over (or the probe never answered): this
            // attempt is the probe.
            Circuit::Open { .. } | Circuit::HalfOpen { .. } => {
                self.circuit = Circuit::HalfOpen { probe_since: now };
                Ok(())
            }
        }
    }

    /// Records an attempt's result: `true` for an answer (any final
    /// status), `false` for a failure.
    pub(crate) fn record(&mut self, succeeded: bool, now: Instant) {
        self.circuit = match (self.circuit, succeeded) {
            (_, true) => Circuit::Closed { failures: 0 },
            (Circuit::Closed { failures }, false) => {
                let failures = failures.saturating_add(1);
                if failures >= self.config.failures {
                    Circuit::Open {
                        until: later(now, self.config.cool_down),
                    }
                } else {
                    Circuit::Closed { failures }
                }
            }
            // The probe failed: another cool-down.
            (Circuit::HalfOpen { .. }, false) => Circuit::Open {
                until: later(now, self.config.cool_down),
            },
            // A late failure of an attempt admitted before the circuit
            // opened changes nothing.
            (open @ Circuit::Open { .. }, false) => open,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn breaker() -> BreakerState {
        BreakerState::new(CircuitBreaker::new(3).with_cool_down(10 * SECOND))
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let t0 = Instant::now();
        let mut b = breaker();
        b.record(false, t0);
        b.record(false, t0);
        b.record(true, t0);
        b.record(false, t0);
        b.record(false, t0);
        assert_eq!(b.admit(t0), Ok(()), "a success in between resets the count");
        b.record(false, t0);
        assert_eq!(b.admit(t0), Err(10 * SECOND));
        assert_eq!(b.admit(t0 + 4 * SECOND), Err(6 * SECOND));
    }

    #[test]
    fn after_the_cool_down_one_probe_goes_through() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..3 {
            b.record(false, t0);
        }
        let later = t0 + 10 * SECOND;
        assert_eq!(b.admit(later), Ok(()), "the probe");
        assert!(b.admit(later).is_err(), "others wait for the probe");
        // The probe fails: another full cool-down.
        b.record(false, later + SECOND);
        assert_eq!(b.admit(later + SECOND), Err(10 * SECOND));
        // The next probe succeeds: closed again.
        let again = later + 11 * SECOND;
        assert_eq!(b.admit(again), Ok(()));
        b.record(true, again);
        assert_eq!(b.admit(again), Ok(()));
        assert_eq!(b.admit(again), Ok(()));
    }

    #[test]
    fn a_probe_that_never_answers_does_not_block_for_ever() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..3 {
            b.record(false, t0);
        }
        assert_eq!(b.admit(t0 + 10 * SECOND), Ok(()));
        // Its caller went away; a cool-down later another probe may go.
        assert!(b.admit(t0 + 19 * SECOND).is_err());
        assert_eq!(b.admit(t0 + 20 * SECOND), Ok(()));
    }

    #[test]
    fn late_failures_do_not_extend_an_open_circuit() {
        let t0 = Instant::now();
        let mut b = breaker();
        for _ in 0..3 {
            b.record(false, t0);
        }
        b.record(false, t0 + 9 * SECOND);
        assert_eq!(b.admit(t0 + 10 * SECOND), Ok(()));
    }

    #[test]
    fn an_endless_cool_down_does_not_overflow() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(CircuitBreaker::new(1).with_cool_down(Duration::MAX));
        b.record(false, t0);
        assert!(b.admit(t0 + 1000 * SECOND).is_err());
    }

    #[test]
    fn at_least_one_failure_opens_it() {
        assert_eq!(CircuitBreaker::new(0).failures(), 1);
    }
}

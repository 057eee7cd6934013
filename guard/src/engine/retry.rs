//! When the *settle* step (see the engine's docs) sends a completion
//! again after a transient failure: a pure function of the attempts made,
//! the time since the first began and the lease known to be left, so the
//! policy is tested without a store or a clock.
//!
//! A completion under a live lease is still valid: the store fences it by
//! the lease's token, and nobody else may run the key while the lease
//! holds. So the engine keeps trying for as long as a store's outage may
//! reasonably last (a NATS JetStream leader election took 4.6 to 8.3 s on
//! this project's cluster; a Redis or PostgreSQL failover a few seconds),
//! with capped exponential backoff, bounded by the completion retry window
//! ([`Engine::with_completion_retry_window`](crate::Engine::with_completion_retry_window))
//! and by the lease: no attempt may run past the lease's end less a safety
//! margin (a tenth of the lease): a resend's store timeout is cut to end
//! there, and none is sent with less than [`MIN_ATTEMPT`] to run. Past
//! either bound the outcome is not stored, and the key lapses into
//! abandoned when the lease ends, as before: the engine fails closed.

use std::time::Duration;

/// The pause after the first failed attempt; each later pause doubles it.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two attempts: a store that comes back is used
/// within a second.
pub(super) const MAX_PAUSE: Duration = Duration::from_secs(1);
/// The shortest time a resend is given to run (a store's round trip is a
/// few milliseconds): with less of the lease left, none is sent.
pub(super) const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// The bounds of one completion's retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RetrySchedule {
    /// Attempts may start up to this long after the first one began.
    pub(super) window: Duration,
    /// How long one attempt may take (the engine's store timeout).
    pub(super) attempt_timeout: Duration,
    /// The lease's length: a tenth of it is kept as the safety margin.
    pub(super) lease: Duration,
}

/// The next attempt: after a pause, bounded by a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Attempt {
    /// How long to wait before sending it.
    pub(super) pause: Duration,
    /// How long it may take: the store timeout, or less to end inside the
    /// lease.
    pub(super) timeout: Duration,
}

impl RetrySchedule {
    /// What is kept between the last attempt's end and the lease's end: a
    /// tenth of the lease (6 s of the default 60 s), for the store's clock
    /// and this process's drifting apart and for a late renewal's answer.
    pub(super) fn margin(&self) -> Duration {
        self.lease / 10
    }

    /// The next attempt, after `failed` attempts (at least one) failed
    /// transiently, `elapsed` after the first began, with `lease_left` of
    /// the lease known to be held from now; `None` to give up.
    pub(super) fn next(
        &self,
        failed: u32,
        elapsed: Duration,
        lease_left: Duration,
    ) -> Option<Attempt> {
        let window_left = self.window.checked_sub(elapsed).filter(|d| !d.is_zero())?;
        // The attempt must end inside the lease, less the margin; the last
        // one's pause shrinks so that it still has its shortest run.
        let room = lease_left.checked_sub(self.margin())?;
        let latest_pause = room
            .checked_sub(MIN_ATTEMPT.min(self.attempt_timeout))
            .filter(|d| !d.is_zero())?;
        let pause = backoff(failed).min(window_left).min(latest_pause);
        let timeout = (room - pause).min(self.attempt_timeout);
        Some(Attempt { pause, timeout })
    }
}

/// The capped exponential pause after `failed` failed attempts: 50 ms,
/// 100 ms, 200 ms, ... up to one second.
pub(super) fn backoff(failed: u32) -> Duration {
    let doublings = failed.saturating_sub(1).min(16);
    FIRST_PAUSE.saturating_mul(1 << doublings).min(MAX_PAUSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    /// The engine's defaults: a 30 s window, a 5 s store timeout, a 60 s lease.
    fn defaults() -> RetrySchedule {
        RetrySchedule {
            window: 30 * S,
            attempt_timeout: 5 * S,
            lease: 60 * S,
        }
    }

    /// The attempts (start, timeout) made when each fails after `takes`
    /// (or its timeout, if shorter), until the schedule gives up, with
    /// `lease_left` of the lease at the first.
    fn attempts(
        schedule: RetrySchedule,
        takes: Duration,
        lease_left: Duration,
    ) -> Vec<(Duration, Duration)> {
        let mut made = vec![(Duration::ZERO, schedule.attempt_timeout)];
        let mut now = takes.min(schedule.attempt_timeout);
        while let Some(next) = schedule.next(
            u32::try_from(made.len()).unwrap(),
            now,
            lease_left.saturating_sub(now),
        ) {
            now += next.pause;
            made.push((now, next.timeout));
            now += takes.min(next.timeout);
            assert!(made.len() < 10_000, "the schedule never ends");
        }
        made
    }

    #[test]
    fn pauses_double_from_50_ms_up_to_a_second() {
        let pauses: Vec<_> = (1..=8).map(backoff).collect();
        assert_eq!(
            pauses,
            [50 * MS, 100 * MS, 200 * MS, 400 * MS, 800 * MS, S, S, S]
        );
        assert_eq!(backoff(0), 50 * MS);
        assert_eq!(backoff(u32::MAX), S);
    }

    #[test]
    fn the_default_window_outlasts_the_longest_election_measured_with_margin() {
        // During a NATS election every attempt fails after the store's
        // 4 s retry budget, or at once (no responders), or at the engine's
        // 5 s timeout: either way attempts go on past 25 s, beyond two
        // elections back to back (the longest single one measured took
        // 8.3 s), and none starts past the window.
        for takes in [Duration::ZERO, 10 * MS, 4 * S, 5 * S] {
            let made = attempts(defaults(), takes, 60 * S);
            let (last, timeout) = *made.last().unwrap();
            let ended = last + takes.min(timeout);
            assert!(
                ended > 25 * S,
                "{takes:?}: the last attempt ended at {ended:?}"
            );
            assert!(last <= 30 * S, "{takes:?}: past the window: {last:?}");
            assert!(
                made.iter().all(|&(_, t)| t == 5 * S),
                "full timeouts: {made:?}"
            );
        }
    }

    #[test]
    fn no_attempt_starts_past_the_window() {
        let schedule = defaults();
        assert_eq!(schedule.next(3, 30 * S, 60 * S), None);
        assert_eq!(schedule.next(3, 31 * S, 60 * S), None);
        // Just inside it: the pause shrinks to what is left of it.
        let last = schedule.next(9, 30 * S - 10 * MS, 60 * S).unwrap();
        assert_eq!(last.pause, 10 * MS);
        let first = schedule.next(1, Duration::ZERO, 60 * S).unwrap();
        assert_eq!(
            first,
            Attempt {
                pause: 50 * MS,
                timeout: 5 * S
            }
        );
    }

    #[test]
    fn no_attempt_runs_past_the_lease_less_a_tenth_of_it() {
        let schedule = defaults();
        // 60 s lease: a 6 s margin. With 8 s left, a resend after 50 ms
        // gets what remains (1.95 s), not the 5 s store timeout.
        assert_eq!(
            schedule.next(1, S, 8 * S),
            Some(Attempt {
                pause: 50 * MS,
                timeout: 1950 * MS
            })
        );
        // With 140 ms to run, the pause shrinks to leave the last resend
        // its 100 ms; under 100 ms, no resend.
        assert_eq!(
            schedule.next(1, S, 6 * S + 140 * MS),
            Some(Attempt {
                pause: 40 * MS,
                timeout: 100 * MS
            })
        );
        assert_eq!(schedule.next(1, S, 6 * S + 90 * MS), None);
        assert_eq!(schedule.next(1, S, 6 * S), None);
        assert_eq!(schedule.next(1, S, Duration::ZERO), None);
        // Whatever each attempt takes, every resend ends inside the lease
        // less the margin.
        for lease_left in [7 * S, 14 * S, 60 * S] {
            for takes in [Duration::ZERO, 300 * MS, 5 * S] {
                for (start, timeout) in attempts(schedule, takes, lease_left).into_iter().skip(1) {
                    assert!(
                        start + timeout + schedule.margin() <= lease_left,
                        "an attempt at {start:?} for {timeout:?} may outlive the lease"
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_lease_bounds_the_retries_before_the_window() {
        // A 3 s lease, a 500 ms store timeout: retries go on until 300 ms
        // before the lease's end, long before the 30 s window ends.
        let schedule = RetrySchedule {
            window: 30 * S,
            attempt_timeout: 500 * MS,
            lease: 3 * S,
        };
        assert_eq!(schedule.margin(), 300 * MS);
        let made = attempts(schedule, 500 * MS, 3 * S);
        let (last, timeout) = *made.last().unwrap();
        assert!(made.len() > 3, "{made:?}");
        assert!(last + timeout <= 2700 * MS, "{made:?}");
        assert!(last + timeout >= 2500 * MS, "{made:?}");
        // A lease shorter than its margin and one resend: none.
        let tight = RetrySchedule {
            window: 30 * S,
            attempt_timeout: 5 * S,
            lease: S,
        };
        assert_eq!(tight.next(1, Duration::ZERO, 140 * MS), None);
        assert!(tight.next(1, Duration::ZERO, 900 * MS).is_some());
    }

    #[test]
    fn a_zero_window_never_retries() {
        let none = RetrySchedule {
            window: Duration::ZERO,
            ..defaults()
        };
        assert_eq!(none.next(1, Duration::ZERO, 60 * S), None);
    }
}

//! The stream leader's clock, as this process reads it: a sample of the
//! leader's time (the `ts` of a stream info answer, which the leader
//! writes) carried forward by this process's monotonic clock.
//!
//! No wall clock of this host is read. The estimate is off by at most half
//! the sample's round trip (the leader wrote `ts` somewhere inside it; the
//! midpoint is taken) plus the drift of the two oscillators since the
//! sample, which a new sample every [`RESAMPLE`] keeps to microseconds.
//! After a change of leader the next sample reads the new leader's clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use time::OffsetDateTime;

/// How long one sample is used before the next read takes another.
pub(crate) const RESAMPLE: Duration = Duration::from_secs(10);

/// One reading of the leader's clock.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When (on this process's monotonic clock) the leader's clock read
    /// `leader`: the midpoint of the request's round trip.
    local: Instant,
    leader: OffsetDateTime,
}

/// The leader's clock as last sampled; see the module's documentation.
#[derive(Debug, Default)]
pub(crate) struct LeaderClock {
    sample: Mutex<Option<Sample>>,
}

impl LeaderClock {
    /// The estimate of the leader's time now, if a sample younger than
    /// [`RESAMPLE`] is at hand.
    pub(crate) fn now(&self) -> Option<OffsetDateTime> {
        let sample = (*self
            .sample
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))?;
        let elapsed = sample.local.elapsed();
        (elapsed < RESAMPLE).then(|| sample.leader + elapsed)
    }

    /// Records a reading: the leader wrote `leader` between `sent` and
    /// `received`.
    pub(crate) fn record(&self, sent: Instant, received: Instant, leader: OffsetDateTime) {
        let local = sent + received.saturating_duration_since(sent) / 2;
        *self
            .sample
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Sample { local, leader });
    }

    /// Forgets the sample (after a change of leader is suspected).
    pub(crate) fn forget(&self) {
        *self
            .sample
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_carried_forward_from_its_round_trips_midpoint() {
        let clock = LeaderClock::default();
        assert!(clock.now().is_none());
        let sent = Instant::now();
        let received = sent + Duration::from_millis(10);
        let leader = OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_000);
        clock.record(sent, received, leader);
        let now = clock.now().expect("a fresh sample");
        // The midpoint (sent + 5 ms) read `leader`; `now` is later than it.
        let local_midpoint = sent + Duration::from_millis(5);
        let lower = leader + Instant::now().saturating_duration_since(local_midpoint);
        assert!(now <= lower + Duration::from_millis(1), "{now} vs {lower}");
        assert!(now >= leader);
        clock.forget();
        assert!(clock.now().is_none());
    }
}

//! The seeded fault schedule: which answers the proxy delays, drops or
//! resets, after the write ran.
//!
//! A fate is a pure function of the seed, the moment the request reaches
//! the proxy and the request's identity (its logical operation and its
//! attempt number). Outside the window every request is forwarded; inside
//! it, each `(operation, attempt)` draws its fate from the seed alone. The
//! two runs of the lab send the same operations at the same moments, so
//! their first attempts meet exactly the same faults; a retry meets the
//! fate its `(operation, attempt)` draws if it lands inside the window.

use std::time::Duration;

/// What the proxy does with one answer, once the upstream has answered
/// (the write ran in every case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The answer is passed on at once.
    Forward,
    /// The answer is held this long, then passed on if the client is still
    /// there.
    Delay(Duration),
    /// The answer is never passed on: the connection stays silent until
    /// the client gives up on it.
    Drop,
    /// The connection is reset (RST) instead of the answer.
    Reset,
}

/// The faults of one incident: a window, the shares of answers delayed,
/// dropped and reset inside it, and the seed that picks them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSchedule {
    /// Picks the faulted requests and the delays.
    pub seed: u64,
    /// When the window opens, from the start of the run's traffic.
    pub start: Duration,
    /// How long the window lasts.
    pub window: Duration,
    /// The share of answers delayed inside the window.
    pub delayed: f64,
    /// The share of answers dropped inside the window.
    pub dropped: f64,
    /// The share of connections reset after the write ran, inside the
    /// window.
    pub reset: f64,
    /// The shortest delay.
    pub min_delay: Duration,
    /// The longest delay.
    pub max_delay: Duration,
}

impl FaultSchedule {
    /// The incident's default mix: a 40 s window opening 10 s into the
    /// traffic; inside it 20 % of answers delayed by 0.3 to 4 s, 10 %
    /// dropped and 10 % reset.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            start: Duration::from_secs(10),
            window: Duration::from_secs(40),
            delayed: 0.2,
            dropped: 0.1,
            reset: 0.1,
            min_delay: Duration::from_millis(300),
            max_delay: Duration::from_secs(4),
        }
    }

    /// Whether `at` (from the start of the traffic) is inside the window.
    pub fn in_window(&self, at: Duration) -> bool {
        at >= self.start && at < self.start + self.window
    }

    /// The fate of attempt `attempt` of operation `operation`, reaching the
    /// proxy at `at`.
    pub fn fate(&self, at: Duration, operation: u64, attempt: u32) -> Fate {
        if !self.in_window(at) {
            return Fate::Forward;
        }
        let mut state = self.seed
            ^ operation.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(attempt).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        let draw = unit(splitmix64(&mut state));
        let length = unit(splitmix64(&mut state));
        if draw < self.reset {
            Fate::Reset
        } else if draw < self.reset + self.dropped {
            Fate::Drop
        } else if draw < self.reset + self.dropped + self.delayed {
            let span = self.max_delay.saturating_sub(self.min_delay);
            Fate::Delay(self.min_delay + span.mul_f64(length))
        } else {
            Fate::Forward
        }
    }
}

/// SplitMix64: a tiny, well-mixed generator, enough to draw fates.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in `[0, 1)` from 64 random bits.
pub(crate) fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_fails_outside_the_window() {
        let schedule = FaultSchedule::new(7);
        for operation in 0..1000 {
            assert_eq!(
                schedule.fate(Duration::from_secs(9), operation, 0),
                Fate::Forward
            );
            assert_eq!(
                schedule.fate(Duration::from_secs(50), operation, 0),
                Fate::Forward
            );
        }
    }

    #[test]
    fn inside_the_window_the_shares_follow_the_schedule_and_the_seed() {
        let schedule = FaultSchedule::new(7);
        let at = Duration::from_secs(20);
        let fates: Vec<Fate> = (0..20_000).map(|n| schedule.fate(at, n, 0)).collect();
        let again: Vec<Fate> = (0..20_000).map(|n| schedule.fate(at, n, 0)).collect();
        assert_eq!(fates, again, "the same seed, the same fates");
        let share = |test: fn(&Fate) -> bool| {
            fates.iter().filter(|f| test(f)).count() as f64 / fates.len() as f64
        };
        assert!((share(|f| *f == Fate::Reset) - 0.1).abs() < 0.01);
        assert!((share(|f| *f == Fate::Drop) - 0.1).abs() < 0.01);
        assert!((share(|f| matches!(f, Fate::Delay(_))) - 0.2).abs() < 0.01);
        assert!(fates.iter().all(|f| match f {
            Fate::Delay(d) => *d >= schedule.min_delay && *d <= schedule.max_delay,
            _ => true,
        }));
        let retries: Vec<Fate> = (0..200).map(|n| schedule.fate(at, n, 1)).collect();
        assert_ne!(retries, fates[..200], "a retry draws its own fate");
        let other = FaultSchedule::new(8);
        let others: Vec<Fate> = (0..200).map(|n| other.fate(at, n, 0)).collect();
        assert_ne!(others, fates[..200], "another seed, other fates");
    }
}

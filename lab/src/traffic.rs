//! The client population's traffic: logical operations at a steady rate,
//! reads and writes mixed, the same for both runs of a seed.

use std::time::Duration;

use crate::schedule::{splitmix64, unit};

/// A read or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `GET /payments/{id}`: safe to repeat.
    Read,
    /// `POST /payments`: a debit.
    Write,
}

impl Kind {
    /// The kind's name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "reads",
            Self::Write => "writes",
        }
    }
}

/// The payments written before the traffic starts, for reads to find.
pub const SEEDED_PAYMENTS: u64 = 20;

/// The amount of the payments written before the traffic, above every
/// debit's (a debit's amount is its operation number plus one).
pub const SEEDED_AMOUNT: i64 = 1_000_000_000;

/// One logical operation: a call a client makes once, however many
/// requests its retries send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    /// Its number in the run (sent as `X-Lab-Operation`).
    pub index: u64,
    /// When it starts, from the start of the traffic.
    pub at: Duration,
    /// Read or write.
    pub kind: Kind,
    /// The client instance that makes it.
    pub client: usize,
    /// For a read, the payment it reads (1 to [`SEEDED_PAYMENTS`]).
    pub payment: u64,
    /// For a write, how long its handler is asked to take (the example's
    /// `delay_ms`; zero: as long as it takes).
    pub handler_time: Duration,
}

impl Operation {
    /// A debit's amount: unique per debit, so the ledger counts its
    /// executions by amount.
    pub fn amount(&self) -> i64 {
        self.index as i64 + 1
    }
}

/// The operations of a run: `rate` per second for `duration`, evenly
/// spaced, a share `writes` of them writes, spread over `clients`
/// instances in turn; which ones are writes, and what reads read, drawn
/// from `seed`.
pub fn plan(
    seed: u64,
    rate: f64,
    duration: Duration,
    writes: f64,
    clients: usize,
) -> Vec<Operation> {
    plan_with_surge(seed, rate, duration, writes, clients, None)
}

/// A surge of traffic: inside `window` (from the start of the traffic),
/// `factor` times the rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Surge {
    /// When the rate is multiplied.
    pub window: std::ops::Range<Duration>,
    /// By how much.
    pub factor: f64,
}

/// [`plan`], with the rate multiplied inside the surge's window (the
/// overload scenario's offered load). Which operations are writes, and
/// what reads read, still depend on the seed and the operation's number
/// alone.
pub fn plan_with_surge(
    seed: u64,
    rate: f64,
    duration: Duration,
    writes: f64,
    clients: usize,
    surge: Option<&Surge>,
) -> Vec<Operation> {
    // Steady spans, each at its rate: the times are the span's start plus
    // a whole number of intervals (no sum of rounded intervals drifts).
    let end = duration.as_secs_f64();
    let spans = match surge {
        None => vec![(0.0, end, rate)],
        Some(surge) => {
            let (from, to) = (
                surge.window.start.as_secs_f64().min(end),
                surge.window.end.as_secs_f64().min(end),
            );
            vec![
                (0.0, from, rate),
                (from, to, rate * surge.factor),
                (to, end, rate),
            ]
        }
    };
    let mut times = Vec::new();
    for (from, to, rate) in spans {
        let count = ((to - from) * rate).ceil().max(0.0) as u64;
        times.extend(
            (0..count)
                .map(|k| from + k as f64 / rate)
                .filter(|at| *at < to)
                .map(Duration::from_secs_f64),
        );
    }
    times
        .into_iter()
        .enumerate()
        .map(|(index, at)| {
            let index = index as u64;
            let mut state = seed.rotate_left(17) ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            let kind = if unit(splitmix64(&mut state)) < writes {
                Kind::Write
            } else {
                Kind::Read
            };
            Operation {
                index,
                at,
                kind,
                client: (index % clients.max(1) as u64) as usize,
                payment: 1 + splitmix64(&mut state) % SEEDED_PAYMENTS,
                handler_time: Duration::ZERO,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_steady_mixed_and_seeded() {
        let ops = plan(3, 40.0, Duration::from_secs(50), 0.2, 4);
        assert_eq!(ops.len(), 2000);
        assert_eq!(ops[40].at, Duration::from_secs(1));
        let writes = ops.iter().filter(|o| o.kind == Kind::Write).count();
        assert!((350..450).contains(&writes), "{writes}");
        assert!(
            ops.iter()
                .all(|o| (1..=SEEDED_PAYMENTS).contains(&o.payment))
        );
        assert_eq!(ops, plan(3, 40.0, Duration::from_secs(50), 0.2, 4));
        assert_ne!(ops, plan(4, 40.0, Duration::from_secs(50), 0.2, 4));
        assert!(ops.iter().all(|o| o.amount() < SEEDED_AMOUNT));
    }

    #[test]
    fn a_surge_multiplies_the_rate_in_its_window() {
        let surge = Surge {
            window: Duration::from_secs(10)..Duration::from_secs(20),
            factor: 2.0,
        };
        let ops = plan_with_surge(3, 40.0, Duration::from_secs(30), 0.2, 4, Some(&surge));
        let within = |from: u64, to: u64| {
            ops.iter()
                .filter(|o| o.at >= Duration::from_secs(from) && o.at < Duration::from_secs(to))
                .count()
        };
        assert!((399..=401).contains(&within(0, 10)), "{}", within(0, 10));
        assert!((799..=801).contains(&within(10, 20)), "{}", within(10, 20));
        assert!((399..=401).contains(&within(20, 30)), "{}", within(20, 30));
    }
}

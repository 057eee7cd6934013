//! What an incident run is made of: the traffic, the faults and the naive
//! client's retries, typed, with the defaults of `incident`.

use std::time::Duration;

use crate::schedule::FaultSchedule;

/// The two ways the same clients call the same API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The SDK defaults of the story: every 5xx, timeout and connection
    /// error retried 3 times, 1, 2 then 4 s apart; no key, no budget; the
    /// app without its guard.
    Naive,
    /// The app behind the guard; the retry client with its defaults (a key
    /// per debit, budget, deadline, jitter); the status service asked
    /// before a write is resent.
    Guarded,
}

impl Mode {
    /// The run's name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::Guarded => "guarded",
        }
    }
}

/// The naive client's retries: what the story's SDK does by default.
#[derive(Debug, Clone, PartialEq)]
pub struct NaivePolicy {
    /// How long an attempt waits for its answer.
    pub timeout: Duration,
    /// The pause before each retry (one retry per entry).
    pub pauses: Vec<Duration>,
}

impl Default for NaivePolicy {
    /// A 2 s timeout, then 3 retries after 1, 2 and 4 s.
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            pauses: [1, 2, 4].map(Duration::from_secs).to_vec(),
        }
    }
}

/// One incident: both runs use all of it.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentConfig {
    /// Logical operations started per second, by the whole population.
    pub rate: f64,
    /// How long the population sends (the faults' window lies inside).
    pub duration: Duration,
    /// The share of operations that are writes (debits).
    pub writes: f64,
    /// Client instances the operations are spread over (each guarded one
    /// has its own retry budget, as separate processes would).
    pub clients: usize,
    /// The faults, and the seed of both the faults and the traffic.
    pub schedule: FaultSchedule,
    /// The naive run's retries.
    pub naive: NaivePolicy,
    /// When set, the app is killed (SIGKILL) this far into the traffic,
    /// while a debit runs in its handler, and started again at once: then
    /// debits take [`CRASH_HANDLER_TIME`] in their handler and the guard's
    /// lease is [`CRASH_LEASE`], so the killed debit's key is abandoned
    /// before the run ends. Off by default.
    pub crash_at: Option<Duration>,
    /// With [`crash_at`](Self::crash_at): the guarded run's debits go to
    /// the payments example's resumable route (`POST /debits`: steps
    /// `reserve`, `charge` at the lab's fake PSP with the step's derived
    /// key, `record`; abandoned runs resumed), and the client's retry
    /// resumes each crashed debit instead of being told `outcome-unknown`.
    /// Off in [`IncidentConfig::new`] (the crashed debit is left to
    /// reconcile, as before); on for `incident --crash-at` unless
    /// `--no-resume`.
    pub resume: bool,
    /// The overload scenario: the API has a capacity, and the offered load
    /// surges past it for the schedule's window. Off (the jitter scenario)
    /// by default.
    pub overload: Option<Overload>,
}

/// The overload scenario's settings: no network faults, but a capacity
/// the window's surge of traffic exceeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overload {
    /// Requests per second the API admits (the proxy answers the others
    /// `503` with `Retry-After`, see [`crate::capacity`]).
    pub capacity: f64,
    /// The offered load inside the window, in multiples of the rate.
    pub surge: f64,
}

impl Overload {
    /// The defaults for a traffic of `rate` operations per second: a
    /// capacity of 1.5 times the rate, and twice the rate offered in the
    /// window (a third more than the API admits, before any retry).
    pub fn for_rate(rate: f64) -> Self {
        Self {
            capacity: 1.5 * rate,
            surge: 2.0,
        }
    }
}

/// Which of the two incidents a run replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Network jitter: answers delayed, dropped and reset in the window,
    /// on a healthy server.
    Jitter,
    /// Overload: the offered load surges past the API's capacity in the
    /// window.
    Overload,
}

impl Scenario {
    /// The scenario's name, and the stem of its page and plot.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Jitter => "incident",
            Self::Overload => "overload",
        }
    }
}

/// The guarded client's deadline for a debit on the resumable route: past
/// the crashed run's lease ([`CRASH_LEASE`]), the app's restart and the
/// resumed run, so that the client's own retry resumes the crashed debit.
pub const RESUME_DEADLINE: Duration = Duration::from_secs(30);

/// How long a debit's handler takes when the run has a crash (the
/// example's `delay_ms`), so that one is running when the app is killed.
pub const CRASH_HANDLER_TIME: Duration = Duration::from_millis(300);

/// The guard's lease when the run has a crash (`LEASE_SECS`), so that the
/// killed debit's record is abandoned within the run.
pub const CRASH_LEASE: Duration = Duration::from_secs(5);

impl IncidentConfig {
    /// The default incident of `seed`: 40 operations per second for 70 s,
    /// one in five a debit, over 4 client instances; the faults of
    /// [`FaultSchedule::new`] (a 40 s window from 10 s).
    pub fn new(seed: u64) -> Self {
        Self {
            rate: 40.0,
            duration: Duration::from_secs(70),
            writes: 0.2,
            clients: 4,
            schedule: FaultSchedule::new(seed),
            naive: NaivePolicy::default(),
            crash_at: None,
            resume: false,
            overload: None,
        }
    }

    /// The default overload incident of `seed`: the same traffic, no
    /// network faults, a capacity of 60 requests per second, and 80
    /// operations per second offered for 30 s from 10 s in.
    pub fn overload(seed: u64) -> Self {
        let mut config = Self::new(seed);
        config.schedule.window = Duration::from_secs(30);
        config.schedule.delayed = 0.0;
        config.schedule.dropped = 0.0;
        config.schedule.reset = 0.0;
        config.duration = Duration::from_secs(55);
        config.overload = Some(Overload::for_rate(config.rate));
        config
    }

    /// Which incident this is.
    pub fn scenario(&self) -> Scenario {
        match self.overload {
            Some(_) => Scenario::Overload,
            None => Scenario::Jitter,
        }
    }

    /// Checks what a command line may get wrong.
    ///
    /// # Errors
    ///
    /// A message naming the setting that is out of range.
    pub fn check(&self) -> Result<(), String> {
        let share = |name: &str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(format!("{name} must be between 0 and 1, not {value}"))
            }
        };
        share("--writes", self.writes)?;
        let s = &self.schedule;
        share(
            "--delayed + --dropped + --reset",
            s.delayed + s.dropped + s.reset,
        )?;
        if !(self.rate > 0.0 && self.rate <= 1000.0) {
            return Err(format!(
                "--rate must be above 0 and at most 1000, not {}",
                self.rate
            ));
        }
        if let Some(overload) = self.overload
            && !(overload.capacity > 0.0 && overload.surge >= 1.0 && overload.surge <= 10.0)
        {
            return Err(format!(
                "--capacity must be above 0 and --surge between 1 and 10, not {} and {}",
                overload.capacity, overload.surge
            ));
        }
        if self.clients == 0 {
            return Err("--clients must be at least 1".into());
        }
        if self.crash_at.is_some_and(|at| at >= self.duration) {
            return Err("--crash-at must fall within --duration".into());
        }
        if s.start + s.window > self.duration {
            return Err(format!(
                "the window ({} s from {} s) must end within --duration ({} s)",
                s.window.as_secs_f64(),
                s.start.as_secs_f64(),
                self.duration.as_secs_f64()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_incident_is_valid_and_a_window_past_the_end_is_not() {
        let mut config = IncidentConfig::new(1);
        assert_eq!(config.check(), Ok(()));
        config.duration = Duration::from_secs(45);
        assert!(config.check().is_err_and(|e| e.contains("--duration")));
        let mut config = IncidentConfig::new(1);
        config.writes = 1.5;
        assert!(config.check().is_err_and(|e| e.contains("--writes")));
        let config = IncidentConfig::overload(1);
        assert_eq!(config.check(), Ok(()));
        assert_eq!(config.scenario(), Scenario::Overload);
    }
}

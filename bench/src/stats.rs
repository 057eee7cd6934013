//! What one measured run yields: counts over the measured window and every
//! latency in it (exact percentiles, no histogram buckets).

use std::time::Duration;

/// The raw outcome of one run (merged over its connections or clients).
#[derive(Debug, Default)]
pub(crate) struct Sample {
    /// Operations that completed inside the measured window as expected.
    pub(crate) ok: u64,
    /// Operations that completed inside the window with an unexpected answer
    /// or failed.
    pub(crate) errors: u64,
    /// The first error seen, for the log.
    pub(crate) first_error: Option<String>,
    /// Latency of each completed operation, in microseconds.
    pub(crate) latencies_us: Vec<u32>,
    /// The measured window.
    pub(crate) window: Duration,
    /// Operations completed in all, warm-up included.
    pub(crate) total: u64,
}

impl Sample {
    pub(crate) fn merge(&mut self, other: Sample) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.total += other.total;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
    }

    pub(crate) fn error(&mut self, message: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }

    /// Summarizes the sample.
    pub(crate) fn summary(mut self) -> Summary {
        self.latencies_us.sort_unstable();
        let seconds = self.window.as_secs_f64().max(1e-9);
        let at = |q: f64| -> f64 {
            if self.latencies_us.is_empty() {
                return f64::NAN;
            }
            let n = self.latencies_us.len();
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            f64::from(self.latencies_us[rank - 1])
        };
        Summary {
            throughput: self.ok as f64 / seconds,
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            errors: self.errors,
            first_error: self.first_error,
        }
    }
}

/// Throughput and latency percentiles of one run.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    /// Completed operations per second.
    pub(crate) throughput: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

/// Microseconds since `start`, saturated into a `u32`.
pub(crate) fn micros(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX)
}

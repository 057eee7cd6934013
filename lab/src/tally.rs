//! The figures of a run, from its record: totals for the table and
//! per-second series for the plot. Pure functions of the record.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::callers::CallOutcome;
use crate::config::Mode;
use crate::proxy::Exchange;
use crate::run::{AbandonedKey, RunRecord, Unsettled};
use crate::schedule::Fate;
use crate::traffic::Kind;

/// Requests and retries of one kind (reads, writes, or both blended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    /// Logical operations.
    pub operations: u64,
    /// Requests that reached the API (first attempts and retries).
    pub requests: u64,
    /// Requests beyond an operation's first attempt.
    pub retries: u64,
    /// Retries whose answer reached the client as a success.
    pub retries_succeeded: u64,
    /// Operations whose client gave up without an answer.
    pub gave_up: u64,
}

impl Traffic {
    /// Requests per logical operation.
    pub fn amplification(&self) -> f64 {
        ratio(self.requests, self.operations)
    }

    /// The share of requests that are retries.
    pub fn retry_rate(&self) -> f64 {
        ratio(self.retries, self.requests)
    }

    /// The share of retries that succeeded.
    pub fn retry_success_rate(&self) -> f64 {
        ratio(self.retries_succeeded, self.retries)
    }

    fn add(self, other: Self) -> Self {
        Self {
            operations: self.operations + other.operations,
            requests: self.requests + other.requests,
            retries: self.retries + other.retries,
            retries_succeeded: self.retries_succeeded + other.retries_succeeded,
            gave_up: self.gave_up + other.gave_up,
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The figures of the window (of faults, or of the surge) alone.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowFigures {
    /// Logical operations started in the window.
    pub operations: u64,
    /// Requests that reached the API in the window.
    pub requests: u64,
    /// Operations completed in the window: those whose successful answer
    /// (200 for a read, 201 for a write) reached the client from a request
    /// that arrived in it, whenever they started.
    pub completed: u64,
    /// How long the window lasts, in seconds.
    pub seconds: f64,
}

impl WindowFigures {
    /// Requests per operation in the window.
    pub fn amplification(&self) -> f64 {
        ratio(self.requests, self.operations)
    }

    /// Operations completed per second of the window: the goodput.
    pub fn goodput(&self) -> f64 {
        if self.seconds > 0.0 {
            self.completed as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Calls given up by one cause: reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GaveUp {
    /// Reads given up.
    pub reads: u64,
    /// Writes given up.
    pub writes: u64,
}

/// What the fake PSP charged, on the resumable route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PspFigures {
    /// Charges made, all debits together.
    pub charges: u64,
    /// Debits charged more than once (each under another key: the
    /// derived key makes a repeated charge step charge once).
    pub double_charged: u64,
    /// The most charges of one debit.
    pub most_charges: u64,
    /// Charge requests that made no charge: a charge step run again after
    /// the crash, its derived key absorbing it.
    pub absorbed: u64,
}

/// The totals of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Naive or guarded.
    pub mode: Mode,
    /// Reads.
    pub reads: Traffic,
    /// Writes.
    pub writes: Traffic,
    /// Logical debits.
    pub debits: u64,
    /// Rows in the ledger for them: executions of the debit handler.
    pub executions: u64,
    /// Debits executed more than once.
    pub double_charged: u64,
    /// Executions beyond the first of each debit.
    pub extra_executions: u64,
    /// The most executions of one debit.
    pub most_executions: u64,
    /// Debits never executed.
    pub not_executed: u64,
    /// Debits lost: charged at the PSP but not in the ledger, or never
    /// executed while their client was given no answer (it gave up).
    pub lost: u64,
    /// The PSP's charges (resumable route only).
    pub psp: Option<PspFigures>,
    /// Questions asked of the status service.
    pub lookups: u64,
    /// Answers the proxy held, dropped and reset.
    pub delayed: u64,
    /// Answers never passed on.
    pub dropped: u64,
    /// Connections reset after the write ran.
    pub reset: u64,
    /// Records left to reconcile (guarded only).
    pub unsettled: Option<Unsettled>,
    /// The abandoned keys among them, with their debits.
    pub abandoned: Vec<AbandonedKey>,
    /// How long the run's traffic took, to its last answer.
    pub elapsed: Duration,
    /// The window's own figures.
    pub window: WindowFigures,
    /// Requests the API's capacity refused (overload scenario).
    pub shed: u64,
    /// Calls given up, by cause (the retry client's error kind, or the
    /// naive client's last failure).
    pub gave_up_by: BTreeMap<String, GaveUp>,
}

impl Summary {
    /// Reads and writes together: the figure a dashboard shows by default.
    pub fn blended(&self) -> Traffic {
        self.reads.add(self.writes)
    }

    /// Ledger executions per logical debit.
    pub fn executions_per_debit(&self) -> f64 {
        ratio(self.executions, self.debits)
    }

    /// PSP charges per logical debit (resumable route only).
    pub fn charges_per_debit(&self) -> Option<f64> {
        self.psp.map(|psp| ratio(psp.charges, self.debits))
    }

    /// Counts a run's record.
    pub fn of(record: &RunRecord) -> Self {
        let traffic = |kind: Kind| {
            let calls = record.calls.iter().filter(|c| c.operation.kind == kind);
            let exchanges = record.exchanges.iter().filter(|e| e.kind == kind);
            let retries = exchanges.clone().filter(|e| e.attempt > 0);
            Traffic {
                operations: calls.clone().count() as u64,
                requests: exchanges.count() as u64,
                retries: retries.clone().count() as u64,
                retries_succeeded: retries.filter(|e| e.succeeded()).count() as u64,
                gave_up: calls
                    .filter(|c| matches!(c.outcome, CallOutcome::GaveUp(_)))
                    .count() as u64,
            }
        };
        let debits: Vec<i64> = record.debits().map(|c| c.operation.amount()).collect();
        let runs = |amount: &i64| record.ledger.get(amount).copied().unwrap_or(0);
        let charged = |amount: &i64| {
            record
                .psp_charges
                .as_ref()
                .and_then(|charges| charges.get(amount).copied())
                .unwrap_or(0)
        };
        let lost = record
            .debits()
            .filter(|call| {
                let amount = call.operation.amount();
                runs(&amount) == 0
                    && (charged(&amount) > 0 || matches!(call.outcome, CallOutcome::GaveUp(_)))
            })
            .count() as u64;
        let psp = record.psp_charges.as_ref().map(|_| PspFigures {
            charges: debits.iter().map(charged).sum(),
            double_charged: debits.iter().filter(|a| charged(a) > 1).count() as u64,
            most_charges: debits.iter().map(charged).max().unwrap_or(0),
            absorbed: record
                .psp_requests
                .saturating_sub(debits.iter().map(charged).sum()),
        });
        let fates = |test: fn(&Fate) -> bool| {
            record.exchanges.iter().filter(|e| test(&e.fate)).count() as u64
        };
        let in_window = |at: Duration| record.window.contains(&at);
        let window = WindowFigures {
            operations: record
                .calls
                .iter()
                .filter(|c| in_window(c.operation.at))
                .count() as u64,
            requests: record.exchanges.iter().filter(|e| in_window(e.at)).count() as u64,
            completed: record
                .exchanges
                .iter()
                .filter(|e| in_window(e.at) && e.succeeded())
                .map(|e| e.operation)
                .collect::<std::collections::HashSet<_>>()
                .len() as u64,
            seconds: (record.window.end.saturating_sub(record.window.start)).as_secs_f64(),
        };
        let mut gave_up_by: BTreeMap<String, GaveUp> = BTreeMap::new();
        for call in &record.calls {
            if let CallOutcome::GaveUp(cause) = &call.outcome {
                let entry = gave_up_by.entry(cause.clone()).or_default();
                match call.operation.kind {
                    Kind::Read => entry.reads += 1,
                    Kind::Write => entry.writes += 1,
                }
            }
        }
        Self {
            mode: record.mode,
            reads: traffic(Kind::Read),
            writes: traffic(Kind::Write),
            debits: debits.len() as u64,
            executions: debits.iter().map(runs).sum(),
            // In the ledger, or at the PSP (the resumable route).
            double_charged: debits
                .iter()
                .filter(|a| runs(a) > 1 || charged(a) > 1)
                .count() as u64,
            extra_executions: debits.iter().map(|a| runs(a).saturating_sub(1)).sum(),
            most_executions: debits.iter().map(runs).max().unwrap_or(0),
            not_executed: debits.iter().filter(|a| runs(a) == 0).count() as u64,
            lost,
            psp,
            lookups: record.lookups.len() as u64,
            delayed: fates(|f| matches!(f, Fate::Delay(_))),
            dropped: fates(|f| *f == Fate::Drop),
            reset: fates(|f| *f == Fate::Reset),
            unsettled: record.unsettled,
            abandoned: record.abandoned.clone(),
            elapsed: record.elapsed,
            window,
            shed: record.exchanges.iter().filter(|e| e.shed).count() as u64,
            gave_up_by,
        }
    }
}

/// A rate over a span: `None` where nothing was counted.
pub type Rate = Option<f64>;

/// A run's figures second by second (index = second of the run).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    /// Requests that reached the API.
    pub requests: Vec<f64>,
    /// Of which retries.
    pub retries: Vec<f64>,
    /// Debits started.
    pub debits: Vec<f64>,
    /// Executions of the debit handler.
    pub executions: Vec<f64>,
    /// Executions beyond a debit's first (double charges made).
    pub extra_executions: Vec<f64>,
    /// Requests per read started, over the trailing [`SMOOTHING`] seconds.
    pub read_amplification: Vec<Rate>,
    /// Requests per write started, same span.
    pub write_amplification: Vec<Rate>,
    /// Requests per operation started, same span.
    pub blended_amplification: Vec<Rate>,
    /// Retry rate of reads, same span.
    pub read_retry_rate: Vec<Rate>,
    /// Retry rate of writes, same span.
    pub write_retry_rate: Vec<Rate>,
    /// Retry rate of reads and writes together, same span.
    pub blended_retry_rate: Vec<Rate>,
    /// Retry success rate of reads, same span.
    pub read_retry_success: Vec<Rate>,
    /// Retry success rate of writes, same span.
    pub write_retry_success: Vec<Rate>,
    /// Retry success rate of both, same span.
    pub blended_retry_success: Vec<Rate>,
}

/// The span, in seconds, the plotted rates are taken over.
pub const SMOOTHING: usize = 5;

impl Series {
    /// A run's series, `seconds` long.
    pub fn of(record: &RunRecord, seconds: usize) -> Self {
        let second = |at: Duration| (at.as_secs() as usize).min(seconds.saturating_sub(1));
        let mut series = Self {
            requests: vec![0.0; seconds],
            retries: vec![0.0; seconds],
            debits: vec![0.0; seconds],
            executions: vec![0.0; seconds],
            extra_executions: vec![0.0; seconds],
            ..Self::default()
        };
        if seconds == 0 {
            return series;
        }
        // Per second and kind: requests, retries, retries that succeeded.
        let mut counts: HashMap<(usize, Kind), (u64, u64, u64)> = HashMap::new();
        let mut by_time: Vec<&Exchange> = record.exchanges.iter().collect();
        by_time.sort_by_key(|e| e.at);
        let mut executed: HashMap<u64, u64> = HashMap::new();
        for exchange in by_time {
            let s = second(exchange.at);
            series.requests[s] += 1.0;
            let entry = counts.entry((s, exchange.kind)).or_default();
            entry.0 += 1;
            if exchange.attempt > 0 {
                series.retries[s] += 1.0;
                entry.1 += 1;
                if exchange.succeeded() {
                    entry.2 += 1;
                }
            }
            if exchange.executed() {
                series.executions[s] += 1.0;
                let runs = executed.entry(exchange.operation).or_default();
                *runs += 1;
                if *runs > 1 {
                    series.extra_executions[s] += 1.0;
                }
            }
        }
        let mut started: HashMap<(usize, Kind), u64> = HashMap::new();
        for call in &record.calls {
            let s = second(call.operation.at);
            *started.entry((s, call.operation.kind)).or_default() += 1;
            if call.operation.kind == Kind::Write {
                series.debits[s] += 1.0;
            }
        }
        let amplification = |kinds: &[Kind]| -> Vec<Rate> {
            (0..seconds)
                .map(|s| {
                    let (mut requests, mut operations) = (0, 0);
                    for t in s.saturating_sub(SMOOTHING - 1)..=s {
                        for kind in kinds {
                            requests += counts.get(&(t, *kind)).map_or(0, |c| c.0);
                            operations += started.get(&(t, *kind)).copied().unwrap_or(0);
                        }
                    }
                    (operations > 0).then(|| requests as f64 / operations as f64)
                })
                .collect()
        };
        series.read_amplification = amplification(&[Kind::Read]);
        series.write_amplification = amplification(&[Kind::Write]);
        series.blended_amplification = amplification(&[Kind::Read, Kind::Write]);
        let rates = |kinds: &[Kind], success: bool| -> Vec<Rate> {
            (0..seconds)
                .map(|s| {
                    let (mut requests, mut retries, mut succeeded) = (0, 0, 0);
                    for t in s.saturating_sub(SMOOTHING - 1)..=s {
                        for kind in kinds {
                            if let Some((a, b, c)) = counts.get(&(t, *kind)) {
                                requests += a;
                                retries += b;
                                succeeded += c;
                            }
                        }
                    }
                    let (part, whole) = if success {
                        (succeeded, retries)
                    } else {
                        (retries, requests)
                    };
                    (whole > 0).then(|| part as f64 / whole as f64)
                })
                .collect()
        };
        series.read_retry_rate = rates(&[Kind::Read], false);
        series.write_retry_rate = rates(&[Kind::Write], false);
        series.blended_retry_rate = rates(&[Kind::Read, Kind::Write], false);
        series.read_retry_success = rates(&[Kind::Read], true);
        series.write_retry_success = rates(&[Kind::Write], true);
        series.blended_retry_success = rates(&[Kind::Read, Kind::Write], true);
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Call;
    use crate::traffic::Operation;

    fn exchange(at: u64, kind: Kind, operation: u64, attempt: u32, status: u16) -> Exchange {
        Exchange {
            at: Duration::from_secs(at),
            kind,
            operation,
            attempt,
            fate: Fate::Forward,
            status: Some(status),
            replayed: false,
            delivered: true,
            shed: false,
        }
    }

    fn call(index: u64, kind: Kind, outcome: CallOutcome) -> Call {
        Call {
            operation: Operation {
                index,
                at: Duration::from_secs(index),
                kind,
                client: 0,
                payment: 1,
                handler_time: Duration::ZERO,
            },
            outcome,
        }
    }

    #[test]
    fn a_debit_run_twice_is_a_double_charge_and_reads_and_writes_are_counted_apart() {
        let mut lost = exchange(1, Kind::Write, 1, 0, 201);
        lost.fate = Fate::Reset;
        lost.delivered = false;
        let record = RunRecord {
            mode: Mode::Naive,
            calls: vec![
                call(0, Kind::Read, CallOutcome::Answered(200)),
                call(1, Kind::Write, CallOutcome::Answered(201)),
                call(2, Kind::Write, CallOutcome::GaveUp("timeout".into())),
            ],
            exchanges: vec![
                exchange(0, Kind::Read, 0, 0, 200),
                lost,
                exchange(2, Kind::Write, 1, 1, 201),
                exchange(2, Kind::Write, 2, 0, 201),
            ],
            lookups: vec![],
            ledger: HashMap::from([(2, 2), (3, 1)]),
            route: crate::callers::DebitRoute::Payments,
            psp_charges: None,
            psp_requests: 0,
            unsettled: None,
            abandoned: vec![],
            elapsed: Duration::from_secs(3),
            window: Duration::ZERO..Duration::from_secs(3),
        };
        let summary = Summary::of(&record);
        assert_eq!((summary.debits, summary.executions), (2, 3));
        assert_eq!((summary.double_charged, summary.extra_executions), (1, 1));
        assert_eq!(summary.most_executions, 2);
        assert_eq!(summary.writes.requests, 3);
        assert_eq!(summary.writes.retries, 1);
        assert_eq!(summary.writes.retries_succeeded, 1);
        assert_eq!(summary.writes.gave_up, 1);
        assert_eq!(summary.reads.retries, 0);
        assert_eq!(summary.blended().requests, 4);
        assert!((summary.writes.amplification() - 1.5).abs() < 1e-9);
        assert_eq!(summary.reset, 1);

        let series = Series::of(&record, 4);
        assert_eq!(series.requests, vec![1.0, 1.0, 2.0, 0.0]);
        assert_eq!(series.executions, vec![0.0, 1.0, 2.0, 0.0]);
        assert_eq!(series.extra_executions, vec![0.0, 0.0, 1.0, 0.0]);
        assert_eq!(series.read_retry_rate[0], Some(0.0));
        assert_eq!(series.write_retry_rate[0], None);
        assert_eq!(series.write_retry_rate[2], Some(1.0 / 3.0));
        assert_eq!(series.write_retry_success[2], Some(1.0));
        // Seconds 0 to 2: 3 write requests for 2 writes started.
        assert_eq!(series.write_amplification[2], Some(1.5));
        assert_eq!(series.read_amplification[0], Some(1.0));
        assert_eq!((summary.lost, summary.psp), (0, None));
    }

    #[test]
    fn on_the_resumable_route_the_psp_charges_are_counted_and_a_charge_without_a_row_is_lost() {
        let record = RunRecord {
            mode: Mode::Guarded,
            calls: vec![
                call(1, Kind::Write, CallOutcome::Answered(201)),
                call(2, Kind::Write, CallOutcome::Answered(201)),
                call(
                    3,
                    Kind::Write,
                    CallOutcome::GaveUp("deadline-exceeded".into()),
                ),
                call(
                    4,
                    Kind::Write,
                    CallOutcome::GaveUp("deadline-exceeded".into()),
                ),
            ],
            exchanges: vec![],
            lookups: vec![],
            // By amount (index + 1): 3 charged twice, 4 charged and never
            // recorded (lost), 5 neither (its client gave up: lost too).
            ledger: HashMap::from([(2, 1), (3, 1)]),
            route: crate::callers::DebitRoute::Resumable,
            psp_charges: Some(HashMap::from([(2, 1), (3, 2), (4, 1)])),
            psp_requests: 6,
            unsettled: None,
            abandoned: vec![],
            elapsed: Duration::from_secs(3),
            window: Duration::ZERO..Duration::from_secs(3),
        };
        let summary = Summary::of(&record);
        assert_eq!(summary.lost, 2);
        assert_eq!(
            summary.psp,
            Some(PspFigures {
                charges: 4,
                double_charged: 1,
                most_charges: 2,
                absorbed: 2
            })
        );
        assert_eq!(summary.charges_per_debit(), Some(1.0));
    }
}

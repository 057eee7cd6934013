//! The markdown table of both runs.

use std::fmt::Write as _;

use crate::config::{IncidentConfig, Scenario};
use crate::tally::{Summary, Traffic};

fn percent(value: f64) -> String {
    format!("{:.1} %", value * 100.0)
}

/// Picks the traffic of one kind (or both) from a summary.
type KindOf = fn(&Summary) -> Traffic;

/// The table comparing the runs, one row per figure.
pub fn table(naive: &Summary, guarded: &Summary) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let mut row = |name: &str, figure: &dyn Fn(&Summary) -> String| {
        rows.push((name.to_owned(), figure(naive), figure(guarded)));
    };
    let pair = |a: u64, b: u64| format!("{a} / {b}");
    row("logical operations (reads / writes)", &|s| {
        pair(s.reads.operations, s.writes.operations)
    });
    row("requests reaching the API (reads / writes)", &|s| {
        pair(s.reads.requests, s.writes.requests)
    });
    row("retries (reads / writes)", &|s| {
        pair(s.reads.retries, s.writes.retries)
    });
    let kinds: [(&str, KindOf); 3] = [
        ("blended", Summary::blended),
        ("reads", |s| s.reads),
        ("writes", |s| s.writes),
    ];
    for (kind, of) in kinds {
        row(&format!("amplification, {kind}"), &|s| {
            format!("{:.3}", of(s).amplification())
        });
    }
    for (kind, of) in kinds {
        row(&format!("retry rate, {kind}"), &|s| {
            percent(of(s).retry_rate())
        });
    }
    for (kind, of) in kinds {
        row(&format!("retry success rate, {kind}"), &|s| {
            let traffic = of(s);
            if traffic.retries == 0 {
                "no retries".to_owned()
            } else {
                percent(traffic.retry_success_rate())
            }
        });
    }
    row("**executions per logical debit**", &|s| {
        format!("**{:.3}**", s.executions_per_debit())
    });
    row(
        "**double charges** (debits executed more than once)",
        &|s| format!("**{}**", s.double_charged),
    );
    row("extra executions / most of one debit", &|s| {
        format!("{} / {}", s.extra_executions, s.most_executions)
    });
    row("debits never executed", &|s| s.not_executed.to_string());
    row(
        "**debits lost** (charged but not in the ledger, or never executed and given up)",
        &|s| format!("**{}**", s.lost),
    );
    row("calls given up by the client (reads / writes)", &|s| {
        pair(s.reads.gave_up, s.writes.gave_up)
    });
    row("given up, by cause (reads / writes)", &|s| {
        if s.gave_up_by.is_empty() {
            return "none".to_owned();
        }
        s.gave_up_by
            .iter()
            .map(|(cause, n)| format!("{cause} {}", pair(n.reads, n.writes)))
            .collect::<Vec<_>>()
            .join(", ")
    });
    row("**amplification in the window**", &|s| {
        format!("**{:.3}**", s.window.amplification())
    });
    row(
        "**goodput in the window** (operations completed per second)",
        &|s| format!("**{:.1}**", s.window.goodput()),
    );
    row("status look-ups", &|s| match s.unsettled {
        None => "none (no status service)".to_owned(),
        Some(_) => s.lookups.to_string(),
    });
    row(
        "**keys left to reconcile** (abandoned / in flight past lease)",
        &|s| match s.unsettled {
            None => format!(
                "no keys to ask about: {} double charges seen only in the ledger, {} debits given up",
                s.double_charged, s.writes.gave_up
            ),
            Some(u) => format!(
                "**{}** ({} / {})",
                u.abandoned + u.in_flight_past_lease,
                u.abandoned,
                u.in_flight_past_lease
            ),
        },
    );
    // The resumable route's PSP, when either run has one (a crash run).
    if naive.psp.is_some() || guarded.psp.is_some() {
        row(
            "**PSP charges per debit** (charges / most of one debit / repeated charge requests absorbed by the derived key)",
            &|s| match (s.charges_per_debit(), s.psp) {
                (Some(per_debit), Some(psp)) => format!(
                    "**{per_debit:.3}** ({} / {} / {})",
                    psp.charges, psp.most_charges, psp.absorbed
                ),
                _ => "no PSP (`POST /payments`)".to_owned(),
            },
        );
    }
    row("answers delayed / dropped / reset by the proxy", &|s| {
        format!("{} / {} / {}", s.delayed, s.dropped, s.reset)
    });
    row("requests refused past the API's capacity (503)", &|s| {
        s.shed.to_string()
    });
    row("wall time of the traffic", &|s| {
        format!("{:.1} s", s.elapsed.as_secs_f64())
    });
    let mut out = String::from("| | naive | guarded |\n|---|---:|---:|\n");
    for (name, a, b) in rows {
        let _ = writeln!(out, "| {name} | {a} | {b} |");
    }
    out
}

/// The line before the guide's copy of the table (`docs/guide/lab.md`).
pub const README_BEGIN: &str = "<!-- incident-lab: begin -->";
/// The line after it.
pub const README_END: &str = "<!-- incident-lab: end -->";

/// `readme` with the text between its [`README_BEGIN`] and [`README_END`]
/// lines replaced by `table`; `None` when it has no such pair.
pub fn splice(readme: &str, table: &str) -> Option<String> {
    let begin = readme.find(README_BEGIN)? + README_BEGIN.len();
    let end = begin + readme[begin..].find(README_END)?;
    Some(format!(
        "{}\n{}\n{}",
        &readme[..begin],
        table.trim_end(),
        &readme[end..]
    ))
}

/// The command line that reproduces `config`.
pub fn command(config: &IncidentConfig) -> String {
    let s = &config.schedule;
    let crash = config
        .crash_at
        .map(|at| format!(" --crash-at {}", at.as_secs_f64()))
        .unwrap_or_default();
    let overload = config
        .overload
        .map(|o| {
            format!(
                " --scenario overload --capacity {} --surge {}",
                o.capacity, o.surge
            )
        })
        .unwrap_or_default();
    format!(
        "cargo run -p idempotency-lab -- incident --seed {} --window {} --window-start {} \
         --duration {} --rate {} --writes {} --clients {} --delayed {} --dropped {} --reset {}\
         {overload}{crash}",
        s.seed,
        s.window.as_secs_f64(),
        s.start.as_secs_f64(),
        config.duration.as_secs_f64(),
        config.rate,
        config.writes,
        config.clients,
        s.delayed,
        s.dropped,
        s.reset,
    )
}

/// The whole page: what ran, the table, the plot.
pub fn page(config: &IncidentConfig, naive: &Summary, guarded: &Summary, plot: &str) -> String {
    match config.scenario() {
        Scenario::Jitter => jitter_page(config, naive, guarded, plot),
        Scenario::Overload => overload_page(config, naive, guarded, plot),
    }
}

/// What the figures are worth on this machine.
const MACHINE: &str = "Run on a shared 2-core machine while other builds ran: \
     the counts (requests, retries, calls given up, double charges) are the \
     figures to compare; times and rates per second are the machine's too.";

/// The overload scenario's page.
fn overload_page(
    config: &IncidentConfig,
    naive: &Summary,
    guarded: &Summary,
    plot: &str,
) -> String {
    let s = &config.schedule;
    let overload = config.overload.unwrap_or(crate::config::Overload {
        capacity: 0.0,
        surge: 1.0,
    });
    let naive_pauses: Vec<String> = config
        .naive
        .pauses
        .iter()
        .map(|p| format!("{} s", p.as_secs_f64()))
        .collect();
    format!(
        "# The overload lab: the last run\n\n\
         Written by the lab; rerun with:\n\n```sh\n{command}\n```\n\n\
         {operations} operations over {duration} s ({rate} per second, {writes:.0} % debits, \
         over {clients} client instances), twice over the same seeded traffic; the API admits \
         {capacity} requests per second and answers the others `503` with `Retry-After: \
         {retry_after}` (each refusal costs a quarter of an admitted request); from {start} s \
         for {window} s the offered load is {surge} times the rate ({offered} operations per \
         second), no network faults. Naive: no key, every 5xx, timeout and connection error \
         retried after {pauses}, the app without its guard. Guarded: the app behind the guard, \
         the retry client's defaults, the status service asked before a write is resent. \
         \"In the window\": requests reaching the API in it, per operation started in it; \
         goodput: operations whose successful answer came from a request that arrived in it, per second of it. {machine}\n\n\
         {table}\n![Both runs over time]({plot})\n",
        command = command(config),
        operations = naive.reads.operations + naive.writes.operations,
        duration = config.duration.as_secs_f64(),
        rate = config.rate,
        writes = config.writes * 100.0,
        clients = config.clients,
        capacity = overload.capacity,
        retry_after = crate::capacity::SHED_RETRY_AFTER,
        start = s.start.as_secs_f64(),
        window = s.window.as_secs_f64(),
        surge = overload.surge,
        offered = config.rate * overload.surge,
        pauses = naive_pauses.join(", "),
        machine = MACHINE,
        table = table(naive, guarded),
    )
}

/// The jitter scenario's page.
fn jitter_page(config: &IncidentConfig, naive: &Summary, guarded: &Summary, plot: &str) -> String {
    let s = &config.schedule;
    let naive_pauses: Vec<String> = config
        .naive
        .pauses
        .iter()
        .map(|p| format!("{} s", p.as_secs_f64()))
        .collect();
    format!(
        "# The incident lab: the last run\n\n\
         Written by the lab; rerun with:\n\n```sh\n{command}\n```\n\n\
         {operations} operations in {duration} s ({rate} per second, {writes:.0} % debits, \
         over {clients} client instances), twice over the same seeded faults: from {start} s \
         for {window} s, {delayed:.0} % of answers delayed ({min_delay}–{max_delay} s), \
         {dropped:.0} % dropped and {reset:.0} % reset, each after the write ran. \
         Naive: no key, every 5xx, timeout and connection error retried after {pauses}, \
         {timeout} s per attempt, the app without its guard. Guarded: the app behind the guard, \
         the retry client's defaults, the status service asked before a write is resent. \
         Counted at the proxy (requests, retries, whether the client got the answer) and \
         at the ledger (executions per debit).{crash} {machine}\n\n{table}\n{keys}![Both runs over time]({plot})\n",
        command = command(config),
        operations = naive.reads.operations + naive.writes.operations,
        duration = config.duration.as_secs_f64(),
        rate = config.rate,
        writes = config.writes * 100.0,
        clients = config.clients,
        start = s.start.as_secs_f64(),
        window = s.window.as_secs_f64(),
        delayed = s.delayed * 100.0,
        min_delay = s.min_delay.as_secs_f64(),
        max_delay = s.max_delay.as_secs_f64(),
        dropped = s.dropped * 100.0,
        reset = s.reset * 100.0,
        pauses = naive_pauses.join(", "),
        timeout = config.naive.timeout.as_secs_f64(),
        table = table(naive, guarded),
        keys = to_reconcile(guarded),
        machine = MACHINE,
        crash = config
            .crash_at
            .map(|at| format!(
                " The app was killed (SIGKILL) {} s into the traffic, while a debit ran, \
                 and started again (debits took {} ms in their handler, the lease was {} s).{}",
                at.as_secs_f64(),
                crate::config::CRASH_HANDLER_TIME.as_millis(),
                crate::config::CRASH_LEASE.as_secs(),
                if config.resume { RESUMABLE } else { "" }
            ))
            .unwrap_or_default(),
    )
}

/// What the jitter page says of a crash run on the resumable route.
const RESUMABLE: &str = " The guarded run's debits went to the resumable route \
     (`POST /debits`: steps `reserve`, `charge` at a fake PSP with the step's derived key \
     as its `Idempotency-Key`, `record`; abandoned runs resumed), its client without the \
     status service (which advises `reconcile` for an abandoned key) and with a 30 s \
     deadline, so that its own retry resumes each crashed debit.";

/// The guarded run's abandoned keys and the debit each was claimed for:
/// the list finance needs (empty when there is none).
pub fn to_reconcile(guarded: &Summary) -> String {
    if guarded.abandoned.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "Keys left to reconcile (abandoned: outcome unknown; the status service \
         answers `reconcile`):\n\n| key | debit | amount |\n|---|---:|---:|\n",
    );
    for abandoned in &guarded.abandoned {
        let (debit, amount) = match &abandoned.debit {
            Some(debit) => (debit.index.to_string(), debit.amount().to_string()),
            None => ("?".to_owned(), "?".to_owned()),
        };
        let _ = writeln!(out, "| `{}` | {debit} | {amount} |", abandoned.key);
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_is_replaced_between_its_markers_only() {
        let readme = format!("intro\n{README_BEGIN}\n| old |\n{README_END}\nrest\n");
        assert_eq!(
            splice(&readme, "| new |\n").as_deref(),
            Some(format!("intro\n{README_BEGIN}\n| new |\n{README_END}\nrest\n").as_str())
        );
        assert_eq!(splice("no markers", "| new |"), None);
        assert_eq!(splice(&format!("{README_END}\n{README_BEGIN}"), "x"), None);
    }

    #[test]
    fn the_guides_lab_page_has_the_markers_around_its_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide/lab.md");
        let readme = std::fs::read_to_string(path).expect("the guide's lab page");
        let begin = readme.find(README_BEGIN).expect("the begin marker") + README_BEGIN.len();
        let end = begin + readme[begin..].find(README_END).expect("the end marker");
        let table = readme[begin..end].trim();
        assert!(table.starts_with("| | naive | guarded |"), "{table}");
        assert_eq!(splice(&readme, table).as_deref(), Some(readme.as_str()));
    }
}

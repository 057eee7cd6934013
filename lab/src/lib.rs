//! The incident lab: a payments API (the guard's payments example) behind
//! a fault-injecting proxy that, for a window, delays, drops and resets
//! answers after the write ran; a steady client population driven twice
//! over the same seeded faults, once with a naive SDK (every failure
//! retried 1, 2, 4 s apart, no key, no budget, the app unguarded) and once
//! guarded (the guard, the retry client's defaults, the status service).
//! It writes a markdown table and an SVG plot of both runs.
//!
//! ```text
//! cargo run -p idempotency-lab -- incident
//! ```
//!
//! Everything runs on this machine with nothing started beforehand: each
//! run has its own SQLite file; the app and the status service are the
//! workspace's own programs, started as processes ([`Programs`]: this
//! package's `lab-payments` and `lab-status-service`, built from the
//! payments example's and the service's files; the command line finds
//! them next to its executable, the tests get them with the test build).

pub mod callers;
pub mod capacity;
pub mod config;
pub mod plot;
pub mod programs;
pub mod proxy;
pub mod report;
pub mod run;
pub mod schedule;
pub mod tally;
pub mod traffic;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

pub use config::{IncidentConfig, Mode, NaivePolicy, Overload, Scenario};
pub use programs::Programs;
pub use run::AbandonedKey;
pub use schedule::FaultSchedule;
pub use tally::{Series, Summary};

/// The file names the lab writes into its output directory (the jitter
/// scenario's; the overload scenario's are `overload.md` and
/// `overload.svg`).
pub const TABLE_FILE: &str = "incident.md";
/// The plot's file name.
pub const PLOT_FILE: &str = "incident.svg";

/// What an incident produced.
#[derive(Debug, Clone)]
pub struct Incident {
    /// The naive run's totals.
    pub naive: Summary,
    /// The guarded run's totals.
    pub guarded: Summary,
    /// The page written (`incident.md`).
    pub table: PathBuf,
    /// The plot written (`incident.svg`).
    pub plot: PathBuf,
}

/// Runs both runs of `config` one after the other and writes the page and
/// the plot into `out`. With `keep_store`, the guarded run's SQLite file
/// is left there (`guarded.db`), for the status service and its console.
///
/// # Errors
///
/// When a run fails (see [`run::run`]) or a file cannot be written.
pub async fn incident(
    config: &IncidentConfig,
    programs: &Programs,
    out: &Path,
    keep_store: Option<&Path>,
) -> anyhow::Result<Incident> {
    config.check().map_err(anyhow::Error::msg)?;
    let scratch = tempfile::tempdir().context("a temporary directory")?;
    let naive = run::run(Mode::Naive, config, programs, scratch.path()).await?;
    let guarded_dir = keep_store.unwrap_or(scratch.path());
    std::fs::create_dir_all(guarded_dir)
        .with_context(|| format!("create {}", guarded_dir.display()))?;
    let guarded = run::run(Mode::Guarded, config, programs, guarded_dir).await?;
    let seconds = naive.elapsed.max(guarded.elapsed).as_secs() as usize + 1;
    let svg = plot::svg(
        &Series::of(&naive, seconds),
        &Series::of(&guarded, seconds),
        &config.schedule,
        seconds,
    );
    let (naive, guarded) = (Summary::of(&naive), Summary::of(&guarded));
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let stem = config.scenario().as_str();
    let plot_file = format!("{stem}.svg");
    let table = out.join(format!("{stem}.md"));
    let plot = out.join(&plot_file);
    std::fs::write(&plot, svg).with_context(|| format!("write {}", plot.display()))?;
    let page = report::page(config, &naive, &guarded, &plot_file);
    std::fs::write(&table, page).with_context(|| format!("write {}", table.display()))?;
    Ok(Incident {
        naive,
        guarded,
        table,
        plot,
    })
}

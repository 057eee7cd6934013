//! `idempotency-lab incident`: the incident lab's command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idempotency_lab::{IncidentConfig, Programs};

/// The incident lab.
#[derive(Debug, Parser)]
#[command(name = "idempotency-lab", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the payments example through a fault window twice, naive and
    /// guarded, and writes a table and a plot of both runs.
    Incident(IncidentArgs),
}

#[derive(Debug, clap::Args)]
struct IncidentArgs {
    /// The seed of the faults and of the traffic.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Seconds the fault window lasts.
    #[arg(long, default_value_t = 40.0)]
    window: f64,
    /// Seconds into the traffic the window opens.
    #[arg(long, default_value_t = 10.0)]
    window_start: f64,
    /// Seconds the client population sends, per run.
    #[arg(long, default_value_t = 70.0)]
    duration: f64,
    /// Logical operations started per second.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// The share of operations that are debits (writes).
    #[arg(long, default_value_t = 0.2)]
    writes: f64,
    /// Client instances (each guarded one has its own retry budget).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Share of answers delayed inside the window.
    #[arg(long, default_value_t = 0.2)]
    delayed: f64,
    /// Share of answers dropped inside the window.
    #[arg(long, default_value_t = 0.1)]
    dropped: f64,
    /// Share of connections reset after the write ran, inside the window.
    #[arg(long, default_value_t = 0.1)]
    reset: f64,
    /// Where the table (`incident.md`) and the plot (`incident.svg`) go
    /// (default: the workspace's `docs/lab`, and then the copy of the table
    /// in the guide's page on the lab, `docs/guide/lab.md`, is rewritten too).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Kill the app (SIGKILL) this many seconds into the traffic, while a
    /// debit runs, and start it again (debits then take 300 ms in their
    /// handler, and the lease is 5 s): the guarded run is left with an
    /// abandoned key to reconcile.
    #[arg(long)]
    crash_at: Option<f64>,
    /// Leave the guarded run's SQLite file (`guarded.db`) in this
    /// directory, for the status service and its console.
    #[arg(long)]
    keep_store: Option<PathBuf>,
}

impl IncidentArgs {
    fn config(&self) -> Result<IncidentConfig, String> {
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .map_err(|_| format!("--{name} must be a number of seconds, not {value}"))
        };
        let mut config = IncidentConfig::new(self.seed);
        config.duration = seconds("duration", self.duration)?;
        config.rate = self.rate;
        config.writes = self.writes;
        config.clients = self.clients;
        config.schedule.window = seconds("window", self.window)?;
        config.schedule.start = seconds("window-start", self.window_start)?;
        config.schedule.delayed = self.delayed;
        config.schedule.dropped = self.dropped;
        config.schedule.reset = self.reset;
        config.crash_at = self
            .crash_at
            .map(|at| seconds("crash-at", at))
            .transpose()?;
        config.check()?;
        Ok(config)
    }
}

/// Configuration errors exit 2, failures 1.
#[tokio::main]
async fn main() -> ExitCode {
    let Command::Incident(args) = Cli::parse().command;
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("idempotency-lab: {error}");
            return ExitCode::from(2);
        }
    };
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| workspace.join("docs/lab"));
    eprintln!(
        "idempotency-lab: two runs of {:.0} s each (naive, then guarded)...",
        config.duration.as_secs_f64()
    );
    let programs = Programs::of_the_workspace();
    match idempotency_lab::incident(&config, &programs, &out, args.keep_store.as_deref()).await {
        Ok(incident) => {
            let table = idempotency_lab::report::table(&incident.naive, &incident.guarded);
            println!("{table}");
            println!(
                "wrote {} and {}",
                incident.table.display(),
                incident.plot.display()
            );
            if args.out.is_none() {
                update_readme(&workspace.join("docs/guide/lab.md"), &table);
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("idempotency-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Rewrites the guide's copy of the table (between its markers), or says
/// why not.
fn update_readme(readme: &std::path::Path, table: &str) {
    use idempotency_lab::report::{README_BEGIN, README_END, splice};
    let spliced = std::fs::read_to_string(readme)
        .ok()
        .and_then(|text| splice(&text, table));
    match spliced.map(|text| std::fs::write(readme, text)) {
        Some(Ok(())) => println!("updated the table in {}", readme.display()),
        Some(Err(error)) => eprintln!("idempotency-lab: {}: {error}", readme.display()),
        None => eprintln!(
            "idempotency-lab: {} has no table to update (between {README_BEGIN} and {README_END})",
            readme.display()
        ),
    }
}

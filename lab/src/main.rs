//! `idempotency-lab incident`: the incident lab's command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idempotency_lab::{IncidentConfig, Overload, Programs, Scenario};

/// The incident lab.
#[derive(Debug, Parser)]
#[command(name = "idempotency-lab", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the payments example through a fault window (network jitter,
    /// or a surge past its capacity) twice, naive and guarded, and writes
    /// a table and a plot of both runs.
    Incident(IncidentArgs),
}

/// The two incidents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ScenarioArg {
    /// Answers delayed, dropped and reset on a healthy server
    /// (`incident.md`).
    Jitter,
    /// The offered load past the API's capacity (`overload.md`).
    Overload,
}

#[derive(Debug, clap::Args)]
struct IncidentArgs {
    /// The seed of the faults and of the traffic.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Which incident: network jitter, or overload.
    #[arg(long, value_enum, default_value_t = ScenarioArg::Jitter)]
    scenario: ScenarioArg,
    /// Seconds the window lasts (default: 40 for jitter, 30 for overload).
    #[arg(long)]
    window: Option<f64>,
    /// Seconds into the traffic the window opens.
    #[arg(long, default_value_t = 10.0)]
    window_start: f64,
    /// Seconds the client population sends, per run (default: 70 for
    /// jitter, 55 for overload).
    #[arg(long)]
    duration: Option<f64>,
    /// Logical operations started per second.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// The share of operations that are debits (writes).
    #[arg(long, default_value_t = 0.2)]
    writes: f64,
    /// Client instances (each guarded one has its own retry budget).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Share of answers delayed inside the window (default: 0.2 for
    /// jitter, 0 for overload).
    #[arg(long)]
    delayed: Option<f64>,
    /// Share of answers dropped inside the window (default: 0.1 for
    /// jitter, 0 for overload).
    #[arg(long)]
    dropped: Option<f64>,
    /// Share of connections reset after the write ran, inside the window
    /// (default: 0.1 for jitter, 0 for overload).
    #[arg(long)]
    reset: Option<f64>,
    /// Overload: requests per second the API admits (default: 1.5 times
    /// the rate).
    #[arg(long)]
    capacity: Option<f64>,
    /// Overload: the offered load in the window, in multiples of the rate.
    #[arg(long, default_value_t = 2.0)]
    surge: f64,
    /// Where the table (`incident.md`, or `overload.md`) and the plot
    /// (`incident.svg`, or `overload.svg`) go (default: the workspace's
    /// `docs/lab`, and then, for jitter, the copy of the table in the
    /// guide's page on the lab, `docs/guide/lab.md`, is rewritten too).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Kill the app (SIGKILL) this many seconds into the traffic, while a
    /// debit runs, and start it again (debits then take 300 ms in their
    /// handler, and the lease is 5 s). The guarded run's debits go to the
    /// resumable route (`POST /debits`: reserve, charge at a fake PSP,
    /// record), and the client's retry resumes each crashed debit.
    #[arg(long)]
    crash_at: Option<f64>,
    /// With `--crash-at`: the guarded run's debits stay on `POST
    /// /payments`, and the crashed debit is left abandoned, a key to
    /// reconcile.
    #[arg(long)]
    no_resume: bool,
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
        let mut config = match self.scenario {
            ScenarioArg::Jitter => IncidentConfig::new(self.seed),
            ScenarioArg::Overload => {
                let mut config = IncidentConfig::overload(self.seed);
                config.overload = Some(Overload {
                    capacity: self.capacity.unwrap_or(1.5 * self.rate),
                    surge: self.surge,
                });
                config
            }
        };
        if let Some(duration) = self.duration {
            config.duration = seconds("duration", duration)?;
        }
        config.rate = self.rate;
        config.writes = self.writes;
        config.clients = self.clients;
        if let Some(window) = self.window {
            config.schedule.window = seconds("window", window)?;
        }
        config.schedule.start = seconds("window-start", self.window_start)?;
        let s = &mut config.schedule;
        s.delayed = self.delayed.unwrap_or(s.delayed);
        s.dropped = self.dropped.unwrap_or(s.dropped);
        s.reset = self.reset.unwrap_or(s.reset);
        config.crash_at = self
            .crash_at
            .map(|at| seconds("crash-at", at))
            .transpose()?;
        config.resume = config.crash_at.is_some() && !self.no_resume;
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
        "idempotency-lab: {}: two runs of {:.0} s each (naive, then guarded)...",
        config.scenario().as_str(),
        config.duration.as_secs_f64()
    );
    let programs = match Programs::next_to_the_lab() {
        Ok(programs) => programs,
        Err(error) => {
            eprintln!("idempotency-lab: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    match idempotency_lab::incident(&config, &programs, &out, args.keep_store.as_deref()).await {
        Ok(incident) => {
            let table = idempotency_lab::report::table(&incident.naive, &incident.guarded);
            println!("{table}");
            println!(
                "wrote {} and {}",
                incident.table.display(),
                incident.plot.display()
            );
            // The guide's lab page shows the jitter table (between its markers).
            if args.out.is_none() && config.scenario() == Scenario::Jitter {
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

//! The retry-storm harness (see `idempotency_tests::storm`), as a command.
//!
//! ```text
//! cargo build --release -p idempotency-tests --bins  # the app and service: built on first run
//! target/release/storm                                   # 8 clients x 25 payments
//! target/release/storm --clients 50 --payments 2000      # 100 000 payments
//! target/release/storm --guard off                       # watch the duplicates
//! ```

use std::time::Duration;

use clap::Parser;
use idempotency_tests::programs::{self, Program};
use idempotency_tests::storm::{self, StormConfig};

/// Reproduces a retry storm against the payments example behind a
/// fault-injecting proxy, and counts what the retries did.
#[derive(Debug, Parser)]
struct Args {
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Payments per client, one after another.
    #[arg(long, default_value_t = 25)]
    payments: usize,
    /// Share of answers dropped after the payment ran.
    #[arg(long, default_value_t = 0.3)]
    drop: f64,
    /// Share of connections reset before the request is forwarded.
    #[arg(long, default_value_t = 0.05)]
    reset: f64,
    /// Run the app with the guard `on` or `off`.
    #[arg(long, default_value = "on")]
    guard: String,
    /// Where payments and records live (default: a fresh SQLite file).
    #[arg(long)]
    database_url: Option<String>,
    /// Seed of the proxy's faults.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = StormConfig {
        clients: args.clients,
        payments: args.payments,
        drop: args.drop,
        reset: args.reset,
        guard: args.guard != "off",
        database_url: args.database_url,
        seed: args.seed,
        timeout: Duration::from_secs(5),
    };
    let report = storm::run(
        &config,
        &programs::path(Program::Payments),
        &programs::path(Program::StatusService),
    )
    .await;
    println!("{report}");
    if config.guard && (report.duplicate_rows > 0 || report.wrong_answers > 0) {
        anyhow::bail!("the guard let a payment run twice, or answered with another payment");
    }
    Ok(())
}

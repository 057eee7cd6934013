//! The benchmark harness of the idempotency guard: its overhead against the
//! store's own limit (the claim and complete statements issued directly,
//! without HTTP) and against the best peer crate (`idempotent` 0.3.0 and
//! 2.0.0, on the same Redis), measured side by side in one run.
//!
//! One command produces everything (the table, `docs/BENCHMARKS.md` and the
//! plot `docs/benchmarks.png`):
//!
//! ```text
//! cargo run --release -p idempotency-bench
//! cargo run --release -p idempotency-bench -- --growth   # + 1M and 10M rows
//! cargo run --release -p idempotency-bench -- --growth-only  # just those
//! cargo run -p idempotency-bench -- --smoke              # CI: a few seconds, no figures
//! ```
//!
//! A full run first builds the peer `idempotent` 2.0.0 (`bench/peer2`, a
//! crate outside the workspace: `cargo build --release
//! --ignore-rust-version --manifest-path bench/peer2/Cargo.toml`); the smoke
//! run and `--no-peer2` leave it out. `--help` shows every option.
//!
//! The servers under test run as child processes (this binary re-executed
//! with the hidden `serve` subcommand), so each one's peak RSS is its own;
//! the load generator and the raw-store runs live in the parent.

mod allocations;
mod batches;
mod cli;
mod growth;
mod handwritten;
mod harness;
mod load;
mod machine;
mod orchestrate;
mod peer;
mod peer2;
mod plot;
mod raw;
mod replicas;
mod report;
mod results;
mod server;
mod setup;
mod stats;
mod timers;

use clap::Parser as _;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    // Both sides get the same runtime: one worker per core, as
    // `#[tokio::main]` would build it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Some(cli::Command::Serve(args)) => runtime.block_on(server::serve(args)),
        Some(cli::Command::Run(args)) => runtime.block_on(orchestrate::run(args)),
        Some(cli::Command::Timers(args)) => runtime.block_on(timers::run(args)),
        None => runtime.block_on(orchestrate::run(cli.run)),
    }
}

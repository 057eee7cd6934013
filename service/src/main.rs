//! `idempotency-service`: `serve` (the default) or `migrate`.

use anyhow::Context as _;
use clap::Parser;
use idempotency_service::{Cli, Command};

#[tokio::main]
pub(crate) async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if cli.config.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => idempotency_service::serve(cli.config)
            .await
            .context("idempotency-service serve"),
        Command::Migrate => idempotency_service::migrate(&cli.config)
            .await
            .context("idempotency-service migrate"),
    }
}

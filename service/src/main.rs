//! `idempotency-service`: `serve` (the default) or `migrate`.

use anyhow::Context as _;
use clap::Parser;
use idempotency_service::{Cli, Command};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

#[tokio::main]
pub(crate) async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let subscriber = tracing_subscriber::registry().with(filter);
    // Traces over OTLP/HTTP when built with `--features otel` and
    // OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[cfg(feature = "otel")]
    let traces = idempotency_guard::telemetry::otel::install_from_env("idempotency-service")?;
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(
        traces
            .as_ref()
            .map(idempotency_guard::telemetry::otel::layer),
    );
    if cli.config.log_json {
        subscriber
            .with(tracing_subscriber::fmt::layer().json())
            .init();
    } else {
        subscriber.with(tracing_subscriber::fmt::layer()).init();
    }
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => idempotency_service::serve(cli.config)
            .await
            .context("idempotency-service serve"),
        Command::Migrate => idempotency_service::migrate(&cli.config)
            .await
            .context("idempotency-service migrate"),
    };
    #[cfg(feature = "otel")]
    if let Some(traces) = traces {
        // Sends the spans still buffered.
        traces.shutdown()?;
    }
    result
}

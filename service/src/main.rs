//! `idempotency-service`: `serve` (the default) or `migrate`.
//!
//! Exit codes: 0 done, 1 a failure while running (a store that cannot be
//! reached, a port taken), 2 a configuration error (one line on standard
//! error naming the variable or file and what it expects; no backtrace).

use std::process::ExitCode;

use clap::Parser;
use idempotency_guard::telemetry::logs::{LogFormat, fmt_layer};
use idempotency_service::{Cli, Command, ServiceError};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The exit code of a configuration error (as clap's own usage errors).
const CONFIGURATION_ERROR: u8 = 2;

#[tokio::main]
pub(crate) async fn main() -> ExitCode {
    let cli = Cli::parse();
    // LOG_FORMAT=text|json (LOG_JSON=true, the older switch, means json).
    let format = if cli.config.log_json {
        Ok(LogFormat::Json)
    } else {
        LogFormat::from_env(LogFormat::Text)
    };
    let checked = format
        .map_err(|error| error.to_string())
        .and_then(|format| {
            cli.config
                .check()
                .map(|()| format)
                .map_err(|e| e.to_string())
        });
    let format = match checked {
        Ok(format) => format,
        Err(message) => {
            eprintln!("idempotency-service: configuration: {message}");
            return ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let subscriber = tracing_subscriber::registry().with(filter);
    // Traces over OTLP/HTTP when built with `--features otel` and
    // OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[cfg(feature = "otel")]
    let traces = match idempotency_guard::telemetry::otel::install_from_env("idempotency-service") {
        Ok(traces) => traces,
        Err(error) => {
            eprintln!("idempotency-service: configuration: OpenTelemetry: {error}");
            return ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(
        traces
            .as_ref()
            .map(idempotency_guard::telemetry::otel::layer),
    );
    subscriber.with(fmt_layer(format)).init();
    let (what, result) = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => ("serve", idempotency_service::serve(cli.config).await),
        Command::Migrate => ("migrate", idempotency_service::migrate(&cli.config).await),
    };
    #[cfg(feature = "otel")]
    if let Some(traces) = traces {
        // Sends the spans still buffered.
        if let Err(error) = traces.shutdown() {
            eprintln!("idempotency-service: sending the last traces: {error}");
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}`: the error and its causes on one line, no backtrace.
            let error = anyhow::Error::new(error);
            let configuration = matches!(
                error.downcast_ref::<ServiceError>(),
                Some(
                    ServiceError::Tokens(_)
                        | ServiceError::AdminTokens(_)
                        | ServiceError::Reconciled(_)
                )
            );
            if configuration {
                eprintln!("idempotency-service: configuration: {error:#}");
                ExitCode::from(CONFIGURATION_ERROR)
            } else {
                eprintln!("idempotency-service {what}: {error:#}");
                ExitCode::FAILURE
            }
        }
    }
}

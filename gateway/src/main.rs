//! `idempotency-gateway`: reads its configuration, opens the store, serves.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use idempotency_gateway::config::{Config, ConfigError};
use idempotency_gateway::{Gateway, GatewayError, serve, shutdown_signal};
use idempotency_guard::store::encrypted::{
    REQUIRE_SEALED_VARIABLE, require_sealed_from_environment,
};
use idempotency_guard::telemetry::logs::{LogFormat, fmt_layer};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// mimalloc: its thread-local free lists make the proxy's per-request
/// allocations (header maps, bodies, futures) cheaper than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The idempotency guard as a reverse proxy: the routes the configuration
/// names run at most once per `Idempotency-Key`; everything else passes
/// through. Flags override the file; each has an environment fallback.
#[derive(Debug, Parser)]
#[command(name = "idempotency-gateway", version)]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "GATEWAY_CONFIG", default_value = "gateway.toml")]
    config: PathBuf,
    /// Overrides `listen`.
    #[arg(long, env = "LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Overrides `upstream`.
    #[arg(long, env = "UPSTREAM_URL")]
    upstream: Option<String>,
    /// Overrides `store` (the database URL).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Overrides `redis`.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Overrides `store_kind` (`sql`, `redis` or `tiered`).
    #[arg(long, env = "STORE_KIND")]
    store_kind: Option<String>,
    /// Checks the configuration and exits.
    #[arg(long)]
    check: bool,
}

/// The exit code of a configuration error (as clap's own usage errors).
const CONFIGURATION_ERROR: u8 = 2;

/// Configuration errors exit 2 and runtime failures 1, each with one line
/// on standard error (the error and its causes, no backtrace).
#[tokio::main]
async fn main() -> ExitCode {
    let format = match LogFormat::from_env(LogFormat::Json) {
        Ok(format) => format,
        Err(error) => return fail(&anyhow::Error::from(error), CONFIGURATION_ERROR),
    };
    // JSON lines unless LOG_FORMAT=text (coloured only on a terminal).
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with(fmt_layer(format))
        .init();
    let cli = Cli::parse();
    let config = match configure(&cli) {
        Ok(config) => config,
        Err(error) => return fail(&error, CONFIGURATION_ERROR),
    };
    if cli.check {
        println!("configuration ok: {} guarded routes", config.routes.len());
        return ExitCode::SUCCESS;
    }
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let configuration = error
                .downcast_ref::<GatewayError>()
                .is_some_and(|error| matches!(error, GatewayError::Config(_)));
            fail(
                &error,
                if configuration {
                    CONFIGURATION_ERROR
                } else {
                    1
                },
            )
        }
    }
}

/// Prints `error` and its causes on one line and returns `code`.
fn fail(error: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("idempotency-gateway: {error:#}");
    ExitCode::from(code)
}

/// The file, then the flags and environment over it, checked.
fn configure(cli: &Cli) -> anyhow::Result<Config> {
    let path = cli.config.display();
    let mut config = Config::from_file(&cli.config).with_context(|| format!("{path}"))?;
    if let Some(listen) = cli.listen {
        config.listen = listen;
    }
    if let Some(upstream) = &cli.upstream {
        config.upstream.clone_from(upstream);
    }
    if let Some(url) = &cli.database_url {
        config.store.clone_from(url);
    }
    if let Some(url) = &cli.redis_url {
        config.redis = Some(url.clone());
    }
    if let Some(kind) = &cli.store_kind {
        // Parsed here, not by clap, so a bad value is one line, as in the
        // file.
        config.store_kind = kind
            .parse()
            .map_err(ConfigError::Invalid)
            .with_context(|| format!("{path}"))?;
    }
    if std::env::var_os(REQUIRE_SEALED_VARIABLE).is_some() {
        config.require_sealed = require_sealed_from_environment()?;
    }
    Gateway::check(&config).with_context(|| format!("{path}"))?;
    Ok(config)
}

/// Opens the store and serves until a shutdown signal.
async fn run(config: Config) -> anyhow::Result<()> {
    let metrics = idempotency_guard::telemetry::install_prometheus()
        .context("installing the metrics recorder")?;
    idempotency_gateway::describe_metrics();
    let listen = config.listen;
    let gateway = Gateway::open(config, Some(metrics)).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let drained = serve(gateway, listener, shutdown_signal()).await?;
    tracing::info!(drained, "gateway stopped");
    Ok(())
}

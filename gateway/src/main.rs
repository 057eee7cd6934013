//! `idempotency-gateway`: reads its configuration, opens the store, serves.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use idempotency_gateway::config::Config;
use idempotency_gateway::{Gateway, serve, shutdown_signal};
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // JSON lines unless LOG_FORMAT=text (coloured only on a terminal).
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with(fmt_layer(LogFormat::from_env(LogFormat::Json)?))
        .init();
    let cli = Cli::parse();
    let mut config = Config::from_file(&cli.config)
        .with_context(|| format!("configuration {}", cli.config.display()))?;
    if let Some(listen) = cli.listen {
        config.listen = listen;
    }
    if let Some(upstream) = cli.upstream {
        config.upstream = upstream;
    }
    if let Some(url) = cli.database_url {
        config.store = url;
    }
    if let Some(url) = cli.redis_url {
        config.redis = Some(url);
    }
    if let Some(kind) = cli.store_kind {
        config.store_kind = kind;
    }
    config.validate().context("configuration")?;
    if cli.check {
        println!("configuration ok: {} guarded routes", config.routes.len());
        return Ok(());
    }
    let metrics = idempotency_guard::telemetry::install_prometheus()
        .context("installing the metrics recorder")?;
    idempotency_gateway::describe_metrics();
    let listen = config.listen;
    let gateway = Gateway::open(config, Some(metrics))
        .await
        .context("starting")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let drained = serve(gateway, listener, shutdown_signal()).await?;
    tracing::info!(drained, "gateway stopped");
    Ok(())
}

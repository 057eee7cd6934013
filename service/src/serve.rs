//! Running the service: `serve` and `migrate`.

use std::sync::Arc;
use std::time::Duration;

use idempotency_guard::server::BodyTimeoutLayer;
use idempotency_guard::store::{AnyStore, StoreOptions};

use crate::config::Config;
use crate::router::build_router;
use crate::state::AppState;
use crate::tokens::{Tokens, TokensError};

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The store could not be reached.
    #[error("cannot connect to the store")]
    Connect(#[source] idempotency_guard::StoreError),
    /// A migration failed.
    #[error(transparent)]
    Migrate(#[from] idempotency_guard::MigrationError),
    /// The tokens could not be read.
    #[error("cannot read the scope tokens (TOKENS_FILE, TOKENS)")]
    Tokens(#[source] TokensError),
    /// The admin tokens could not be read.
    #[error("cannot read the admin tokens (ADMIN_TOKENS_FILE, ADMIN_TOKENS)")]
    AdminTokens(#[source] crate::admin::AdminTokensError),
    /// The reconciled marks could not be read.
    #[error("cannot read the reconciled marks (RECONCILED_FILE)")]
    Reconciled(#[source] crate::admin::ReconciledError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder")]
    Metrics(#[source] metrics_exporter_prometheus::BuildError),
    /// The listener failed.
    #[error("cannot listen on {address}")]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server failed while serving.
    #[error("the server failed")]
    Serve(#[source] std::io::Error),
}

async fn connect(config: &Config) -> Result<AnyStore, ServiceError> {
    AnyStore::open(&StoreOptions {
        kind: config.store,
        database_url: &config.database_url,
        redis_url: config.redis_url.as_deref(),
        redis_prefix: &config.redis_prefix,
        notifications: false,
        // The service reads statuses and whether a body is stored, both
        // kept in clear by encryption at rest: it needs no key.
        encryption: None,
        require_sealed: true,
        nats: config.nats(),
    })
    .await
    .map_err(ServiceError::Connect)
}

/// Applies pending migrations (`idempotency-service migrate`).
///
/// # Errors
///
/// When the store cannot be reached or a migration fails.
pub async fn migrate(config: &Config) -> Result<(), ServiceError> {
    let store = connect(config).await?;
    store.migrate().await?;
    tracing::info!(store = store.kind(), "migrations applied");
    Ok(())
}

fn tokens(config: &Config) -> Result<Tokens, ServiceError> {
    let mut tokens = match &config.tokens_file {
        Some(path) => Tokens::from_file(path).map_err(ServiceError::Tokens)?,
        None => Tokens::default(),
    };
    if let Some(pairs) = &config.tokens {
        tokens.add_pairs(pairs).map_err(ServiceError::Tokens)?;
    }
    if tokens.is_empty() {
        tracing::warn!(
            "no tokens configured: every /v1 request will be refused (set TOKENS_FILE or TOKENS)"
        );
    }
    Ok(tokens)
}

fn admin_tokens(config: &Config) -> Result<crate::admin::AdminTokens, ServiceError> {
    let mut tokens = match &config.admin_tokens_file {
        Some(path) => {
            crate::admin::AdminTokens::from_file(path).map_err(ServiceError::AdminTokens)?
        }
        None => crate::admin::AdminTokens::default(),
    };
    if let Some(triples) = &config.admin_tokens {
        tokens
            .add_triples(triples)
            .map_err(ServiceError::AdminTokens)?;
    }
    Ok(tokens)
}

/// Serves the status API until SIGTERM or Ctrl-C, then lets in-flight
/// requests finish.
///
/// # Errors
///
/// When the store, the tokens, the listener or the server fail.
pub async fn serve(config: Config) -> Result<(), ServiceError> {
    let tokens = tokens(&config)?;
    let admin_tokens = admin_tokens(&config)?;
    let reconciled = match &config.reconciled_file {
        Some(path) => {
            crate::admin::Reconciled::from_file(path).map_err(ServiceError::Reconciled)?
        }
        None => {
            if config.console {
                tracing::warn!(
                    "no RECONCILED_FILE: records marked reconciled are kept in memory and lost at restart"
                );
            }
            crate::admin::Reconciled::in_memory()
        }
    };
    let store = connect(&config).await?;
    if config.migrate_on_start {
        store.migrate().await?;
    }
    let metrics =
        idempotency_guard::telemetry::install_prometheus().map_err(ServiceError::Metrics)?;
    let purge = (config.purge_interval_secs > 0).then(|| {
        let interval = Duration::from_secs(config.purge_interval_secs);
        tokio::spawn(idempotency_guard::purge_periodically(
            store.clone(),
            interval,
            1000,
        ))
    });
    let state = AppState {
        store: store.clone(),
        tokens: Arc::new(tokens),
        metrics: Some(metrics),
        retry_after: Duration::from_secs(config.retry_after_secs),
        admin_tokens: Arc::new(admin_tokens),
        reconciled: Arc::new(reconciled),
        console: config.console,
        console_sessions: Arc::new(crate::admin::ConsoleSessions::new(
            config.console_sessions(),
        )),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServiceError::Listen {
            address: config.listen,
            source,
        })?;
    tracing::info!(listen = %config.listen, store = store.kind(), "key-status service listening");
    // Every connection bounded (header read, idle, HTTP/2 pings, the cap,
    // 414/431 for oversized heads), every request body given BODY_SECS.
    let app =
        build_router(state).layer(BodyTimeoutLayer::new(Duration::from_secs(config.body_secs)));
    config
        .server()
        .serve(listener, move |_client| app.clone(), shutdown_signal())
        .await;
    if let Some(purge) = purge {
        purge.abort();
    }
    tracing::info!("key-status service stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

//! Binding the router, and the graceful shutdown that drains detached runs.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::app::Gateway;
use crate::config::ConfigError;

/// Serves `gateway` on `listener` until `shutdown` completes, then stops
/// accepting, lets open requests finish, and waits for every guarded
/// upstream request still running (its client may be gone) so its outcome
/// is stored or released, not lost. Returns whether every run ended in time.
///
/// # Errors
///
/// [`std::io::Error`] from the listener; a configuration error as
/// [`std::io::ErrorKind::InvalidInput`].
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<bool> {
    let router = gateway.router().map_err(|error: ConfigError| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, error)
    })?;
    let drain = gateway.drain();
    tracing::info!(
        listen = %listener.local_addr()?,
        upstream = %gateway.config().upstream,
        store = gateway.store().kind(),
        encrypted = gateway.store().is_encrypted(),
        routes = gateway.config().routes.len(),
        "gateway listening"
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await?;
    let running = drain.running();
    tracing::info!(running, "stopped accepting; draining guarded runs");
    Ok(drain.wait().await)
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
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
        () = interrupt => {}
        () = terminate => {}
    }
}

//! Listening, and stopping on Ctrl-C or SIGTERM with the requests in progress finished.

use std::sync::Arc;

use super::routes::app;
use super::service::Service;

/// Binds `host:port`, or the next free port above it (up to 100 tries) when it is taken;
/// port 0 takes any free port.
pub async fn bind(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    let tries = if port == 0 { 1 } else { 100 };
    let mut last = None;
    for p in (0..tries).filter_map(|i| port.checked_add(i)) {
        match tokio::net::TcpListener::bind((host, p)).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("cannot listen on {host}:{p}")),
        }
    }
    Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow::anyhow!("no port")))
        .with_context(|| format!("cannot listen on {host}: ports {port}..{} are all taken", port.saturating_add(tries - 1)))
}

/// Serves on `listener` until Ctrl-C or SIGTERM; then answers `/health` with 503, stops
/// accepting, lets the requests in progress finish, and returns.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<Service>) -> anyhow::Result<()> {
    let sv = state.clone();
    let stop = async move {
        shutdown_signal().await;
        sv.stopping();
    };
    axum::serve(listener, app(state)).with_graceful_shutdown(stop).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    crate::errln!("moge: stopping: finishing the requests in progress");
}

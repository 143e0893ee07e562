//! The status server: `/status` (SPEC §5 document, nothing secret),
//! `/readyz`, `/healthz` and `/metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::Arc;

use actors::status::StatusBoard;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct AppState {
    board: StatusBoard,
    registry: Arc<Registry>,
}

/// The routes, for serving and for tests.
pub fn router(board: StatusBoard, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/readyz", get(readyz))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(AppState { board, registry })
}

async fn status(State(s): State<AppState>) -> Response {
    axum::Json(s.board.snapshot()).into_response()
}

async fn readyz(State(s): State<AppState>) -> Response {
    match s.board.readyz() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        // The reason is a contract enum with an operator-facing message,
        // never free text that could carry key material.
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason:?}: {}\n", reason.message()),
        )
            .into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

/// Binds `addr` (so a busy port fails start-up, not later) and returns the
/// bound address and the serving future, which ends when `shutdown` fires.
pub async fn bind(
    addr: SocketAddr,
    board: StatusBoard,
    registry: Arc<Registry>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = router(board, registry);
    let serve = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = shutdown.changed().await;
            })
            .await
    };
    Ok((local, serve))
}

//! The accept loop: hyper's HTTP/1.1 connections over the router, with a connection
//! limit, a header-read timeout (slow clients cannot hold a connection open by dribbling
//! headers), and a graceful stop: on SIGINT / SIGTERM no new connection is taken,
//! keep-alive ends, in-flight requests and streams run to their end, then `serve` returns.

use crate::pool::Pool;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connection settings.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// How long a stop waits for in-flight requests before cancelling them.
    pub drain_timeout: Duration,
}

/// Serve `router` on `listener` until `stop` resolves, then drain: `pool` stops taking
/// requests, and the runs still going when the drain outlasts its limit are cancelled.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl std::future::Future<Output = ()>,
    pool: Arc<Pool>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(stop);
    loop {
        let (socket, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                // Out of file descriptors and the like: wait, do not spin.
                Err(e) => {
                    qhx::elog!("qhx_server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = socket.set_nodelay(true);
        let io = TokioIo::new(socket);
        let permit = Arc::clone(&slots).try_acquire_owned().ok();
        let svc = match permit {
            Some(_) => hyper_util::service::TowerToHyperService::new(router.clone()),
            None => hyper_util::service::TowerToHyperService::new(busy_router()),
        };
        let conn = http.serve_connection(io, svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection error is the client's (reset, timeout); nothing to report.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    pool.drain();
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        qhx::elog!(
            "qhx_server: requests still running after {} s; cancelling them",
            limits.drain_timeout.as_secs()
        );
        pool.cancel_all();
    }
}

/// Every request on a connection past `--max-connections` gets a 503.
fn busy_router() -> Router {
    Router::new().fallback(|| async {
        let mut e = crate::error::ApiError::overloaded(0);
        e.message = "too many open connections (--max-connections); retry later".into();
        let mut r = axum::response::IntoResponse::into_response(e);
        r.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        r
    })
}

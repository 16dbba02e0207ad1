//! The accept loop: HTTP/1.1 (optionally over TLS) with bounds that a slow or hostile client
//! cannot get around.
//!
//! - At most [`MAX_CONNECTIONS`] connections are served at once. Past that the loop stops
//!   accepting: new connections wait in the kernel's listen backlog until a slot frees, rather
//!   than being refused, so a scrape during a burst is delayed instead of failed.
//! - A client must send a complete request head within [`HEADER_READ_TIMEOUT`] (also the limit
//!   for an idle keep-alive connection's next request, and for a TLS handshake), so a slowloris
//!   client holds a slot for at most that long.
//! - A handler that has not answered within [`REQUEST_TIMEOUT`] gets a 503.
//! - On shutdown the listener closes, open connections finish their current request and close;
//!   whatever is still open after [`crate::SHUTDOWN_GRACE`] is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

use super::tls::TlsReloader;

/// Connections served at once. Prometheus needs one or two; the rest is headroom for bursts.
pub const MAX_CONNECTIONS: usize = 512;

/// Time a client gets to send a whole request head (and to finish a TLS handshake).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a request's handler gets to produce a response.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `stop` turns true, then shuts down gracefully.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<TlsReloader>>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            // The semaphore is never closed, so acquiring only waits.
            Ok(permit) = slots.clone().acquire_owned() => permit,
        };
        let (stream, peer) = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, usually: back off instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            handle(stream, peer, app, tls, watcher).await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(crate::SHUTDOWN_GRACE) => tracing::warn!(
            "connections still open {:?} after shutdown; closing them", crate::SHUTDOWN_GRACE
        ),
    }
}

async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    tls: Option<Arc<TlsReloader>>,
    watcher: Watcher,
) {
    // Responses are written in one go; waiting for more to coalesce only adds latency.
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return serve_connection(stream, peer, app, watcher).await;
    };
    let acceptor = tls.acceptor();
    match tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => serve_connection(stream, peer, app, watcher).await,
        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake timed out"),
    }
}

async fn serve_connection<S>(stream: S, peer: SocketAddr, app: Router, watcher: Watcher)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        // Basic auth bounds the credential checks per client address (see `super::auth`).
        req.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, app.oneshot(req)).await {
                Ok(response) => response,
                Err(_) => Ok::<Response, Infallible>(
                    (StatusCode::SERVICE_UNAVAILABLE, "request timed out\n").into_response(),
                ),
            }
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(connection).await {
        // Header timeouts, resets and malformed requests: the client's problem, not ours.
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

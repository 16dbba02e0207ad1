//! The accept loop: HTTP/1.1 (optionally over TLS) with bounds that a slow or hostile client
//! cannot get around.
//!
//! - Every connection is accepted at once and tracked in a [`Registry`] (see
//!   [`super::connections`]): its TLS handshake, each request head and each idle wait between
//!   requests get [`HEADER_READ_TIMEOUT`], a response its client does not read gets
//!   [`connections::WRITE_TIMEOUT`]; past a high-water mark each new connection closes an idle,
//!   unfinished or non-reading one, oldest first, so a fresh scrape never waits behind silent
//!   clients. The soft open-file limit is raised to the hard one, and the connection cap is
//!   sized from it; an accept that still fails for lack of a descriptor closes a connection
//!   to free one.
//! - A request head is read into at most [`MAX_HEAD_BYTES`] (431 beyond), with at most hyper's
//!   default 100 header fields (431 beyond), so a client cannot make the server buffer more.
//! - A request body (no route takes one) is read and dropped before any route answers, at most
//!   [`MAX_REQUEST_BODY`] bytes (413 beyond): until it has arrived the request counts as its
//!   head, held to the head's allowance and reclaimable as an unfinished head, so a body that
//!   never comes holds a connection no longer than a head that never ends.
//! - A handler that has not answered within [`REQUEST_TIMEOUT`] gets a 503.
//! - A kept-alive connection serves at most [`MAX_REQUESTS_PER_CONNECTION`] requests; the last
//!   response says `Connection: close`.
//! - On shutdown the listener closes, open connections finish their current request and close;
//!   whatever is still open after [`SHUTDOWN_GRACE`] is dropped.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::{Buf, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

use super::connections::{self, CloseReason, Conn, ConnectionMetrics, Registry, Tracked, Tracker};
use super::tls::TlsReloader;

/// How long open HTTP connections get to finish after the shutdown signal before they are dropped:
/// a client that never finishes a request must not hold a rolling update hostage. The sampler
/// stops meanwhile, and blocking work still running then is abandoned, so the process exits
/// within this.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Time a client gets to send a whole request head, to finish a TLS handshake, and to send its
/// next request on a kept-alive connection ([`connections::ALLOWANCE`]; shorter under pressure).
pub const HEADER_READ_TIMEOUT: Duration = connections::ALLOWANCE;

/// Time a request's handler gets to produce a response.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests served on one kept-alive connection (nginx's `keepalive_requests` default), so that
/// no connection lives forever and per-connection state is renewed.
pub const MAX_REQUESTS_PER_CONNECTION: u32 = 1000;

/// hyper's read buffer per connection, the bound on a request head: far above any scraper's
/// head (a few hundred bytes), far below hyper's default of about 400 KB.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The largest request body read (and dropped) before answering. No route takes a body, but one
/// that is sent anyway must be read off the connection: closing a connection with unread bytes,
/// or receiving bytes after closing it, makes the kernel reset it and the client loses the
/// response.
pub const MAX_REQUEST_BODY: u64 = 64 * 1024;

/// Connections the kernel completes and queues before the server accepts them (capped by
/// `net.core.somaxconn`): a burst of connections faster than the accept loop must not fill the
/// queue, or the kernel drops a scraper's SYN and it retries only a second later.
pub const LISTEN_BACKLOG: u32 = 4096;

/// At most one log line per this interval about failing accepts, with a count of the others.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Longest wait for a descriptor to free after a failed accept, when none could be reclaimed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A listener on `addr` with a backlog of [`LISTEN_BACKLOG`] (the standard library's is 128).
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As the standard library does: a restarted exporter can listen again at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `listener` until `stop` turns true, then shuts down gracefully. Connections
/// are counted in `metrics`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<TlsReloader>>,
    metrics: ConnectionMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let open_files = connections::raise_open_file_limit();
    let registry = Registry::new(connections::cap_for(open_files), metrics);
    tracing::info!(
        max_connections = registry.cap(),
        open_file_limit = open_files.map_or_else(|| "unknown".into(), |l| l.to_string()),
        "connection limits"
    );
    let sweeper = tokio::spawn(Arc::clone(&registry).sweep_forever());
    let graceful = GracefulShutdown::new();
    let mut accept_errors = Throttled::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&registry, &e, &mut accept_errors).await;
                    continue;
                }
            },
        };
        // Over the cap with nothing to reclaim: the new connection is closed at once.
        let Some(tracker) = registry.admit(tls.is_some()) else {
            continue;
        };
        tokio::spawn(handle(
            stream,
            peer,
            tracker,
            app.clone(),
            tls.clone(),
            graceful.watcher(),
        ));
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!(
            "connections still open {:?} after shutdown; closing them", SHUTDOWN_GRACE
        ),
    }
    sweeper.abort();
}

/// After a failed accept: when the process is out of descriptors (or memory), closes a
/// connection to make room and waits until its descriptor is free; other errors concern one
/// connection only and are skipped.
async fn accept_failed(registry: &Registry, e: &io::Error, log: &mut Throttled) {
    let exhausted = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    if !exhausted {
        tracing::debug!(error = %e, "accept failed");
        return;
    }
    let ended = registry.ended();
    tokio::pin!(ended);
    ended.as_mut().enable();
    let reclaimed = registry.reclaim_one();
    log.warn(e, reclaimed);
    let _ = tokio::time::timeout(ACCEPT_RETRY, ended).await;
}

/// A warning at most once per [`ACCEPT_ERROR_LOG_INTERVAL`], counting the ones left out.
#[derive(Debug, Default)]
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    fn warn(&mut self, e: &io::Error, reclaimed: bool) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < ACCEPT_ERROR_LOG_INTERVAL)
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            error = %e,
            reclaimed,
            suppressed = self.suppressed,
            "cannot accept a connection: out of file descriptors"
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}

async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    tracker: Tracker,
    app: Router,
    tls: Option<Arc<TlsReloader>>,
    watcher: Watcher,
) {
    // Responses are written in one go; waiting for more to coalesce only adds latency.
    let _ = stream.set_nodelay(true);
    let conn = Arc::clone(tracker.conn());
    let stream = Tracked::new(stream, Arc::clone(&conn));
    // The connection is dropped (its socket closed) before the tracker ends.
    let reason = tokio::select! {
        // The registry's reason is the one counted.
        () = conn.closed() => CloseReason::Error,
        reason = serve_stream(stream, peer, &conn, app, tls, watcher) => reason,
    };
    tracker.end(reason);
}

async fn serve_stream(
    stream: Tracked<TcpStream>,
    peer: SocketAddr,
    conn: &Arc<Conn>,
    app: Router,
    tls: Option<Arc<TlsReloader>>,
    watcher: Watcher,
) -> CloseReason {
    let Some(tls) = tls else {
        return serve_connection(stream, peer, conn, app, watcher).await;
    };
    match tls.acceptor().accept(stream).await {
        Ok(stream) => {
            conn.handshake_done();
            serve_connection(stream, peer, conn, app, watcher).await
        }
        Err(e) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            CloseReason::Error
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    conn: &Arc<Conn>,
    app: Router,
    watcher: Watcher,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handler_conn = Arc::clone(conn);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let app = app.clone();
        let conn = Arc::clone(&handler_conn);
        async move {
            // Before the request starts, so that the connection still counts as reading its head.
            let mut req = match read_body(req).await {
                Ok(req) => req,
                Err(refused) => return Ok::<Response, Infallible>(refused),
            };
            // Basic auth bounds the credential checks per client address (see `super::auth`).
            req.extensions_mut().insert(ConnectInfo(peer));
            let n = conn.request_started();
            let mut response = match tokio::time::timeout(REQUEST_TIMEOUT, app.oneshot(req)).await {
                Ok(Ok(response)) => response,
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "request timed out\n").into_response(),
            };
            conn.request_finished();
            if n >= MAX_REQUESTS_PER_CONNECTION {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        }
    });
    let mut builder = http1::Builder::new();
    // The registry enforces head and idle deadlines, with the reason counted.
    builder
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    match watcher.watch(connection).await {
        Ok(()) if conn.requests() >= MAX_REQUESTS_PER_CONNECTION => CloseReason::RequestLimit,
        Ok(()) => CloseReason::Completed,
        Err(e) => {
            // Malformed or oversized requests, resets: the client's problem, not ours.
            tracing::debug!(error = %e, "HTTP connection ended with an error");
            CloseReason::Error
        }
    }
}

/// Reads and drops `req`'s body (at most [`MAX_REQUEST_BODY`] bytes) and returns the request
/// without it, so that a client that sends a body, even late, gets its whole response. A larger
/// body is refused with 413 and a broken one with 400, each closing the connection. How long the
/// body may take is the registry's head allowance: the caller has not started the request yet.
pub async fn read_body<B>(req: Request<B>) -> Result<Request<Body>, Response>
where
    B: hyper::body::Body + Unpin,
{
    let (parts, body) = req.into_parts();
    match drain(body, MAX_REQUEST_BODY).await {
        Ok(()) => Ok(Request::from_parts(parts, Body::empty())),
        Err((status, reason)) => {
            Err((status, [(header::CONNECTION, "close")], reason).into_response())
        }
    }
}

/// Reads `body` to its end, dropping the bytes; refuses it past `limit` bytes or when it breaks.
async fn drain<B>(mut body: B, limit: u64) -> Result<(), (StatusCode, &'static str)>
where
    B: hyper::body::Body + Unpin,
{
    const TOO_LARGE: (StatusCode, &str) =
        (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
    if body.is_end_stream() {
        return Ok(());
    }
    if body.size_hint().lower() > limit {
        return Err(TOO_LARGE);
    }
    let mut read = 0;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| (StatusCode::BAD_REQUEST, "broken request body\n"))?;
        read += frame.data_ref().map_or(0, |d| d.remaining() as u64);
        if read > limit {
            return Err(TOO_LARGE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Bytes, HttpBody};

    async fn read(body: Body) -> Result<(), StatusCode> {
        let req = Request::get("/healthz").body(body).unwrap();
        match read_body(req).await {
            Ok(req) => {
                assert!(req.body().is_end_stream(), "the body is dropped");
                Ok(())
            }
            Err(refused) => {
                let close = refused.headers().get(header::CONNECTION);
                assert_eq!(close.map(|v| v.as_bytes()), Some(&b"close"[..]));
                Err(refused.status())
            }
        }
    }

    fn stream(chunks: Vec<Result<Bytes, std::io::Error>>) -> Body {
        Body::from_stream(tokio_stream::iter(chunks))
    }

    #[tokio::test]
    async fn a_small_request_body_is_read_and_dropped() {
        assert_eq!(read(Body::empty()).await, Ok(()));
        assert_eq!(read(Body::from("0123456789")).await, Ok(()));
        let chunks = vec![
            Ok(Bytes::from_static(b"abc")),
            Ok(Bytes::from(vec![0; 60_000])),
        ];
        assert_eq!(read(stream(chunks)).await, Ok(()));
    }

    #[tokio::test]
    async fn a_large_or_broken_body_is_refused_and_the_connection_closed() {
        let declared = Body::from(vec![0; MAX_REQUEST_BODY as usize + 1]);
        assert_eq!(read(declared).await, Err(StatusCode::PAYLOAD_TOO_LARGE));
        let chunk = Bytes::from(vec![0; 40_000]);
        let streamed = stream(vec![Ok(chunk.clone()), Ok(chunk)]);
        assert_eq!(read(streamed).await, Err(StatusCode::PAYLOAD_TOO_LARGE));
        let broken = stream(vec![Err(std::io::Error::other("reset"))]);
        assert_eq!(read(broken).await, Err(StatusCode::BAD_REQUEST));
    }
}

//! Every open connection in one registry, with what it is doing, so that no client can hold one
//! longer than its allowance and a new connection always finds room, the way nginx reclaims
//! keep-alive connections.
//!
//! - Each connection's socket is wrapped in [`Tracked`], which stamps read and write progress;
//!   the handler wrapper marks requests in flight. From these a connection is, at any moment, in
//!   its TLS handshake, reading a request head (a connection that has sent nothing since it
//!   opened, or since its handshake, counts as reading its first head; a request whose body has
//!   not all arrived counts as reading its head too), running a handler,
//!   stalled writing a response its client does not read, or idle between requests.
//! - A sweep every [`SWEEP_INTERVAL`] closes what has overrun its allowance: handshake, head and
//!   idle [`ALLOWANCE`] ([`PRESSURED_ALLOWANCE`] past the high-water mark), a stalled write
//!   [`WRITE_TIMEOUT`]. A handler has its own limit (`server::REQUEST_TIMEOUT`).
//! - Past the high-water mark (3/4 of the cap), each new connection makes room by closing one
//!   other that has been idle, unfinished (handshake or head) or stalled for [`RECLAIM_GRACE`];
//!   at the cap, any idle or unfinished one will do. Idle ones go first, then unfinished, then
//!   stalled, oldest first within each. A connection whose handler runs for a client that reads
//!   is never taken. Only at the cap with nothing to take is the new one refused.
//! - The cap comes from the open-file limit, raised at start from its soft to its hard value,
//!   less [`FD_RESERVE`] for everything else the process opens, and at most
//!   [`MAX_CONNECTIONS`] (which bounds memory: hyper's buffer of up to 16 KiB per connection, TLS
//!   state).
//! - The number open and the number closed by [`CloseReason`] are served as
//!   `nvml_exporter_http_connections` and `nvml_exporter_http_connections_closed_total`.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use prometheus::{IntCounterVec, IntGauge, Opts};

use crate::metrics::catalog::{
    self, CLOSE_REASONS, HTTP_CONNECTIONS, HTTP_CONNECTIONS_CLOSED_TOTAL,
};

/// Most connections served at once, whatever the open-file limit: about 16 KiB of request
/// buffer and some TLS state each keeps the worst case well under a 128 MiB memory limit.
pub const MAX_CONNECTIONS: usize = 1024;

/// The fewest connections the cap allows, however low the open-file limit.
pub const MIN_CONNECTIONS: usize = 16;

/// File descriptors left for everything but connections: NVML's device files, the kubelet
/// client, certificate and `/proc` reads, logs.
pub const FD_RESERVE: u64 = 64;

/// Time allowed for a TLS handshake, for a request head (from its first byte; for the first
/// request, from the connection's start or its handshake's end), and for an idle keep-alive
/// connection's next request.
pub const ALLOWANCE: Duration = Duration::from_secs(10);

/// [`ALLOWANCE`] past the high-water mark: still ample for a scraper on a local network.
pub const PRESSURED_ALLOWANCE: Duration = Duration::from_secs(2);

/// Time a response may wait for its client to read any of it (nginx's `send_timeout` rule: the
/// time between two successful writes, not the whole response).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection must have been idle, unfinished or stalled before it is taken to make
/// room below the cap (a stalled one, at all): a client between two requests, or one reading a
/// response slowly, keeps its place, so a busy keep-alive client is not made to reconnect.
pub const RECLAIM_GRACE: Duration = Duration::from_secs(1);

/// How often allowances are checked: the precision of every deadline above.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(500);

/// Why a connection was closed: the `reason` label of
/// `nvml_exporter_http_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CloseReason {
    /// The client closed it, or asked to (`Connection: close`), or the server shut down.
    Completed = 1,
    /// Idle between requests past its allowance.
    IdleTimeout,
    /// A request head not complete within its allowance (including a client that sent nothing).
    HeadTimeout,
    /// A TLS handshake not complete within its allowance.
    HandshakeTimeout,
    /// A response its client did not read for [`WRITE_TIMEOUT`].
    WriteTimeout,
    /// Closed to make room for a new connection.
    Reclaimed,
    /// Closed after its last allowed request ([`crate::http::server::MAX_REQUESTS_PER_CONNECTION`]).
    RequestLimit,
    /// A new connection closed at once: over the cap, with no connection that could be taken.
    Refused,
    /// A malformed or oversized request, a failed handshake, a reset.
    Error,
}

impl CloseReason {
    /// Every reason, in label order.
    pub const ALL: &[CloseReason] = &[
        CloseReason::Completed,
        CloseReason::IdleTimeout,
        CloseReason::HeadTimeout,
        CloseReason::HandshakeTimeout,
        CloseReason::WriteTimeout,
        CloseReason::Reclaimed,
        CloseReason::RequestLimit,
        CloseReason::Refused,
        CloseReason::Error,
    ];

    /// The label value, as the catalog lists them.
    pub fn label(self) -> &'static str {
        CLOSE_REASONS[self as usize - 1]
    }

    fn from_code(code: u8) -> Option<CloseReason> {
        CloseReason::ALL.iter().copied().find(|r| *r as u8 == code)
    }
}

/// `nvml_exporter_http_connections` and `nvml_exporter_http_connections_closed_total`: kept by
/// the server, served by the encoder from the registry they are registered in.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    /// Connections open now.
    pub open: IntGauge,
    /// Connections closed, by [`CloseReason`].
    pub closed_by_reason: IntCounterVec,
}

impl ConnectionMetrics {
    /// Counters at zero, every reason present (so that `rate()` has a first point), registered
    /// in `registry`.
    pub fn new(registry: &prometheus::Registry) -> ConnectionMetrics {
        let ConnectionMetrics {
            open,
            closed_by_reason,
        } = ConnectionMetrics::unregistered();
        ConnectionMetrics {
            open: crate::metrics::registered(registry, open),
            closed_by_reason: crate::metrics::registered(registry, closed_by_reason),
        }
    }

    /// The counters, in no registry (tests of the server alone).
    pub fn unregistered() -> ConnectionMetrics {
        let open = IntGauge::new(HTTP_CONNECTIONS, catalog::help(HTTP_CONNECTIONS))
            .expect("static gauge options are valid");
        let closed_by_reason = IntCounterVec::new(
            Opts::new(
                HTTP_CONNECTIONS_CLOSED_TOTAL,
                catalog::help(HTTP_CONNECTIONS_CLOSED_TOTAL),
            ),
            &["reason"],
        )
        .expect("static counter options are valid");
        for reason in CloseReason::ALL {
            closed_by_reason.with_label_values(&[reason.label()]);
        }
        ConnectionMetrics {
            open,
            closed_by_reason,
        }
    }

    /// Counts one connection closed for `reason`.
    pub fn closed(&self, reason: CloseReason) {
        self.closed_by_reason
            .with_label_values(&[reason.label()])
            .inc();
    }
}

/// What a connection is doing, and for how long (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activity {
    Handshake(u64),
    Head(u64),
    /// A response written, waiting for the next request.
    Idle(u64),
    /// A write that has waited this long for the client to read.
    Stalled(u64),
    /// A handler running.
    Busy,
}

impl Activity {
    /// The reason to close a connection doing this now, if it has overrun its allowance.
    fn overrun(self, pressure: bool) -> Option<CloseReason> {
        let allowance = millis(if pressure {
            PRESSURED_ALLOWANCE
        } else {
            ALLOWANCE
        });
        match self {
            Activity::Handshake(t) if t >= allowance => Some(CloseReason::HandshakeTimeout),
            Activity::Head(t) if t >= allowance => Some(CloseReason::HeadTimeout),
            Activity::Idle(t) if t >= allowance => Some(CloseReason::IdleTimeout),
            Activity::Stalled(t) if t >= millis(WRITE_TIMEOUT) => Some(CloseReason::WriteTimeout),
            _ => None,
        }
    }

    /// The order in which connections are taken to make room (lowest first), for one that has
    /// been doing this for at least `grace` milliseconds; `None`: not taken.
    fn reclaim_rank(self, grace: u64) -> Option<u8> {
        match self {
            Activity::Idle(t) if t >= grace => Some(0),
            Activity::Handshake(t) | Activity::Head(t) if t >= grace => Some(1),
            Activity::Stalled(t) if t >= grace.max(millis(RECLAIM_GRACE)) => Some(2),
            _ => None,
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One connection's state, updated by its socket wrapper and its request handler, read by the
/// registry. Times are milliseconds since the registry's start, plus one (0: none).
#[derive(Debug)]
pub struct Conn {
    epoch: Instant,
    opened: u64,
    handshaking: AtomicBool,
    in_handler: AtomicBool,
    requests: AtomicU32,
    /// When the first byte of the current request head arrived.
    head_since: AtomicU64,
    /// When a write first waited for the client, since the last successful write.
    stalled_since: AtomicU64,
    /// The last read, write or handler end.
    last_active: AtomicU64,
    /// The reason it is being closed ([`CloseReason`] as u8), 0 while open.
    closing: AtomicU8,
    close: Notify,
}

impl Conn {
    fn new(epoch: Instant, tls: bool) -> Conn {
        let now = now_ms(epoch);
        Conn {
            epoch,
            opened: now,
            handshaking: AtomicBool::new(tls),
            in_handler: AtomicBool::new(false),
            requests: AtomicU32::new(0),
            head_since: AtomicU64::new(0),
            stalled_since: AtomicU64::new(0),
            last_active: AtomicU64::new(now),
            closing: AtomicU8::new(0),
            close: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        now_ms(self.epoch)
    }

    fn on_read(&self) {
        let now = self.now();
        self.last_active.store(now, Ordering::Relaxed);
        if !self.in_handler.load(Ordering::Relaxed) {
            let _ = self
                .head_since
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn on_write(&self) {
        self.last_active.store(self.now(), Ordering::Relaxed);
        self.stalled_since.store(0, Ordering::Relaxed);
    }

    fn on_write_pending(&self) {
        let now = self.now();
        let _ = self
            .stalled_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The TLS handshake is done; from now on the connection waits for its first request, with
    /// an allowance of its own.
    pub fn handshake_done(&self) {
        self.head_since.store(self.now(), Ordering::Relaxed);
        self.handshaking.store(false, Ordering::Relaxed);
    }

    /// A request's head is complete and its handler starts; returns how many requests this
    /// connection has now had.
    pub fn request_started(&self) -> u32 {
        self.in_handler.store(true, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The handler has produced its response.
    pub fn request_finished(&self) {
        self.last_active.store(self.now(), Ordering::Relaxed);
        self.in_handler.store(false, Ordering::Relaxed);
    }

    /// Requests served on this connection so far.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Resolves when the registry closes this connection; the caller then drops it.
    pub async fn closed(&self) {
        self.close.notified().await;
    }

    fn activity(&self, now: u64) -> Activity {
        let since = |t: u64| now.saturating_sub(t);
        if self.handshaking.load(Ordering::Relaxed) {
            return Activity::Handshake(since(self.opened));
        }
        let stalled = self.stalled_since.load(Ordering::Relaxed);
        if stalled != 0 {
            return Activity::Stalled(since(stalled));
        }
        if self.in_handler.load(Ordering::Relaxed) {
            return Activity::Busy;
        }
        match self.head_since.load(Ordering::Relaxed) {
            0 if self.requests() == 0 => Activity::Head(since(self.opened)),
            0 => Activity::Idle(since(self.last_active.load(Ordering::Relaxed))),
            head => Activity::Head(since(head)),
        }
    }
}

fn now_ms(epoch: Instant) -> u64 {
    millis(epoch.elapsed()) + 1
}

/// The open connections and the rules for closing them.
#[derive(Debug)]
pub struct Registry {
    epoch: Instant,
    cap: usize,
    high_water: usize,
    metrics: ConnectionMetrics,
    inner: Mutex<Inner>,
    /// Signalled whenever a connection's socket has been dropped.
    ended: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// By id, which is opening order: iteration is oldest first.
    conns: BTreeMap<u64, Arc<Conn>>,
    /// Connections not yet told to close.
    live: usize,
}

impl Registry {
    /// A registry admitting up to `cap` connections (at least [`MIN_CONNECTIONS`]), counting
    /// into `metrics`.
    pub fn new(cap: usize, metrics: ConnectionMetrics) -> Arc<Registry> {
        let cap = cap.max(MIN_CONNECTIONS);
        Arc::new(Registry {
            epoch: Instant::now(),
            cap,
            high_water: cap * 3 / 4,
            metrics,
            inner: Mutex::new(Inner::default()),
            ended: Notify::new(),
        })
    }

    /// The most connections served at once.
    pub fn cap(&self) -> usize {
        self.cap
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the map whole (every update is one call).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a connection just accepted and makes room for it: past the high-water mark
    /// another connection is closed, if one may be taken. `None` when over the cap with nothing
    /// to take: the caller drops the new connection.
    pub fn admit(self: &Arc<Registry>, tls: bool) -> Option<Tracker> {
        self.admit_at(tls, now_ms(self.epoch))
    }

    fn admit_at(self: &Arc<Registry>, tls: bool, now: u64) -> Option<Tracker> {
        let conn = Arc::new(Conn::new(self.epoch, tls));
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        if inner.live >= self.high_water {
            let grace = if inner.live >= self.cap {
                0
            } else {
                millis(RECLAIM_GRACE)
            };
            if let Some(victim) = victim(&inner.conns, now, grace) {
                close(&mut inner, &victim, CloseReason::Reclaimed);
            } else if inner.live >= self.cap {
                drop(inner);
                self.metrics.closed(CloseReason::Refused);
                return None;
            }
        }
        inner.conns.insert(id, Arc::clone(&conn));
        inner.live += 1;
        drop(inner);
        self.metrics.open.inc();
        Some(Tracker {
            id,
            conn,
            registry: Arc::clone(self),
        })
    }

    /// Closes one connection to free a file descriptor (accept failed for lack of one); false
    /// when none may be taken.
    pub fn reclaim_one(&self) -> bool {
        let mut inner = self.lock();
        let now = now_ms(self.epoch);
        match victim(&inner.conns, now, 0) {
            Some(victim) => {
                close(&mut inner, &victim, CloseReason::Reclaimed);
                true
            }
            None => false,
        }
    }

    /// Resolves when a connection's socket is next dropped.
    pub fn ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    /// Closes every connection that has overrun its allowance.
    pub fn sweep(&self) {
        self.sweep_at(now_ms(self.epoch));
    }

    fn sweep_at(&self, now: u64) {
        let mut inner = self.lock();
        let pressure = inner.live > self.high_water;
        let overrun: Vec<(Arc<Conn>, CloseReason)> = inner
            .conns
            .values()
            .filter(|c| c.closing.load(Ordering::Relaxed) == 0)
            .filter_map(|c| Some((Arc::clone(c), c.activity(now).overrun(pressure)?)))
            .collect();
        for (conn, reason) in overrun {
            close(&mut inner, &conn, reason);
        }
    }

    /// Runs [`Registry::sweep`] every [`SWEEP_INTERVAL`], forever.
    pub async fn sweep_forever(self: Arc<Registry>) {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.sweep();
        }
    }
}

/// The connection to take to make room: lowest [`Activity::reclaim_rank`], oldest first.
fn victim(conns: &BTreeMap<u64, Arc<Conn>>, now: u64, grace: u64) -> Option<Arc<Conn>> {
    let mut best: Option<(u8, &Arc<Conn>)> = None;
    for conn in conns.values() {
        if conn.closing.load(Ordering::Relaxed) != 0 {
            continue;
        }
        let Some(rank) = conn.activity(now).reclaim_rank(grace) else {
            continue;
        };
        if best.is_none_or(|(r, _)| rank < r) {
            best = Some((rank, conn));
            if rank == 0 {
                break;
            }
        }
    }
    best.map(|(_, c)| Arc::clone(c))
}

/// Tells `conn` to close for `reason` (the first reason given wins).
fn close(inner: &mut Inner, conn: &Conn, reason: CloseReason) {
    if conn
        .closing
        .compare_exchange(0, reason as u8, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        inner.live -= 1;
        conn.close.notify_one();
    }
}

/// A connection's place in the registry: dropping it (when the connection's socket is gone)
/// removes the connection and counts why it closed.
#[derive(Debug)]
pub struct Tracker {
    id: u64,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Tracker {
    /// The connection's state, for its socket wrapper and its handler.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Ends the connection: `natural` is why, unless the registry closed it (its reason wins).
    pub fn end(self, natural: CloseReason) {
        close(&mut self.registry.lock(), &self.conn, natural);
        // Drop does the rest, as it does when the task is dropped without ending here.
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        inner.conns.remove(&self.id);
        // Without a reason by now, the task was dropped (a panic, or the runtime shutting down).
        close(&mut inner, &self.conn, CloseReason::Error);
        drop(inner);
        let code = self.conn.closing.load(Ordering::Relaxed);
        let reason = CloseReason::from_code(code).unwrap_or(CloseReason::Error);
        self.registry.metrics.open.dec();
        self.registry.metrics.closed(reason);
        self.registry.ended.notify_waiters();
    }
}

/// A socket that stamps its connection's read and write progress.
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    /// Wraps `inner`, reporting to `conn`.
    pub fn new(inner: S, conn: Arc<Conn>) -> Tracked<S> {
        Tracked { inner, conn }
    }

    fn wrote(&self, poll: &Poll<io::Result<usize>>) {
        match poll {
            Poll::Ready(Ok(n)) if *n > 0 => self.conn.on_write(),
            Poll::Pending => self.conn.on_write_pending(),
            Poll::Ready(_) => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.on_read();
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        if poll.is_pending() {
            self.conn.on_write_pending();
        }
        poll
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises the soft open-file limit to the hard limit and returns the soft limit now in force
/// (`None` if it cannot be read).
#[allow(
    unsafe_code,
    reason = "getrlimit and setrlimit are C calls, given a pointer to a local struct"
)]
pub fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit for the call's duration.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Some(limit.rlim_cur)
}

/// The connection cap for an open-file limit: the limit less [`FD_RESERVE`], within
/// [`MIN_CONNECTIONS`]..=[`MAX_CONNECTIONS`] (unlimited or unknown: [`MAX_CONNECTIONS`]).
pub fn cap_for(open_file_limit: Option<u64>) -> usize {
    let room = open_file_limit.map_or(u64::MAX, |l| l.saturating_sub(FD_RESERVE));
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn every_reason_has_its_catalog_label() {
        assert_eq!(CloseReason::ALL.len(), CLOSE_REASONS.len());
        let labels: Vec<&str> = CloseReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, CLOSE_REASONS);
        assert_eq!(CloseReason::WriteTimeout.label(), "write_timeout");
        assert_eq!(CloseReason::Error.label(), "error");
    }

    #[test]
    fn allowances_by_activity_shortened_under_pressure() {
        use Activity::*;
        assert_eq!(Head(10 * S - 1).overrun(false), None);
        assert_eq!(Head(10 * S).overrun(false), Some(CloseReason::HeadTimeout));
        assert_eq!(Idle(10 * S).overrun(false), Some(CloseReason::IdleTimeout));
        assert_eq!(
            Handshake(10 * S).overrun(false),
            Some(CloseReason::HandshakeTimeout)
        );
        assert_eq!(Idle(2 * S - 1).overrun(true), None);
        assert_eq!(Idle(2 * S).overrun(true), Some(CloseReason::IdleTimeout));
        assert_eq!(Head(2 * S).overrun(true), Some(CloseReason::HeadTimeout));
        assert_eq!(
            Handshake(2 * S).overrun(true),
            Some(CloseReason::HandshakeTimeout)
        );
        // A stalled write has its own limit, the same under pressure.
        assert_eq!(Stalled(9 * S).overrun(true), None);
        assert_eq!(
            Stalled(10 * S).overrun(false),
            Some(CloseReason::WriteTimeout)
        );
        // A running handler is bounded by the request timeout, not here.
        assert_eq!(Busy.overrun(true), None);
    }

    #[test]
    fn idle_is_taken_first_then_unfinished_then_not_reading_never_busy() {
        use Activity::*;
        // At the cap (no grace).
        assert_eq!(Idle(0).reclaim_rank(0), Some(0));
        assert_eq!(Head(0).reclaim_rank(0), Some(1));
        assert_eq!(Handshake(0).reclaim_rank(0), Some(1));
        assert_eq!(Stalled(S).reclaim_rank(0), Some(2));
        // A write waiting briefly is a client reading slowly, not a client that does not read.
        assert_eq!(Stalled(S - 1).reclaim_rank(0), None);
        assert_eq!(Busy.reclaim_rank(0), None);
        // Below the cap, only what has wasted its place for the grace.
        assert_eq!(Idle(S - 1).reclaim_rank(S), None);
        assert_eq!(Head(S - 1).reclaim_rank(S), None);
        assert_eq!(Idle(S).reclaim_rank(S), Some(0));
        assert_eq!(Stalled(S).reclaim_rank(S), Some(2));
    }

    #[test]
    fn activity_follows_the_socket_and_the_handler() {
        let epoch = Instant::now();
        let conn = Conn::new(epoch, false);
        let later = conn.opened + 5 * S;
        // Nothing sent yet: waiting for the first head since the start.
        assert_eq!(conn.activity(later), Activity::Head(5 * S));
        conn.on_read();
        assert!(matches!(conn.activity(later), Activity::Head(t) if t >= 4 * S));
        assert_eq!(conn.request_started(), 1);
        assert_eq!(conn.activity(later), Activity::Busy);
        conn.request_finished();
        assert!(matches!(conn.activity(later), Activity::Idle(t) if t >= 4 * S));
        conn.on_write_pending();
        assert!(matches!(conn.activity(later), Activity::Stalled(t) if t >= 4 * S));
        conn.on_write();
        assert!(matches!(conn.activity(later), Activity::Idle(_)));
        // Bytes of the next request start a new head.
        conn.on_read();
        assert!(matches!(conn.activity(later), Activity::Head(t) if t >= 4 * S));

        let tls = Conn::new(epoch, true);
        tls.on_read();
        assert_eq!(
            tls.activity(tls.opened + S),
            Activity::Handshake(S),
            "bytes of a handshake are not a head"
        );
        tls.handshake_done();
        let head_from = tls.head_since.load(Ordering::Relaxed);
        assert_eq!(
            tls.activity(head_from + S),
            Activity::Head(S),
            "the first head's allowance starts after the handshake"
        );
    }

    fn closed(m: &ConnectionMetrics, reason: CloseReason) -> u64 {
        m.closed_by_reason
            .with_label_values(&[reason.label()])
            .get()
    }

    fn closing(t: &Tracker) -> Option<CloseReason> {
        CloseReason::from_code(t.conn().closing.load(Ordering::Relaxed))
    }

    #[test]
    fn past_the_high_water_mark_a_new_connection_closes_an_idle_then_the_oldest_unfinished() {
        let metrics = ConnectionMetrics::unregistered();
        let registry = Registry::new(16, metrics.clone());
        assert_eq!((registry.cap(), registry.high_water), (16, 12));
        let conns: Vec<Tracker> = (0..12).map(|_| registry.admit(false).unwrap()).collect();
        assert!(conns.iter().all(|t| closing(t).is_none()), "below the mark");
        for t in &conns[..4] {
            t.conn().request_started();
        }
        conns[6].conn().request_started();
        conns[6].conn().request_finished();
        // Past the mark, a connection that has only just gone idle or opened keeps its place.
        let now = now_ms(registry.epoch);
        let _new = registry.admit(false).unwrap();
        assert!(
            conns.iter().all(|t| closing(t).is_none()),
            "within the grace"
        );

        let later = now + millis(RECLAIM_GRACE);
        let _new = registry.admit_at(false, later).unwrap();
        assert_eq!(
            closing(&conns[6]),
            Some(CloseReason::Reclaimed),
            "idle first"
        );
        let _new = registry.admit_at(false, later).unwrap();
        assert_eq!(
            closing(&conns[4]),
            Some(CloseReason::Reclaimed),
            "then the oldest unfinished; busy ones are never taken"
        );
        assert!(conns[..4].iter().all(|t| closing(t).is_none()));
        assert_eq!(
            metrics.open.get(),
            15,
            "closing ones stay open until dropped"
        );
        drop(conns);
        assert_eq!(metrics.open.get(), 3);
        assert_eq!(closed(&metrics, CloseReason::Reclaimed), 2);
        assert_eq!(closed(&metrics, CloseReason::Error), 10, "dropped unended");
    }

    #[test]
    fn at_the_cap_any_idle_or_unfinished_connection_makes_room() {
        let registry = Registry::new(16, ConnectionMetrics::unregistered());
        let conns: Vec<Tracker> = (0..16).map(|_| registry.admit(false).unwrap()).collect();
        assert!(conns.iter().all(|t| closing(t).is_none()));
        let _new = registry.admit(false).unwrap();
        assert_eq!(closing(&conns[0]), Some(CloseReason::Reclaimed));
        assert!(conns[1..].iter().all(|t| closing(t).is_none()));
    }

    #[test]
    fn over_the_cap_with_only_busy_connections_the_new_one_is_refused() {
        let metrics = ConnectionMetrics::unregistered();
        let registry = Registry::new(16, metrics.clone());
        let busy: Vec<Tracker> = (0..16)
            .map(|_| {
                let t = registry.admit(false).unwrap();
                t.conn().request_started();
                t
            })
            .collect();
        assert!(registry.admit(false).is_none());
        assert_eq!(closed(&metrics, CloseReason::Refused), 1);
        assert!(!registry.reclaim_one());
        assert_eq!(metrics.open.get(), 16);
        // A client that stops reading frees a place.
        busy[3].conn().on_write_pending();
        registry.sweep_at(now_ms(registry.epoch) + S);
        assert!(closing(&busy[3]).is_none(), "a stall is not a timeout yet");
        let t = registry.admit_at(false, now_ms(registry.epoch) + S);
        assert!(t.is_some());
        assert_eq!(closing(&busy[3]), Some(CloseReason::Reclaimed));
    }

    #[test]
    fn the_sweep_closes_what_overran_its_allowance() {
        let metrics = ConnectionMetrics::unregistered();
        let registry = Registry::new(100, metrics.clone());
        let silent = registry.admit(false).unwrap();
        let busy = registry.admit(false).unwrap();
        busy.conn().request_started();
        let handshake = registry.admit(true).unwrap();
        let now = now_ms(registry.epoch);
        registry.sweep_at(now + 9 * S);
        assert!(
            [&silent, &busy, &handshake]
                .iter()
                .all(|t| closing(t).is_none())
        );
        registry.sweep_at(now + 11 * S);
        assert_eq!(closing(&silent), Some(CloseReason::HeadTimeout));
        assert_eq!(closing(&handshake), Some(CloseReason::HandshakeTimeout));
        assert_eq!(closing(&busy), None);
        silent.end(CloseReason::Completed);
        assert_eq!(
            closed(&metrics, CloseReason::HeadTimeout),
            1,
            "the registry's reason wins"
        );
        busy.end(CloseReason::RequestLimit);
        assert_eq!(closed(&metrics, CloseReason::RequestLimit), 1);
        assert_eq!(closed(&metrics, CloseReason::Completed), 0);
        drop(handshake);
        assert_eq!(metrics.open.get(), 0);
        assert_eq!(registry.lock().live, 0);
    }

    #[test]
    fn the_cap_leaves_a_reserve_of_file_descriptors() {
        assert_eq!(cap_for(Some(256)), 256 - FD_RESERVE as usize);
        assert_eq!(cap_for(Some(20)), MIN_CONNECTIONS);
        assert_eq!(cap_for(Some(1 << 20)), MAX_CONNECTIONS);
        assert_eq!(cap_for(Some(u64::MAX)), MAX_CONNECTIONS);
        assert_eq!(cap_for(None), MAX_CONNECTIONS);
    }

    #[test]
    fn reasons_have_distinct_labels_and_codes() {
        for r in CloseReason::ALL {
            assert_eq!(CloseReason::from_code(*r as u8), Some(*r));
        }
        let labels: std::collections::BTreeSet<_> =
            CloseReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), CloseReason::ALL.len());
    }
}

//! HTTP basic auth against bcrypt hashes (`basic_auth_users`).
//!
//! bcrypt is slow on purpose (tens of milliseconds at cost 10, doubling with each step), so:
//! - a hash's cost must lie in [`COSTS`], checked at load: a higher cost would make every login
//!   take seconds to hours (and a cost bcrypt refuses would make every login fail without a word);
//! - verification runs on tokio's blocking pool, never on the (one or two) async workers, at most
//!   [`MAX_CONCURRENT_VERIFY`] at once; the turn is held until the hash is computed, even when the
//!   request that asked has timed out or gone;
//! - the queue for a turn is bounded, so a flood of wrong passwords is answered at once instead of
//!   queued: one client address (an IPv6 address counts by its /64 prefix) may have at most
//!   [`MAX_VERIFY_PER_PEER`] checks waiting or running, more get `429 Too Many Requests`; at most
//!   [`MAX_WAITING_VERIFY`] checks wait in all, more get `503 Service Unavailable`; both carry
//!   `Retry-After: 1` and cost no bcrypt. A flood from one address thus holds at most the running
//!   checks, and a scraper from another address waits for about one check (a scraper sharing the
//!   flood's address, behind the same NAT, is refused with it; a flood from many addresses can
//!   fill the queue, and then a scraper gets a 503 at once rather than a wait that would outlast
//!   its timeout);
//! - a successful `Authorization` header is remembered by its SHA-256, so Prometheus scraping
//!   every few seconds costs one bcrypt per credential, not one per scrape, and never queues;
//! - an unknown user name still costs one bcrypt, against the dearest configured hash (result
//!   discarded), so response times do not tell which user names exist.
//!
//! On shutdown [`BasicAuth::close`] answers the checks still waiting with 503 at once, so that
//! stopping waits for the running checks only.
//!
//! The middleware asks an [`AuthSwitch`] for the users in force at each request: a reload of the
//! web-config replaces them as a whole (checks already running finish against the old ones).
//!
//! `/healthz` and `/readyz` are exempt: kubelet probes cannot easily send credentials, and those
//! endpoints reveal only whether the exporter is up and why it is not ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Paths served without credentials.
pub const EXEMPT_PATHS: &[&str] = &["/healthz", "/readyz"];

/// At most this many remembered credentials; the set is emptied when full, which only costs a
/// bcrypt per credential again.
const CACHE_LIMIT: usize = 256;

/// bcrypt verifications running at once; more wait for a turn.
pub const MAX_CONCURRENT_VERIFY: usize = 2;

/// Checks one client address may have waiting or running at once; more are answered 429.
pub const MAX_VERIFY_PER_PEER: usize = MAX_CONCURRENT_VERIFY;

/// Checks waiting for a turn, from all addresses together; more are answered 503. With the
/// running ones that is five rounds of checks: a fraction of a second at cost 10, about 5 s at the
/// highest cost allowed on a current server core, inside Prometheus's 10 s scrape timeout.
pub const MAX_WAITING_VERIFY: usize = 4 * MAX_CONCURRENT_VERIFY;

/// The bcrypt costs accepted. 4 is bcrypt's minimum; 14 already takes about 1 s per check on a
/// current server core (each step doubles it), and beyond it a scrape waiting behind a few checks
/// would miss Prometheus's 10 s timeout. exporter-toolkit suggests 10.
pub const COSTS: RangeInclusive<u32> = 4..=14;

/// The `WWW-Authenticate` challenge sent with a 401.
pub const CHALLENGE: &str = "Basic realm=\"nvml-exporter\", charset=\"UTF-8\"";

/// Why the configured users cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A user's hash is not a bcrypt hash.
    #[error(
        "basic_auth_users.{user}: not a bcrypt hash ({error}); create one with htpasswd -nBC 10 {user}"
    )]
    NotBcrypt {
        /// The user named in the file.
        user: String,
        /// What bcrypt found wrong.
        error: bcrypt::BcryptError,
    },
    /// A user's hash has a cost outside [`COSTS`].
    #[error(
        "basic_auth_users.{user}: bcrypt cost {cost} is outside {}..={} (each step doubles the time of a login); create a hash with htpasswd -nBC 10 {user}",
        COSTS.start(), COSTS.end()
    )]
    Cost {
        /// The user named in the file.
        user: String,
        /// The cost of the hash.
        cost: u32,
    },
    /// No user at all.
    #[error("basic_auth_users is empty")]
    NoUsers,
}

/// Configured users, the cache of verified headers and the queue for bcrypt turns.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// The configured hash of the highest cost, verified against for unknown names.
    decoy: String,
    verified: Mutex<HashSet<[u8; 32]>>,
    turns: Arc<Semaphore>,
    queue: Arc<Queue>,
}

/// Why a check was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The client's address has [`MAX_VERIFY_PER_PEER`] checks waiting or running.
    Peer,
    /// [`MAX_WAITING_VERIFY`] checks are waiting, or the exporter is stopping.
    Busy,
}

impl BasicAuth {
    /// Checks every hash is a well-formed bcrypt hash of a cost in [`COSTS`]; the error names
    /// the user.
    pub fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, AuthError> {
        let mut decoy: Option<(u32, &String)> = None;
        for (user, hash) in &users {
            let parts =
                bcrypt::HashParts::from_str(hash).map_err(|error| AuthError::NotBcrypt {
                    user: user.clone(),
                    error,
                })?;
            let cost = parts.get_cost();
            if !COSTS.contains(&cost) {
                return Err(AuthError::Cost {
                    user: user.clone(),
                    cost,
                });
            }
            if decoy.is_none_or(|(dearest, _)| cost > dearest) {
                decoy = Some((cost, hash));
            }
        }
        let decoy = decoy
            .map(|(_, hash)| hash.clone())
            .ok_or(AuthError::NoUsers)?;
        Ok(BasicAuth {
            users,
            decoy,
            verified: Mutex::new(HashSet::new()),
            turns: Arc::new(Semaphore::new(MAX_CONCURRENT_VERIFY)),
            queue: Arc::new(Queue::default()),
        })
    }

    /// Answers the checks waiting for a turn, and any asked from now on, with 503; the running
    /// ones finish. Called on shutdown so that stopping does not wait for a queue of bcrypts.
    pub fn close(&self) {
        self.turns.close();
    }

    /// Whether an `Authorization` header value names a configured user with the right password.
    /// Blocking: may run bcrypt, without a turn.
    pub fn check(&self, authorization: &[u8]) -> bool {
        self.remembered(authorization) || self.verify(authorization)
    }

    /// Whether this exact header value was verified before. Cheap: one SHA-256.
    pub fn remembered(&self, authorization: &[u8]) -> bool {
        self.cache().contains(&sha256(authorization))
    }

    /// Verifies on the blocking pool when `peer` may queue and a turn comes; the turn and the
    /// peer's place are held until bcrypt returns, even if this future is dropped first.
    async fn verify_in_turn(
        self: &Arc<Self>,
        peer: IpAddr,
        authorization: Vec<u8>,
    ) -> Result<bool, Refusal> {
        let place = self.queue.enter(peer)?;
        // Only `close` makes this fail.
        let turn = self
            .turns
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Refusal::Busy)?;
        let held = place.running(turn);
        let auth = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let ok = auth.verify(&authorization);
            drop(held);
            ok
        })
        .await
        .map_err(|_| Refusal::Busy)
    }

    /// Runs bcrypt for the header's user (or the decoy) and remembers a success. Blocking.
    fn verify(&self, authorization: &[u8]) -> bool {
        let key = sha256(authorization);
        let Some((user, password)) = parse_basic(authorization) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(hash) => (hash.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        let ok = bcrypt::verify(password.as_bytes(), hash).unwrap_or(false) && known;
        if ok {
            let mut cache = self.cache();
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.insert(key);
        }
        ok
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashSet<[u8; 32]>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The basic auth in force (`None`: every request passes), replaced as a whole when the
/// web-config is reloaded with other users.
#[derive(Debug, Default)]
pub struct AuthSwitch {
    current: Mutex<Option<Arc<BasicAuth>>>,
    /// Set by [`close`](Self::close): a replacement arriving afterwards is closed too.
    closed: std::sync::atomic::AtomicBool,
}

impl AuthSwitch {
    /// Starts with `auth`.
    pub fn new(auth: Option<Arc<BasicAuth>>) -> AuthSwitch {
        AuthSwitch {
            current: Mutex::new(auth),
            closed: Default::default(),
        }
    }

    /// The users in force now.
    pub fn current(&self) -> Option<Arc<BasicAuth>> {
        self.lock().clone()
    }

    /// Puts the users of `auth` in force from the next request on. Nothing turns basic auth off
    /// once it is on: a reload refuses that (see [`crate::reload`]).
    pub fn replace(&self, auth: Arc<BasicAuth>) {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            auth.close();
        }
        *self.lock() = Some(auth);
    }

    /// [`BasicAuth::close`] on the users in force and on any that replace them later.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(auth) = self.current() {
            auth.close();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<BasicAuth>>> {
        // A poisoned lock only means a swap panicked; the value is one Arc.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Who waits for a bcrypt turn: checks per client address (waiting or running) and checks
/// waiting in all. Holds only addresses with a check, so at most
/// `MAX_WAITING_VERIFY + MAX_CONCURRENT_VERIFY` entries.
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    per_peer: HashMap<IpAddr, usize>,
    waiting: usize,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a check from `peer`, or why there is none.
    fn enter(self: &Arc<Self>, peer: IpAddr) -> Result<Place, Refusal> {
        let peer = client_key(peer);
        let mut state = self.lock();
        if state.per_peer.get(&peer).copied().unwrap_or(0) >= MAX_VERIFY_PER_PEER {
            return Err(Refusal::Peer);
        }
        if state.waiting >= MAX_WAITING_VERIFY {
            return Err(Refusal::Busy);
        }
        *state.per_peer.entry(peer).or_default() += 1;
        state.waiting += 1;
        Ok(Place {
            queue: Arc::clone(self),
            peer,
            waiting: true,
        })
    }
}

/// A check's place in the [`Queue`], given back on drop.
#[derive(Debug)]
struct Place {
    queue: Arc<Queue>,
    peer: IpAddr,
    waiting: bool,
}

impl Place {
    /// The check got its turn: it no longer waits, but still counts for its address until the
    /// returned pair is dropped (the place first, then the turn, so that whoever gets the turn
    /// next finds the place given back).
    fn running(mut self, turn: OwnedSemaphorePermit) -> (Place, OwnedSemaphorePermit) {
        self.queue.lock().waiting -= 1;
        self.waiting = false;
        (self, turn)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        if self.waiting {
            state.waiting -= 1;
        }
        if let Some(n) = state.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                state.per_peer.remove(&self.peer);
            }
        }
    }
}

/// The address a client is counted by: IPv4 (also when mapped into IPv6) as is, IPv6 by its /64
/// prefix, the smallest block a host is usually given.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// `Basic base64(user:password)` → (user, password).
fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// axum middleware: 401 with a challenge unless basic auth is off, the path is exempt or the
/// credentials check out; 429 or 503 when the check cannot queue (see the module doc). The
/// client's address comes from the [`ConnectInfo`] extension the server adds; without it all
/// clients count as one.
pub async fn require(State(switch): State<Arc<AuthSwitch>>, req: Request, next: Next) -> Response {
    let Some(auth) = switch.current() else {
        return next.run(req).await;
    };
    if EXEMPT_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    let verdict = match header {
        Some(value) if auth.remembered(&value) => Ok(true),
        Some(value) => auth.verify_in_turn(peer, value).await,
        None => Ok(false),
    };
    let (status, body) = match verdict {
        Ok(true) => return next.run(req).await,
        Ok(false) => (StatusCode::UNAUTHORIZED, "Unauthorized\n"),
        Err(Refusal::Peer) => (
            StatusCode::TOO_MANY_REQUESTS,
            "too many credential checks from this address\n",
        ),
        Err(Refusal::Busy) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many credential checks waiting\n",
        ),
    };
    let mut response = (status, body).into_response();
    let (name, value) = if status == StatusCode::UNAUTHORIZED {
        (header::WWW_AUTHENTICATE, CHALLENGE)
    } else {
        (header::RETRY_AFTER, "1")
    };
    response
        .headers_mut()
        .insert(name, HeaderValue::from_static(value));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> Vec<u8> {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {encoded}").into_bytes()
    }

    fn auth() -> BasicAuth {
        // Cost 4, the minimum, keeps the test fast; the check does not depend on the cost.
        let hash = bcrypt::hash("s3cret:with:colons", 4).unwrap();
        BasicAuth::new(BTreeMap::from([("prometheus".to_string(), hash)])).unwrap()
    }

    /// A well-formed hash of any cost, without the time it takes to compute one.
    fn hash_of_cost(cost: u32) -> String {
        format!("$2y${cost:02}$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW")
    }

    #[test]
    fn right_credentials_pass_and_are_cached() {
        let a = auth();
        assert!(a.check(&header("prometheus", "s3cret:with:colons")));
        assert_eq!(a.cache().len(), 1);
        assert!(a.check(&header("prometheus", "s3cret:with:colons")));
        assert_eq!(a.cache().len(), 1);
    }

    #[test]
    fn wrong_password_unknown_user_and_garbage_fail_and_are_not_cached() {
        let a = auth();
        assert!(!a.check(&header("prometheus", "wrong")));
        // The decoy hash is the real user's, so the real password must not let an unknown in.
        assert!(!a.check(&header("nobody", "s3cret:with:colons")));
        assert!(!a.check(b"Basic !!!"));
        assert!(!a.check(b"Bearer abc"));
        assert!(!a.check(b""));
        assert!(a.cache().is_empty());
    }

    #[test]
    fn a_switch_serves_the_replacement_and_closes_one_that_comes_after_shutdown() {
        let switch = AuthSwitch::new(None);
        assert!(switch.current().is_none());
        let first = Arc::new(auth());
        switch.replace(Arc::clone(&first));
        assert!(Arc::ptr_eq(&switch.current().unwrap(), &first));
        switch.close();
        assert!(first.turns.is_closed());
        // A reload that lands during shutdown must not reopen the queue.
        let second = Arc::new(auth());
        switch.replace(Arc::clone(&second));
        assert!(second.turns.is_closed());
    }

    #[test]
    fn malformed_hash_is_refused_naming_the_user() {
        let e = BasicAuth::new(BTreeMap::from([("alice".to_string(), "plain".to_string())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alice") && e.contains("bcrypt"), "{e}");
    }

    #[test]
    fn costs_outside_the_range_are_refused_naming_the_user() {
        for cost in [31, 99, 15, 3] {
            let users = BTreeMap::from([
                ("alice".to_string(), hash_of_cost(10)),
                ("bob".to_string(), hash_of_cost(cost)),
            ]);
            let e = BasicAuth::new(users).unwrap_err().to_string();
            assert!(
                e.starts_with("basic_auth_users.bob: bcrypt cost ")
                    && e.contains(&cost.to_string())
                    && e.contains("4..=14"),
                "{e}"
            );
        }
        for cost in [4, 10, 14] {
            let users = BTreeMap::from([("alice".to_string(), hash_of_cost(cost))]);
            assert!(BasicAuth::new(users).is_ok(), "cost {cost}");
        }
    }

    #[test]
    fn the_decoy_is_the_dearest_hash() {
        let users = BTreeMap::from([
            ("a".to_string(), hash_of_cost(5)),
            ("b".to_string(), hash_of_cost(12)),
            ("c".to_string(), hash_of_cost(8)),
        ]);
        assert_eq!(BasicAuth::new(users).unwrap().decoy, hash_of_cost(12));
    }

    #[test]
    fn one_address_may_queue_two_checks_and_all_together_eight() {
        let queue = Arc::new(Queue::default());
        let a = IpAddr::from([10, 0, 0, 1]);
        let first = queue.enter(a).unwrap();
        let _second = queue.enter(a).unwrap();
        assert_eq!(queue.enter(a).unwrap_err(), Refusal::Peer);
        // The same client over IPv4-mapped IPv6 is the same address.
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        assert_eq!(queue.enter(mapped).unwrap_err(), Refusal::Peer);
        // A running check still counts for its address, not as waiting.
        let turn = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let running = first.running(turn);
        assert_eq!(queue.enter(a).unwrap_err(), Refusal::Peer);
        drop(running);
        let _third = queue.enter(a).unwrap();
        assert_eq!(queue.lock().waiting, 2);

        let mut others = Vec::new();
        for i in 0..MAX_WAITING_VERIFY - 2 {
            others.push(queue.enter(IpAddr::from([10, 0, 1, i as u8])).unwrap());
        }
        let b = IpAddr::from([10, 0, 2, 1]);
        assert_eq!(queue.enter(b).unwrap_err(), Refusal::Busy);
        others.pop();
        let _b = queue.enter(b).unwrap();
    }

    #[test]
    fn ipv6_clients_count_by_their_64_prefix() {
        let queue = Arc::new(Queue::default());
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_net: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_net: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _p = (queue.enter(one).unwrap(), queue.enter(same_net).unwrap());
        assert_eq!(queue.enter(one).unwrap_err(), Refusal::Peer);
        assert!(queue.enter(other_net).is_ok());
    }

    #[test]
    fn dropped_places_are_given_back() {
        let queue = Arc::new(Queue::default());
        let a = IpAddr::from([10, 0, 0, 1]);
        for _ in 0..10 {
            let p = queue.enter(a).unwrap();
            let _q = queue.enter(a).unwrap();
            drop(p);
        }
        let state = queue.lock();
        assert!(state.per_peer.is_empty() && state.waiting == 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_turn_is_held_until_bcrypt_returns_even_when_the_request_gives_up() {
        let a = Arc::new(
            BasicAuth::new(BTreeMap::from([("u".to_string(), hash_of_cost(12))])).unwrap(),
        );
        let peer = IpAddr::from([10, 0, 0, 1]);
        let asking = {
            let a = Arc::clone(&a);
            tokio::spawn(async move { a.verify_in_turn(peer, header("u", "x")).await })
        };
        // Wait until the check runs, then drop the request as the request timeout would.
        while a.turns.available_permits() == MAX_CONCURRENT_VERIFY {
            tokio::task::yield_now().await;
        }
        asking.abort();
        assert!(asking.await.unwrap_err().is_cancelled());
        assert_eq!(
            a.turns.available_permits(),
            MAX_CONCURRENT_VERIFY - 1,
            "the turn is still held while bcrypt runs"
        );
        // And given back when it returns.
        let _turn = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            a.turns
                .clone()
                .acquire_many_owned(MAX_CONCURRENT_VERIFY as u32),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(a.queue.lock().per_peer.is_empty());
    }

    #[tokio::test]
    async fn closed_checks_are_refused_at_once() {
        let a = Arc::new(auth());
        a.close();
        let verdict = a
            .verify_in_turn(IpAddr::from([10, 0, 0, 1]), header("prometheus", "x"))
            .await;
        assert_eq!(verdict, Err(Refusal::Busy));
        assert!(a.queue.lock().per_peer.is_empty());
    }
}

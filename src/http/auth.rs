//! HTTP basic auth against bcrypt hashes (`basic_auth_users`).
//!
//! bcrypt is slow on purpose (tens of milliseconds at cost 10), so:
//! - verification runs on tokio's blocking pool, never on the (one or two) async workers, and at most
//!   [`MAX_CONCURRENT_VERIFY`] at once, so a flood of wrong passwords queues instead of taking
//!   every core and hundreds of threads;
//! - a successful `Authorization` header is remembered by its SHA-256, so Prometheus scraping
//!   every few seconds costs one bcrypt per credential, not one per scrape;
//! - an unknown user name still costs one bcrypt (against a configured user's hash, result
//!   discarded), so response times do not tell which user names exist.
//!
//! `/healthz` and `/readyz` are exempt: kubelet probes cannot easily send credentials, and those
//! endpoints reveal only whether the exporter is up and why it is not ready.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

/// Paths served without credentials.
pub const EXEMPT_PATHS: &[&str] = &["/healthz", "/readyz"];

/// At most this many remembered credentials; the set is emptied when full, which only costs a
/// bcrypt per credential again.
const CACHE_LIMIT: usize = 256;

/// bcrypt verifications running at once; more wait for a turn.
pub const MAX_CONCURRENT_VERIFY: usize = 2;

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
    /// No user at all.
    #[error("basic_auth_users is empty")]
    NoUsers,
}

/// Configured users and the cache of verified headers.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// A configured user's hash, verified against for unknown names.
    decoy: String,
    verified: Mutex<HashSet<[u8; 32]>>,
    turns: Arc<tokio::sync::Semaphore>,
}

impl BasicAuth {
    /// Checks every hash is a well-formed bcrypt hash; the error names the user.
    pub fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, AuthError> {
        for (user, hash) in &users {
            bcrypt::HashParts::from_str(hash).map_err(|error| AuthError::NotBcrypt {
                user: user.clone(),
                error,
            })?;
        }
        let decoy = users.values().next().cloned().ok_or(AuthError::NoUsers)?;
        Ok(BasicAuth {
            users,
            decoy,
            verified: Mutex::new(HashSet::new()),
            turns: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_VERIFY)),
        })
    }

    /// Whether an `Authorization` header value names a configured user with the right password.
    /// Blocking: may run bcrypt.
    pub fn check(&self, authorization: &[u8]) -> bool {
        self.remembered(authorization) || self.verify(authorization)
    }

    /// Whether this exact header value was verified before. Cheap: one SHA-256.
    pub fn remembered(&self, authorization: &[u8]) -> bool {
        self.cache().contains(&sha256(authorization))
    }

    /// Runs bcrypt for the header's user (or a decoy) and remembers a success. Blocking.
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

/// axum middleware: 401 with a challenge unless the path is exempt or the credentials check out.
pub async fn require(State(auth): State<Arc<BasicAuth>>, req: Request, next: Next) -> Response {
    if EXEMPT_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let ok = match header {
        Some(value) if auth.remembered(&value) => true,
        Some(value) => {
            // The semaphore is never closed, so this only waits for a turn.
            let _turn = auth.turns.clone().acquire_owned().await;
            let auth = auth.clone();
            tokio::task::spawn_blocking(move || auth.verify(&value))
                .await
                .unwrap_or(false)
        }
        None => false,
    };
    if ok {
        return next.run(req).await;
    }
    let mut response = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(CHALLENGE),
    );
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
    fn malformed_hash_is_refused_naming_the_user() {
        let e = BasicAuth::new(BTreeMap::from([("alice".to_string(), "plain".to_string())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alice") && e.contains("bcrypt"), "{e}");
    }
}

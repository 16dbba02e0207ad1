//! The one HTTPS client of the kubelet's and the API server's REST APIs: the kubelet's `/pods`
//! ([`super::pods`]), the DRA driver's ResourceSlices ([`super::slices`]) and the node's status
//! and Events ([`super::node_condition`]) all call through a [`RestClient`], and nothing else in
//! the exporter builds an HTTP client or sets a bearer token.
//!
//! Each call
//! - reads the service account's token again ([`read_token`], bounded): projected tokens rotate;
//! - verifies the peer against its CA file (read when the client is made, and again after a
//!   failed call), or not at all for a kubelet with `--kubelet-insecure-tls`; talks to it
//!   directly (no proxy from the environment) and follows no redirect, since the request carries
//!   the token;
//! - builds its URL from segments ([`RestClient::url`]), each percent-encoded whole, so that no
//!   name (a node's, a namespace's) can add a path segment, a query or a fragment;
//! - gives up after `--kubernetes-timeout`, connecting included;
//! - reads the answer through one bounded reader ([`read_bounded`]): at most the cap the caller
//!   gives for a successful answer, [`ERROR_BODY_BYTES`] of an error's (enough for the message
//!   the log shows; the rest is never read);
//! - fails with one error type, [`RestError`], carrying the reason the error counter counts
//!   (each caller's [`Reasons`]) and a message that says what to change, with the RBAC hint for
//!   a refused token written here once.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, StatusCode, Uri};
use reqwest::{Method, Url};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;

use crate::certificates::{self, AnyCertificate};
use crate::files::read_bounded_file;
use crate::sample::KubeletError;

/// The most read of an error answer: the API server's `Status` and the kubelet's text say what
/// was refused in a few hundred bytes; the rest of a larger answer is never read.
pub const ERROR_BODY_BYTES: usize = 4 * 1024;

/// The most of an error answer shown in a message.
const ERROR_TEXT_CHARS: usize = 512;

/// The largest token file read: a service account's token is about 1 KiB.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Which server a client calls: what its messages call it and which options configure it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The kubelet's HTTPS API (`--kubelet-url`, `--kubelet-ca-file`).
    Kubelet,
    /// The API server (`--kubernetes-api-url`, `--kubernetes-api-ca-file`).
    ApiServer,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Kubelet => "the kubelet",
            Peer::ApiServer => "the API server",
        }
    }

    fn ca_option(self) -> &'static str {
        match self {
            Peer::Kubelet => "--kubelet-ca-file",
            Peer::ApiServer => "--kubernetes-api-ca-file",
        }
    }
}

/// The reasons a caller's failures are counted under in `nvml_exporter_kubernetes_errors_total`.
#[derive(Debug, Clone, Copy)]
pub struct Reasons {
    /// No connection, or one that failed.
    pub unavailable: KubeletError,
    /// No answer within `--kubernetes-timeout`.
    pub timeout: KubeletError,
    /// The TLS handshake or the CA file.
    pub tls: KubeletError,
    /// The token file, or a 401 or 403.
    pub auth: KubeletError,
    /// A 409.
    pub conflict: KubeletError,
    /// Any other answer that is not a success.
    pub http: KubeletError,
    /// A successful answer larger than the caller's cap.
    pub too_large: KubeletError,
}

/// What a caller needs granted when its token is refused, for the one RBAC hint.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    /// What the ClusterRole must grant, e.g. "patch on nodes/status".
    pub rules: &'static str,
    /// The manifest that grants it.
    pub manifest: &'static str,
}

/// A call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RestError {
    /// The error counter's reason, from the caller's [`Reasons`].
    pub reason: KubeletError,
    /// What went wrong and, where known, what to change.
    pub message: String,
}

/// A client of one peer, with the service account's token.
#[derive(Debug)]
pub struct RestClient {
    peer: Peer,
    base: Url,
    /// `None` only for a kubelet with `--kubelet-insecure-tls`.
    ca_file: Option<PathBuf>,
    token_file: PathBuf,
    timeout: Duration,
    reasons: Reasons,
    grant: Grant,
    /// Made (reading the CA file) on the first call and again after a failed one.
    http: Option<reqwest::Client>,
}

impl RestClient {
    /// A client of `peer` at `base` (`base`'s path, if any, prefixes every call's), verified
    /// against `ca_file`, sending the token of `token_file`, counting under `reasons`. Touches
    /// neither the network nor a file until the first call.
    pub fn new(
        peer: Peer,
        base: &Uri,
        ca_file: Option<PathBuf>,
        token_file: PathBuf,
        timeout: Duration,
        reasons: Reasons,
        grant: Grant,
    ) -> RestClient {
        // An `http::Uri` the options accepted is an absolute URL, which `Url` parses too.
        let base = Url::parse(&base.to_string()).expect("an absolute URL");
        RestClient {
            peer,
            base,
            ca_file,
            token_file,
            timeout,
            reasons,
            grant,
            http: None,
        }
    }

    /// The URL of `segments` under the base URL, each percent-encoded as one segment (a `/`, `?`
    /// or `#` in one stays inside it), with `query`'s pairs form-encoded. A segment that is
    /// empty, `.` or `..` would address another path: it is refused.
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Result<Url, RestError> {
        if let Some(bad) = segments.iter().find(|s| matches!(**s, "" | "." | "..")) {
            return Err(RestError {
                reason: self.reasons.http,
                message: format!("{bad:?} is not a name that can go into a URL path"),
            });
        }
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an https URL has a path")
            .pop_if_empty()
            .extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// GETs `url` and returns its body, at most `cap` bytes (more fails under
    /// [`Reasons::too_large`]).
    pub async fn get(&mut self, url: &Url, cap: usize) -> Result<Vec<u8>, RestError> {
        self.call(Method::GET, url, None, cap).await
    }

    /// Sends `body` (JSON of `content_type`) with `method` to `url`. A success's answer is not
    /// read: its status says all a write needs.
    pub async fn send(
        &mut self,
        method: Method,
        url: &Url,
        content_type: &'static str,
        body: Vec<u8>,
    ) -> Result<(), RestError> {
        self.call(method, url, Some((content_type, body)), 0)
            .await
            .map(drop)
    }

    async fn call(
        &mut self,
        method: Method,
        url: &Url,
        body: Option<(&'static str, Vec<u8>)>,
        cap: usize,
    ) -> Result<Vec<u8>, RestError> {
        let what = format!("{method} {url}");
        let result =
            match tokio::time::timeout(self.timeout, self.exchange(method, url, body, cap)).await {
                Ok(result) => result,
                Err(_elapsed) => Err(RestError {
                    reason: self.reasons.timeout,
                    message: format!(
                        "no answer within {} (--kubernetes-timeout)",
                        humantime::format_duration(self.timeout)
                    ),
                }),
            };
        result.map_err(|e| {
            // Whatever state the connection is in (a half-read answer, a stalled server), and
            // whatever changed in the CA file, the next call starts afresh.
            self.http = None;
            RestError {
                reason: e.reason,
                message: format!("{what}: {}", e.message),
            }
        })
    }

    async fn exchange(
        &mut self,
        method: Method,
        url: &Url,
        body: Option<(&'static str, Vec<u8>)>,
        cap: usize,
    ) -> Result<Vec<u8>, RestError> {
        // Read before connecting: a missing token is a configuration error, not the peer's.
        let token = read_token(&self.token_file)
            .await
            .map_err(|e| self.fail(self.reasons.auth, e))?;
        let http = match &self.http {
            Some(http) => http.clone(),
            None => {
                let http = self.client()?;
                self.http.insert(http).clone()
            }
        };
        let mut request = http
            .request(method, url.clone())
            .header(ACCEPT, "application/json")
            .header(AUTHORIZATION, token);
        if let Some((content_type, body)) = body {
            request = request.header(CONTENT_TYPE, content_type).body(body);
        }
        // A keep-alive connection the peer closed just as it is reused is no failure: reqwest
        // sends a request that had not gone out again, on a new connection.
        let mut response = request.send().await.map_err(|e| self.send_failed(&e))?;
        let status = response.status();
        if !status.is_success() {
            let text = match read_bounded(&mut response, ERROR_BODY_BYTES).await {
                Ok(Read::Whole(body) | Read::Cut(body)) => body,
                Err(_) => Vec::new(),
            };
            return Err(self.refused(status, &text));
        }
        if cap == 0 {
            return Ok(Vec::new());
        }
        match read_bounded(&mut response, cap).await {
            Ok(Read::Whole(body)) => Ok(body),
            Ok(Read::Cut(_)) => Err(self.fail(
                self.reasons.too_large,
                format!("the answer is larger than {}", bytes_text(cap)),
            )),
            Err(e) => Err(self.fail(self.reasons.unavailable, causes(&e))),
        }
    }

    fn fail(&self, reason: KubeletError, message: impl Into<String>) -> RestError {
        RestError {
            reason,
            message: message.into(),
        }
    }

    /// An HTTP/1.1 client that verifies the peer as its CA file says (read now), and talks to
    /// it directly: no proxy from the environment, no redirect followed.
    fn client(&self) -> Result<reqwest::Client, RestError> {
        let host = self.base.host_str().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Err(e) = ServerName::try_from(host) {
            return Err(self.fail(
                self.reasons.tls,
                format!("{host:?} is not a TLS server name: {e}"),
            ));
        }
        let tls = client_tls(self.ca_file.as_deref(), self.peer.ca_option())
            .map_err(|e| self.fail(self.reasons.tls, e))?;
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .http1_only()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                self.fail(
                    self.reasons.tls,
                    format!("the HTTPS client: {}", causes(&e)),
                )
            })
    }

    /// A request that got no answer: refused by TLS, or no connection, or one that failed.
    fn send_failed(&self, e: &reqwest::Error) -> RestError {
        if let Some(tls) = tls_cause(e) {
            let mut message = format!("TLS handshake with {}: {tls}", self.peer.name());
            if let Some(ca) = &self.ca_file {
                message.push_str(&format!(
                    "; is its certificate signed by {} {} and valid for this host?",
                    self.peer.ca_option(),
                    ca.display()
                ));
                if self.peer == Peer::Kubelet {
                    message.push_str(
                        " Kubelets often serve a self-signed certificate: then pass \
                         --kubelet-insecure-tls",
                    );
                }
            }
            return self.fail(self.reasons.tls, message);
        }
        if e.is_connect() {
            // The innermost cause says it: "Connection refused", "failed to lookup address".
            let cause = chain(e).last().unwrap_or(e);
            let host = self.base.host_str().unwrap_or_default();
            let port = self.base.port_or_known_default().unwrap_or(443);
            return self.fail(
                self.reasons.unavailable,
                format!(
                    "connecting to {} at {host}:{port}: {cause}",
                    self.peer.name()
                ),
            );
        }
        self.fail(self.reasons.unavailable, causes(e))
    }

    /// A non-2xx answer, with the start of its text (the API server's `Status` message, the
    /// kubelet's "Forbidden (user=…, verb=get, resource=nodes, subresource=proxy)"): it says who
    /// was refused what.
    fn refused(&self, status: StatusCode, body: &[u8]) -> RestError {
        let text: String = String::from_utf8_lossy(body)
            .chars()
            .take(ERROR_TEXT_CHARS)
            .collect();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut message = format!("{} answered {status}", self.peer.name());
        if !text.is_empty() {
            message.push_str(&format!(" ({text})"));
        }
        let rbac = format!(
            "the exporter's service account needs a ClusterRole granting {}, bound to it: see {}",
            self.grant.rules, self.grant.manifest
        );
        let reason = match status {
            StatusCode::UNAUTHORIZED => {
                let webhook = match self.peer {
                    // The kubelet checks tokens only with webhook authentication.
                    Peer::Kubelet => {
                        " (it needs webhook token authentication, the default of managed clusters)"
                    }
                    Peer::ApiServer => "",
                };
                message.push_str(&format!(
                    "; {} did not accept the token from --kubelet-token-file {}{webhook}, and {rbac}",
                    self.peer.name(),
                    self.token_file.display()
                ));
                self.reasons.auth
            }
            StatusCode::FORBIDDEN => {
                message.push_str(&format!("; {rbac}"));
                self.reasons.auth
            }
            StatusCode::CONFLICT => self.reasons.conflict,
            _ => self.reasons.http,
        };
        self.fail(reason, message)
    }
}

/// What [`read_bounded`] read.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The whole body.
    Whole(Vec<u8>),
    /// The first `cap` bytes of a longer body; the rest was not read.
    Cut(Vec<u8>),
}

/// Reads `response`'s body up to `cap` bytes: a body that declares a longer length is cut before
/// anything is read, and one that grows past the cap is cut as soon as it does, so that no
/// answer makes the exporter hold more than `cap` bytes of it.
pub async fn read_bounded(
    response: &mut reqwest::Response,
    cap: usize,
) -> Result<Read, reqwest::Error> {
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Ok(Read::Cut(Vec::new()));
    }
    // Reserved at the cap so that the buffer never moves (and is never held twice) while it
    // grows: its pages become resident only as the answer fills them.
    let mut body = Vec::with_capacity(cap);
    while let Some(chunk) = response.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok(Read::Cut(body));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Read::Whole(body))
}

/// "32 MiB", "4 KiB".
fn bytes_text(n: usize) -> String {
    if n >= 1024 * 1024 {
        format!("{} MiB", n / (1024 * 1024))
    } else {
        format!("{} KiB", n / 1024)
    }
}

/// A TLS client configuration trusting the CA bundle at `ca_file` (`option` names it in the
/// error), or, with `None`, any certificate (`--kubelet-insecure-tls`, as metrics-server's flag
/// of the same name).
fn client_tls(ca_file: Option<&Path>, option: &str) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match ca_file {
        Some(ca_file) => {
            let roots = certificates::read_roots(ca_file)
                .map_err(|e| format!("{option} {}: {e}", ca_file.display()))?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(AnyCertificate::of_servers(&provider))
            .with_no_client_auth(),
    };
    Ok(config)
}

/// The rustls error among `e`'s causes: what refused the handshake, if TLS did.
fn tls_cause(e: &reqwest::Error) -> Option<&rustls::Error> {
    let mut cause = e.source();
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // The TLS stream reports rustls's error inside I/O errors, whose `source` skips the
        // error they wrap.
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(wrapped) => Some(wrapped),
            None => c.source(),
        };
    }
    None
}

/// What failed, from hyper's error on ("connection closed before message completed"): the levels
/// reqwest adds above it only repeat that the request or its body failed, with the URL.
fn causes(e: &reqwest::Error) -> String {
    let first = chain(e).find(|c| c.is::<hyper::Error>()).unwrap_or(e);
    chain(first)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

/// `e` and its sources, outermost first.
fn chain<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&c| c.source())
}

/// The `Authorization` header from the token file, read on a blocking thread with
/// [`read_bounded_file`]'s bounds: a FIFO or a device such as `/dev/zero` is an error, found
/// without waiting for a writer or reading past [`MAX_TOKEN_BYTES`], and a slow file system
/// stalls no task of the runtime. The error names the option and the file.
pub async fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let fail = |what: String| format!("--kubelet-token-file {}: {what}", path.display());
    let owned = path.to_owned();
    let bytes = tokio::task::spawn_blocking(move || read_bounded_file(&owned, MAX_TOKEN_BYTES))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e| fail(e.to_string()))?;
    let token = std::str::from_utf8(&bytes)
        .map_err(|_| fail("the token is not text".into()))?
        .trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| fail("the token has characters a header cannot carry".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests;

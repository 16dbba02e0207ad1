//! The kubelet's pod list (`GET <kubelet>/pods`): how a process's cgroup is named.
//!
//! A process's cgroup path gives its pod UID and container runtime ID, but the pod-resources API
//! has no UIDs. The kubelet's own HTTPS API answers `/pods` with a v1 `PodList` of the pods it runs
//! (the endpoint node agents use), which [`super::pod_list`] reads keeping only what attribution
//! needs.
//!
//! [`PodsClient`] calls it with the service account's bearer token, re-read on every call because
//! projected tokens rotate. The kubelet's serving certificate is verified against a CA file, or not
//! at all with `--kubelet-insecure-tls` (kubelets often serve a self-signed certificate). The
//! HTTP client (reqwest, on rustls with the ring provider) keeps one HTTP/1.1 keep-alive
//! connection between calls and reconnects when the kubelet closes it; after a failed call the
//! client is made anew, which re-reads the CA file. Every failure carries the `pods_*` reason it
//! is counted under in `nvml_exporter_kubernetes_errors_total`, and a message that says what to
//! fix.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::header::{ACCEPT, AUTHORIZATION};
use http::{HeaderValue, StatusCode, Uri};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;

use crate::certificates::{self, AnyCertificate};
use crate::files::read_bounded_file;
use crate::sample::KubeletError;

use super::pod_list::{KubeletPods, parse_pod_list_copying};
use super::{KubernetesOptions, PodsOptions};

/// The largest `/pods` answer read: room for the kubelet's default 110 pods each at the API
/// server's 256 KiB limit on annotations (27.5 MiB) and their specs, and a bound on what a
/// misbehaving endpoint can make the exporter buffer.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The error reasons of `/pods` calls, counted only when the pod list is fetched.
pub const REASONS: &[KubeletError] = &[
    KubeletError::PodsUnavailable,
    KubeletError::PodsTimeout,
    KubeletError::PodsTls,
    KubeletError::PodsAuth,
    KubeletError::PodsHttp,
    KubeletError::PodsParse,
];

/// What to grant when the kubelet refuses the token, repeated in every 401/403 message.
const RBAC_FIX: &str = "the exporter's service account needs a ClusterRole granting `get` on \
    `nodes/proxy` (or `nodes/pods` on kubelets with fine-grained authorization), bound to it: \
    see deploy/kubernetes/processes";

/// A `/pods` call that did not return a pod list.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PodsError {
    /// The error counter's reason (one of [`REASONS`]).
    pub reason: KubeletError,
    /// What went wrong and, where known, what to change.
    pub message: String,
}

impl PodsError {
    fn new(reason: KubeletError, message: impl Into<String>) -> PodsError {
        PodsError {
            reason,
            message: message.into(),
        }
    }
}

/// A client of one kubelet's `/pods`.
#[derive(Debug)]
pub struct PodsClient {
    /// `<kubelet-url>/pods`.
    url: Uri,
    token_file: PathBuf,
    /// `None` with `--kubelet-insecure-tls`.
    ca_file: Option<PathBuf>,
    timeout: Duration,
    /// The HTTP client, whose pool keeps the keep-alive connection between calls. Made (reading
    /// the CA file) on the first call and again after a failed one.
    http: Option<reqwest::Client>,
    /// The labels and annotations copied ([`PodsOptions::copied`]).
    copied: Vec<(String, bool, String)>,
}

impl PodsClient {
    /// A client for the kubelet of `pods` (`--kubelet-*`), with the token file and timeout of
    /// `options`. Touches neither the network nor the files until the first call.
    pub fn new(pods: &PodsOptions, options: &KubernetesOptions) -> PodsClient {
        PodsClient {
            url: pods_url(&pods.url),
            token_file: options.token_file.clone(),
            ca_file: pods.ca_file.clone(),
            timeout: options.timeout,
            http: None,
            copied: pods.copied.clone(),
        }
    }

    /// The URL called.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// Fetches and parses the pod list, giving up after the timeout (connecting included).
    pub async fn fetch(&mut self) -> Result<KubeletPods, PodsError> {
        let result = match tokio::time::timeout(self.timeout, self.call()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(PodsError::new(
                KubeletError::PodsTimeout,
                format!(
                    "GET {}: no answer within {} (--kubernetes-timeout)",
                    self.url,
                    humantime::format_duration(self.timeout)
                ),
            )),
        };
        if result.is_err() {
            // Whatever state the connection is in (a half-read answer, a stalled server), and
            // whatever changed in the CA file, the next call starts afresh.
            self.http = None;
        }
        result
    }

    async fn call(&mut self) -> Result<KubeletPods, PodsError> {
        // Read before connecting: a missing token is a configuration error, not a kubelet one.
        let token = read_token(&self.token_file).await?;
        let http = match &self.http {
            Some(http) => http.clone(),
            None => {
                let http = self.client()?;
                self.http.insert(http).clone()
            }
        };
        // A keep-alive connection the kubelet closed just as it is reused is no kubelet failure:
        // reqwest sends a request that had not gone out again, on a new connection.
        let mut response = http
            .get(self.url.to_string())
            .header(ACCEPT, "application/json")
            .header(AUTHORIZATION, token)
            .send()
            .await
            .map_err(|e| self.send_failed(&e))?;
        let status = response.status();
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(self.too_large());
        }
        // Reserved at the cap so that the buffer never moves (and is never held twice) while
        // it grows: its pages become resident only as the answer fills them.
        let mut body = Vec::with_capacity(MAX_BODY_BYTES);
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unavailable(&e))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(self.too_large());
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(self.refused(status, &body));
        }
        parse_pod_list_copying(&body, &self.copied).map_err(|e| {
            PodsError::new(
                KubeletError::PodsParse,
                format!("GET {}: the answer is not a pod list: {e}", self.url),
            )
        })
    }

    /// An HTTP/1.1 client that verifies the kubelet as `--kubelet-ca-file` (read now) or
    /// `--kubelet-insecure-tls` say, and talks to it directly: no proxy from the environment, no
    /// redirect followed.
    fn client(&self) -> Result<reqwest::Client, PodsError> {
        let host = self.host();
        if let Err(e) = ServerName::try_from(host) {
            return Err(PodsError::new(
                KubeletError::PodsTls,
                format!(
                    "--kubelet-url {}: {host:?} is not a TLS server name: {e}",
                    self.url
                ),
            ));
        }
        reqwest::Client::builder()
            .tls_backend_preconfigured(self.tls_config()?)
            .http1_only()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                PodsError::new(
                    KubeletError::PodsTls,
                    format!("the HTTPS client for {}: {}", self.url, causes(&e)),
                )
            })
    }

    fn tls_config(&self) -> Result<ClientConfig, PodsError> {
        client_tls(self.ca_file.as_deref(), "--kubelet-ca-file")
            .map_err(|e| PodsError::new(KubeletError::PodsTls, e))
    }

    /// The kubelet's host, without the brackets of an IPv6 literal.
    fn host(&self) -> &str {
        let host = self.url.host().unwrap_or_default();
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// A request that got no answer: refused by TLS, or no connection, or one that failed.
    fn send_failed(&self, e: &reqwest::Error) -> PodsError {
        if let Some(tls) = tls_cause(e) {
            return self.handshake_failed(tls);
        }
        if e.is_builder() {
            return PodsError::new(
                KubeletError::PodsHttp,
                format!("GET {}: {}", self.url, causes(e)),
            );
        }
        if e.is_connect() {
            // The innermost cause says it: "Connection refused", "failed to lookup address".
            let cause = chain(e).last().unwrap_or(e);
            let port = self.url.port_u16().unwrap_or(443);
            return PodsError::new(
                KubeletError::PodsUnavailable,
                format!(
                    "connecting to the kubelet at {}:{port}: {cause}",
                    self.host()
                ),
            );
        }
        self.unavailable(e)
    }

    fn handshake_failed(&self, e: &rustls::Error) -> PodsError {
        let hint = match &self.ca_file {
            Some(ca) => format!(
                "; is the kubelet's serving certificate signed by --kubelet-ca-file {} and valid \
                 for this host? Kubelets often serve a self-signed certificate: then pass \
                 --kubelet-insecure-tls",
                ca.display()
            ),
            None => String::new(),
        };
        PodsError::new(
            KubeletError::PodsTls,
            format!("TLS handshake with the kubelet at {}: {e}{hint}", self.url),
        )
    }

    fn unavailable(&self, e: &reqwest::Error) -> PodsError {
        PodsError::new(
            KubeletError::PodsUnavailable,
            format!("GET {}: {}", self.url, causes(e)),
        )
    }

    fn too_large(&self) -> PodsError {
        PodsError::new(
            KubeletError::PodsParse,
            format!(
                "GET {}: the answer is larger than {} MiB",
                self.url,
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        )
    }

    /// A non-2xx answer. The kubelet's body is a short text ("Forbidden (user=…, verb=get,
    /// resource=nodes, subresource=proxy)") that says who was refused what: worth logging.
    fn refused(&self, status: StatusCode, body: &[u8]) -> PodsError {
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut message = format!("GET {}: the kubelet answered {status}", self.url);
        if !text.is_empty() {
            message.push_str(&format!(" ({text})"));
        }
        let reason = match status {
            StatusCode::UNAUTHORIZED => {
                message.push_str(&format!(
                    "; the kubelet did not accept the token from --kubelet-token-file {} (it \
                     needs webhook token authentication, the default of managed clusters), and \
                     {RBAC_FIX}",
                    self.token_file.display()
                ));
                KubeletError::PodsAuth
            }
            StatusCode::FORBIDDEN => {
                message.push_str(&format!("; {RBAC_FIX}"));
                KubeletError::PodsAuth
            }
            _ => KubeletError::PodsHttp,
        };
        PodsError::new(reason, message)
    }
}

/// A TLS client configuration trusting the CA bundle at `ca_file` (`option` names it in the
/// error), or, with `None`, any certificate (`--kubelet-insecure-tls`, as metrics-server's flag
/// of the same name).
pub(super) fn client_tls(ca_file: Option<&Path>, option: &str) -> Result<ClientConfig, String> {
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

/// An HTTPS client of the API server trusting the CA bundle at `ca_file` (`option` names it in
/// the error): no proxy, no redirects (the request carries a bearer token).
pub(super) fn https_client(ca_file: &Path, option: &str) -> Result<reqwest::Client, String> {
    let tls = client_tls(Some(ca_file), option)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("the HTTPS client: {}", causes(&e)))
}

/// The rustls error among `e`'s causes: what refused the handshake, if TLS did.
pub(super) fn tls_cause(e: &reqwest::Error) -> Option<&rustls::Error> {
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
pub(super) fn causes(e: &reqwest::Error) -> String {
    let first = chain(e).find(|c| c.is::<hyper::Error>()).unwrap_or(e);
    chain(first)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

/// `e` and its sources, outermost first.
pub(super) fn chain<'a>(
    e: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&c| c.source())
}

/// `https://host:port[/prefix]` → `https://host:port[/prefix]/pods`.
fn pods_url(base: &Uri) -> Uri {
    let path = format!("{}/pods", base.path().trim_end_matches('/'));
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(path.parse().expect("a URL path with /pods appended"));
    Uri::from_parts(parts).expect("the URL with only its path changed")
}

/// The largest token file read: a service account's token is about 1 KiB.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The `Authorization` header from the token file, read on a blocking thread with
/// [`read_bounded_file`]'s bounds: a FIFO or a device such as `/dev/zero` is an error, found
/// without waiting for a writer or reading past [`MAX_TOKEN_BYTES`], and a slow file system
/// stalls no task of the runtime.
pub(super) async fn read_token(path: &Path) -> Result<HeaderValue, PodsError> {
    let fail = |what: String| {
        PodsError::new(
            KubeletError::PodsAuth,
            format!("--kubelet-token-file {}: {what}", path.display()),
        )
    };
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
mod tests {
    use super::*;

    /// A TLS server on 127.0.0.1 that reads one request, writes `answer` and closes; the
    /// `--kubelet-insecure-tls` client that calls it, with its token file.
    async fn server_answering(answer: &'static [u8]) -> (PodsClient, tempfile::TempDir) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let _ = tls.read(&mut [0; 4096]).await;
            let _ = tls.write_all(answer).await;
            let _ = tls.shutdown().await;
        });
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "t\n").unwrap();
        let pods = PodsOptions {
            url: format!("https://{address}").parse().unwrap(),
            ca_file: None,
            copied: Vec::new(),
        };
        let client = PodsClient::new(
            &pods,
            &KubernetesOptions {
                token_file: dir.path().join("token"),
                timeout: Duration::from_secs(10),
                ..KubernetesOptions::default()
            },
        );
        (client, dir)
    }

    #[tokio::test]
    async fn a_kubelet_that_drops_the_connection_is_unavailable_and_says_how() {
        let (mut client, _dir) = server_answering(b"").await;
        let e = client.fetch().await.unwrap_err();
        assert_eq!(e.reason, KubeletError::PodsUnavailable);
        assert_eq!(
            e.message,
            format!(
                "GET {}: connection closed before message completed",
                client.url()
            )
        );

        let (mut client, _dir) =
            server_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}").await;
        let e = client.fetch().await.unwrap_err();
        assert_eq!(e.reason, KubeletError::PodsUnavailable);
        assert!(
            e.message.starts_with(&format!(
                "GET {}: error reading a body from connection: ",
                client.url()
            )),
            "{}",
            e.message
        );
    }

    #[test]
    fn pods_url_appends_to_the_path() {
        let u = |s: &str| pods_url(&s.parse().unwrap()).to_string();
        assert_eq!(u("https://10.0.0.1:10250"), "https://10.0.0.1:10250/pods");
        assert_eq!(u("https://10.0.0.1:10250/"), "https://10.0.0.1:10250/pods");
        assert_eq!(
            u("https://api/api/v1/nodes/n1/proxy/"),
            "https://api/api/v1/nodes/n1/proxy/pods"
        );
    }
}

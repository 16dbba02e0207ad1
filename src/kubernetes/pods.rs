//! The kubelet's pod list (`GET <kubelet>/pods`): how a process's cgroup is named.
//!
//! A process's cgroup path gives its pod UID and container runtime ID, but the pod-resources API
//! has no UIDs. The kubelet's own HTTPS API answers `/pods` with a v1 `PodList` of the pods it runs
//! (the endpoint node agents use); [`parse_pod_list`] keeps only UID, namespace, name and the
//! runtime ID → name of each container, as [`PodIdentity`]s.
//!
//! [`PodsClient`] calls it with the service account's bearer token, re-read on every call because
//! projected tokens rotate. The kubelet's serving certificate is verified against a CA file, or not
//! at all with `--kubelet-insecure-tls` (kubelets often serve a self-signed certificate). One
//! HTTP/1.1 keep-alive connection is reused between calls and remade after it closes or a call
//! fails; a new connection re-reads the CA file. Every failure carries the `pods_*` reason it is
//! counted under in `nvml_exporter_kubernetes_errors_total`, and a message that says what to fix.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, HOST};
use http::{HeaderValue, Request, StatusCode, Uri};
use hyper::body::Body as _;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::certificates::{self, AnyCertificate};
use crate::config::KubernetesConfig;
use crate::sample::{ContainerIdentity, KubeletError, PodIdentity};

/// The largest `/pods` answer read. A full `PodList` is a few KiB per pod; 64 MiB is far above a
/// node at the kubelet's pod limit, and bounds what a misbehaving endpoint can make us buffer.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

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
pub struct PodsClient {
    /// `<kubelet-url>/pods`.
    url: Uri,
    token_file: PathBuf,
    /// `None` with `--kubelet-insecure-tls`.
    ca_file: Option<PathBuf>,
    timeout: Duration,
    /// The open keep-alive connection, if any.
    connection: Option<SendRequest<String>>,
}

impl std::fmt::Debug for PodsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodsClient")
            .field("url", &self.url)
            .field("token_file", &self.token_file)
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl PodsClient {
    /// A client for the kubelet of `config` (`--kubelet-*`, `--kubernetes-timeout`). Touches
    /// neither the network nor the files until the first call.
    pub fn new(config: &KubernetesConfig) -> PodsClient {
        PodsClient {
            url: pods_url(&config.kubelet_url),
            token_file: config.kubelet_token_file.clone(),
            ca_file: (!config.kubelet_insecure_tls).then(|| config.kubelet_ca_file.clone()),
            timeout: config.timeout,
            connection: None,
        }
    }

    /// The URL called.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// Fetches and parses the pod list, giving up after the timeout (connecting included).
    pub async fn fetch(&mut self) -> Result<Vec<PodIdentity>, PodsError> {
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
            // Whatever state the connection is in (a half-read answer, a stalled server), the
            // next call starts afresh.
            self.connection = None;
        }
        result
    }

    async fn call(&mut self) -> Result<Vec<PodIdentity>, PodsError> {
        // Read before connecting: a missing token is a configuration error, not a kubelet one.
        let token = read_token(&self.token_file)?;
        let (mut sender, reused) = match self.connection.take() {
            Some(sender) if !sender.is_closed() => (sender, true),
            _ => (self.connect().await?, false),
        };
        let response = match self.send(&mut sender, &token).await {
            // The kubelet may close an idle keep-alive connection just as it is reused; that is
            // no kubelet failure, so the request is sent once more on a new connection.
            Err(_) if reused => {
                sender = self.connect().await?;
                self.send(&mut sender, &token).await?
            }
            result => result?,
        };
        let status = response.status();
        let declared_length = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared_length.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(self.too_large());
        }
        let body = self.read_body(response.into_body()).await?;
        // The answer was read whole, so the connection can carry the next call.
        self.connection = Some(sender);
        if !status.is_success() {
            return Err(self.refused(status, &body));
        }
        parse_pod_list(&body).map_err(|e| {
            PodsError::new(
                KubeletError::PodsParse,
                format!("GET {}: the answer is not a pod list: {e}", self.url),
            )
        })
    }

    async fn send(
        &self,
        sender: &mut SendRequest<String>,
        token: &HeaderValue,
    ) -> Result<http::Response<hyper::body::Incoming>, PodsError> {
        sender.ready().await.map_err(|e| self.unavailable(&e))?;
        let authority = self.url.authority().map(|a| a.as_str()).unwrap_or_default();
        let request = Request::get(self.url.path())
            .header(HOST, authority)
            .header(ACCEPT, "application/json")
            .header(AUTHORIZATION, token.clone())
            .body(String::new())
            .map_err(|e| {
                PodsError::new(KubeletError::PodsHttp, format!("GET {}: {e}", self.url))
            })?;
        sender
            .send_request(request)
            .await
            .map_err(|e| self.unavailable(&e))
    }

    /// Reads the whole body, at most [`MAX_BODY_BYTES`].
    async fn read_body(&self, mut body: hyper::body::Incoming) -> Result<Vec<u8>, PodsError> {
        let mut out = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|e| self.unavailable(&e))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > MAX_BODY_BYTES {
                    return Err(self.too_large());
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(out)
    }

    /// A new TCP + TLS connection, driven by a task of its own until either side closes it.
    async fn connect(&self) -> Result<SendRequest<String>, PodsError> {
        let host = self.url.host().unwrap_or_default();
        // An IPv6 literal is written in brackets in a URL but not in a socket address or SNI.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self.url.port_u16().unwrap_or(443);
        let server_name = ServerName::try_from(host.to_owned()).map_err(|e| {
            PodsError::new(
                KubeletError::PodsTls,
                format!(
                    "--kubelet-url {}: {host:?} is not a TLS server name: {e}",
                    self.url
                ),
            )
        })?;
        let tls = TlsConnector::from(Arc::new(self.tls_config()?));
        let tcp = TcpStream::connect((host, port)).await.map_err(|e| {
            PodsError::new(
                KubeletError::PodsUnavailable,
                format!("connecting to the kubelet at {host}:{port}: {e}"),
            )
        })?;
        let stream = tls
            .connect(server_name, tcp)
            .await
            .map_err(|e| self.handshake_failed(e))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unavailable(&e))?;
        tokio::spawn(async move {
            // Ends when the kubelet or the client closes the connection; the next call notices
            // through `is_closed` and reconnects, so the error itself has no one to tell.
            let _ = connection.await;
        });
        Ok(sender)
    }

    fn tls_config(&self) -> Result<ClientConfig, PodsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| PodsError::new(KubeletError::PodsTls, e.to_string()))?;
        let config = match &self.ca_file {
            Some(ca_file) => {
                let roots = certificates::read_roots(ca_file).map_err(|e| {
                    PodsError::new(
                        KubeletError::PodsTls,
                        format!("--kubelet-ca-file {}: {e}", ca_file.display()),
                    )
                })?;
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            // `--kubelet-insecure-tls`, as metrics-server's flag of the same name.
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(AnyCertificate::of_servers(&provider))
                .with_no_client_auth(),
        };
        Ok(config)
    }

    fn handshake_failed(&self, e: std::io::Error) -> PodsError {
        let is_tls = e
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
        if !is_tls {
            return PodsError::new(
                KubeletError::PodsUnavailable,
                format!("TLS handshake with the kubelet at {}: {e}", self.url),
            );
        }
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

    fn unavailable(&self, e: &hyper::Error) -> PodsError {
        let mut message = format!("GET {}: {e}", self.url);
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        PodsError::new(KubeletError::PodsUnavailable, message)
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

/// `https://host:port[/prefix]` → `https://host:port[/prefix]/pods`.
fn pods_url(base: &Uri) -> Uri {
    let path = format!("{}/pods", base.path().trim_end_matches('/'));
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(path.parse().expect("a URL path with /pods appended"));
    Uri::from_parts(parts).expect("the URL with only its path changed")
}

/// The `Authorization` header from the token file.
fn read_token(path: &Path) -> Result<HeaderValue, PodsError> {
    let fail = |what: String| {
        PodsError::new(
            KubeletError::PodsAuth,
            format!("--kubelet-token-file {}: {what}", path.display()),
        )
    };
    let token = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| fail("the token has characters a header cannot carry".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

// Only the fields used; serde skips the rest of each (large) pod object.

#[derive(Deserialize)]
struct PodList {
    kind: Option<String>,
    items: Option<Vec<Pod>>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
struct Metadata {
    uid: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    container_statuses: Option<Vec<ContainerStatus>>,
    init_container_statuses: Option<Vec<ContainerStatus>>,
    ephemeral_container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: Option<String>,
    state: Option<ContainerState>,
}

#[derive(Deserialize)]
struct ContainerState {
    running: Option<serde::de::IgnoredAny>,
}

/// The pods of a v1 `PodList` that still have a running container (in any phase: a pod being
/// deleted still runs its processes), sorted by UID. Each lists every container status with a
/// runtime ID (init and ephemeral containers too), sorted by ID, the ID without its scheme.
pub fn parse_pod_list(json: &[u8]) -> Result<Vec<PodIdentity>, serde_json::Error> {
    let list: PodList = serde_json::from_slice(json)?;
    if let Some(kind) = list.kind.as_deref().filter(|k| *k != "PodList") {
        return Err(serde::de::Error::custom(format!(
            "kind is {kind:?}, not \"PodList\""
        )));
    }
    let mut pods: Vec<PodIdentity> = list
        .items
        .unwrap_or_default()
        .into_iter()
        .filter_map(identity)
        .collect();
    pods.sort();
    pods.dedup();
    Ok(pods)
}

fn identity(pod: Pod) -> Option<PodIdentity> {
    let status = pod.status?;
    let statuses: Vec<ContainerStatus> = [
        status.init_container_statuses,
        status.container_statuses,
        status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .collect();
    let running = statuses
        .iter()
        .any(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()));
    let uid = pod.metadata.uid.filter(|u| !u.is_empty())?;
    if !running {
        return None;
    }
    let mut containers: Vec<ContainerIdentity> = statuses
        .into_iter()
        .filter_map(|s| {
            let id = s.container_id?;
            let id = strip_scheme(&id);
            (!id.is_empty()).then(|| ContainerIdentity {
                id: id.to_owned(),
                name: s.name,
            })
        })
        .collect();
    containers.sort();
    containers.dedup();
    Some(PodIdentity {
        uid,
        namespace: pod.metadata.namespace.unwrap_or_default(),
        pod: pod.metadata.name.unwrap_or_default(),
        containers,
    })
}

/// "containerd://abc" → "abc"; an ID without a scheme is kept as it is.
fn strip_scheme(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn container_ids_lose_their_scheme() {
        assert_eq!(strip_scheme("containerd://0a1b"), "0a1b");
        assert_eq!(strip_scheme("cri-o://0a1b"), "0a1b");
        assert_eq!(strip_scheme("docker://0a1b"), "0a1b");
        assert_eq!(strip_scheme("0a1b"), "0a1b");
    }

    fn status(name: &str, id: Option<&str>, state: &str) -> serde_json::Value {
        let mut s = serde_json::json!({ "name": name, "state": { state: {} } });
        if let Some(id) = id {
            s["containerID"] = id.into();
        }
        s
    }

    #[test]
    fn only_pods_with_a_running_container_and_only_containers_with_an_id() {
        let list = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {},
            "items": [
                { "metadata": { "name": "b", "namespace": "ns", "uid": "uid-b" },
                  "status": { "phase": "Running",
                    "initContainerStatuses": [status("init", Some("containerd://i1"), "terminated")],
                    "containerStatuses": [
                        status("main", Some("containerd://c2"), "running"),
                        status("side", None, "waiting"),
                    ] } },
                { "metadata": { "name": "done", "namespace": "ns", "uid": "uid-done" },
                  "status": { "phase": "Succeeded",
                    "containerStatuses": [status("main", Some("cri-o://d1"), "terminated")] } },
                { "metadata": { "name": "a", "namespace": "ns", "uid": "uid-a" },
                  "status": { "phase": "Failed",
                    "containerStatuses": [status("main", Some("docker://a1"), "running")] } },
                { "metadata": { "name": "pending", "namespace": "ns", "uid": "uid-p" },
                  "status": { "phase": "Pending" } },
            ]
        });
        let pods = parse_pod_list(list.to_string().as_bytes()).unwrap();
        let c = |id: &str, name: &str| ContainerIdentity {
            id: id.into(),
            name: name.into(),
        };
        assert_eq!(
            pods,
            [
                PodIdentity {
                    uid: "uid-a".into(),
                    namespace: "ns".into(),
                    pod: "a".into(),
                    containers: vec![c("a1", "main")],
                },
                PodIdentity {
                    uid: "uid-b".into(),
                    namespace: "ns".into(),
                    pod: "b".into(),
                    containers: vec![c("c2", "main"), c("i1", "init")],
                },
            ]
        );
    }

    #[test]
    fn not_a_pod_list_is_an_error() {
        assert!(parse_pod_list(b"<html>").is_err());
        let e = parse_pod_list(br#"{"kind":"Status","status":"Failure"}"#).unwrap_err();
        assert!(e.to_string().contains("Status"), "{e}");
        assert_eq!(
            parse_pod_list(br#"{"kind":"PodList","items":null}"#).unwrap(),
            []
        );
    }
}

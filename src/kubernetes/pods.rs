//! The kubelet's pod list (`GET <kubelet>/pods`): how a process's cgroup is named.
//!
//! A process's cgroup path gives its pod UID and container runtime ID, but the pod-resources API
//! has no UIDs. The kubelet's own HTTPS API answers `/pods` with a v1 `PodList` of the pods it runs
//! (the endpoint node agents use), which [`super::pod_list`] reads keeping only what attribution
//! needs.
//!
//! [`PodsClient`] calls it through the one REST client ([`super::rest`]: the service account's
//! token, the kubelet's serving certificate verified against a CA file or not at all with
//! `--kubelet-insecure-tls`, since kubelets often serve a self-signed one, the deadline, the body
//! cap [`MAX_BODY_BYTES`]). The client keeps one HTTP/1.1 keep-alive connection between calls
//! and reconnects when the kubelet closes it. Every failure carries the `pods_*` reason it is
//! counted under in `nvml_exporter_kubernetes_errors_total`, and a message that says what to fix.

use reqwest::Url;

use crate::sample::KubeletError;

use super::pod_list::{KubeletPods, parse_pod_list_copying};
use super::rest::{Grant, Peer, Reasons, RestClient, RestError};
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
    KubeletError::PodsTooLarge,
];

/// How the client counts `/pods` failures.
const COUNTED: Reasons = Reasons {
    unavailable: KubeletError::PodsUnavailable,
    timeout: KubeletError::PodsTimeout,
    tls: KubeletError::PodsTls,
    auth: KubeletError::PodsAuth,
    conflict: KubeletError::PodsHttp,
    http: KubeletError::PodsHttp,
    too_large: KubeletError::PodsTooLarge,
};

/// What to grant when the kubelet refuses the token.
const GRANT: Grant = Grant {
    rules: "`get` on `nodes/proxy` (or `nodes/pods` on kubelets with fine-grained authorization)",
    manifest: "deploy/kubernetes/processes",
};

/// A client of one kubelet's `/pods`.
#[derive(Debug)]
pub struct PodsClient {
    rest: RestClient,
    /// `<kubelet-url>/pods`.
    url: Url,
    /// The labels and annotations copied ([`PodsOptions::copied`]).
    copied: Vec<(String, bool, String)>,
}

impl PodsClient {
    /// A client for the kubelet of `pods` (`--kubelet-*`), with the token file and timeout of
    /// `options`. Touches neither the network nor the files until the first call.
    pub fn new(pods: &PodsOptions, options: &KubernetesOptions) -> PodsClient {
        let rest = RestClient::new(
            Peer::Kubelet,
            &pods.url,
            pods.ca_file.clone(),
            options.token_file.clone(),
            options.timeout,
            COUNTED,
            GRANT,
        );
        let url = rest.url(&["pods"], &[]).expect("a constant segment");
        PodsClient {
            rest,
            url,
            copied: pods.copied.clone(),
        }
    }

    /// The URL called.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Fetches and parses the pod list, giving up after the timeout (connecting included).
    pub async fn fetch(&mut self) -> Result<KubeletPods, RestError> {
        let body = self.rest.get(&self.url, MAX_BODY_BYTES).await?;
        parse_pod_list_copying(&body, &self.copied).map_err(|e| RestError {
            reason: KubeletError::PodsParse,
            message: format!("GET {}: the answer is not a pod list: {e}", self.url),
        })
    }
}

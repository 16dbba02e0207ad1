//! The GPUs' health verdicts on this node's status (`--kubernetes-node-condition`): the condition
//! [`CONDITION_TYPE`] and an Event on every change of a GPU's health state, written to the API
//! server so that schedulers, `kubectl describe node` and remediation controllers see them.
//!
//! The [`Reporter`] reads the published snapshot every refresh (it never calls NVML) and
//! - patches `/api/v1/nodes/NAME/status` with a strategic merge patch holding only its own
//!   condition, which the API server merges by `type` into the node's conditions, keeping every
//!   other one (as node-problem-detector does): `True` when every GPU is healthy, `False` when
//!   one is not (reason `GpuFailed` or `GpuDegraded`, the worst; the message names each
//!   unhealthy GPU, its state, reasons and actions), `Unknown` while NVML does not answer. It is
//!   written when it changes and again every [`HEARTBEAT`]; `lastTransitionTime` is when this
//!   process first saw the status it writes;
//! - creates an events.k8s.io/v1 Event regarding the Node (in `default`, where the kubelet's
//!   node events are) for each GPU whose state changed, and, at the start, for each GPU that is
//!   not healthy.
//!
//! A failed call (refused, 401/403, 409, 5xx, no answer within `--kubernetes-timeout`) is counted
//! in `nvml_exporter_kubernetes_errors_total` under one of [`REASONS`], logged when the API server
//! stops accepting (not on every retry), and retried after a backoff that doubles from
//! [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]; Events wait meanwhile, at most [`MAX_PENDING_EVENTS`].
//! The reporter is its own task: sampling and serving never wait for it.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::Uri;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Value, json};

use crate::sample::{HealthAction, HealthState, KubeletError, Snapshot};

use super::pods::{causes, chain, https_client, read_token, tls_cause};
use super::{ApiServer, KubernetesOptions, StateHandle};

/// The node condition's type.
pub const CONDITION_TYPE: &str = "NvidiaGpuHealthy";

/// How often an unchanged condition is written again, so that a `lastHeartbeatTime` older than
/// this (and a margin) tells a reader the exporter stopped reporting.
pub const HEARTBEAT: Duration = Duration::from_secs(300);

/// The wait after the first failed call; it doubles with each further failure.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Events kept while the API server does not accept them; older ones are dropped first.
pub const MAX_PENDING_EVENTS: usize = 64;

/// The error reasons of the reporter's calls.
pub const REASONS: &[KubeletError] = &[
    KubeletError::NodeConditionForbidden,
    KubeletError::NodeConditionConflict,
    KubeletError::NodeConditionHttp,
    KubeletError::NodeConditionTimeout,
    KubeletError::NodeConditionUnavailable,
];

/// The Events' `reportingController`.
const CONTROLLER: &str = "nvml-exporter";

/// Where Events about cluster-scoped objects such as a Node go.
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// What the API server accepts at most in an Event's note; the condition's message is held to
/// it too.
const MAX_NOTE_BYTES: usize = 1024;

/// One GPU's verdict, as the condition and the Events name it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuVerdict {
    index: u32,
    uuid: String,
    state: HealthState,
    /// Each active reason with its action.
    reasons: Vec<(&'static str, HealthAction)>,
}

impl GpuVerdict {
    /// The most disruptive action among the reasons.
    fn action(&self) -> HealthAction {
        self.reasons
            .iter()
            .map(|(_, a)| *a)
            .max()
            .unwrap_or(HealthAction::None)
    }

    /// "GPU 2 (GPU-…) failed: xid_79 (reboot_node)".
    fn describe(&self) -> String {
        let mut text = format!("GPU {} ({}) {}", self.index, self.uuid, self.state.label());
        if !self.reasons.is_empty() {
            let reasons: Vec<String> = self
                .reasons
                .iter()
                .map(|(reason, action)| format!("{reason} ({})", action.label()))
                .collect();
            text.push_str(&format!(": {}", reasons.join(", ")));
        }
        text
    }
}

/// The verdict of every GPU of `snapshot` that has one, by UUID; `None` while NVML does not
/// answer.
fn verdicts(snapshot: &Snapshot) -> Option<BTreeMap<String, GpuVerdict>> {
    if !snapshot.nvml_up {
        return None;
    }
    let gpus = snapshot
        .devices
        .iter()
        .filter_map(|d| {
            let health = d.health.as_ref()?;
            let verdict = GpuVerdict {
                index: d.index,
                uuid: d.uuid.clone(),
                state: health.state,
                reasons: health
                    .reasons
                    .iter()
                    .map(|r| (r.reason, r.action))
                    .collect(),
            };
            Some((d.uuid.clone(), verdict))
        })
        .collect();
    Some(gpus)
}

/// What the condition says (its times aside).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    status: &'static str,
    reason: &'static str,
    message: String,
}

impl Condition {
    fn of(verdicts: Option<&BTreeMap<String, GpuVerdict>>) -> Condition {
        let Some(verdicts) = verdicts else {
            return Condition {
                status: "Unknown",
                reason: "NvmlUnavailable",
                message: "NVML does not answer: the GPUs' health cannot be read".into(),
            };
        };
        let mut unhealthy: Vec<&GpuVerdict> = verdicts
            .values()
            .filter(|v| v.state != HealthState::Healthy)
            .collect();
        unhealthy.sort_by_key(|v| v.index);
        let Some(worst) = unhealthy.iter().map(|v| v.state).max() else {
            return Condition {
                status: "True",
                reason: "GpusHealthy",
                message: format!("all {} GPUs healthy", verdicts.len()),
            };
        };
        let described: Vec<String> = unhealthy.iter().map(|v| v.describe()).collect();
        Condition {
            status: "False",
            reason: reason_of(worst),
            message: truncate(described.join("; ")),
        }
    }
}

/// The condition's and an Event's reason for a GPU in `state`.
fn reason_of(state: HealthState) -> &'static str {
    match state {
        HealthState::Healthy => "GpuHealthy",
        HealthState::Degraded => "GpuDegraded",
        HealthState::Failed => "GpuFailed",
    }
}

/// `text` cut to [`MAX_NOTE_BYTES`] at a character boundary, ending in "…" when cut.
fn truncate(mut text: String) -> String {
    if text.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The Events for the GPUs whose state differs between `before` (`None` at the start: every GPU
/// not healthy is news) and `now`, in GPU order.
fn changes(
    before: Option<&BTreeMap<String, GpuVerdict>>,
    now: &BTreeMap<String, GpuVerdict>,
) -> Vec<(Option<HealthState>, GpuVerdict)> {
    let mut changed: Vec<(Option<HealthState>, GpuVerdict)> = now
        .iter()
        .filter_map(|(uuid, verdict)| {
            let was = before.and_then(|b| b.get(uuid)).map(|v| v.state);
            let news = match was {
                Some(was) => was != verdict.state,
                None => verdict.state != HealthState::Healthy,
            };
            news.then(|| (was, verdict.clone()))
        })
        .collect();
    changed.sort_by_key(|(_, v)| v.index);
    changed
}

/// An events.k8s.io/v1 Event regarding `node` for a GPU that was `was` and is now `verdict`.
fn event(node: &str, was: Option<HealthState>, verdict: &GpuVerdict, at: SystemTime) -> Value {
    let from = was.map_or_else(String::new, |w| format!(" (was {})", w.label()));
    let note = truncate(format!("{}{from}", verdict.describe()));
    let instance: String = format!("{CONTROLLER}-{node}").chars().take(128).collect();
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            // The prefix keeps a generated name within the 253 characters of a DNS subdomain.
            "generateName": format!("{}.nvidia-gpu-", node.chars().take(200).collect::<String>()),
            "namespace": "default",
        },
        "eventTime": humantime::format_rfc3339_micros(at).to_string(),
        "reportingController": CONTROLLER,
        "reportingInstance": instance,
        "action": verdict.action().label(),
        "reason": reason_of(verdict.state),
        "type": if verdict.state == HealthState::Healthy { "Normal" } else { "Warning" },
        // `kubectl describe node` finds a node's Events by its name in `uid`, as the kubelet's.
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "note": note,
    })
}

/// The strategic merge patch of the node's status that sets the condition.
fn condition_patch(condition: &Condition, heartbeat: SystemTime, transition: SystemTime) -> Value {
    json!({
        "status": {
            "conditions": [{
                "type": CONDITION_TYPE,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastHeartbeatTime": humantime::format_rfc3339_seconds(heartbeat).to_string(),
                "lastTransitionTime": humantime::format_rfc3339_seconds(transition).to_string(),
            }]
        }
    })
}

/// A call the API server did not accept.
#[derive(Debug)]
struct CallError {
    reason: KubeletError,
    message: String,
}

/// A client of this node's status and of Events, with the service account's token.
#[derive(Debug)]
struct ApiClient {
    base: Uri,
    node: String,
    token_file: PathBuf,
    ca_file: PathBuf,
    timeout: Duration,
    /// Made (reading the CA file) on the first call and again after a failed one.
    http: Option<reqwest::Client>,
}

impl ApiClient {
    fn status_path(&self) -> String {
        format!("/api/v1/nodes/{}/status", self.node)
    }

    /// Sends `body` with `method` to `path` under the API server's URL, giving up after
    /// `--kubernetes-timeout`.
    async fn send(
        &mut self,
        method: reqwest::Method,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> Result<(), CallError> {
        let url = format!("{}{path}", self.base.to_string().trim_end_matches('/'));
        let what = format!("{method} {url}");
        let timeout = self.timeout;
        let call = self.call(method, &url, content_type, body);
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(CallError {
                reason: KubeletError::NodeConditionTimeout,
                message: format!(
                    "no answer within {} (--kubernetes-timeout)",
                    humantime::format_duration(self.timeout)
                ),
            }),
        };
        result.map_err(|e| {
            self.http = None;
            CallError {
                reason: e.reason,
                message: format!("{what}: {}", e.message),
            }
        })
    }

    async fn call(
        &mut self,
        method: reqwest::Method,
        url: &str,
        content_type: &str,
        body: &Value,
    ) -> Result<(), CallError> {
        let unavailable = |message: String| CallError {
            reason: KubeletError::NodeConditionUnavailable,
            message,
        };
        let token = read_token(&self.token_file).await.map_err(|e| CallError {
            reason: KubeletError::NodeConditionForbidden,
            message: e.message,
        })?;
        let http = match &self.http {
            Some(http) => http.clone(),
            None => {
                let http =
                    https_client(&self.ca_file, "--kubernetes-api-ca-file").map_err(unavailable)?;
                self.http.insert(http).clone()
            }
        };
        let response = http
            .request(method, url)
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, content_type)
            .header(AUTHORIZATION, token)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| {
                unavailable(match tls_cause(&e) {
                    Some(tls) => format!(
                        "TLS handshake with the API server: {tls}; is its certificate signed by \
                         --kubernetes-api-ca-file {}?",
                        self.ca_file.display()
                    ),
                    None => chain(&e).last().map(|c| c.to_string()).unwrap_or_default(),
                })
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.map_err(|e| unavailable(causes(&e)))?;
        let text: String = text.chars().take(512).collect();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut message = format!("the API server answered {status} ({text})");
        let reason = match status.as_u16() {
            401 | 403 => {
                message.push_str(
                    "; the exporter's service account needs a ClusterRole granting patch on \
                     nodes/status and create on events (events.k8s.io), bound to it: see \
                     deploy/kubernetes/health",
                );
                KubeletError::NodeConditionForbidden
            }
            409 => KubeletError::NodeConditionConflict,
            _ => KubeletError::NodeConditionHttp,
        };
        Err(CallError { reason, message })
    }
}

/// Writes the condition and the Events of one node.
#[derive(Debug)]
pub struct Reporter {
    client: ApiClient,
    /// Where the errors are counted.
    state: StateHandle,
    /// The verdicts when NVML last answered, by UUID; `None` before it first did. Events are
    /// made of the changes from it: at the start every GPU not healthy is news, and after NVML
    /// was down, what changed since it last answered.
    answered: Option<BTreeMap<String, GpuVerdict>>,
    /// The condition last accepted by the API server, and when.
    written: Option<(Condition, Instant)>,
    /// The status written and since when this process has seen it.
    since: Option<(&'static str, SystemTime)>,
    /// Events not yet accepted, oldest first.
    pending: VecDeque<Value>,
    /// No call before this, after a failure; with the wait that set it.
    backoff: Option<(Instant, Duration)>,
}

impl Reporter {
    /// A reporter for the node of `api`, with the token file and timeout of `options`, counting
    /// its errors in `state`. Touches nothing until the first [`step`](Self::step).
    pub fn new(api: &ApiServer, options: &KubernetesOptions, state: StateHandle) -> Reporter {
        Reporter {
            client: ApiClient {
                base: api.url.clone(),
                node: api.node_name.clone(),
                token_file: options.token_file.clone(),
                ca_file: api.ca_file.clone(),
                timeout: options.timeout,
                http: None,
            },
            state,
            answered: None,
            written: None,
            since: None,
            pending: VecDeque::new(),
            backoff: None,
        }
    }

    /// Takes in `snapshot` (the last published; `None` before the first tick) and makes the calls
    /// that are due.
    pub async fn step(&mut self, snapshot: Option<&Snapshot>) {
        let Some(snapshot) = snapshot else {
            return;
        };
        let now = verdicts(snapshot);
        if let Some(now) = &now {
            let at = SystemTime::now();
            for (was, verdict) in changes(self.answered.as_ref(), now) {
                if self.pending.len() == MAX_PENDING_EVENTS {
                    self.pending.pop_front();
                }
                self.pending
                    .push_back(event(&self.client.node, was, &verdict, at));
            }
            self.answered = Some(now.clone());
        }
        self.write(&Condition::of(now.as_ref())).await;
    }

    /// Writes `condition` if it changed or its heartbeat is due, then the pending Events; nothing
    /// while backing off.
    async fn write(&mut self, condition: &Condition) {
        let at = Instant::now();
        if self.backoff.is_some_and(|(until, _)| at < until) {
            return;
        }
        let due = match &self.written {
            Some((written, when)) => written != condition || at >= *when + HEARTBEAT,
            None => true,
        };
        if due {
            let wall = SystemTime::now();
            let transition = match self.since {
                Some((status, since)) if status == condition.status => since,
                _ => wall,
            };
            let patch = condition_patch(condition, wall, transition);
            let path = self.client.status_path();
            let sent = self
                .client
                .send(
                    reqwest::Method::PATCH,
                    &path,
                    "application/strategic-merge-patch+json",
                    &patch,
                )
                .await;
            if let Err(e) = sent {
                return self.failed(e);
            }
            self.since = Some((condition.status, transition));
            self.written = Some((condition.clone(), at));
        }
        while let Some(event) = self.pending.front() {
            let sent = self
                .client
                .send(
                    reqwest::Method::POST,
                    EVENTS_PATH,
                    "application/json",
                    event,
                )
                .await;
            if let Err(e) = sent {
                return self.failed(e);
            }
            self.pending.pop_front();
        }
        if self.backoff.take().is_some() {
            tracing::info!(
                node = %self.client.node,
                "the API server accepts the GPU health condition again"
            );
        }
    }

    fn failed(&mut self, e: CallError) {
        let wait = match self.backoff {
            Some((_, wait)) => (wait * 2).min(MAX_BACKOFF),
            None => {
                // Logged when the API server stops accepting, not on every retry.
                tracing::warn!(
                    node = %self.client.node,
                    reason = e.reason.label(),
                    error = %e.message,
                    "could not write the GPU health condition or an Event; retrying with backoff"
                );
                FIRST_BACKOFF
            }
        };
        self.backoff = Some((Instant::now() + wait, wait));
        self.state.count_error(e.reason);
    }
}

/// The reporter's task. Stops when dropped.
#[derive(Debug)]
pub struct Writer {
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Starts reporting on the current tokio runtime, reading `current` (the last published
    /// snapshot, `None` before the first tick) every `--kubernetes-refresh`.
    pub fn spawn(
        api: &ApiServer,
        options: &KubernetesOptions,
        state: StateHandle,
        current: impl Fn() -> Option<Arc<Snapshot>> + Send + 'static,
    ) -> Writer {
        let mut reporter = Reporter::new(api, options, state);
        let refresh = options.refresh;
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(refresh);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                reporter.step(current().as_deref()).await;
            }
        });
        Writer { task }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests;

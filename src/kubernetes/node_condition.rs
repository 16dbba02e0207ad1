//! The GPUs' health verdicts on this node's status (`--kubernetes-node-condition`): the condition
//! [`CONDITION_TYPE`] and an Event on every change of a GPU's health state, written to the API
//! server so that schedulers, `kubectl describe node` and remediation controllers see them.
//!
//! The [`Reporter`] reads the published snapshot every refresh (it never calls NVML) and
//! - patches `/api/v1/nodes/NAME/status` with a strategic merge patch holding only its own
//!   condition, which the API server merges by `type` into the node's conditions, keeping every
//!   other one (as node-problem-detector does): `True` when every GPU is healthy, `False` when
//!   one is not or the node's own verdict is not (a GPU the PCI bus lists that NVML does not
//!   enumerate: reason `GpuFailed` or `GpuDegraded`, the worst; the message names the node's
//!   reasons and each unhealthy GPU, its state, reasons and actions), `Unknown` while NVML does
//!   not answer. It is
//!   written when it changes and again every [`HEARTBEAT`]; `lastTransitionTime` is when this
//!   process first saw the status it writes;
//! - creates an events.k8s.io/v1 Event regarding the Node (in `default`, where the kubelet's
//!   node events are) for each GPU whose state changed, and, at the start, for each GPU that is
//!   not healthy.
//!
//! Neither follows a flapping GPU flip by flip. A changed condition is written at once while its
//! [`CONDITION_BUDGET`] lasts, then at most once per its refill (the newest condition then); each
//! GPU's Events have a [`EVENT_BUDGET`] of their own, and the changes of a GPU past it are told in
//! one Event when the budget allows, with how many there were. Ordinary failures and recoveries
//! stay within the bursts and are told at once.
//!
//! A failed call (refused, 401/403, 409, 5xx, no answer within `--kubernetes-timeout`) is counted
//! in `nvml_exporter_kubernetes_errors_total` under one of [`REASONS`], logged when the API server
//! stops accepting (not on every retry), and retried after a backoff that doubles from
//! [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]; Events wait meanwhile, at most [`MAX_PENDING_EVENTS`].
//! The reporter is its own task: sampling and serving never wait for it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::{Method, Url};
use serde_json::{Value, json};

use crate::sample::{HealthAction, HealthState, KubeletError, Snapshot};

use super::rest::{Grant, Peer, Reasons, RestClient, RestError};
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

/// How often a changed condition may be written: a few at once, then one per 10 s (the
/// kubelet's own node status period), whatever the GPUs do.
pub const CONDITION_BUDGET: Budget = Budget::new(3, Duration::from_secs(10));

/// How many Events one GPU may send: a few at once (a failure, its reset and its recovery),
/// then one per 30 s, which tells every change held back meanwhile.
pub const EVENT_BUDGET: Budget = Budget::new(3, Duration::from_secs(30));

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

/// How the client counts failed calls.
const COUNTED: Reasons = Reasons {
    unavailable: KubeletError::NodeConditionUnavailable,
    timeout: KubeletError::NodeConditionTimeout,
    tls: KubeletError::NodeConditionUnavailable,
    auth: KubeletError::NodeConditionForbidden,
    conflict: KubeletError::NodeConditionConflict,
    http: KubeletError::NodeConditionHttp,
    // A write's answer is not read.
    too_large: KubeletError::NodeConditionHttp,
};

/// What to grant when the API server refuses the token.
const GRANT: Grant = Grant {
    rules: "patch on nodes/status and create on events (events.k8s.io)",
    manifest: "deploy/kubernetes/health",
};

/// The Events' `reportingController`.
const CONTROLLER: &str = "nvml-exporter";

/// Where Events about cluster-scoped objects such as a Node go.
const EVENTS_PATH: [&str; 6] = [
    "apis",
    "events.k8s.io",
    "v1",
    "namespaces",
    "default",
    "events",
];

/// What the API server accepts at most in an Event's note; the condition's message is held to
/// it too.
const MAX_NOTE_BYTES: usize = 1024;

/// A token bucket: `burst` calls at once, then one per `refill`.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    burst: u32,
    refill: Duration,
    tokens: u32,
    /// When the last token was earned (or the bucket was last full).
    earned: Option<Instant>,
}

impl Budget {
    /// A full bucket.
    pub const fn new(burst: u32, refill: Duration) -> Budget {
        Budget {
            burst,
            refill,
            tokens: burst,
            earned: None,
        }
    }

    /// Takes a token if one is left at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let earned = *self.earned.get_or_insert(now);
        let refills = (now.saturating_duration_since(earned).as_nanos() / self.refill.as_nanos())
            .min(u128::from(self.burst)) as u32;
        self.tokens = (self.tokens + refills).min(self.burst);
        self.earned = Some(if self.tokens == self.burst {
            now
        } else {
            earned + self.refill * refills
        });
        let left = self.tokens > 0;
        self.tokens -= u32::from(left);
        left
    }
}

/// What one GPU's Events have told, and what they have not yet.
#[derive(Debug)]
struct GpuEvents {
    budget: Budget,
    /// The state the last Event gave (or, before the first, the one before the change).
    told: Option<HealthState>,
    /// Changes since the last Event.
    untold: u32,
}

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

/// The node's own verdict when it is not healthy: reasons no GPU carries (a GPU the PCI bus
/// lists that NVML does not enumerate), as the condition names them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeVerdict {
    state: HealthState,
    reasons: Vec<(&'static str, HealthAction)>,
    /// The PCI addresses of the GPUs NVML does not enumerate.
    missing: Vec<String>,
}

impl NodeVerdict {
    /// "node failed: gpus_missing (reboot_node): 0000:ca:00.0 on the PCI bus, not in NVML".
    fn describe(&self) -> String {
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .map(|(reason, action)| format!("{reason} ({})", action.label()))
            .collect();
        let mut text = format!("node {}: {}", self.state.label(), reasons.join(", "));
        if !self.missing.is_empty() {
            text.push_str(&format!(
                ": {} on the PCI bus, not in NVML",
                self.missing.join(", ")
            ));
        }
        text
    }
}

/// The node's verdict in `snapshot` when it is not healthy.
fn node_verdict(snapshot: &Snapshot) -> Option<NodeVerdict> {
    let health = snapshot.node_health.as_ref()?;
    (health.state != HealthState::Healthy).then(|| NodeVerdict {
        state: health.state,
        reasons: health
            .reasons
            .iter()
            .map(|r| (r.reason, r.action))
            .collect(),
        missing: snapshot
            .missing_gpus
            .iter()
            .flatten()
            .map(|g| g.address.clone())
            .collect(),
    })
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
    /// The condition of the GPUs' `verdicts` and the node's own (`node`, when not healthy: a
    /// GPU NVML lost is in none of the GPUs' verdicts).
    fn of(
        verdicts: Option<&BTreeMap<String, GpuVerdict>>,
        node: Option<&NodeVerdict>,
    ) -> Condition {
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
        let Some(worst) = unhealthy
            .iter()
            .map(|v| v.state)
            .chain(node.map(|n| n.state))
            .max()
        else {
            return Condition {
                status: "True",
                reason: "GpusHealthy",
                message: format!("all {} GPUs healthy", verdicts.len()),
            };
        };
        let described: Vec<String> = node
            .map(NodeVerdict::describe)
            .into_iter()
            .chain(unhealthy.iter().map(|v| v.describe()))
            .collect();
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

/// An events.k8s.io/v1 Event regarding `node` for a GPU that was `was` and is now `verdict`,
/// after `changes` changes of its state (more than one when the rate limit held some back).
fn event(
    node: &str,
    was: Option<HealthState>,
    verdict: &GpuVerdict,
    changes: u32,
    at: SystemTime,
) -> Value {
    let from = match (was, changes) {
        (None, _) => String::new(),
        (Some(w), 0 | 1) => format!(" (was {})", w.label()),
        (Some(w), n) => format!(" (was {}; {n} changes since the last Event)", w.label()),
    };
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

/// Writes the condition and the Events of one node.
#[derive(Debug)]
pub struct Reporter {
    client: RestClient,
    /// This node's name.
    node: String,
    /// `/api/v1/nodes/NAME/status`, or why the name cannot be in a path.
    status_url: Result<Url, RestError>,
    /// The Events collection.
    events_url: Url,
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
    /// Each GPU's Events, by UUID, from its first change on.
    gpu_events: BTreeMap<String, GpuEvents>,
    /// How often a changed condition may be written.
    condition_budget: Budget,
    /// No call before this, after a failure; with the wait that set it.
    backoff: Option<(Instant, Duration)>,
}

impl Reporter {
    /// A reporter for the node of `api`, with the token file and timeout of `options`, counting
    /// its errors in `state`. Touches nothing until the first [`step`](Self::step).
    pub fn new(api: &ApiServer, options: &KubernetesOptions, state: StateHandle) -> Reporter {
        let client = RestClient::new(
            Peer::ApiServer,
            &api.url,
            Some(api.ca_file.clone()),
            options.token_file.clone(),
            options.timeout,
            COUNTED,
            GRANT,
        );
        Reporter {
            status_url: client.url(&["api", "v1", "nodes", &api.node_name, "status"], &[]),
            events_url: client.url(&EVENTS_PATH, &[]).expect("constant segments"),
            node: api.node_name.clone(),
            client,
            state,
            answered: None,
            written: None,
            since: None,
            pending: VecDeque::new(),
            gpu_events: BTreeMap::new(),
            condition_budget: CONDITION_BUDGET,
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
            self.tell(now, Instant::now(), SystemTime::now());
            self.answered = Some(now.clone());
        }
        self.write(&Condition::of(
            now.as_ref(),
            node_verdict(snapshot).as_ref(),
        ))
        .await;
    }

    /// Queues an Event for each GPU whose state changed since the last answer, or that has
    /// changes its budget held back, as far as its budget allows now.
    fn tell(&mut self, now: &BTreeMap<String, GpuVerdict>, clock: Instant, at: SystemTime) {
        self.gpu_events.retain(|uuid, _| now.contains_key(uuid));
        for (was, verdict) in changes(self.answered.as_ref(), now) {
            let gpu = self
                .gpu_events
                .entry(verdict.uuid.clone())
                .or_insert(GpuEvents {
                    budget: EVENT_BUDGET,
                    told: was,
                    untold: 0,
                });
            gpu.untold += 1;
        }
        let mut due: Vec<&GpuVerdict> = now
            .values()
            .filter(|v| self.gpu_events.get(&v.uuid).is_some_and(|g| g.untold > 0))
            .collect();
        due.sort_by_key(|v| v.index);
        for verdict in due {
            let gpu = self.gpu_events.get_mut(&verdict.uuid).expect("filtered");
            if !gpu.budget.take(clock) {
                continue;
            }
            if self.pending.len() == MAX_PENDING_EVENTS {
                self.pending.pop_front();
            }
            let told = gpu.told.replace(verdict.state);
            self.pending
                .push_back(event(&self.node, told, verdict, gpu.untold, at));
            gpu.untold = 0;
        }
    }

    /// Writes `condition` if it changed or its heartbeat is due, then the pending Events; nothing
    /// while backing off.
    async fn write(&mut self, condition: &Condition) {
        let at = Instant::now();
        if self.backoff.is_some_and(|(until, _)| at < until) {
            return;
        }
        let due = match &self.written {
            Some((written, when)) => {
                at >= *when + HEARTBEAT || (written != condition && self.condition_budget.take(at))
            }
            None => true,
        };
        if due {
            let wall = SystemTime::now();
            let transition = match self.since {
                Some((status, since)) if status == condition.status => since,
                _ => wall,
            };
            let patch = condition_patch(condition, wall, transition);
            let sent = match &self.status_url {
                Ok(url) => {
                    self.client
                        .send(
                            Method::PATCH,
                            url,
                            "application/strategic-merge-patch+json",
                            patch.to_string().into_bytes(),
                        )
                        .await
                }
                Err(e) => Err(e.clone()),
            };
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
                    Method::POST,
                    &self.events_url,
                    "application/json",
                    event.to_string().into_bytes(),
                )
                .await;
            if let Err(e) = sent {
                return self.failed(e);
            }
            self.pending.pop_front();
        }
        if self.backoff.take().is_some() {
            tracing::info!(
                node = %self.node,
                "the API server accepts the GPU health condition again"
            );
        }
    }

    fn failed(&mut self, e: RestError) {
        let wait = match self.backoff {
            Some((_, wait)) => (wait * 2).min(MAX_BACKOFF),
            None => {
                // Logged when the API server stops accepting, not on every retry.
                tracing::warn!(
                    node = %self.node,
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

//! Pod attribution: which container the kubelet gave each GPU to (`--kubernetes`).
//!
//! A [`Watcher`] task on the tokio runtime calls the kubelet pod-resources API's `List`
//! ([`pod_resources`]) on its own schedule (`--kubernetes-refresh`, by default every sampling interval)
//! with a deadline (`--kubernetes-timeout`), and keeps the result as a [`KubernetesState`]. The
//! state is attached to each snapshot when it is published and resolved against that snapshot's
//! devices when it is encoded ([`mapping`]). So neither the sampler threads nor a scrape ever wait
//! for the kubelet: a slow or absent kubelet costs one failed call per refresh, counted in
//! `nvml_exporter_kubernetes_errors_total` and shown by `nvml_exporter_kubernetes_up 0`.
//!
//! An assignment disappears with the first successful `List` that no longer has it. While calls
//! fail the last successful list is kept: containers keep their GPUs across a kubelet restart,
//! and dropping the labels for its duration would split every series twice.
//!
//! With [`KubernetesOptions::pods`] (per-process attribution, or `--kubelet-pods`) each refresh also
//! fetches the kubelet's pod list ([`pods`]), at the same time as `List` and with the same
//! deadline, into [`KubernetesState::pods`]. Its failures are counted under their own `pods_*`
//! reasons and kept apart from `up`, which stays about the pod-resources API; a failed call keeps
//! the last list.
//!
//! The pod list also says which pods have ended. The kubelet keeps the device assignments of a
//! pod that has finished (phase `Succeeded` or `Failed`) until the pod is deleted, and `List`
//! goes on naming it: a pod the pod list shows ended, or no longer has, loses its GPUs at that
//! refresh. Pods seen ended stay so while `/pods` fails; without the pod list, `List` is followed
//! as it is. The pod-resources API names pods without their UID, so a pod recreated under the
//! same name (a StatefulSet's) that runs keeps the devices listed under that name.
//!
//! With `--kubernetes-dra` the devices that containers hold through resource claims of NVIDIA's
//! DRA driver are assignments too ([`dra`]): each `List` answer's claims are named through the
//! driver's ResourceSlices, read from the API server only when the cached ones lack a claimed
//! device ([`slices`]). Its failures are counted under the `dra_*` reasons; the device-plugin
//! assignments of the same answer are served whatever they are.
//!
//! With `--kubernetes-node-condition` a [`node_condition::Writer`] task writes the GPUs' health
//! verdicts, read from the published snapshots, to the node's status and to Events. Its failures
//! are counted under the `node_condition_*` reasons; it writes, and reads nothing back.
//!
//! The calls to the kubelet's HTTPS API and to the API server (the pod list, the slices, the node
//! condition) all go through one client, [`rest`]: the token, TLS, the deadline, the body caps
//! and the error reasons are there, once.

pub mod dra;
pub mod mapping;
pub mod node_condition;
pub mod pod_list;
pub mod pod_resources;
pub mod pods;
pub mod proto;
pub mod rest;
pub mod slices;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Uri;

use crate::sample::{KubeletError, KubernetesState, PodAssignment, Snapshot};

use mapping::ResourceFilter;
use pod_resources::PodResourcesClient;
use pods::PodsClient;

/// What the kubelet refresh is built from (`--kubernetes-*`, `--kubelet-*`), with the defaults
/// that depend on other options resolved. A reload restarts the refresh when these change.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KubernetesOptions {
    /// The kubelet's pod-resources socket (`--pod-resources-socket`).
    pub pod_resources_socket: PathBuf,
    /// Extended resource names counted besides NVIDIA's (`--kubernetes-resource-names`).
    pub resource_names: Vec<String>,
    /// How often the kubelet is asked (`--kubernetes-refresh`, or the interval).
    pub refresh: Duration,
    /// The deadline of each call (`--kubernetes-timeout`).
    pub timeout: Duration,
    /// The service account token sent to the kubelet and the API server
    /// (`--kubelet-token-file`).
    pub token_file: PathBuf,
    /// The kubelet's pod list, where it is fetched; `None` otherwise.
    pub pods: Option<PodsOptions>,
    /// DRA claims, with `--kubernetes-dra`; `None` otherwise.
    pub dra: Option<DraOptions>,
    /// Where the health condition is written, with `--kubernetes-node-condition`; `None`
    /// otherwise.
    pub node_condition: Option<ApiServer>,
}

/// How the kubelet's `/pods` is fetched.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodsOptions {
    /// The kubelet's base URL (`--kubelet-url`).
    pub url: Uri,
    /// The CA that signs the kubelet's certificate (`--kubelet-ca-file`); `None` with
    /// `--kubelet-insecure-tls`.
    pub ca_file: Option<PathBuf>,
    /// The pod labels and annotations copied onto `nvidia_gpu_pod_info`: (key, whether an
    /// annotation, Prometheus label name), in option order, labels first.
    pub copied: Vec<(String, bool, String)>,
}

/// How the DRA driver's ResourceSlices are read from the API server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraOptions {
    /// The DRA driver whose claims are read (`--kubernetes-dra-driver`).
    pub driver: String,
    /// Where this node's slices are listed.
    pub api: ApiServer,
}

/// This node in the API server: what DRA and the node condition are told.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ApiServer {
    /// This node's name, as the API server knows it (`--kubernetes-node-name`).
    pub node_name: String,
    /// The API server (`--kubernetes-api-url`, or the in-cluster service).
    pub url: Uri,
    /// The CA that signs the API server's certificate (`--kubernetes-api-ca-file`).
    pub ca_file: PathBuf,
}

/// The latest kubelet state, shared between the refresh task and the publisher.
#[derive(Debug, Clone)]
pub struct StateHandle(Arc<Mutex<KubernetesState>>);

impl StateHandle {
    /// Nothing asked yet: down, no assignments, every error reason at 0.
    pub fn new(options: &KubernetesOptions) -> StateHandle {
        StateHandle(Arc::new(Mutex::new(initial_state(options))))
    }

    /// Follows a configuration reload that changes what is asked: the error reasons of a call
    /// turned on appear from 0, those of a call turned off disappear, and the pod list goes with
    /// its call. The rest of the state carries on.
    pub fn reconfigure(&self, options: &KubernetesOptions) {
        let mut state = self.lock();
        for (on, reasons) in optional_reasons(options) {
            if on {
                for reason in reasons {
                    state.errors.entry(*reason).or_insert(0);
                }
            } else {
                state.errors.retain(|reason, _| !reasons.contains(reason));
            }
        }
        if options.pods.is_none() {
            state.pods = Arc::from([]);
            state.pod_meta = Arc::default();
        }
    }

    /// Counts one failed call under `reason`.
    pub fn count_error(&self, reason: KubeletError) {
        *self.lock().errors.entry(reason).or_default() += 1;
    }

    /// A copy of the latest state (cheap: the assignment list is shared).
    pub fn current(&self) -> KubernetesState {
        self.lock().clone()
    }

    /// Replaces the state, as a refresh does.
    #[cfg(test)]
    pub(crate) fn replace(&self, state: KubernetesState) {
        *self.lock() = state;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KubernetesState> {
        // A poisoned lock only means an update panicked; each update replaces whole fields.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl From<KubernetesState> for StateHandle {
    /// A handle holding `state`, as if the kubelet had answered it.
    fn from(state: KubernetesState) -> StateHandle {
        StateHandle(Arc::new(Mutex::new(state)))
    }
}

/// The refresh task. Stops when dropped.
#[derive(Debug)]
pub struct Watcher {
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    /// Starts refreshing `state` on the current tokio runtime. Never fails: a missing socket is
    /// one more failed call, retried at the next refresh.
    ///
    /// `on_change` is called (on the runtime) whenever a refresh changes the GPU assignments or
    /// the pod list, so the publisher can serve them before the next tick.
    pub fn spawn(
        options: &KubernetesOptions,
        state: StateHandle,
        on_change: impl Fn() + Send + Sync + 'static,
    ) -> Watcher {
        let mut refresher = Refresher::new(options, state.clone());
        refresher.on_change = Some(Box::new(on_change));
        let refresh = options.refresh;
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(refresh);
            // A call that takes longer than the period delays the next one instead of bunching
            // calls up after it.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                refresher.refresh().await;
            }
        });
        Watcher { task }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Kubernetes tasks of a running exporter: the kubelet refresh and, with
/// `--kubernetes-node-condition`, the node condition's writer. Both stop when dropped.
#[derive(Debug)]
pub struct Tasks {
    /// The latest kubelet answer, shared with the publisher.
    pub state: StateHandle,
    _watcher: Watcher,
    _condition: Option<node_condition::Writer>,
}

impl Tasks {
    /// Refreshes `state` as `options` say, calling `on_change` when the assignments or the pod
    /// list change, and with `--kubernetes-node-condition` writes the verdicts of `current` (the
    /// last published snapshot) to the node. Called on the runtime.
    pub fn start(
        options: &KubernetesOptions,
        state: StateHandle,
        on_change: impl Fn() + Send + Sync + 'static,
        current: impl Fn() -> Option<Arc<Snapshot>> + Send + 'static,
    ) -> Tasks {
        let condition = options
            .node_condition
            .as_ref()
            .map(|api| node_condition::Writer::spawn(api, options, state.clone(), current));
        Tasks {
            _watcher: Watcher::spawn(options, state.clone(), on_change),
            _condition: condition,
            state,
        }
    }
}

/// Calls `List` (and `/pods` when asked to) once and returns the resulting state, for `--once`.
pub async fn list_once(options: &KubernetesOptions) -> KubernetesState {
    let state = StateHandle::new(options);
    Refresher::new(options, state.clone()).refresh().await;
    state.current()
}

/// Nothing asked yet. The error reasons of the optional calls (the pod list, DRA, the node
/// condition) exist only where the call is made, so that a node does not serve counters for
/// calls it never makes.
fn initial_state(options: &KubernetesOptions) -> KubernetesState {
    let mut state = KubernetesState::new();
    for (on, reasons) in optional_reasons(options) {
        if !on {
            state.errors.retain(|reason, _| !reasons.contains(reason));
        }
    }
    state
}

/// The error reasons of the optional calls: the pod list, DRA, the node condition.
const OPTIONAL_REASONS: [&[KubeletError]; 3] =
    [pods::REASONS, dra::REASONS, node_condition::REASONS];

/// Whether each optional call is made, with its error reasons.
fn optional_reasons(
    options: &KubernetesOptions,
) -> impl Iterator<Item = (bool, &'static [KubeletError])> {
    let on = [
        options.pods.is_some(),
        options.dra.is_some(),
        options.node_condition.is_some(),
    ];
    on.into_iter().zip(OPTIONAL_REASONS)
}

/// One `List` call (and `/pods` call) and what it changes.
struct Refresher {
    client: PodResourcesClient,
    filter: ResourceFilter,
    timeout: std::time::Duration,
    state: StateHandle,
    /// Told when the assignments or the pod list change.
    on_change: Option<OnChange>,
    /// The `/pods` client, with [`KubernetesOptions::pods`].
    pods: Option<PodsClient>,
    /// How the last `/pods` call ended; `None` before the first. Only for logging changes.
    pods_last: Option<Result<(), KubeletError>>,
    /// The assignments of the last successful `List`, ended pods included.
    listed: Arc<[PodAssignment]>,
    /// (namespace, name) of the pods `listed` names that the last successful `/pods` showed
    /// ended or did not have.
    ended: BTreeSet<(String, String)>,
    /// The DRA claim resolver, with `--kubernetes-dra`.
    dra: Option<dra::Dra>,
}

type OnChange = Box<dyn Fn() + Send + Sync>;

impl Refresher {
    fn new(options: &KubernetesOptions, state: StateHandle) -> Refresher {
        // A refresher made anew by a reload carries on from the assignments served.
        let listed = state.current().assignments;
        Refresher {
            client: PodResourcesClient::new(&options.pod_resources_socket),
            filter: ResourceFilter::new(options.resource_names.iter().cloned()),
            timeout: options.timeout,
            state,
            on_change: None,
            pods: options.pods.as_ref().map(|pods| {
                if pods.ca_file.is_none() {
                    tracing::warn!(
                        url = %pods.url,
                        "--kubelet-insecure-tls: the kubelet's serving certificate is not verified; \
                         anyone who can intercept node traffic can answer /pods and receives the \
                         service account token"
                    );
                }
                PodsClient::new(pods, options)
            }),
            pods_last: None,
            listed,
            ended: BTreeSet::new(),
            dra: options.dra.as_ref().map(|dra| dra::Dra::new(dra, options)),
        }
    }

    async fn refresh(&mut self) {
        // Both calls at once, so a slow kubelet costs one deadline per refresh, not two.
        let (list, pods) = match &mut self.pods {
            Some(pods) => {
                let (list, pods) = tokio::join!(self.client.list(self.timeout), pods.fetch());
                (list, Some(pods))
            }
            None => (self.client.list(self.timeout).await, None),
        };
        let claimed = match (&list, &self.dra) {
            (Ok(response), Some(dra)) => Some(dra::claimed_devices(response, dra.driver())),
            _ => None,
        };
        self.apply(list);
        if let (Some(claimed), Some(dra)) = (claimed, &mut self.dra) {
            let (assignments, errors) = dra.resolve(claimed).await;
            if !assignments.is_empty() {
                let mut all = self.listed.to_vec();
                all.extend(assignments);
                all.sort();
                all.dedup();
                self.listed = Arc::from(all);
            }
            let mut state = self.state.lock();
            for reason in errors {
                *state.errors.entry(reason).or_default() += 1;
            }
        }
        let mut changed = false;
        if let Some(pods) = pods {
            changed |= self.apply_pods(pods);
        }
        changed |= self.attribute();
        if let (true, Some(on_change)) = (changed, &self.on_change) {
            on_change();
        }
    }

    /// Records the result of one `/pods` call; true when the pod list or what it says of the
    /// pods (controllers, copied labels) changed.
    fn apply_pods(&mut self, result: Result<pod_list::KubeletPods, rest::RestError>) -> bool {
        let url = self
            .pods
            .as_ref()
            .map(|p| p.url().to_string())
            .unwrap_or_default();
        let mut state = self.state.lock();
        match result {
            Ok(answer) => {
                self.ended = self.ended_pods(&answer.live);
                let list = answer.running;
                let mut changed = false;
                if *state.pod_meta != answer.meta {
                    state.pod_meta = Arc::new(answer.meta);
                    changed = true;
                }
                if self.pods_last != Some(Ok(())) {
                    tracing::info!(url, pods = list.len(), "kubelet pod list answering");
                }
                self.pods_last = Some(Ok(()));
                if *state.pods != *list {
                    tracing::debug!(pods = list.len(), "kubelet pod list changed");
                    state.pods = Arc::from(list);
                    changed = true;
                }
                return changed;
            }
            Err(e) => {
                // Logged when the pod list stops answering or fails differently (a fix of one
                // problem revealing the next), not on every failed refresh.
                if self.pods_last != Some(Err(e.reason)) {
                    tracing::warn!(
                        url,
                        reason = e.reason.label(),
                        error = %e,
                        "kubelet pod list not answering; keeping the last list and retrying every refresh"
                    );
                }
                self.pods_last = Some(Err(e.reason));
                *state.errors.entry(e.reason).or_default() += 1;
            }
        }
        false
    }

    /// The pods of the listed assignments that are not in `live`, each logged when it starts
    /// to be left out.
    fn ended_pods(&self, live: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
        let ended: BTreeSet<(String, String)> = self
            .listed
            .iter()
            .map(|a| (a.container.namespace.clone(), a.container.pod.clone()))
            .filter(|pod| !live.contains(pod))
            .collect();
        for (namespace, pod) in ended.difference(&self.ended) {
            tracing::info!(
                namespace,
                pod,
                "pod has ended (or left the kubelet's pod list) while the kubelet still lists its \
                 devices: its GPUs are no longer attributed to it"
            );
        }
        ended
    }

    /// Serves the listed assignments of pods not ended; true when that changed them.
    fn attribute(&mut self) -> bool {
        let assignments: Vec<PodAssignment> = self
            .listed
            .iter()
            .filter(|a| {
                let pod = (a.container.namespace.clone(), a.container.pod.clone());
                !self.ended.contains(&pod)
            })
            .cloned()
            .collect();
        let mut state = self.state.lock();
        if *state.assignments == *assignments {
            return false;
        }
        tracing::debug!(assignments = ?assignments, "GPU assignments changed");
        state.assignments = Arc::from(assignments);
        true
    }

    /// Records the result of one `List`.
    fn apply(&mut self, result: Result<proto::ListPodResourcesResponse, pod_resources::ListError>) {
        let mut state = self.state.lock();
        match result {
            Ok(response) => {
                let assignments = mapping::assignments(&response, &self.filter);
                if !state.up {
                    tracing::info!(
                        socket = %self.client.socket().display(),
                        assignments = assignments.len(),
                        "kubelet pod-resources API answering"
                    );
                }
                self.listed = Arc::from(assignments);
                state.up = true;
            }
            Err(e) => {
                // Logged when the kubelet stops answering, not on every failed refresh.
                let list_errors = state
                    .errors
                    .iter()
                    .filter(|(reason, _)| {
                        OPTIONAL_REASONS
                            .iter()
                            .all(|reasons| !reasons.contains(reason))
                    })
                    .map(|(_, n)| *n);
                if state.up || list_errors.sum::<u64>() == 0 {
                    tracing::warn!(
                        socket = %self.client.socket().display(),
                        reason = e.reason.label(),
                        error = %e,
                        "kubelet pod-resources API not answering; keeping the last assignments and retrying every refresh"
                    );
                }
                state.up = false;
                *state.errors.entry(e.reason).or_default() += 1;
            }
        }
    }
}

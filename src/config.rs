//! Configuration: defaults < `--config` file (TOML) < `NVML_EXPORTER_*` environment < flags.
//!
//! Every option is declared once, as a field of [`Config`]. clap derives from it the flag, the
//! environment variable and the default shown in `--help` (`--nvml-lib`, `NVML_EXPORTER_NVML_LIB`,
//! `[default: libnvidia-ml.so.1]`); serde derives the file key (`nvml_lib`). [`load`] reads the
//! file into a `Config` (a missing key keeps its default), lets every value given by a flag or the
//! environment replace the file's, and validates the result.
//!
//! Nothing here exits: [`load`] returns a [`ConfigError`] whose message names the option and where
//! the bad value came from (the command line, the environment variable, or the file's line), and
//! `main` turns it into exit status 2.
//!
//! Adding an option: a field of [`Config`] (its doc comment is the help text; `#[arg]` gives the
//! flag, the variable and the default; `#[serde(deserialize_with)]` when the file writes the value
//! as text), then the code that uses it, and a check in `Config::validate` if some values must be
//! refused.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, CommandFactory, FromArgMatches, Parser, ValueEnum};
use serde::{Deserialize, Deserializer};

use crate::files::{one_line, read_small_file};
use crate::groups::{Group, Groups, valid_names};
use crate::kubernetes::{DraOptions, KubernetesOptions, PodsOptions};
use crate::metrics::dcgm::DcgmCompat;

/// The NVML library loaded when neither `--nvml-lib` nor `--demo` is given. Containers get only the
/// versioned soname from the NVIDIA container toolkit, so the unversioned name would not be found.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// The shortest sampling interval accepted. Production wants 1s or more (NVML refreshes most
/// readings every 100ms to 1s); shorter intervals exist for soak runs that compress hours of ticks.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The longest sampling interval accepted.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// The shortest default `--stale-grace`; a long interval lengthens it to three intervals.
const MIN_DEFAULT_STALE_GRACE: Duration = Duration::from_secs(5);

/// Where the kubelet serves the pod-resources API on every standard node.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Where the kubelet serves its HTTPS API (`/pods`) when the DaemonSet does not say: a kubelet
/// reachable on the loopback interface, as with `hostNetwork`.
pub const DEFAULT_KUBELET_URL: &str = "https://127.0.0.1:10250";

/// The service account token Kubernetes projects into every pod that mounts one.
pub const DEFAULT_KUBELET_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu).
pub const DEFAULT_DRA_DRIVER: &str = "gpu.nvidia.com";

/// The cluster CA projected next to the token; it signs the kubelet's serving certificate when the
/// cluster approves kubelet serving certificates (`serverTLSBootstrap`).
pub const DEFAULT_KUBELET_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// File name of the simulated driver library that `--demo` loads from next to the executable.
pub const DEMO_NVML_LIB: &str = "libnvml_sim.so";

/// Every option of the exporter. A field's name is its file key and, with dashes, its flag; its
/// doc comment is its help text.
///
/// [`load`] returns it validated; [`Config::default`] holds the defaults, which are clap's.
#[derive(Debug, Clone, PartialEq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// YAML file in the Prometheus exporter-toolkit web-config format: tls_server_config (TLS,
    /// client certificates) and basic_auth_users (bcrypt). Without it: plain HTTP, no auth
    #[arg(
        long,
        env = "NVML_EXPORTER_WEB_CONFIG",
        value_name = "FILE",
        global = true
    )]
    pub web_config: Option<PathBuf>,

    /// Address to serve HTTP on; ":PORT" means all IPv4 interfaces
    #[arg(long, env = "NVML_EXPORTER_LISTEN", value_name = "ADDR",
          default_value = "0.0.0.0:9400", value_parser = parse_listen)]
    #[serde(deserialize_with = "listen_text")]
    pub listen: SocketAddr,

    /// Sampling interval (at least 10ms; below 1s only for tests and soak runs: NVML refreshes most
    /// readings every 100ms to 1s)
    #[arg(long, env = "NVML_EXPORTER_INTERVAL", value_name = "DURATION",
          default_value = "1s", value_parser = parse_duration)]
    #[serde(deserialize_with = "duration_text")]
    pub interval: Duration,

    /// Per-device deadline within one tick; a device that misses it is served from its last
    /// reading, marked stale (at most the interval) [default: the interval]
    #[arg(long, env = "NVML_EXPORTER_DEVICE_TIMEOUT", value_name = "DURATION",
          value_parser = parse_duration)]
    #[serde(deserialize_with = "some_duration_text")]
    pub device_timeout: Option<Duration>,

    /// How long a device may go without a fresh reading before nvidia_gpu_up drops to 0 (at least
    /// the interval) [default: 5s, or 3 intervals when that is longer]
    #[arg(long, env = "NVML_EXPORTER_STALE_GRACE", value_name = "DURATION",
          value_parser = parse_duration)]
    #[serde(deserialize_with = "some_duration_text")]
    pub stale_grace: Option<Duration>,

    /// A GPU (or MIG instance) whose SM activity, or utilization where GPM does not answer, is
    /// below this ratio is idle: its holders' GPU-seconds count as idle (0 to 1)
    #[arg(
        long,
        env = "NVML_EXPORTER_IDLE_THRESHOLD",
        value_name = "RATIO",
        default_value_t = 0.05
    )]
    pub idle_threshold: f64,

    /// NVML library to load: a path or a soname
    #[arg(long, env = "NVML_EXPORTER_NVML_LIB", value_name = "PATH",
          default_value = DEFAULT_NVML_LIB)]
    pub nvml_lib: PathBuf,

    /// Use the simulated GPUs of libnvml_sim.so next to the executable instead of the driver
    #[arg(long, env = "NVML_EXPORTER_DEMO", value_name = "BOOL", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true",
          require_equals = true)]
    pub demo: bool,

    /// Sample once, print the exposition to stdout and exit (status 1 when NVML is unavailable)
    #[arg(long, env = "NVML_EXPORTER_ONCE", value_name = "BOOL", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true",
          require_equals = true)]
    pub once: bool,

    /// Log format
    #[arg(long, env = "NVML_EXPORTER_LOG_FORMAT", value_name = "FORMAT", value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives
    #[arg(
        long,
        env = "NVML_EXPORTER_LOG_LEVEL",
        value_name = "FILTER",
        default_value = "info"
    )]
    pub log_level: String,

    /// Serve dcgm-exporter's metric names, units and labels: "dcgm" (the default when given
    /// without a value) serves only those for the GPUs, "both" serves the native names and then
    /// dcgm-exporter's, "off" only the native ones
    #[arg(long, env = "NVML_EXPORTER_DCGM_COMPAT", value_name = "MODE", value_enum,
          default_value_t = DcgmCompat::Off, num_args = 0..=1, default_missing_value = "dcgm",
          require_equals = true)]
    pub dcgm_compat: DcgmCompat,

    /// At most this many series of the GPU families (dcgm-exporter's names included): above it
    /// whole collector groups are left out, the most detailed first (processes, NVLink per link, media engines, SM pipes,
    /// clock-event reasons, ... see docs/metrics.md), with one log line and
    /// nvml_exporter_series_dropped_total; identity and nvidia_gpu_up are never left out
    /// [default: no limit]
    #[arg(long, env = "NVML_EXPORTER_MAX_SERIES", value_name = "N")]
    pub max_series: Option<usize>,

    /// Attribute GPUs to pods: ask the kubelet's pod-resources API which container holds each GPU
    /// (nvidia_gpu_pod_info, and labels on the GPU's series)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES", value_name = "BOOL", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true",
          require_equals = true, help_heading = "Kubernetes")]
    pub kubernetes: bool,

    /// Add namespace, pod and container labels to every series of a GPU assigned to exactly one
    /// container (a shared GPU gets none; nvidia_gpu_pod_info lists its containers)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_LABELS", value_name = "BOOL",
          default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    pub kubernetes_labels: bool,

    /// The kubelet's pod-resources socket
    #[arg(long, env = "NVML_EXPORTER_POD_RESOURCES_SOCKET", value_name = "PATH",
          default_value = DEFAULT_POD_RESOURCES_SOCKET, help_heading = "Kubernetes")]
    pub pod_resources_socket: PathBuf,

    /// Extended resource names whose devices are GPUs too, comma-separated (nvidia.com/gpu and
    /// nvidia.com/mig-* always are)
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_RESOURCE_NAMES",
        value_name = "NAMES",
        value_delimiter = ',',
        help_heading = "Kubernetes"
    )]
    pub kubernetes_resource_names: Vec<String>,

    /// How often to ask the kubelet [default: the interval]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_REFRESH", value_name = "DURATION",
          value_parser = parse_duration, help_heading = "Kubernetes")]
    #[serde(deserialize_with = "some_duration_text")]
    pub kubernetes_refresh: Option<Duration>,

    /// Deadline of one call to the kubelet; a slower answer counts as a timeout
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_TIMEOUT", value_name = "DURATION",
          default_value = "1s", value_parser = parse_duration, help_heading = "Kubernetes")]
    #[serde(deserialize_with = "duration_text")]
    pub kubernetes_timeout: Duration,

    /// The kubelet's HTTPS API, asked for its pod list (/pods) to name the pod and container of
    /// each GPU process (with --processes)
    #[arg(long, env = "NVML_EXPORTER_KUBELET_URL", value_name = "URL",
          default_value = DEFAULT_KUBELET_URL, value_parser = parse_url,
          help_heading = "Kubernetes")]
    #[serde(deserialize_with = "url_text")]
    pub kubelet_url: http::Uri,

    /// Bearer token for the kubelet, re-read on every call
    #[arg(long, env = "NVML_EXPORTER_KUBELET_TOKEN_FILE", value_name = "PATH",
          default_value = DEFAULT_KUBELET_TOKEN_FILE, help_heading = "Kubernetes")]
    pub kubelet_token_file: PathBuf,

    /// CA bundle verifying the kubelet's serving certificate
    #[arg(long, env = "NVML_EXPORTER_KUBELET_CA_FILE", value_name = "PATH",
          default_value = DEFAULT_KUBELET_CA_FILE, help_heading = "Kubernetes")]
    pub kubelet_ca_file: PathBuf,

    /// Do not verify the kubelet's serving certificate (kubelets often serve a self-signed one)
    #[arg(long, env = "NVML_EXPORTER_KUBELET_INSECURE_TLS", value_name = "BOOL",
          default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    pub kubelet_insecure_tls: bool,

    /// Fetch the kubelet's pod list (/pods) even without --processes, so that the GPUs of a pod
    /// that has ended (Succeeded, Failed, or gone from the list) are released at the next
    /// refresh rather than when the kubelet forgets their devices; needs the RBAC of
    /// deploy/kubernetes/processes
    #[arg(long, env = "NVML_EXPORTER_KUBELET_PODS", value_name = "BOOL",
          default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    pub kubelet_pods: bool,

    /// Pod labels copied onto nvidia_gpu_pod_info as label_KEY (kube-state-metrics' naming),
    /// comma-separated, e.g. kueue.x-k8s.io/queue-name,team; read from the kubelet's pod list,
    /// which they make the exporter fetch (with the RBAC of deploy/kubernetes/processes)
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_POD_LABELS",
        value_name = "KEYS",
        value_delimiter = ',',
        help_heading = "Kubernetes"
    )]
    pub kubernetes_pod_labels: Vec<String>,

    /// Pod annotations copied onto nvidia_gpu_pod_info as annotation_KEY, comma-separated,
    /// as --kubernetes-pod-labels
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_POD_ANNOTATIONS",
        value_name = "KEYS",
        value_delimiter = ',',
        help_heading = "Kubernetes"
    )]
    pub kubernetes_pod_annotations: Vec<String>,

    /// Attribute GPUs and MIG devices allocated through DRA resource claims of
    /// --kubernetes-dra-driver, named exactly by the driver's ResourceSlices, read from the API
    /// server (needs --kubernetes-node-name and the RBAC of deploy/kubernetes/dra)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_DRA", value_name = "BOOL",
          default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    pub kubernetes_dra: bool,

    /// The DRA driver whose claims are GPU assignments (NVIDIA's; other drivers' are ignored)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_DRA_DRIVER", value_name = "NAME",
          default_value = DEFAULT_DRA_DRIVER, help_heading = "Kubernetes")]
    pub kubernetes_dra_driver: String,

    /// This node's name, whose ResourceSlices are read (with --kubernetes-dra; in a DaemonSet,
    /// from the downward API's spec.nodeName)
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_NODE_NAME",
        value_name = "NAME",
        help_heading = "Kubernetes"
    )]
    pub kubernetes_node_name: Option<String>,

    /// The API server, asked for ResourceSlices with --kubernetes-dra [default:
    /// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, as in-cluster clients]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_API_URL", value_name = "URL",
          value_parser = parse_url, help_heading = "Kubernetes")]
    #[serde(deserialize_with = "some_url_text")]
    pub kubernetes_api_url: Option<http::Uri>,

    /// CA bundle verifying the API server's certificate (the service account's token, from
    /// --kubelet-token-file, is the credential)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_API_CA_FILE", value_name = "PATH",
          default_value = DEFAULT_KUBELET_CA_FILE, help_heading = "Kubernetes")]
    pub kubernetes_api_ca_file: PathBuf,

    /// Serve per-process GPU memory and SM utilization, and per-pod sums of them (needs the
    /// host's pids: hostPID in Kubernetes)
    #[arg(long, env = "NVML_EXPORTER_PROCESSES", value_name = "BOOL", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true",
          require_equals = true, help_heading = "Processes")]
    pub processes: bool,

    /// At most this many process series per GPU, the largest by memory; per-pod sums still count
    /// every process
    #[arg(long, env = "NVML_EXPORTER_MAX_PROCESSES_PER_GPU", value_name = "N",
          default_value_t = crate::processes::DEFAULT_MAX_PROCESSES_PER_GPU,
          help_heading = "Processes")]
    pub max_processes_per_gpu: usize,

    /// Where the host's procfs is mounted, for process names and cgroups
    #[arg(
        long,
        env = "NVML_EXPORTER_HOST_PROC",
        value_name = "PATH",
        default_value = "/proc",
        help_heading = "Processes"
    )]
    pub host_proc: PathBuf,

    /// A directory of HPC job mapping files in dcgm-exporter's format, re-read every tick: one
    /// file per GPU index (or GPU.INSTANCE, e.g. 2.1, for a MIG GPU instance) holding the IDs
    /// of the jobs on it, one a line, written by the scheduler's prolog and removed by its
    /// epilog (nvidia_gpu_job_info)
    #[arg(
        long,
        env = "NVML_EXPORTER_HPC_JOB_MAPPING_DIR",
        value_name = "DIR",
        help_heading = "HPC jobs"
    )]
    pub hpc_job_mapping_dir: Option<PathBuf>,

    /// The collector groups: `--collector.NAME`, `--no-collector.NAME`,
    /// `--collector.disable-defaults`; in the file a table `collector` (`collector.nvlink-links =
    /// true`).
    #[command(flatten)]
    #[serde(rename = "collector")]
    pub collectors: Collectors,

    /// Set by the `check-config` subcommand: validate everything, print "ok" and exit instead of
    /// serving. Not an option.
    #[arg(skip)]
    #[serde(skip)]
    pub check_config: bool,

    /// Set by [`load`]: the `--config` file the options were read from, watched for changes by
    /// the configuration reload. Not an option.
    #[arg(skip)]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
}

impl Default for Config {
    /// The defaults declared on the fields: an empty command line, read without the environment.
    fn default() -> Self {
        let command =
            Config::augment_args(clap::Command::new("nvml-exporter")).mut_args(|arg| arg.env(None));
        command
            .try_get_matches_from(["nvml-exporter"])
            .and_then(|matches| Config::from_arg_matches(&matches))
            .expect("every declared default parses")
    }
}

impl Config {
    /// The per-device deadline within a tick: `--device-timeout`, or the interval.
    pub fn device_timeout(&self) -> Duration {
        self.device_timeout.unwrap_or(self.interval)
    }

    /// How long a device may go without a fresh reading: `--stale-grace`, or 5s or three
    /// intervals, whichever is longer, so that one missed tick never marks a GPU down.
    pub fn stale_grace(&self) -> Duration {
        self.stale_grace
            .unwrap_or_else(|| MIN_DEFAULT_STALE_GRACE.max(self.interval.saturating_mul(3)))
    }

    /// How often the kubelet is asked: `--kubernetes-refresh`, or the interval.
    pub fn kubernetes_refresh(&self) -> Duration {
        self.kubernetes_refresh.unwrap_or(self.interval)
    }

    /// The API server: `--kubernetes-api-url`, else what in-cluster clients use, the service the
    /// kubelet describes in `KUBERNETES_SERVICE_HOST` and `_PORT`, else
    /// `https://kubernetes.default.svc`.
    pub fn kubernetes_api_url(&self) -> http::Uri {
        if let Some(url) = &self.kubernetes_api_url {
            return url.clone();
        }
        let host = std::env::var("KUBERNETES_SERVICE_HOST").unwrap_or_default();
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_default();
        let url = match (host.trim(), port.trim()) {
            ("", _) => "https://kubernetes.default.svc".to_owned(),
            (host, port) => {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.to_owned()
                };
                let port = if port.is_empty() { "443" } else { port };
                format!("https://{host}:{port}")
            }
        };
        url.parse()
            .unwrap_or_else(|_| http::Uri::from_static("https://kubernetes.default.svc"))
    }

    /// Which NVML library to load: the simulator with `--demo`, else `--nvml-lib`.
    pub fn nvml(&self) -> NvmlSource {
        if self.demo {
            NvmlSource::Demo
        } else {
            NvmlSource::Path(self.nvml_lib.clone())
        }
    }

    /// Whether the kubelet's pod list (`/pods`) is fetched: with `--kubelet-pods`, and where
    /// naming the pod of a GPU process (`--processes`, with the processes group on) needs it.
    /// Whenever it is, the GPUs of ended pods are released.
    pub fn fetch_pods(&self) -> bool {
        self.kubelet_pods
            || !self.kubernetes_pod_labels.is_empty()
            || !self.kubernetes_pod_annotations.is_empty()
            || (self.processes && self.groups().contains(Group::Processes))
    }

    /// The pod labels and annotations copied onto `nvidia_gpu_pod_info`: (key, whether an
    /// annotation, Prometheus label name), in option order, labels first.
    pub fn copied_pod_metadata(&self) -> Vec<(String, bool, String)> {
        let labels = self.kubernetes_pod_labels.iter().map(|k| (k, false));
        let annotations = self.kubernetes_pod_annotations.iter().map(|k| (k, true));
        labels
            .chain(annotations)
            .map(|(key, annotation)| {
                let prefix = if annotation { "annotation_" } else { "label_" };
                (
                    key.clone(),
                    annotation,
                    format!("{prefix}{}", sanitize_label(key)),
                )
            })
            .collect()
    }

    /// What the kubelet refresh reads (`--kubernetes-*`, `--kubelet-*`), defaults resolved: the
    /// pod list only where it is fetched, DRA only with `--kubernetes-dra`.
    pub fn kubernetes_options(&self) -> KubernetesOptions {
        KubernetesOptions {
            pod_resources_socket: self.pod_resources_socket.clone(),
            resource_names: self.kubernetes_resource_names.clone(),
            refresh: self.kubernetes_refresh(),
            timeout: self.kubernetes_timeout,
            token_file: self.kubelet_token_file.clone(),
            pods: self.fetch_pods().then(|| PodsOptions {
                url: self.kubelet_url.clone(),
                ca_file: (!self.kubelet_insecure_tls).then(|| self.kubelet_ca_file.clone()),
                copied: self.copied_pod_metadata(),
            }),
            dra: self.kubernetes_dra.then(|| DraOptions {
                driver: self.kubernetes_dra_driver.clone(),
                node_name: self.kubernetes_node_name.clone().unwrap_or_default(),
                api_url: self.kubernetes_api_url(),
                api_ca_file: self.kubernetes_api_ca_file.clone(),
            }),
        }
    }

    /// The HPC job mapping directory read: `--hpc-job-mapping-dir`, while the `jobs` group is on
    /// (a group that is off is not read).
    pub fn job_mapping_dir(&self) -> Option<&std::path::Path> {
        self.hpc_job_mapping_dir
            .as_deref()
            .filter(|_| self.groups().contains(Group::Jobs))
    }

    /// The collector groups whose native families are served: the defaults (none with
    /// `--collector.disable-defaults`), then each group switched by name.
    pub fn groups(&self) -> Groups {
        self.collectors.groups(Groups::none())
    }

    /// Whether an assigned GPU's series carry namespace, pod and container labels.
    pub fn pod_labels(&self) -> bool {
        self.kubernetes && self.kubernetes_labels
    }

    /// Refuses values that parse but cannot be used, naming the option and where its value came
    /// from; trims the resource names and drops empty ones.
    fn validate(&mut self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        self.validate_pod_metadata(origins)?;
        self.validate_timing(origins)?;
        if !(0.0..=1.0).contains(&self.idle_threshold) {
            return Err(invalid(
                "idle_threshold",
                format!("{} is not a ratio from 0 to 1", self.idle_threshold),
            ));
        }
        // Only a value someone wrote conflicts with --demo; the default library does not.
        if self.demo && origins.of("nvml_lib") != Origin::Default {
            return Err(ConfigError::Invalid(format!(
                "--nvml-lib ({}) and --demo ({}) cannot be used together: --demo loads the simulated library",
                origins.of("nvml_lib"),
                origins.of("demo")
            )));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(invalid(
                "log_level",
                format!("{}: {e}", quote(&self.log_level)),
            ));
        }
        self.validate_kubernetes(origins)?;
        if self.max_series == Some(0) {
            return Err(invalid("max_series", "must be at least 1".into()));
        }
        if self.max_processes_per_gpu == 0 {
            return Err(invalid(
                "max_processes_per_gpu",
                "must be at least 1".into(),
            ));
        }
        let paths = [
            ("web_config", self.web_config.as_deref()),
            ("nvml_lib", Some(self.nvml_lib.as_path())),
            ("pod_resources_socket", Some(&self.pod_resources_socket)),
            ("kubelet_token_file", Some(&self.kubelet_token_file)),
            ("kubelet_ca_file", Some(&self.kubelet_ca_file)),
            ("kubernetes_api_ca_file", Some(&self.kubernetes_api_ca_file)),
            ("host_proc", Some(&self.host_proc)),
        ];
        for (id, path) in paths {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(invalid(id, "the path is empty".into()));
            }
        }
        Ok(())
    }

    /// The pod labels and annotations to copy: only with `--kubernetes`, no empty key, no two
    /// served under one name.
    fn validate_pod_metadata(&self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        let copied = [
            ("kubernetes_pod_labels", &self.kubernetes_pod_labels),
            (
                "kubernetes_pod_annotations",
                &self.kubernetes_pod_annotations,
            ),
        ];
        if let Some((id, _)) = copied.iter().find(|(_, keys)| !keys.is_empty())
            && !self.kubernetes
        {
            // Silently serving nothing would look like pods without those labels.
            return Err(invalid(
                id,
                "needs --kubernetes: the keys are copied onto nvidia_gpu_pod_info, which only \
                 --kubernetes serves"
                    .into(),
            ));
        }
        let mut names = std::collections::BTreeMap::new();
        for (key, annotation, name) in self.copied_pod_metadata() {
            let id = if annotation {
                "kubernetes_pod_annotations"
            } else {
                "kubernetes_pod_labels"
            };
            if key.trim().is_empty() {
                return Err(invalid(id, "an empty key".into()));
            }
            if let Some(other) = names.insert(name.clone(), key.clone()) {
                return Err(invalid(
                    id,
                    format!("{other:?} and {key:?} would both be served as {name}"),
                ));
            }
        }
        Ok(())
    }

    /// The interval within its bounds, and the per-device deadline and staleness grace against it.
    fn validate_timing(&self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        let interval = self.interval;
        if interval < MIN_INTERVAL {
            return Err(invalid(
                "interval",
                format!(
                    "{} is below the minimum of {}",
                    fmt_duration(interval),
                    fmt_duration(MIN_INTERVAL)
                ),
            ));
        }
        if interval > MAX_INTERVAL {
            return Err(invalid(
                "interval",
                format!(
                    "{} is above the maximum of {}",
                    fmt_duration(interval),
                    fmt_duration(MAX_INTERVAL)
                ),
            ));
        }
        let device_timeout = self.device_timeout();
        if device_timeout.is_zero() || device_timeout > interval {
            return Err(invalid(
                "device_timeout",
                format!(
                    "{} must be above 0 and at most the interval ({})",
                    fmt_duration(device_timeout),
                    fmt_duration(interval)
                ),
            ));
        }
        let stale_grace = self.stale_grace();
        if stale_grace < interval {
            return Err(invalid(
                "stale_grace",
                format!(
                    "{} must be at least the interval ({})",
                    fmt_duration(stale_grace),
                    fmt_duration(interval)
                ),
            ));
        }
        Ok(())
    }

    /// The Kubernetes options: refresh and timeout, URLs, the DRA driver and node name (trimmed),
    /// and the resource names (trimmed, empty ones dropped).
    fn validate_kubernetes(&mut self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        if let Some(refresh) = self.kubernetes_refresh.filter(|r| *r < MIN_INTERVAL) {
            return Err(invalid(
                "kubernetes_refresh",
                format!(
                    "{} is below the minimum of {}",
                    fmt_duration(refresh),
                    fmt_duration(MIN_INTERVAL)
                ),
            ));
        }
        if self.kubernetes_timeout.is_zero() {
            return Err(invalid("kubernetes_timeout", "must be above 0".into()));
        }
        check_kubelet_url(&self.kubelet_url).map_err(|e| invalid("kubelet_url", e))?;
        if let Some(url) = &self.kubernetes_api_url {
            check_kubelet_url(url).map_err(|e| invalid("kubernetes_api_url", e))?;
        }
        self.kubernetes_dra_driver = self.kubernetes_dra_driver.trim().to_owned();
        if self.kubernetes_dra_driver.is_empty() {
            return Err(invalid("kubernetes_dra_driver", "must not be empty".into()));
        }
        self.kubernetes_node_name = self
            .kubernetes_node_name
            .take()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty());
        if self.kubernetes && self.kubernetes_dra && self.kubernetes_node_name.is_none() {
            return Err(invalid(
                "kubernetes_node_name",
                "is needed by --kubernetes-dra (set NVML_EXPORTER_KUBERNETES_NODE_NAME from the \
                 downward API's spec.nodeName)"
                    .into(),
            ));
        }
        self.kubernetes_resource_names = std::mem::take(&mut self.kubernetes_resource_names)
            .into_iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if let Some(bad) = self
            .kubernetes_resource_names
            .iter()
            .find(|n| n.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(
                "kubernetes_resource_names",
                format!("'{bad}' is not a resource name (e.g. example.com/gpu)"),
            ));
        }
        Ok(())
    }
}

/// `--collector.NAME[=BOOL]`, `--no-collector.NAME` and `--collector.disable-defaults`: which
/// collector groups ([`crate::groups`]) are on. The flags are made from the group list;
/// each has a variable (`NVML_EXPORTER_COLLECTOR_NVLINK_LINKS=true`) and a key of the file's
/// `collector` table (`collector.nvlink-links = true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collectors {
    /// Start from no group: only those switched on are collected.
    pub disable_defaults: bool,
    /// Groups switched on (true) or off (false) by name.
    pub switched: BTreeMap<Group, bool>,
}

/// The name of `--collector.disable-defaults` after `collector.`.
const DISABLE_DEFAULTS: &str = "disable-defaults";

/// The argument ids of one switch: `collector.NAME` (also its long flag), `no-collector.NAME`,
/// and the variable.
struct SwitchIds {
    group: Option<Group>,
    on: &'static str,
    off: &'static str,
    env: &'static str,
}

/// The ids of every switch, `disable-defaults` first: made once, as clap keeps `&'static str`s.
fn switch_ids() -> &'static [SwitchIds] {
    static IDS: OnceLock<Vec<SwitchIds>> = OnceLock::new();
    IDS.get_or_init(|| {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        std::iter::once((None, DISABLE_DEFAULTS))
            .chain(Group::switchable().map(|g| (Some(g.group), g.name)))
            .map(|(group, name)| SwitchIds {
                group,
                on: leak(format!("collector.{name}")),
                off: leak(format!("no-collector.{name}")),
                env: leak(format!(
                    "NVML_EXPORTER_COLLECTOR_{}",
                    name.replace('-', "_").to_uppercase()
                )),
            })
            .collect()
    })
}

impl Collectors {
    /// The groups on: the defaults (none with `disable_defaults`) and `also`, then the switches.
    pub fn groups(&self, also: Groups) -> Groups {
        let mut groups = if self.disable_defaults {
            Groups::none()
        } else {
            Groups::defaults()
        }
        .union(also);
        for (group, on) in &self.switched {
            groups = if *on {
                groups.with(*group)
            } else {
                groups.without(*group)
            };
        }
        groups
    }
}

/// The error for a group name that is none.
fn unknown_group(name: &str) -> String {
    format!(
        "unknown collector group {}; the groups are: {}",
        quote(name),
        valid_names()
    )
}

/// Refuses `--collector.NAME` / `--no-collector.NAME` flags and `NVML_EXPORTER_COLLECTOR_*`
/// variables that name no group, listing the valid names (clap would only say "unexpected
/// argument", and an unknown variable would be ignored with a warning).
fn check_collector_names<I, T>(args: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    for arg in args {
        let arg = arg.into();
        let Some(arg) = arg.to_str() else { continue };
        let (flag, name) = match arg
            .strip_prefix("--collector.")
            .map(|n| ("--collector.", n))
            .or_else(|| {
                arg.strip_prefix("--no-collector.")
                    .map(|n| ("--no-collector.", n))
            }) {
            Some((flag, rest)) => (flag, rest.split('=').next().unwrap_or(rest)),
            None => continue,
        };
        let known = switch_ids().iter().any(|s| {
            (s.group.is_some() || flag == "--collector.") && s.on == format!("collector.{name}")
        });
        if !known {
            return Err(ConfigError::Invalid(format!(
                "{flag}{name} (command line): {}",
                unknown_group(name)
            )));
        }
    }
    const PREFIX: &str = "NVML_EXPORTER_COLLECTOR_";
    for (var, _) in std::env::vars_os() {
        let Some(var) = var.to_str() else { continue };
        if let Some(rest) = var.strip_prefix(PREFIX)
            && !switch_ids().iter().any(|s| s.env == var)
        {
            return Err(ConfigError::Invalid(format!(
                "environment variable {}: {}",
                one_line(var),
                unknown_group(&rest.to_lowercase().replace('_', "-"))
            )));
        }
    }
    Ok(())
}

impl clap::FromArgMatches for Collectors {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut c = Collectors::default();
        c.update_from_arg_matches(matches)?;
        Ok(c)
    }

    /// A flag or variable given replaces the file's value; `--no-collector.NAME` beats a
    /// variable (flags beat the environment), and of two flags of a group the later wins.
    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for s in switch_ids() {
            let off = matches!(matches.try_get_one::<bool>(s.off), Ok(Some(true)))
                && matches.value_source(s.off) == Some(ValueSource::CommandLine);
            let on = match matches.try_get_one::<bool>(s.on) {
                Ok(Some(v)) if matches.value_source(s.on) != Some(ValueSource::DefaultValue) => {
                    Some(*v)
                }
                _ => None,
            };
            let value = if off { Some(false) } else { on };
            match (s.group, value) {
                (_, None) => {}
                (None, Some(v)) => self.disable_defaults = v,
                (Some(g), Some(v)) => {
                    self.switched.insert(g, v);
                }
            }
        }
        Ok(())
    }
}

impl clap::Args for Collectors {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for s in switch_ids() {
            let (help, long_help) = match s.group {
                None => (
                    "Start from no collector group: only those turned on with --collector.NAME are collected".to_string(),
                    "Start from no collector group: only those turned on with --collector.NAME are \
                     collected. Each group below is turned on with --collector.NAME and off with \
                     --no-collector.NAME; with --dcgm-compat every group that dcgm-exporter's \
                     fields come from is sampled unless turned off".to_string(),
                ),
                Some(g) => {
                    let info = g.info();
                    let text = format!(
                        "Collect the {} group: {} [default: {}]",
                        info.name,
                        info.help,
                        if info.default { "on" } else { "off" }
                    );
                    (text.clone(), text)
                }
            };
            cmd = cmd
                .arg(
                    clap::Arg::new(s.on)
                        .long(s.on)
                        .env(s.env)
                        .value_name("BOOL")
                        .value_parser(clap::value_parser!(bool))
                        .action(ArgAction::Set)
                        .num_args(0..=1)
                        .default_missing_value("true")
                        .require_equals(true)
                        .help(help)
                        .long_help(long_help)
                        .help_heading("Collectors")
                        .overrides_with(s.off),
                )
                .arg(
                    clap::Arg::new(s.off)
                        .long(s.off)
                        .action(ArgAction::SetTrue)
                        .hide(true)
                        .overrides_with(s.on),
                );
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl<'de> Deserialize<'de> for Collectors {
    /// The file's `collector` table: `disable-defaults` and group names, each a boolean.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut c = Collectors::default();
        for (name, on) in BTreeMap::<String, bool>::deserialize(d)? {
            if name == DISABLE_DEFAULTS {
                c.disable_defaults = on;
                continue;
            }
            let group = Group::from_name(&name)
                .filter(|g| *g != Group::Core)
                .ok_or_else(|| D::Error::custom(unknown_group(&name)))?;
            c.switched.insert(group, on);
        }
        Ok(c)
    }
}

/// Where the NVML library comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlSource {
    /// A path or soname given to the dynamic loader.
    Path(PathBuf),
    /// The simulated driver shipped next to the executable (`--demo`).
    Demo,
}

impl NvmlSource {
    /// The path handed to the dynamic loader. For `Demo`, the simulator next to the running
    /// executable (that is where `cargo build` and the release archive put it).
    pub fn library_path(&self) -> PathBuf {
        match self {
            NvmlSource::Path(p) => p.clone(),
            NvmlSource::Demo => std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|dir| dir.join(DEMO_NVML_LIB)))
                .unwrap_or_else(|| PathBuf::from(DEMO_NVML_LIB)),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// The command line: the options, the file holding more of them, and the subcommand.
#[derive(Debug, Parser)]
#[command(
    name = "nvml-exporter",
    version,
    about = "Prometheus exporter for NVIDIA GPUs, reading NVML directly.",
    long_about = "Prometheus exporter for NVIDIA GPUs, reading NVML directly.\n\n\
        Samples every GPU on an interval and serves /metrics, /healthz, /readyz and a landing page.\n\
        Every option can also be set in a TOML file (--config; key = option name with underscores,\n\
        e.g. nvml_lib = \"/usr/lib/libnvidia-ml.so.1\") and by an environment variable\n\
        NVML_EXPORTER_<OPTION> (e.g. NVML_EXPORTER_LISTEN). Precedence: defaults < file < environment < flags.\n\
        Durations are written like 1s, 500ms, 2m."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// TOML file with any of the options below
    #[arg(long, env = "NVML_EXPORTER_CONFIG", value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    #[command(flatten)]
    options: Config,
}

/// Subcommands; without one the exporter serves.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Validate the configuration (flags, environment, --config file and --web-config file)
    /// without starting: prints "ok" (exit 0) or the error (exit 2)
    CheckConfig {
        /// TOML configuration file to check (the same as --config)
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

/// A configuration that cannot be used. `main` prints it and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// clap's own error (unknown flag, unparsable flag or environment value, `--help`, `--version`):
    /// it knows how to print itself and with which status to exit.
    #[error("{0}")]
    Cli(#[from] clap::Error),
    /// The file cannot be read or parsed, or a value is refused. The message names the option and
    /// where its value came from; it is shown on one line whatever the value holds.
    #[error("error: {}", one_line(.0))]
    Invalid(String),
}

/// Reads flags from `args` (including the program name) and options from the process environment
/// and the `--config` file, and validates the result.
pub fn load<I, T>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<T> = args.into_iter().collect();
    check_collector_names(args.iter().cloned())?;
    let mut command = Cli::command();
    let mut matches = command.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let check_config = cli.command.is_some();
    let file_path = match cli.command {
        Some(Command::CheckConfig {
            file: Some(positional),
        }) => {
            if let Some(flag) = &cli.config {
                return Err(ConfigError::Invalid(format!(
                    "check-config {} and --config {} name two files; give one",
                    positional.display(),
                    flag.display()
                )));
            }
            Some(positional)
        }
        _ => cli.config,
    };
    let (mut config, file) = match file_path {
        Some(path) => {
            let (config, lines) = read_file(&path)?;
            (config, Some(FileLines { path, lines }))
        }
        None => (Config::default(), None),
    };
    // A flag or variable beats the file; a default must not. clap fills in the defaults, so they
    // are taken out of the matches before the matches update what the file gave.
    let defaulted: Vec<String> = matches
        .ids()
        .map(|id| id.as_str().to_owned())
        .filter(|id| matches.value_source(id) == Some(ValueSource::DefaultValue))
        .collect();
    for id in &defaulted {
        // The ids come from these matches, so clearing them cannot fail.
        let _ = matches.try_clear_id(id);
    }
    config.update_from_arg_matches(&matches)?;
    config.check_config = check_config;
    config.config_file = file.as_ref().map(|f| f.path.clone());
    let origins = Origins {
        command: &command,
        matches: &matches,
        file: file.as_ref(),
    };
    config.validate(&origins)?;
    Ok(config)
}

/// Reads the `--config` file into a [`Config`], with the line of each key in it.
fn read_file(path: &Path) -> Result<(Config, HashMap<String, usize>), ConfigError> {
    let text = read_small_file(path)
        .and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
        .map_err(|e| {
            ConfigError::Invalid(format!("--config: cannot read {}: {e}", path.display()))
        })?;
    let error = |e: toml::de::Error| {
        // toml gives no position for some errors (its nesting limit): then there is no line.
        let line = e
            .span()
            .map(|s| format!(" line {}", line_of(&text, s.start)))
            .unwrap_or_default();
        // The key the error is about, when toml can tell (it names unknown fields itself).
        let key = e
            .span()
            .and_then(|s| key_before(&text, s.start))
            .map(|k| format!(" (option {k})"))
            .unwrap_or_default();
        ConfigError::Invalid(format!(
            "--config {}{line}{key}: {}",
            path.display(),
            e.message().trim()
        ))
    };
    let table = toml::de::DeTable::parse(&text).map_err(error)?;
    let lines = table
        .get_ref()
        .iter()
        .map(|(key, value)| {
            (
                key.get_ref().to_string(),
                line_of(&text, value.span().start),
            )
        })
        .collect();
    let config = Config::deserialize(toml::de::Deserializer::from(table)).map_err(error)?;
    Ok((config, lines))
}

/// Variables named like options (`NVML_EXPORTER_*`) that are none, each with a warning naming it
/// and the closest option's variable if one is close: a mistyped variable would otherwise be
/// ignored without a word. `vars` are the names in the environment.
pub fn unknown_variables<I, S>(vars: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    const PREFIX: &str = "NVML_EXPORTER_";
    let command = Cli::command();
    let known: Vec<String> = command
        .get_arguments()
        .filter_map(clap::Arg::get_env)
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let mut warnings = Vec::new();
    for var in vars {
        let var = var.as_ref().to_string_lossy();
        let Some(rest) = var.strip_prefix(PREFIX) else {
            continue;
        };
        if known.iter().any(|k| *k == var) || NOT_OPTIONS.contains(&var.as_ref()) {
            continue;
        }
        let closest = known
            .iter()
            .map(|k| (edit_distance(rest, &k[PREFIX.len()..]), k))
            .min()
            .filter(|(d, _)| *d <= 3);
        warnings.push(match closest {
            Some((_, k)) => format!(
                "environment variable {} is not an option and is ignored; did you mean {k}?",
                one_line(&var)
            ),
            None => format!(
                "environment variable {} is not an option and is ignored (see --help for the variables)",
                one_line(&var)
            ),
        });
    }
    warnings
}

/// `NVML_EXPORTER_*` variables that are not options but the project's own: the revision given to
/// the build, and the real NVML library given to the tests by scripts/test.sh.
const NOT_OPTIONS: &[&str] = &["NVML_EXPORTER_REVISION", "NVML_EXPORTER_TEST_REAL_NVML"];

/// Levenshtein distance between two names, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The `key` of a `key = value` line containing `offset`, if that line is one.
fn key_before(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| key.to_string())
}

/// The `--config` file's path and the line of each key in it.
struct FileLines {
    path: PathBuf,
    lines: HashMap<String, usize>,
}

/// Where each option's value came from, for error messages: clap's matches (a flag or a variable),
/// else the file, else the default.
struct Origins<'a> {
    command: &'a clap::Command,
    matches: &'a ArgMatches,
    file: Option<&'a FileLines>,
}

impl Origins<'_> {
    fn arg(&self, id: &str) -> Option<&clap::Arg> {
        self.command.get_arguments().find(|arg| arg.get_id() == id)
    }

    fn of(&self, id: &str) -> Origin {
        match self.matches.value_source(id) {
            Some(ValueSource::CommandLine) => Origin::Flag,
            Some(ValueSource::EnvVariable) => Origin::Env(
                self.arg(id)
                    .and_then(clap::Arg::get_env)
                    .map(|var| var.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            _ => self
                .file
                .and_then(|file| {
                    let line = *file.lines.get(id)?;
                    Some(Origin::File {
                        path: file.path.clone(),
                        line,
                    })
                })
                .unwrap_or(Origin::Default),
        }
    }

    /// A refused value of the option `id`.
    fn invalid(&self, id: &str, msg: String) -> ConfigError {
        let flag = self.arg(id).and_then(clap::Arg::get_long).unwrap_or(id);
        ConfigError::Invalid(format!(
            "invalid value for --{flag} ({}): {msg}",
            self.of(id)
        ))
    }
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Default,
    Flag,
    Env(String),
    File { path: PathBuf, line: usize },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "default"),
            Origin::Flag => write!(f, "command line"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::File { path, line } => write!(f, "{} line {line}", path.display()),
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        format!(
            "{} is not a duration ({e}); write e.g. 1s, 500ms, 2m",
            quote(s)
        )
    })
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse()
        .map_err(|_| format!("{} is not an address; write HOST:PORT with an IP, e.g. 0.0.0.0:9400, [::]:9400 or :9400", quote(s)))
}

fn parse_url(s: &str) -> Result<http::Uri, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("{} is not a URL ({e})", quote(s)))
}

/// A label or annotation key as a Prometheus label name: every character outside
/// `[a-zA-Z0-9_]` becomes `_` (`kueue.x-k8s.io/queue-name` → `kueue_x_k8s_io_queue_name`).
fn sanitize_label(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// An `https://host[:port][/prefix]` URL. Only HTTPS: the request carries a bearer token, and the
/// kubelet's plain-HTTP read-only port is off by default and deprecated.
fn check_kubelet_url(uri: &http::Uri) -> Result<(), String> {
    let shown = quote(&uri.to_string());
    if uri.scheme_str() != Some("https") {
        return Err(format!(
            "{shown} must start with https:// (e.g. https://10.0.0.1:10250)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{shown} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{shown} must not have a query"));
    }
    Ok(())
}

/// A file value written as text, read with the same parser as its flag.
fn from_text<'de, D: Deserializer<'de>, T>(
    d: D,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn duration_text<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    from_text(d, parse_duration)
}

fn some_duration_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    from_text(d, parse_duration).map(Some)
}

fn listen_text<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    from_text(d, parse_listen)
}

fn url_text<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
    from_text(d, parse_url)
}

fn some_url_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<http::Uri>, D::Error> {
    url_text(d).map(Some)
}

/// A value as shown in an error message: in quotes, with line breaks and other control characters
/// escaped, so that whatever was written the message stays on one line.
fn quote(s: &str) -> String {
    format!("'{}'", s.escape_debug())
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::MAX_FILE_BYTES;
    use std::io::Write;

    fn load_args(args: &[&str]) -> Result<Config, ConfigError> {
        load(std::iter::once("nvml-exporter").chain(args.iter().copied()))
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn err(args: &[&str]) -> String {
        match load_args(args) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    // These tests avoid setting NVML_EXPORTER_* variables: the environment is process-global and
    // tests run in parallel. The environment layer is covered by the binary's integration tests.

    #[test]
    fn every_option_has_one_name_as_flag_variable_and_file_key() {
        let mut command = Cli::command();
        command.build();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let flag = id.replace('_', "-");
            assert_eq!(arg.get_long(), Some(flag.as_str()), "{id}");
            // The hidden negation of a collector switch has no variable of its own.
            if id.starts_with("no-collector.") {
                continue;
            }
            let var = format!(
                "NVML_EXPORTER_{}",
                id.replace(['.', '-'], "_").to_uppercase()
            );
            assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var.as_str()));
        }
    }

    #[test]
    fn collector_groups_from_defaults_dcgm_compat_and_switches() {
        assert_eq!(load_args(&[]).unwrap().groups(), Groups::defaults());
        let c = load_args(&["--collector.disable-defaults", "--collector.nvlink-links"]).unwrap();
        assert_eq!(c.groups(), Groups::none().with(Group::NvlinkLinks));
        // --dcgm-compat samples what dcgm-exporter's fields come from, unless turned off by name;
        // the native families served stay those of the groups on.
        let c = load_args(&["--dcgm-compat=both"]).unwrap();
        let sampled = crate::sampler_options(&c).groups;
        assert!(sampled.contains(Group::Clocks) && sampled.contains(Group::ClockEvents));
        assert!(
            !sampled.contains(Group::NvlinkLinks),
            "no DCGM field is per link"
        );
        assert_eq!(c.groups(), Groups::defaults());
        let c = load_args(&["--dcgm-compat", "--no-collector.clocks"]).unwrap();
        assert!(!crate::sampler_options(&c).groups.contains(Group::Clocks));
        let c = load_args(&[]).unwrap();
        assert_eq!(crate::sampler_options(&c).groups, Groups::defaults());
        let c = load_args(&["--collector.memory=false"]).unwrap();
        assert!(!c.groups().contains(Group::Memory));
        let f = file("collector.disable-defaults = true\ncollector.power = true\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.groups(), Groups::none().with(Group::Power));
        let c = load_args(&[
            "--config",
            f.path().to_str().unwrap(),
            "--collector.disable-defaults=false",
        ])
        .unwrap();
        assert_eq!(c.groups(), Groups::defaults());
        let f = file("collector.power = 1\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn max_series_defaults_to_none_and_refuses_0() {
        assert_eq!(load_args(&[]).unwrap().max_series, None);
        assert_eq!(
            load_args(&["--max-series", "500"]).unwrap().max_series,
            Some(500)
        );
        let e = err(&["--max-series", "0"]);
        assert!(
            e.contains("--max-series") && e.contains("at least 1"),
            "{e}"
        );
    }

    #[test]
    fn the_file_beats_defaults_and_loses_to_flags() {
        let f = file(concat!(
            "kubernetes_labels = false\n",
            "kubernetes_resource_names = [\"a.io/gpu\"]\n",
            "host_proc = \"/h\"\n",
            "log_level = \"debug\"\n",
        ));
        let path = f.path().to_str().unwrap();
        let c = load_args(&["--config", path]).unwrap();
        assert!(!c.kubernetes_labels, "a default must not beat the file");
        assert_eq!(c.kubernetes_resource_names, ["a.io/gpu"]);
        assert_eq!(c.host_proc, PathBuf::from("/h"));
        assert_eq!(c.log_level, "debug");
        let c = load_args(&[
            "--config",
            path,
            "--kubernetes-labels",
            "--kubernetes-resource-names",
            "b.io/gpu",
            "--host-proc",
            "/f",
        ])
        .unwrap();
        assert!(c.kubernetes_labels);
        assert_eq!(c.kubernetes_resource_names, ["b.io/gpu"]);
        assert_eq!(c.host_proc, PathBuf::from("/f"));
        assert_eq!(c.log_level, "debug", "what no flag gave stays the file's");
    }

    #[test]
    fn defaults_match_the_documented_contract() {
        let c = load_args(&[]).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9400".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.device_timeout(), c.interval);
        assert_eq!(
            c.nvml(),
            NvmlSource::Path(PathBuf::from("libnvidia-ml.so.1"))
        );
        assert!(!c.once);
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn flags_override_the_file() {
        let f = file("listen = \"127.0.0.1:1234\"\ninterval = \"2s\"\nlog_format = \"json\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap(), "--interval", "3s"]).unwrap();
        assert_eq!(c.listen, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(3));
        assert_eq!(
            c.device_timeout(),
            Duration::from_secs(3),
            "device timeout follows the interval"
        );
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn port_only_listen_means_all_interfaces() {
        let c = load_args(&["--listen", ":9500"]).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9500".parse().unwrap());
    }

    #[test]
    fn demo_and_nvml_lib_conflict() {
        let e = err(&["--demo", "--nvml-lib", "/x.so"]);
        assert!(e.contains("--demo") && e.contains("--nvml-lib"), "{e}");
        let f = file("demo = true\n");
        let e = err(&[
            "--config",
            f.path().to_str().unwrap(),
            "--nvml-lib",
            "/x.so",
        ]);
        assert!(e.contains("--nvml-lib") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn bad_flag_value_names_the_option() {
        let e = err(&["--interval", "soon"]);
        assert!(e.contains("--interval") && e.contains("soon"), "{e}");
        let e = err(&["--interval", "5ms"]);
        assert!(e.contains("--interval") && e.contains("10ms"), "{e}");
        let e = err(&["--listen", "nowhere"]);
        assert!(e.contains("--listen"), "{e}");
        let e = err(&["--log-level", "info,=["]);
        assert!(e.contains("--log-level"), "{e}");
    }

    #[test]
    fn bad_file_value_names_option_and_line() {
        let f = file("# comment\nlisten = \":9400\"\ninterval = \"fast\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("line 3") && e.contains("interval") && e.contains("fast"),
            "{e}"
        );

        // Parses, but out of range: still reported at its line.
        let f = file("stale_grace = \"1s\"\ninterval = \"2s\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("--stale-grace") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn unknown_file_key_is_an_error() {
        let f = file("intervall = \"1s\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("intervall") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn errors_stay_on_one_line_whatever_the_value() {
        // A value with a line break (a TOML escape) is shown escaped.
        let f = file("log_level = \"info\"\ninterval = \" \\n \"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains('\n'), "{e:?}");
        assert!(
            e.contains("line 2") && e.contains("interval") && e.contains("\\n"),
            "{e}"
        );
        let f = file("log_format = \"js\\non\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains('\n') && e.contains("log_format"), "{e:?}");
        let e = err(&["--log-level", "info\n=["]);
        assert!(!e.contains('\n') && e.contains("--log-level"), "{e:?}");
    }

    #[test]
    fn too_deep_nesting_is_an_error_without_a_made_up_line() {
        let f = file(&format!(
            "interval = {}{}\n",
            "[".repeat(1000),
            "]".repeat(1000)
        ));
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(!e.contains("line 0"), "{e}");
        assert!(e.contains(f.path().to_str().unwrap()), "{e}");
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let e = err(&["--config", big.to_str().unwrap()]);
        assert!(
            e.contains("big.toml") && e.contains("larger than 1024 KiB"),
            "{e}"
        );
        let exact = dir.path().join("exact.toml");
        std::fs::write(&exact, vec![b'#'; MAX_FILE_BYTES as usize]).unwrap();
        assert_eq!(
            read_small_file(&exact).unwrap().len() as u64,
            MAX_FILE_BYTES
        );

        let e = err(&["--config", dir.path().to_str().unwrap()]);
        assert!(e.contains("a directory, not a regular file"), "{e}");
        let e = read_small_file(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "a character device, not a regular file");
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        // Opening a FIFO without a writer would block; it must not.
        let e = read_small_file(&fifo).unwrap_err();
        assert_eq!(e.to_string(), "a FIFO, not a regular file");
    }

    #[test]
    fn unknown_variables_are_named_with_the_closest_option() {
        let warnings = unknown_variables([
            "NVML_EXPORTER_LISTEN",
            "NVML_EXPORTER_CONFIG",
            "NVML_EXPORTER_INTERVALL",
            "NVML_EXPORTER_WEBCONFIG",
            "NVML_EXPORTER_FROBNICATE",
            "NVML_EXPORTER_REVISION",
            "PATH",
        ]);
        assert_eq!(
            warnings,
            [
                "environment variable NVML_EXPORTER_INTERVALL is not an option and is ignored; \
                 did you mean NVML_EXPORTER_INTERVAL?",
                "environment variable NVML_EXPORTER_WEBCONFIG is not an option and is ignored; \
                 did you mean NVML_EXPORTER_WEB_CONFIG?",
                "environment variable NVML_EXPORTER_FROBNICATE is not an option and is ignored \
                 (see --help for the variables)",
            ]
        );
        assert_eq!(edit_distance("LISTEN", "LISTEN"), 0);
        assert_eq!(edit_distance("LISTN", "LISTEN"), 1);
        assert_eq!(edit_distance("", "AB"), 2);
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = err(&["--config", "/nonexistent/nvml-exporter.toml"]);
        assert!(
            e.contains("--config") && e.contains("/nonexistent/nvml-exporter.toml"),
            "{e}"
        );
    }

    #[test]
    fn default_stale_grace_follows_a_long_interval() {
        assert_eq!(
            load_args(&["--interval", "2s"]).unwrap().stale_grace(),
            Duration::from_secs(6)
        );
        assert_eq!(
            load_args(&["--interval", "1s"]).unwrap().stale_grace(),
            Duration::from_secs(5)
        );
        let f = file("interval = \"61s\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.stale_grace(), Duration::from_secs(183));
    }

    #[test]
    fn device_timeout_must_fit_in_the_interval() {
        let e = err(&["--interval", "1s", "--device-timeout", "2s"]);
        assert!(e.contains("--device-timeout"), "{e}");
        let c = load_args(&[
            "--interval",
            "2s",
            "--device-timeout",
            "500ms",
            "--stale-grace",
            "2s",
        ])
        .unwrap();
        assert_eq!(c.device_timeout(), Duration::from_millis(500));
    }

    #[test]
    fn web_config_from_flag_or_file() {
        let c = load_args(&["--web-config", "/etc/web.yml"]).unwrap();
        assert_eq!(c.web_config, Some(PathBuf::from("/etc/web.yml")));
        let f = file("web_config = \"/etc/other.yml\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.web_config, Some(PathBuf::from("/etc/other.yml")));
        assert!(!c.check_config);
        let e = err(&["--web-config", ""]);
        assert!(e.contains("--web-config"), "{e}");
    }

    #[test]
    fn check_config_takes_the_file_as_argument_or_flag() {
        let f = file("interval = \"2s\"\n");
        let path = f.path().to_str().unwrap();
        let c = load_args(&["check-config", path]).unwrap();
        assert!(c.check_config);
        assert_eq!(c.interval, Duration::from_secs(2));
        let c = load_args(&["check-config", "--config", path, "--web-config", "w.yml"]).unwrap();
        assert!(c.check_config);
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.web_config, Some(PathBuf::from("w.yml")));
        let e = err(&["check-config", path, "--config", path]);
        assert!(e.contains("check-config") && e.contains("--config"), "{e}");
    }

    #[test]
    fn dra_options_need_a_node_name_and_an_https_api_server() {
        let c = load_args(&[]).unwrap();
        assert!(!c.kubernetes_dra);
        assert_eq!(c.kubernetes_dra_driver, DEFAULT_DRA_DRIVER);
        assert_eq!(c.kubernetes_node_name, None);
        assert_eq!(
            c.kubernetes_api_ca_file,
            PathBuf::from(DEFAULT_KUBELET_CA_FILE)
        );

        let c = load_args(&[
            "--kubernetes",
            "--kubernetes-dra",
            "--kubernetes-node-name",
            " node-1 ",
            "--kubernetes-api-url",
            "https://10.0.0.1:6443",
        ])
        .unwrap();
        assert!(c.kubernetes_dra);
        assert_eq!(c.kubernetes_node_name.as_deref(), Some("node-1"));
        assert_eq!(c.kubernetes_api_url().to_string(), "https://10.0.0.1:6443/");

        let e = err(&["--kubernetes", "--kubernetes-dra"]);
        assert!(e.contains("--kubernetes-node-name"), "{e}");
        let e = err(&["--kubernetes-api-url", "http://10.0.0.1:6443"]);
        assert!(e.contains("--kubernetes-api-url"), "{e}");
        let e = err(&["--kubernetes-dra-driver", " "]);
        assert!(e.contains("--kubernetes-dra-driver"), "{e}");
        let f = file(
            "kubernetes = true\nkubernetes_dra = true\nkubernetes_node_name = \"n\"\nkubernetes_api_url = \"https://api:443\"\n",
        );
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.kubernetes_api_url().to_string(), "https://api:443/");
    }

    #[test]
    fn idle_threshold_defaults_overrides_and_refusals() {
        assert_eq!(load_args(&[]).unwrap().idle_threshold, 0.05);
        assert_eq!(
            load_args(&["--idle-threshold", "0.2"])
                .unwrap()
                .idle_threshold,
            0.2
        );
        let f = file("idle_threshold = 0\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.idle_threshold, 0.0);
        for bad in ["1.5", "-0.1", "NaN"] {
            let e = err(&[&format!("--idle-threshold={bad}")]);
            assert!(
                e.contains("--idle-threshold") && e.contains("not a ratio from 0 to 1"),
                "{bad}: {e}"
            );
        }
        assert!(err(&["--idle-threshold", "lots"]).contains("--idle-threshold"));
    }

    #[test]
    fn kubernetes_defaults_and_overrides() {
        let c = load_args(&["--interval", "2s", "--stale-grace", "5s"]).unwrap();
        assert!(!c.kubernetes && c.kubernetes_labels);
        assert_eq!(
            c.pod_resources_socket,
            PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET)
        );
        assert_eq!(
            c.kubernetes_refresh(),
            Duration::from_secs(2),
            "refresh follows the interval"
        );
        assert_eq!(c.kubernetes_timeout, Duration::from_secs(1));
        assert!(c.kubernetes_resource_names.is_empty());

        let c = load_args(&[
            "--kubernetes",
            "--kubernetes-labels=false",
            "--pod-resources-socket",
            "/run/k.sock",
            "--kubernetes-resource-names",
            "a.com/gpu, b.com/gpu",
            "--kubernetes-refresh",
            "5s",
            "--kubernetes-timeout",
            "200ms",
        ])
        .unwrap();
        assert!(c.kubernetes && !c.kubernetes_labels);
        assert_eq!(c.pod_resources_socket, PathBuf::from("/run/k.sock"));
        assert_eq!(c.kubernetes_resource_names, ["a.com/gpu", "b.com/gpu"]);
        assert_eq!(c.kubernetes_refresh(), Duration::from_secs(5));
        assert_eq!(c.kubernetes_timeout, Duration::from_millis(200));

        let f = file(
            "kubernetes = true\nkubernetes_resource_names = [\"x.io/gpu\"]\nkubernetes_refresh = \"3s\"\n",
        );
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert!(c.kubernetes);
        assert_eq!(c.kubernetes_resource_names, ["x.io/gpu"]);
        assert_eq!(c.kubernetes_refresh(), Duration::from_secs(3));

        let e = err(&["--kubernetes-timeout", "0s"]);
        assert!(e.contains("--kubernetes-timeout"), "{e}");
        let e = err(&["--kubernetes-refresh", "1ms"]);
        assert!(e.contains("--kubernetes-refresh"), "{e}");
        let e = err(&["--pod-resources-socket", ""]);
        assert!(e.contains("--pod-resources-socket"), "{e}");
        let f = file("kubernetes_refresh = \"1ms\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--kubernetes-refresh") && e.contains("line 1"),
            "{e}"
        );
    }

    #[test]
    fn dcgm_compat_modes() {
        assert_eq!(load_args(&[]).unwrap().dcgm_compat, DcgmCompat::Off);
        assert_eq!(
            load_args(&["--dcgm-compat"]).unwrap().dcgm_compat,
            DcgmCompat::Dcgm
        );
        assert_eq!(
            load_args(&["--dcgm-compat=both"]).unwrap().dcgm_compat,
            DcgmCompat::Both
        );
        assert_eq!(
            load_args(&["--dcgm-compat=off"]).unwrap().dcgm_compat,
            DcgmCompat::Off
        );
        let e = err(&["--dcgm-compat=all"]);
        assert!(e.contains("--dcgm-compat") && e.contains("all"), "{e}");

        let f = file("dcgm_compat = \"both\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.dcgm_compat, DcgmCompat::Both);
        // The flag beats the file.
        let c = load_args(&["--config", f.path().to_str().unwrap(), "--dcgm-compat"]).unwrap();
        assert_eq!(c.dcgm_compat, DcgmCompat::Dcgm);
        let f = file("interval = \"1s\"\ndcgm_compat = \"yes\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("dcgm_compat") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn kubelet_options_defaults_and_overrides() {
        let k = load_args(&[]).unwrap();
        assert!(
            !k.fetch_pods(),
            "the pod list is only fetched for --processes"
        );
        assert!(load_args(&["--processes"]).unwrap().fetch_pods());
        assert!(!k.kubelet_pods);
        let p = load_args(&["--kubelet-pods"]).unwrap();
        assert!(p.kubelet_pods && p.fetch_pods());
        assert!(!load_args(&["--kubelet-pods=false"]).unwrap().fetch_pods());
        assert_eq!(k.kubelet_url, DEFAULT_KUBELET_URL);
        assert_eq!(
            k.kubelet_token_file,
            PathBuf::from(DEFAULT_KUBELET_TOKEN_FILE)
        );
        assert_eq!(k.kubelet_ca_file, PathBuf::from(DEFAULT_KUBELET_CA_FILE));
        assert!(!k.kubelet_insecure_tls);

        let k = load_args(&[
            "--kubelet-url",
            "https://10.1.2.3:10250",
            "--kubelet-token-file",
            "/t",
            "--kubelet-ca-file",
            "/ca.pem",
            "--kubelet-insecure-tls",
        ])
        .unwrap();
        assert_eq!(k.kubelet_url, "https://10.1.2.3:10250");
        assert_eq!(k.kubelet_token_file, PathBuf::from("/t"));
        assert_eq!(k.kubelet_ca_file, PathBuf::from("/ca.pem"));
        assert!(k.kubelet_insecure_tls);

        let f = file("kubelet_url = \"https://node:10250/x\"\nkubelet_insecure_tls = true\n");
        let k = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(k.kubelet_url, "https://node:10250/x");
        assert!(k.kubelet_insecure_tls);

        for bad in [
            "http://10.0.0.1:10255",
            "10.0.0.1:10250",
            "https://",
            "https://h/?a=b",
        ] {
            let e = err(&["--kubelet-url", bad]);
            assert!(e.contains("--kubelet-url"), "{bad}: {e}");
        }
        let f = file("kubelet_url = \"http://x\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("--kubelet-url") && e.contains("line 1"), "{e}");
        assert!(err(&["--kubelet-token-file", ""]).contains("--kubelet-token-file"));
        assert!(err(&["--kubelet-ca-file", ""]).contains("--kubelet-ca-file"));
    }

    #[test]
    fn a_global_flag_given_before_and_after_check_config_takes_the_later() {
        let c = load_args(&[
            "--web-config",
            "first.yml",
            "check-config",
            "--web-config",
            "second.yml",
        ])
        .unwrap();
        assert!(c.check_config);
        assert_eq!(c.web_config, Some(PathBuf::from("second.yml")));
    }

    #[test]
    fn boolean_flags_take_optional_values() {
        assert!(load_args(&["--once"]).unwrap().once);
        assert!(!load_args(&["--once=false"]).unwrap().once);
        assert_eq!(load_args(&["--demo"]).unwrap().nvml(), NvmlSource::Demo);
    }

    #[test]
    fn copied_pod_labels_and_annotations() {
        let c = load_args(&[]).unwrap();
        assert!(c.copied_pod_metadata().is_empty());
        let c = load_args(&[
            "--kubernetes",
            "--kubernetes-pod-labels",
            "kueue.x-k8s.io/queue-name,team",
            "--kubernetes-pod-annotations",
            "example.com/owner",
        ])
        .unwrap();
        let names: Vec<String> = c.copied_pod_metadata().into_iter().map(|m| m.2).collect();
        assert_eq!(
            names,
            [
                "label_kueue_x_k8s_io_queue_name",
                "label_team",
                "annotation_example_com_owner"
            ]
        );
        assert!(c.fetch_pods(), "copied keys are read from the pod list");
        let f = file("kubernetes = true\nkubernetes_pod_labels = [\"team\"]\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.kubernetes_pod_labels, ["team"]);
        let e = err(&["--kubernetes", "--kubernetes-pod-labels", "a.b,a_b"]);
        assert!(
            e.contains("--kubernetes-pod-labels") && e.contains("label_a_b"),
            "{e}"
        );
        let e = err(&["--kubernetes", "--kubernetes-pod-annotations", "a,"]);
        assert!(
            e.contains("--kubernetes-pod-annotations") && e.contains("empty"),
            "{e}"
        );
    }

    #[test]
    fn copied_pod_labels_or_annotations_without_kubernetes_are_refused() {
        let e = err(&["--kubernetes-pod-labels", "team"]);
        assert_eq!(
            e,
            "error: invalid value for --kubernetes-pod-labels (command line): needs --kubernetes: the \
             keys are copied onto nvidia_gpu_pod_info, which only --kubernetes serves"
        );
        let e = err(&["--kubernetes-pod-annotations", "example.com/owner"]);
        assert!(
            e.contains("--kubernetes-pod-annotations") && e.contains("needs --kubernetes"),
            "{e}"
        );
        let f = file("kubernetes_pod_labels = [\"team\"]\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--kubernetes-pod-labels (")
                && e.contains(" line 1)")
                && e.contains("needs --kubernetes"),
            "{e}"
        );
    }

    #[test]
    fn hpc_job_mapping_dir_defaults_and_overrides() {
        assert_eq!(load_args(&[]).unwrap().hpc_job_mapping_dir, None);
        let c = load_args(&["--hpc-job-mapping-dir", "/run/job-map"]).unwrap();
        assert_eq!(c.hpc_job_mapping_dir, Some(PathBuf::from("/run/job-map")));
        let f = file("hpc_job_mapping_dir = \"/var/run/dcgm-job-map\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(
            c.hpc_job_mapping_dir,
            Some(PathBuf::from("/var/run/dcgm-job-map"))
        );
        assert_eq!(
            c.job_mapping_dir(),
            Some(Path::new("/var/run/dcgm-job-map"))
        );
        let off = load_args(&["--hpc-job-mapping-dir", "/j", "--no-collector.jobs"]).unwrap();
        assert_eq!(
            off.job_mapping_dir(),
            None,
            "a group that is off is not read"
        );
    }

    #[test]
    fn processes_defaults_and_overrides() {
        let p = load_args(&[]).unwrap();
        assert_eq!(p, Config::default());
        assert!(!p.processes);
        assert_eq!(p.max_processes_per_gpu, 32);
        assert_eq!(p.host_proc, PathBuf::from("/proc"));

        let p = load_args(&[
            "--processes",
            "--max-processes-per-gpu",
            "4",
            "--host-proc",
            "/host/proc",
        ])
        .unwrap();
        assert!(p.processes);
        assert_eq!(p.max_processes_per_gpu, 4);
        assert_eq!(p.host_proc, PathBuf::from("/host/proc"));

        let f = file("processes = true\nmax_processes_per_gpu = 8\nhost_proc = \"/h/proc\"\n");
        let p = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert!(p.processes);
        assert_eq!(p.max_processes_per_gpu, 8);
        assert_eq!(p.host_proc, PathBuf::from("/h/proc"));

        let e = err(&["--max-processes-per-gpu", "0"]);
        assert!(e.contains("--max-processes-per-gpu"), "{e}");
        let e = err(&["--max-processes-per-gpu", "many"]);
        assert!(e.contains("--max-processes-per-gpu"), "{e}");
        let e = err(&["--host-proc", ""]);
        assert!(e.contains("--host-proc"), "{e}");
        let f = file("\nmax_processes_per_gpu = 0\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--max-processes-per-gpu") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn kubernetes_options_hold_the_pod_list_and_dra_only_when_used() {
        let k = load_args(&["--kubernetes", "--interval", "2s"])
            .unwrap()
            .kubernetes_options();
        assert_eq!(k.refresh, Duration::from_secs(2), "the interval by default");
        assert_eq!(
            k.pods, None,
            "no /pods without --kubelet-pods or --processes"
        );
        assert_eq!(k.dra, None);

        let k = load_args(&[
            "--kubernetes",
            "--kubelet-pods",
            "--kubelet-insecure-tls",
            "--kubernetes-pod-labels",
            "app.kubernetes.io/name",
        ])
        .unwrap()
        .kubernetes_options();
        let pods = k.pods.unwrap();
        assert_eq!(
            pods.ca_file, None,
            "not verified with --kubelet-insecure-tls"
        );
        assert_eq!(
            pods.copied,
            [(
                "app.kubernetes.io/name".to_owned(),
                false,
                "label_app_kubernetes_io_name".to_owned()
            )]
        );
        let pods = load_args(&["--kubernetes", "--kubelet-pods"])
            .unwrap()
            .kubernetes_options()
            .pods
            .unwrap();
        assert_eq!(pods.ca_file, Some(PathBuf::from(DEFAULT_KUBELET_CA_FILE)));

        let dra = load_args(&[
            "--kubernetes",
            "--kubernetes-dra",
            "--kubernetes-node-name",
            "node-1",
            "--kubernetes-api-url",
            "https://10.0.0.1:6443",
        ])
        .unwrap()
        .kubernetes_options()
        .dra
        .unwrap();
        assert_eq!(dra.node_name, "node-1");
        assert_eq!(dra.driver, DEFAULT_DRA_DRIVER);
        assert_eq!(dra.api_url, "https://10.0.0.1:6443");
    }
}

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
//! The configuration sits above the parts it configures: each part takes its own options struct,
//! built in `parts` from the `Config` ([`Config::kubernetes_options`],
//! [`Config::sampler_options`], [`Config::metrics_options`], [`Config::otlp_options`]), and none
//! of them imports this
//! module. The options a running exporter applies only at start are declared once here
//! ([`RESTART_OPTIONS`]): a reload keeps them, `--help` lists them, the Helm chart restarts its
//! pods for them.
//!
//! Here: the options, their defaults and the values derived from them; in `loading`, the command
//! line, the file and where each value came from; in `validate`, the refused values; in
//! `collectors`, the `--collector.NAME` switches; in `parts`, each part's options; in `otlp`,
//! the OTLP push's (with OpenTelemetry's `OTEL_*` variables and the files they name); in `values`,
//! the parsers of durations, addresses and URLs that the flags and the file share.
//!
//! Adding an option: a field of [`Config`] (its doc comment is the help text; `#[arg]` gives the
//! flag, the variable and the default; `#[serde(deserialize_with)]` when the file writes the value
//! as text), then the code that uses it, and a check in `Config::validate` (`validate.rs`) if some
//! values must be refused.

mod collectors;
mod loading;
mod otlp;
mod parts;
mod validate;
mod values;

pub use collectors::Collectors;
pub use loading::{ConfigError, load, unknown_variables};
pub use otlp::OtlpError;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, FromArgMatches, ValueEnum};
use serde::Deserialize;

use crate::groups::{Group, Groups};
use crate::metrics::dcgm::{DcgmCompat, DcgmRelease};
use crate::otlp::{Compression as OtlpCompression, Protocol};

use values::{
    duration_text, listen_text, parse_duration, parse_listen, parse_url, some_duration_text,
    some_url_text, url_text,
};

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
    /// below this ratio is idle: its holders' GPU-seconds count as idle, and the node page marks
    /// it "allocated, idle" when it is held (0 to 1)
    #[arg(
        long,
        env = "NVML_EXPORTER_IDLE_THRESHOLD",
        value_name = "RATIO",
        default_value_t = 0.05
    )]
    pub idle_threshold: f64,

    /// A file on the node that keeps the health verdicts held until a GPU reset (an XID that
    /// needs a reset) across restarts of the exporter, per boot; its directory must exist and be
    /// writable. Without it, a restart forgets them
    #[arg(long, env = "NVML_EXPORTER_HEALTH_STATE_FILE", value_name = "PATH")]
    pub health_state_file: Option<PathBuf>,
    /// How long a GPU of an NVSwitch system may take to register with the NVLink fabric after the
    /// exporter (or the driver) starts before its health verdict says fabric_not_registered
    /// (Fabric Manager trains the fabric after each boot)
    #[arg(long, env = "NVML_EXPORTER_FABRIC_REGISTRATION_TIMEOUT", value_name = "DURATION",
          default_value = "5m", value_parser = parse_duration)]
    #[serde(deserialize_with = "duration_text")]
    pub fabric_registration_timeout: Duration,

    /// Where the host's sysfs is mounted, whose PCI bus lists the GPUs NVML should enumerate
    /// (the inventory group: nvidia_node_gpus_missing)
    #[arg(
        long,
        env = "NVML_EXPORTER_HOST_SYS",
        value_name = "PATH",
        default_value = "/sys"
    )]
    pub host_sys: PathBuf,

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

    /// The release of dcgm-exporter whose metric names, units and labels --dcgm-compat serves
    /// (docs/migrating-from-dcgm-exporter.md has what each release names differently)
    #[arg(long, env = "NVML_EXPORTER_DCGM_COMPAT_VERSION", value_name = "VERSION", value_enum,
          default_value_t = DcgmRelease::default())]
    pub dcgm_compat_version: DcgmRelease,

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

    /// This node's name, whose ResourceSlices are read (with --kubernetes-dra) and whose status
    /// gets the health condition (with --kubernetes-node-condition); in a DaemonSet, from the
    /// downward API's spec.nodeName
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_NODE_NAME",
        value_name = "NAME",
        help_heading = "Kubernetes"
    )]
    pub kubernetes_node_name: Option<String>,

    /// The API server, asked for ResourceSlices with --kubernetes-dra and told the health
    /// condition with --kubernetes-node-condition [default:
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

    /// Write the GPUs' health verdicts to this node's status as the condition NvidiaGpuHealthy,
    /// and an Event on every change of a GPU's state (needs --kubernetes-node-name, the health
    /// group and the RBAC of deploy/kubernetes/health)
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_NODE_CONDITION", value_name = "BOOL",
          default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    pub kubernetes_node_condition: bool,

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

    /// Push the metrics to this OTLP receiver too (an OpenTelemetry Collector, Grafana Alloy…),
    /// every --otlp-interval, from the readings /metrics serves: http://HOST:4317 for grpc,
    /// http://HOST:4318 for http/protobuf (which posts to its /v1/metrics), https:// for TLS
    /// (docs/otlp.md) [default: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    /// else no push]
    #[arg(long, env = "NVML_EXPORTER_OTLP_ENDPOINT", value_name = "URL",
          value_parser = parse_url, help_heading = "OTLP")]
    #[serde(deserialize_with = "some_url_text")]
    pub otlp_endpoint: Option<http::Uri>,

    /// The OTLP transport [default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_PROTOCOL",
        value_name = "PROTOCOL",
        value_enum,
        help_heading = "OTLP"
    )]
    pub otlp_protocol: Option<Protocol>,

    /// How often to push (100ms to 1h) [default: OTEL_METRIC_EXPORT_INTERVAL, else 60s]
    #[arg(long, env = "NVML_EXPORTER_OTLP_INTERVAL", value_name = "DURATION",
          value_parser = parse_duration, help_heading = "OTLP")]
    #[serde(deserialize_with = "some_duration_text")]
    pub otlp_interval: Option<Duration>,

    /// Deadline of one push request, connecting included; a slower one is sent again later
    /// [default: OTEL_EXPORTER_OTLP_TIMEOUT, else 10s]
    #[arg(long, env = "NVML_EXPORTER_OTLP_TIMEOUT", value_name = "DURATION",
          value_parser = parse_duration, help_heading = "OTLP")]
    #[serde(deserialize_with = "some_duration_text")]
    pub otlp_timeout: Option<Duration>,

    /// Compression of the push requests [default: OTEL_EXPORTER_OTLP_COMPRESSION, else gzip]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_COMPRESSION",
        value_name = "COMPRESSION",
        value_enum,
        help_heading = "OTLP"
    )]
    pub otlp_compression: Option<OtlpCompression>,

    /// A file of headers every push request carries, one "Name: value" a line (e.g.
    /// "Authorization: Bearer …"; a Secret), read again on every reload [default:
    /// OTEL_EXPORTER_OTLP_HEADERS]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_HEADERS_FILE",
        value_name = "FILE",
        help_heading = "OTLP"
    )]
    pub otlp_headers_file: Option<PathBuf>,

    /// CA certificates (PEM) the receiver's certificate must chain to, read again on every
    /// reload [default: OTEL_EXPORTER_OTLP_CERTIFICATE, else the system's]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_CA_FILE",
        value_name = "FILE",
        help_heading = "OTLP"
    )]
    pub otlp_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) shown to the receiver (mTLS), with --otlp-client-key-file
    /// [default: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_CLIENT_CERT_FILE",
        value_name = "FILE",
        help_heading = "OTLP"
    )]
    pub otlp_client_cert_file: Option<PathBuf>,

    /// The client certificate's private key (PEM) [default: OTEL_EXPORTER_OTLP_CLIENT_KEY]
    #[arg(
        long,
        env = "NVML_EXPORTER_OTLP_CLIENT_KEY_FILE",
        value_name = "FILE",
        help_heading = "OTLP"
    )]
    pub otlp_client_key_file: Option<PathBuf>,

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
}

/// Declares, once, the options a running exporter applies only at start: [`RESTART_OPTIONS`]
/// (what `--help` lists and the Helm chart restarts its pods for) and
/// [`Config::keep_restart_options`] (what a reload keeps).
macro_rules! restart_options {
    ($($field:ident),* $(,)?) => {
        /// The options the exporter applies only at start, by file key: a reload keeps their
        /// running values and logs that they need a restart.
        pub const RESTART_OPTIONS: &[&str] = &[$(stringify!($field)),*];

        impl Config {
            /// Gives the options that need a restart their values in `running` back, and returns
            /// the names of those that differed.
            pub fn keep_restart_options(&mut self, running: &Config) -> Vec<&'static str> {
                let mut changed = Vec::new();
                $(
                    if self.$field != running.$field {
                        changed.push(stringify!($field));
                        self.$field = running.$field.clone();
                    }
                )*
                changed
            }
        }
    };
}

// The listening socket, the NVML library, the sampling schedule (which the readiness rule and
// several defaults follow), the held health verdicts read from their file and logging are set
// up once.
restart_options!(
    listen,
    nvml_lib,
    demo,
    interval,
    device_timeout,
    stale_grace,
    health_state_file,
    log_format,
    log_level,
);

/// A label or annotation key as a Prometheus label name: every character outside
/// `[a-zA-Z0-9_]` becomes `_` (`kueue.x-k8s.io/queue-name` → `kueue_x_k8s_io_queue_name`).
fn sanitize_label(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
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

/// What the tests of every part of the configuration load it with.
#[cfg(test)]
mod testing {
    use std::io::Write;

    use super::{Config, ConfigError, load};

    // The tests avoid setting NVML_EXPORTER_* variables: the environment is process-global and
    // tests run in parallel. The environment layer is covered by the binary's integration tests.

    /// The configuration of a command line (without the program name), from no file but those
    /// it names.
    pub(super) fn load_args(args: &[&str]) -> Result<Config, ConfigError> {
        load(std::iter::once("nvml-exporter").chain(args.iter().copied()))
    }

    /// A temporary file holding `text`.
    pub(super) fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    /// The error a command line gives; panics when it loads.
    pub(super) fn err(args: &[&str]) -> String {
        match load_args(args) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::testing::{err, file, load_args};
    use super::*;

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
    fn dcgm_compat_version_default_override_and_unknown() {
        assert_eq!(
            load_args(&[]).unwrap().dcgm_compat_version,
            DcgmRelease::V4_8_2
        );
        assert_eq!(
            load_args(&["--dcgm-compat-version", "4.8.2"])
                .unwrap()
                .dcgm_compat_version,
            DcgmRelease::V4_8_2
        );
        let f = file("dcgm_compat_version = \"4.8.2\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.dcgm_compat_version, DcgmRelease::V4_8_2);
        // An unknown release names the option and the known ones.
        let e = err(&["--dcgm-compat-version", "4.9"]);
        assert!(
            e.contains("--dcgm-compat-version") && e.contains("4.8.2"),
            "{e}"
        );
        let f = file("interval = \"1s\"\ndcgm_compat_version = \"4.9\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("dcgm_compat_version") && e.contains("line 2") && e.contains("4.8.2"),
            "{e}"
        );
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
        assert_eq!(dra.api.node_name, "node-1");
        assert_eq!(dra.driver, DEFAULT_DRA_DRIVER);
        assert_eq!(dra.api.url, "https://10.0.0.1:6443");
    }
}

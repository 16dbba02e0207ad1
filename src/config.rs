//! Configuration: defaults < `--config` file (TOML) < `NVML_EXPORTER_*` environment < flags.
//!
//! Every option has one name used everywhere: the flag `--nvml-lib`, the file key `nvml_lib`, the
//! environment variable `NVML_EXPORTER_NVML_LIB`. clap reads flags and the environment (a flag
//! beats its variable); the file fills what neither gave. Values from the file keep their span, so
//! a value that parses but is invalid (e.g. `interval = "0s"`) is still reported with its line.
//!
//! Nothing here exits: [`load`] returns a [`ConfigError`] whose message names the option and where
//! the bad value came from, and `main` turns it into exit status 2.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use toml::Spanned;

/// The NVML library loaded when neither `--nvml-lib` nor `--demo` is given. Containers get only the
/// versioned soname from the NVIDIA container toolkit, so the unversioned name would not be found.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// The shortest sampling interval accepted. Production wants 1s or more (NVML refreshes most
/// readings every 100ms to 1s); shorter intervals exist for soak runs that compress hours of ticks.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Where the kubelet serves the pod-resources API on every standard node.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Where the kubelet serves its HTTPS API (`/pods`) when the DaemonSet does not say: a kubelet
/// reachable on the loopback interface, as with `hostNetwork`.
pub const DEFAULT_KUBELET_URL: &str = "https://127.0.0.1:10250";

/// The service account token Kubernetes projects into every pod that mounts one.
pub const DEFAULT_KUBELET_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The cluster CA projected next to the token; it signs the kubelet's serving certificate when the
/// cluster approves kubelet serving certificates (`serverTLSBootstrap`).
pub const DEFAULT_KUBELET_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// File name of the simulated driver library that `--demo` loads from next to the executable.
pub const DEMO_NVML_LIB: &str = "libnvml_sim.so";

/// The validated configuration the exporter runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// Sampling period.
    pub interval: Duration,
    /// How long one device may take to answer within a tick before it is served stale.
    pub device_timeout: Duration,
    /// How long a device may go without a fresh reading before `nvidia_gpu_up` drops to 0.
    pub stale_grace: Duration,
    /// Which NVML library to load.
    pub nvml: NvmlSource,
    /// Sample once, print the exposition to stdout, exit.
    pub once: bool,
    pub log_format: LogFormat,
    /// A `tracing` filter directive, e.g. `info` or `nvml_exporter=debug`.
    pub log_level: String,
    /// The exporter-toolkit web configuration (TLS, basic auth); plain HTTP without it.
    pub web_config: Option<PathBuf>,
    /// `check-config`: validate everything, print "ok" and exit instead of serving.
    pub check_config: bool,
    /// Pod attribution from the kubelet.
    pub kubernetes: KubernetesConfig,
    /// Per-process metrics.
    pub processes: ProcessesConfig,
    /// Which metric names are served: native, dcgm-exporter's, or both (`--dcgm-compat`).
    pub dcgm_compat: DcgmCompat,
}

/// Per-process metrics settings (`--processes`, `--max-processes-per-gpu`, `--host-proc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessesConfig {
    /// Read each GPU's processes and serve per-process and per-pod usage.
    pub enabled: bool,
    /// At most this many process series per GPU (the largest by memory); at least 1.
    pub max_per_gpu: usize,
    /// The host's procfs (`/host/proc` in a container with the host's `/proc` mounted there).
    pub host_proc: PathBuf,
}

impl Default for ProcessesConfig {
    fn default() -> Self {
        ProcessesConfig {
            enabled: false,
            max_per_gpu: crate::processes::DEFAULT_MAX_PROCESSES_PER_GPU,
            host_proc: PathBuf::from("/proc"),
        }
    }
}

/// `--dcgm-compat`: serve dcgm-exporter's metric names, units and labels (see
/// docs/migrating-from-dcgm-exporter.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DcgmCompat {
    /// Native names only.
    #[default]
    Off,
    /// dcgm-exporter's names only (the exporter's own self-metrics stay).
    Dcgm,
    /// Native names first, then dcgm-exporter's.
    Both,
}

/// Pod attribution settings (`--kubernetes*`, `--pod-resources-socket`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// Ask the kubelet which container each GPU is assigned to.
    pub enabled: bool,
    /// Add namespace/pod/container to every per-GPU series of an assigned GPU (besides
    /// `nvidia_gpu_pod_info`).
    pub labels: bool,
    /// The kubelet's pod-resources socket.
    pub socket: PathBuf,
    /// Resource names counted as GPUs besides `nvidia.com/gpu` and `nvidia.com/mig-*`.
    pub resource_names: Vec<String>,
    /// How often `List` is called.
    pub refresh: Duration,
    /// Deadline of one `List` call (and of one `/pods` call).
    pub timeout: Duration,
    /// Fetch the kubelet's pod list (`/pods`) to name the pods and containers of processes. Not
    /// an option of its own: set by `--processes`.
    pub pods: bool,
    /// Base URL of the kubelet's HTTPS API; `/pods` is appended to its path.
    pub kubelet_url: http::Uri,
    /// Bearer token sent to the kubelet, re-read on every call (projected tokens rotate).
    pub kubelet_token_file: PathBuf,
    /// CA bundle that verifies the kubelet's serving certificate.
    pub kubelet_ca_file: PathBuf,
    /// Do not verify the kubelet's serving certificate (`--kubelet-insecure-tls`).
    pub kubelet_insecure_tls: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: false,
            labels: true,
            socket: PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET),
            resource_names: Vec::new(),
            refresh: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            pods: false,
            kubelet_url: http::Uri::from_static(DEFAULT_KUBELET_URL),
            kubelet_token_file: PathBuf::from(DEFAULT_KUBELET_TOKEN_FILE),
            kubelet_ca_file: PathBuf::from(DEFAULT_KUBELET_CA_FILE),
            kubelet_insecure_tls: false,
        }
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

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9400)),
            interval: Duration::from_secs(1),
            device_timeout: Duration::from_secs(1),
            stale_grace: Duration::from_secs(5),
            nvml: NvmlSource::Path(PathBuf::from(DEFAULT_NVML_LIB)),
            once: false,
            log_format: LogFormat::Text,
            log_level: "info".to_string(),
            web_config: None,
            check_config: false,
            kubernetes: KubernetesConfig::default(),
            processes: ProcessesConfig::default(),
            dcgm_compat: DcgmCompat::Off,
        }
    }
}

/// Command line and environment. Every value is optional here so that "not given" can fall back to
/// the file and then to the default.
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

    /// TOML file with any of the options below.
    #[arg(long, env = "NVML_EXPORTER_CONFIG", value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    /// YAML file in the Prometheus exporter-toolkit web-config format: tls_server_config (TLS,
    /// client certificates) and basic_auth_users (bcrypt). Without it: plain HTTP, no auth
    #[arg(
        long,
        env = "NVML_EXPORTER_WEB_CONFIG",
        value_name = "FILE",
        global = true
    )]
    web_config: Option<PathBuf>,

    /// Address to serve HTTP on; ":PORT" means all IPv4 interfaces [default: 0.0.0.0:9400]
    #[arg(long, env = "NVML_EXPORTER_LISTEN", value_name = "ADDR", value_parser = parse_listen)]
    listen: Option<SocketAddr>,

    /// Sampling interval (at least 10ms; below 1s only for tests and soak runs: NVML refreshes most
    /// readings every 100ms to 1s) [default: 1s]
    #[arg(long, env = "NVML_EXPORTER_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    interval: Option<Duration>,

    /// Per-device deadline within one tick; a device that misses it is served from its last
    /// reading, marked stale (at most the interval) [default: the interval]
    #[arg(long, env = "NVML_EXPORTER_DEVICE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    device_timeout: Option<Duration>,

    /// How long a device may go without a fresh reading before nvidia_gpu_up drops to 0 (at least
    /// the interval) [default: 5s, or 3 intervals when that is longer]
    #[arg(long, env = "NVML_EXPORTER_STALE_GRACE", value_name = "DURATION", value_parser = parse_duration)]
    stale_grace: Option<Duration>,

    /// NVML library to load: a path or a soname [default: libnvidia-ml.so.1]
    #[arg(long, env = "NVML_EXPORTER_NVML_LIB", value_name = "PATH")]
    nvml_lib: Option<PathBuf>,

    /// Use the simulated GPUs of libnvml_sim.so next to the executable instead of the driver
    #[arg(long, env = "NVML_EXPORTER_DEMO", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true)]
    demo: Option<bool>,

    /// Sample once, print the exposition to stdout and exit (status 1 when NVML is unavailable)
    #[arg(long, env = "NVML_EXPORTER_ONCE", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true)]
    once: Option<bool>,

    /// Log format [default: text]
    #[arg(long, env = "NVML_EXPORTER_LOG_FORMAT", value_name = "FORMAT")]
    log_format: Option<LogFormat>,

    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives [default: info]
    #[arg(long, env = "NVML_EXPORTER_LOG_LEVEL", value_name = "FILTER")]
    log_level: Option<String>,

    /// Attribute GPUs to pods: ask the kubelet's pod-resources API which container holds each GPU
    /// (nvidia_gpu_pod_info, and labels on the GPU's series) [default: false]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    kubernetes: Option<bool>,

    /// Add namespace, pod and container labels to every series of a GPU assigned to exactly one
    /// container (a shared GPU gets none; nvidia_gpu_pod_info lists its containers) [default: true]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_LABELS", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    kubernetes_labels: Option<bool>,

    /// The kubelet's pod-resources socket [default: /var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(
        long,
        env = "NVML_EXPORTER_POD_RESOURCES_SOCKET",
        value_name = "PATH",
        help_heading = "Kubernetes"
    )]
    pod_resources_socket: Option<PathBuf>,

    /// Extended resource names whose devices are GPUs too, comma-separated (nvidia.com/gpu and
    /// nvidia.com/mig-* always are)
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBERNETES_RESOURCE_NAMES",
        value_name = "NAMES",
        value_delimiter = ',',
        help_heading = "Kubernetes"
    )]
    kubernetes_resource_names: Option<Vec<String>>,

    /// How often to ask the kubelet [default: the interval]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_REFRESH", value_name = "DURATION",
          value_parser = parse_duration, help_heading = "Kubernetes")]
    kubernetes_refresh: Option<Duration>,

    /// Deadline of one call to the kubelet; a slower answer counts as a timeout [default: 1s]
    #[arg(long, env = "NVML_EXPORTER_KUBERNETES_TIMEOUT", value_name = "DURATION",
          value_parser = parse_duration, help_heading = "Kubernetes")]
    kubernetes_timeout: Option<Duration>,

    /// Serve per-process GPU memory and SM utilization, and per-pod sums of them (needs the
    /// host's pids: hostPID in Kubernetes) [default: false]
    #[arg(long, env = "NVML_EXPORTER_PROCESSES", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Processes")]
    processes: Option<bool>,

    /// At most this many process series per GPU, the largest by memory; per-pod sums still count
    /// every process [default: 32]
    #[arg(
        long,
        env = "NVML_EXPORTER_MAX_PROCESSES_PER_GPU",
        value_name = "N",
        help_heading = "Processes"
    )]
    max_processes_per_gpu: Option<usize>,

    /// Where the host's procfs is mounted, for process names and cgroups [default: /proc]
    #[arg(
        long,
        env = "NVML_EXPORTER_HOST_PROC",
        value_name = "PATH",
        help_heading = "Processes"
    )]
    host_proc: Option<PathBuf>,
    /// Serve dcgm-exporter's metric names, units and labels: "dcgm" (the default when given
    /// without a value) serves only those for the GPUs, "both" serves the native names and then
    /// dcgm-exporter's, "off" only the native ones [default: off]
    #[arg(long, env = "NVML_EXPORTER_DCGM_COMPAT", value_name = "MODE", num_args = 0..=1,
          default_missing_value = "dcgm", require_equals = true)]
    dcgm_compat: Option<DcgmCompat>,

    /// The kubelet's HTTPS API, asked for its pod list (/pods) to name the pod and container of
    /// each GPU process (with --processes) [default: https://127.0.0.1:10250]
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBELET_URL",
        value_name = "URL",
        help_heading = "Kubernetes"
    )]
    kubelet_url: Option<String>,

    /// Bearer token for the kubelet, re-read on every call
    /// [default: /var/run/secrets/kubernetes.io/serviceaccount/token]
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBELET_TOKEN_FILE",
        value_name = "PATH",
        help_heading = "Kubernetes"
    )]
    kubelet_token_file: Option<PathBuf>,

    /// CA bundle verifying the kubelet's serving certificate
    /// [default: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt]
    #[arg(
        long,
        env = "NVML_EXPORTER_KUBELET_CA_FILE",
        value_name = "PATH",
        help_heading = "Kubernetes"
    )]
    kubelet_ca_file: Option<PathBuf>,

    /// Do not verify the kubelet's serving certificate (kubelets often serve a self-signed one)
    /// [default: false]
    #[arg(long, env = "NVML_EXPORTER_KUBELET_INSECURE_TLS", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, help_heading = "Kubernetes")]
    kubelet_insecure_tls: Option<bool>,
}

/// Subcommands; without one the exporter serves.
#[derive(Debug, Subcommand)]
enum Command {
    /// Validate the configuration (flags, environment, --config file and --web-config file)
    /// without starting: prints "ok" (exit 0) or the error (exit 2)
    CheckConfig {
        /// TOML configuration file to check (the same as --config)
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

/// The `--config` file. Unknown keys are errors: a misspelt option must not be silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<Spanned<ListenAddr>>,
    interval: Option<Spanned<HumanDuration>>,
    device_timeout: Option<Spanned<HumanDuration>>,
    stale_grace: Option<Spanned<HumanDuration>>,
    nvml_lib: Option<Spanned<PathBuf>>,
    demo: Option<Spanned<bool>>,
    once: Option<Spanned<bool>>,
    log_format: Option<Spanned<LogFormat>>,
    log_level: Option<Spanned<String>>,
    web_config: Option<Spanned<PathBuf>>,
    kubernetes: Option<Spanned<bool>>,
    kubernetes_labels: Option<Spanned<bool>>,
    pod_resources_socket: Option<Spanned<PathBuf>>,
    kubernetes_resource_names: Option<Spanned<Vec<String>>>,
    kubernetes_refresh: Option<Spanned<HumanDuration>>,
    kubernetes_timeout: Option<Spanned<HumanDuration>>,
    processes: Option<Spanned<bool>>,
    max_processes_per_gpu: Option<Spanned<usize>>,
    host_proc: Option<Spanned<PathBuf>>,
    dcgm_compat: Option<Spanned<DcgmCompat>>,
    kubelet_url: Option<Spanned<String>>,
    kubelet_token_file: Option<Spanned<PathBuf>>,
    kubelet_ca_file: Option<Spanned<PathBuf>>,
    kubelet_insecure_tls: Option<Spanned<bool>>,
}

/// A duration written as text ("1s", "250ms") in the file.
#[derive(Debug, Clone, Copy)]
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// A listen address in the file, with the same syntax as the flag.
#[derive(Debug, Clone, Copy)]
struct ListenAddr(SocketAddr);

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_listen(&s)
            .map(ListenAddr)
            .map_err(serde::de::Error::custom)
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

/// A value as shown in an error message: in quotes, with line breaks and other control characters
/// escaped, so that whatever was written the message stays on one line.
fn quote(s: &str) -> String {
    format!("'{}'", s.escape_debug())
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Default,
    Flag,
    Env(&'static str),
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

/// A configuration that cannot be used. `main` prints it and exits with status 2.
#[derive(Debug)]
pub enum ConfigError {
    /// clap's own error (unknown flag, unparsable flag or environment value, `--help`, `--version`):
    /// it knows how to print itself and with which status to exit.
    Cli(clap::Error),
    /// The file could not be read or parsed, or a value is out of range.
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Cli(e) => write!(f, "{e}"),
            ConfigError::Invalid(msg) => write!(f, "error: {}", one_line(msg)),
        }
    }
}

/// `msg` with control characters escaped. Messages quote what the user wrote (a value, a key, a
/// file name), and a line break in any of them must not split the one-line error. Also used for
/// the web-config's messages.
pub(crate) fn one_line(msg: &str) -> String {
    msg.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

impl std::error::Error for ConfigError {}

/// Reads flags from `args` (including the program name) and options from the process environment
/// and the `--config` file, and validates the result.
pub fn load<I, T>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command()
        .try_get_matches_from(args)
        .map_err(ConfigError::Cli)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(ConfigError::Cli)?;
    let check_config = match cli.command.take() {
        Some(Command::CheckConfig { file }) => {
            if let (Some(positional), Some(flag)) = (&file, &cli.config) {
                return Err(ConfigError::Invalid(format!(
                    "check-config {} and --config {} name two files; give one",
                    positional.display(),
                    flag.display()
                )));
            }
            cli.config = file.or(cli.config.take());
            true
        }
        None => false,
    };
    let (file, file_path) = match &cli.config {
        Some(path) => (read_file(path)?, Some(path.clone())),
        None => (FileConfig::default(), None),
    };
    let src = Sources {
        matches: &matches,
        file_path: file_path.as_deref(),
        file_text: file_text_cache(&file_path),
    };
    let mut config = merge(&cli, file, &src)?;
    config.check_config = check_config;
    Ok(config)
}

/// The file's text, re-read only to turn byte spans into line numbers for error messages.
fn file_text_cache(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::Invalid(format!("--config: cannot read {}: {e}", path.display()))
    })?;
    toml::from_str(&text).map_err(|e| {
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
    })
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

struct Sources<'a> {
    matches: &'a ArgMatches,
    file_path: Option<&'a Path>,
    file_text: String,
}

impl Sources<'_> {
    /// Picks flag/env value, else file value, else default, remembering where it came from.
    fn pick<T, F>(
        &self,
        id: &str,
        env: &'static str,
        cli: Option<T>,
        file: Option<Spanned<F>>,
        default: T,
    ) -> (T, Origin)
    where
        F: Into<T>,
    {
        if let Some(v) = cli {
            let origin = match self.matches.value_source(id) {
                Some(ValueSource::EnvVariable) => Origin::Env(env),
                _ => Origin::Flag,
            };
            return (v, origin);
        }
        if let (Some(v), Some(path)) = (file, self.file_path) {
            let line = line_of(&self.file_text, v.span().start);
            return (
                v.into_inner().into(),
                Origin::File {
                    path: path.to_path_buf(),
                    line,
                },
            );
        }
        (default, Origin::Default)
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Duration {
        d.0
    }
}

impl From<ListenAddr> for SocketAddr {
    fn from(a: ListenAddr) -> SocketAddr {
        a.0
    }
}

fn invalid(option: &str, origin: &Origin, msg: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid(format!("invalid value for --{option} ({origin}): {msg}"))
}

fn merge(cli: &Cli, mut file: FileConfig, src: &Sources<'_>) -> Result<Config, ConfigError> {
    let d = Config::default();
    let (interval, interval_origin) = src.pick(
        "interval",
        "NVML_EXPORTER_INTERVAL",
        cli.interval,
        file.interval.take(),
        d.interval,
    );
    // Before the other options take their values out of `file`.
    let mut kubernetes = merge_kubernetes(cli, &mut file, src, interval)?;
    let processes = merge_processes(cli, &mut file, src)?;
    // Naming a process's pod needs the kubelet's pod list; nothing else does.
    kubernetes.pods = processes.enabled;
    let (listen, _) = src.pick(
        "listen",
        "NVML_EXPORTER_LISTEN",
        cli.listen,
        file.listen,
        d.listen,
    );
    let (device_timeout, timeout_origin) = src.pick(
        "device_timeout",
        "NVML_EXPORTER_DEVICE_TIMEOUT",
        cli.device_timeout.map(Some),
        file.device_timeout.map(|s| map_spanned(s, |d| Some(d.0))),
        None,
    );
    // The default follows a long interval: one missed tick must not mark a GPU down, and a value
    // nobody set must never be the one refused.
    let (stale_grace, grace_origin) = src.pick(
        "stale_grace",
        "NVML_EXPORTER_STALE_GRACE",
        cli.stale_grace,
        file.stale_grace,
        d.stale_grace.max(interval.saturating_mul(3)),
    );
    let (nvml_lib, lib_origin) = src.pick(
        "nvml_lib",
        "NVML_EXPORTER_NVML_LIB",
        cli.nvml_lib.clone().map(Some),
        file.nvml_lib.map(|s| map_spanned(s, Some)),
        None,
    );
    let (demo, demo_origin) = src.pick("demo", "NVML_EXPORTER_DEMO", cli.demo, file.demo, false);
    let (dcgm_compat, _) = src.pick(
        "dcgm_compat",
        "NVML_EXPORTER_DCGM_COMPAT",
        cli.dcgm_compat,
        file.dcgm_compat,
        d.dcgm_compat,
    );
    let (once, _) = src.pick("once", "NVML_EXPORTER_ONCE", cli.once, file.once, d.once);
    let (log_format, _) = src.pick(
        "log_format",
        "NVML_EXPORTER_LOG_FORMAT",
        cli.log_format,
        file.log_format,
        d.log_format,
    );
    let (log_level, level_origin) = src.pick(
        "log_level",
        "NVML_EXPORTER_LOG_LEVEL",
        cli.log_level.clone(),
        file.log_level,
        d.log_level,
    );

    let (web_config, web_origin) = src.pick(
        "web_config",
        "NVML_EXPORTER_WEB_CONFIG",
        cli.web_config.clone().map(Some),
        file.web_config.map(|s| map_spanned(s, Some)),
        None,
    );
    if web_config
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(invalid("web-config", &web_origin, "the path is empty"));
    }

    if interval < MIN_INTERVAL {
        return Err(invalid(
            "interval",
            &interval_origin,
            format!(
                "{} is below the minimum of {}",
                fmt_duration(interval),
                fmt_duration(MIN_INTERVAL)
            ),
        ));
    }
    if interval > Duration::from_secs(3600) {
        return Err(invalid(
            "interval",
            &interval_origin,
            format!("{} is above the maximum of 1h", fmt_duration(interval)),
        ));
    }
    let device_timeout = device_timeout.unwrap_or(interval);
    if device_timeout.is_zero() || device_timeout > interval {
        return Err(invalid(
            "device-timeout",
            &timeout_origin,
            format!(
                "{} must be above 0 and at most the interval ({})",
                fmt_duration(device_timeout),
                fmt_duration(interval)
            ),
        ));
    }
    if stale_grace < interval {
        return Err(invalid(
            "stale-grace",
            &grace_origin,
            format!(
                "{} must be at least the interval ({})",
                fmt_duration(stale_grace),
                fmt_duration(interval)
            ),
        ));
    }
    let nvml = match (nvml_lib, demo) {
        (Some(_), true) => {
            return Err(ConfigError::Invalid(format!(
                "--nvml-lib ({lib_origin}) and --demo ({demo_origin}) cannot be used together: --demo loads the simulated library"
            )));
        }
        (Some(path), false) if path.as_os_str().is_empty() => {
            return Err(invalid("nvml-lib", &lib_origin, "the path is empty"));
        }
        (Some(path), false) => NvmlSource::Path(path),
        (None, true) => NvmlSource::Demo,
        (None, false) => d.nvml,
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log_level) {
        return Err(invalid(
            "log-level",
            &level_origin,
            format!("{}: {e}", quote(&log_level)),
        ));
    }
    Ok(Config {
        listen,
        interval,
        device_timeout,
        stale_grace,
        nvml,
        once,
        log_format,
        log_level,
        web_config,
        check_config: false,
        kubernetes,
        processes,
        dcgm_compat,
    })
}

/// The `--processes` options. Takes them out of `file` (the rest of `merge` owns the others).
fn merge_processes(
    cli: &Cli,
    file: &mut FileConfig,
    src: &Sources<'_>,
) -> Result<ProcessesConfig, ConfigError> {
    let d = ProcessesConfig::default();
    let (enabled, _) = src.pick(
        "processes",
        "NVML_EXPORTER_PROCESSES",
        cli.processes,
        file.processes.take(),
        d.enabled,
    );
    let (max_per_gpu, max_origin) = src.pick(
        "max_processes_per_gpu",
        "NVML_EXPORTER_MAX_PROCESSES_PER_GPU",
        cli.max_processes_per_gpu,
        file.max_processes_per_gpu.take(),
        d.max_per_gpu,
    );
    if max_per_gpu == 0 {
        return Err(invalid(
            "max-processes-per-gpu",
            &max_origin,
            "must be at least 1",
        ));
    }
    let (host_proc, proc_origin) = src.pick(
        "host_proc",
        "NVML_EXPORTER_HOST_PROC",
        cli.host_proc.clone(),
        file.host_proc.take(),
        d.host_proc,
    );
    if host_proc.as_os_str().is_empty() {
        return Err(invalid("host-proc", &proc_origin, "the path is empty"));
    }
    Ok(ProcessesConfig {
        enabled,
        max_per_gpu,
        host_proc,
    })
}

/// The `--kubernetes*` options. Takes them out of `file` (the rest of `merge` owns the others).
fn merge_kubernetes(
    cli: &Cli,
    file: &mut FileConfig,
    src: &Sources<'_>,
    interval: Duration,
) -> Result<KubernetesConfig, ConfigError> {
    let d = KubernetesConfig::default();
    let (enabled, _) = src.pick(
        "kubernetes",
        "NVML_EXPORTER_KUBERNETES",
        cli.kubernetes,
        file.kubernetes.take(),
        d.enabled,
    );
    let (labels, _) = src.pick(
        "kubernetes_labels",
        "NVML_EXPORTER_KUBERNETES_LABELS",
        cli.kubernetes_labels,
        file.kubernetes_labels.take(),
        d.labels,
    );
    let (socket, socket_origin) = src.pick(
        "pod_resources_socket",
        "NVML_EXPORTER_POD_RESOURCES_SOCKET",
        cli.pod_resources_socket.clone(),
        file.pod_resources_socket.take(),
        d.socket,
    );
    if socket.as_os_str().is_empty() {
        return Err(invalid(
            "pod-resources-socket",
            &socket_origin,
            "the path is empty",
        ));
    }
    let (resource_names, names_origin) = src.pick(
        "kubernetes_resource_names",
        "NVML_EXPORTER_KUBERNETES_RESOURCE_NAMES",
        cli.kubernetes_resource_names.clone(),
        file.kubernetes_resource_names.take(),
        d.resource_names,
    );
    let resource_names: Vec<String> = resource_names
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    if let Some(bad) = resource_names
        .iter()
        .find(|n| n.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(invalid(
            "kubernetes-resource-names",
            &names_origin,
            format!("'{bad}' is not a resource name (e.g. example.com/gpu)"),
        ));
    }
    let (refresh, refresh_origin) = src.pick(
        "kubernetes_refresh",
        "NVML_EXPORTER_KUBERNETES_REFRESH",
        cli.kubernetes_refresh,
        file.kubernetes_refresh.take(),
        interval,
    );
    // The default is the interval, which is checked with the interval's own origin.
    if refresh < MIN_INTERVAL && refresh_origin != Origin::Default {
        return Err(invalid(
            "kubernetes-refresh",
            &refresh_origin,
            format!(
                "{} is below the minimum of {}",
                fmt_duration(refresh),
                fmt_duration(MIN_INTERVAL)
            ),
        ));
    }
    let (timeout, timeout_origin) = src.pick(
        "kubernetes_timeout",
        "NVML_EXPORTER_KUBERNETES_TIMEOUT",
        cli.kubernetes_timeout,
        file.kubernetes_timeout.take(),
        d.timeout,
    );
    if timeout.is_zero() {
        return Err(invalid(
            "kubernetes-timeout",
            &timeout_origin,
            "must be above 0",
        ));
    }
    let (kubelet_url, url_origin) = src.pick(
        "kubelet_url",
        "NVML_EXPORTER_KUBELET_URL",
        cli.kubelet_url.clone(),
        file.kubelet_url.take(),
        DEFAULT_KUBELET_URL.to_owned(),
    );
    let kubelet_url =
        parse_kubelet_url(&kubelet_url).map_err(|e| invalid("kubelet-url", &url_origin, e))?;
    let (kubelet_token_file, token_origin) = src.pick(
        "kubelet_token_file",
        "NVML_EXPORTER_KUBELET_TOKEN_FILE",
        cli.kubelet_token_file.clone(),
        file.kubelet_token_file.take(),
        d.kubelet_token_file,
    );
    if kubelet_token_file.as_os_str().is_empty() {
        return Err(invalid(
            "kubelet-token-file",
            &token_origin,
            "the path is empty",
        ));
    }
    let (kubelet_ca_file, ca_origin) = src.pick(
        "kubelet_ca_file",
        "NVML_EXPORTER_KUBELET_CA_FILE",
        cli.kubelet_ca_file.clone(),
        file.kubelet_ca_file.take(),
        d.kubelet_ca_file,
    );
    if kubelet_ca_file.as_os_str().is_empty() {
        return Err(invalid("kubelet-ca-file", &ca_origin, "the path is empty"));
    }
    let (kubelet_insecure_tls, _) = src.pick(
        "kubelet_insecure_tls",
        "NVML_EXPORTER_KUBELET_INSECURE_TLS",
        cli.kubelet_insecure_tls,
        file.kubelet_insecure_tls.take(),
        d.kubelet_insecure_tls,
    );
    Ok(KubernetesConfig {
        enabled,
        labels,
        socket,
        resource_names,
        refresh,
        timeout,
        pods: d.pods,
        kubelet_url,
        kubelet_token_file,
        kubelet_ca_file,
        kubelet_insecure_tls,
    })
}

/// An `https://host[:port][/prefix]` URL. Only HTTPS: the request carries a bearer token, and the
/// kubelet's plain-HTTP read-only port is off by default and deprecated.
fn parse_kubelet_url(s: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = s
        .trim()
        .parse()
        .map_err(|e| format!("{} is not a URL ({e})", quote(s)))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!(
            "{} must start with https:// (e.g. https://10.0.0.1:10250)",
            quote(s)
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{} has no host", quote(s)));
    }
    if uri.query().is_some() {
        return Err(format!("{} must not have a query", quote(s)));
    }
    Ok(uri)
}

fn map_spanned<T, U>(s: Spanned<T>, f: impl FnOnce(T) -> U) -> Spanned<U> {
    let span = s.span();
    Spanned::new(span, f(s.into_inner()))
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn defaults_match_the_documented_contract() {
        let c = load_args(&[]).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9400".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.device_timeout, c.interval);
        assert_eq!(c.nvml, NvmlSource::Path(PathBuf::from("libnvidia-ml.so.1")));
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
            c.device_timeout,
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
            load_args(&["--interval", "2s"]).unwrap().stale_grace,
            Duration::from_secs(6)
        );
        assert_eq!(
            load_args(&["--interval", "1s"]).unwrap().stale_grace,
            Duration::from_secs(5)
        );
        let f = file("interval = \"61s\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.stale_grace, Duration::from_secs(183));
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
        assert_eq!(c.device_timeout, Duration::from_millis(500));
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
    fn kubernetes_defaults_and_overrides() {
        let k = load_args(&["--interval", "2s", "--stale-grace", "5s"])
            .unwrap()
            .kubernetes;
        assert!(!k.enabled && k.labels);
        assert_eq!(k.socket, PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET));
        assert_eq!(
            k.refresh,
            Duration::from_secs(2),
            "refresh follows the interval"
        );
        assert_eq!(k.timeout, Duration::from_secs(1));
        assert!(k.resource_names.is_empty());

        let k = load_args(&[
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
        .unwrap()
        .kubernetes;
        assert!(k.enabled && !k.labels);
        assert_eq!(k.socket, PathBuf::from("/run/k.sock"));
        assert_eq!(k.resource_names, ["a.com/gpu", "b.com/gpu"]);
        assert_eq!(k.refresh, Duration::from_secs(5));
        assert_eq!(k.timeout, Duration::from_millis(200));

        let f = file(
            "kubernetes = true\nkubernetes_resource_names = [\"x.io/gpu\"]\nkubernetes_refresh = \"3s\"\n",
        );
        let k = load_args(&["--config", f.path().to_str().unwrap()])
            .unwrap()
            .kubernetes;
        assert!(k.enabled);
        assert_eq!(k.resource_names, ["x.io/gpu"]);
        assert_eq!(k.refresh, Duration::from_secs(3));

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
        let k = load_args(&[]).unwrap().kubernetes;
        assert!(!k.pods, "the pod list is only fetched for --processes");
        assert!(load_args(&["--processes"]).unwrap().kubernetes.pods);
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
        .unwrap()
        .kubernetes;
        assert_eq!(k.kubelet_url, "https://10.1.2.3:10250");
        assert_eq!(k.kubelet_token_file, PathBuf::from("/t"));
        assert_eq!(k.kubelet_ca_file, PathBuf::from("/ca.pem"));
        assert!(k.kubelet_insecure_tls);

        let f = file("kubelet_url = \"https://node:10250/x\"\nkubelet_insecure_tls = true\n");
        let k = load_args(&["--config", f.path().to_str().unwrap()])
            .unwrap()
            .kubernetes;
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
        assert_eq!(load_args(&["--demo"]).unwrap().nvml, NvmlSource::Demo);
    }

    #[test]
    fn processes_defaults_and_overrides() {
        let p = load_args(&[]).unwrap().processes;
        assert_eq!(p, ProcessesConfig::default());
        assert!(!p.enabled);
        assert_eq!(p.max_per_gpu, 32);
        assert_eq!(p.host_proc, PathBuf::from("/proc"));

        let p = load_args(&[
            "--processes",
            "--max-processes-per-gpu",
            "4",
            "--host-proc",
            "/host/proc",
        ])
        .unwrap()
        .processes;
        assert!(p.enabled);
        assert_eq!(p.max_per_gpu, 4);
        assert_eq!(p.host_proc, PathBuf::from("/host/proc"));

        let f = file("processes = true\nmax_processes_per_gpu = 8\nhost_proc = \"/h/proc\"\n");
        let p = load_args(&["--config", f.path().to_str().unwrap()])
            .unwrap()
            .processes;
        assert!(p.enabled);
        assert_eq!(p.max_per_gpu, 8);
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
}

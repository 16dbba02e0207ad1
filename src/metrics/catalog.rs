//! The metric catalog: every series family the exporter serves, declared once.
//!
//! Each [`MetricDef`] row carries what Prometheus needs (name, help, type, label names), what the
//! docs need (unit, closed label values), how to read the values from a [`Snapshot`], and the
//! dcgm-exporter fields it is served as under `--dcgm-compat` (name, unit, type, help and how
//! several series make one, see [`Dcgm`]). The encoder walks this table in order, so the table
//! order *is* the exposition order; `docs/metrics.md` is rendered from it (see [`super::docs`]).

use std::borrow::Cow;

use crate::sample::{
    ClockDomain, ClockEventReason, DeviceSample, FabricCondition, FabricConfiguration, FabricState,
    GpmMetrics, GpmPipe, HealthAction, HealthState, JobsError, KubeletError, MediaEngine,
    NvLinkErrorType, Snapshot, SystemInfo, TemperatureThreshold, ThrottleReason, WorkloadSeconds,
};

use super::samples::Samples;
use crate::groups::Group;
use crate::processes::ProcessField;
use MetricKind::{Counter, Gauge};

/// Prometheus metric type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down.
    Gauge,
    /// A cumulative value that only resets when its source restarts; name ends in `_total`.
    Counter,
    /// Bucketed observations (kept by the encoder's registry).
    Histogram,
}

impl MetricKind {
    /// The word used in `# TYPE` lines and in the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// The series of a family for one device: extra label values (in [`MetricDef::labels`] order)
/// and values. The encoder adds the identity labels `gpu` and `uuid`.
pub type DeviceSeries = fn(&SystemInfo, &DeviceSample, &mut Samples);

/// Reads a per-container family from one container's GPU-seconds on one device.
pub type WorkloadSeries = fn(&WorkloadSeconds) -> Option<f64>;

/// Reads an exporter-wide family from the snapshot.
pub type ExporterSeries = fn(&Snapshot, &mut Samples);

/// Where a family's values come from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// Per GPU, served only while the device is up (a lost device's readings disappear).
    Device(DeviceSeries),
    /// Per GPU, served even while the device is down (identity and the `up` flag itself).
    DeviceIdentity(DeviceSeries),
    /// Per GPU, one series per container the kubelet assigned the GPU to
    /// (`Snapshot::kubernetes`, resolved by the encoder), labelled with [`POD_LABELS`].
    PodAssignments,
    /// Per GPU, one series per process (`--processes`), at most
    /// `MetricsOptions::max_processes_per_gpu` of them (the largest by memory): labels
    /// [`PROCESS_LABELS`], then [`MIG_LABELS`] when it runs in a MIG GPU instance, then
    /// [`POD_LABELS`] when the process's container is known.
    Processes(ProcessField),
    /// Per GPU, one series per container with processes on it: the sum over its processes,
    /// labelled with [`POD_LABELS`]; on a MIG GPU one per (GPU instance, container), with
    /// [`MIG_LABELS`] before them.
    PodProcesses(ProcessField),
    /// Per GPU, one series: the device memory its processes hold outside the kubelet's
    /// assignments (`--processes` with `--kubernetes`).
    OutsideAllocation,
    /// Per GPU, one series per HPC job on it (`Snapshot::jobs`), labelled `hpc_job`; a MIG GPU
    /// instance's jobs with [`MIG_LABELS`] after it.
    Jobs,
    /// Per GPU, one series per container holding it now (`Snapshot::workloads`), labelled with
    /// [`POD_LABELS`]; then per (MIG instance, container), with [`MIG_LABELS`] before them.
    Workloads(WorkloadSeries),
    /// One family for the exporter, from the snapshot.
    Exporter(ExporterSeries),
    /// Kept by the encoder's own registry (state that outlives a snapshot: histograms, counters
    /// incremented by the HTTP layer).
    Registry,
}

impl Source {
    /// Whether the family has the `gpu`/`uuid` identity labels.
    pub fn is_per_device(&self) -> bool {
        matches!(
            self,
            Source::Device(_)
                | Source::DeviceIdentity(_)
                | Source::PodAssignments
                | Source::Processes(_)
                | Source::PodProcesses(_)
                | Source::OutsideAllocation
                | Source::Jobs
                | Source::Workloads(_)
        )
    }
}

/// The dcgm-exporter field a family (or the series with one label value of it) corresponds to:
/// what `--dcgm-compat` serves under that field's name, and what the docs list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dcgm {
    /// DCGM field name, e.g. `DCGM_FI_DEV_GPU_UTIL`: the metric name in compatibility mode.
    pub field: &'static str,
    /// The unit DCGM serves it in (often not a base unit: %, MiB, MHz, mJ).
    pub unit: &'static str,
    /// When set, the DCGM field covers only the series whose closed label (the row's first
    /// [`MetricDef::closed_labels`] entry) has this value.
    pub label_value: Option<&'static str>,
    /// The type dcgm-exporter declares for it.
    pub kind: MetricKind,
    /// dcgm-exporter's `# HELP` text ("… (in MHz).").
    pub help: &'static str,
    /// How the native series it covers make its one value per GPU.
    pub combine: Combine,
}

/// How the native series a DCGM field covers make its one value per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Their sum: exactly one series, or the total over links for the NVLink counters.
    Sum,
    /// The first series in label order: DCGM's fan speed is the first fan's.
    First,
    /// Not from the native values but from [`DeviceSample::last_xid`]: DCGM's XID field is a
    /// gauge of the last XID code, 0 before the first (as dcgm-exporter serves it) on a GPU
    /// whose XID events are watched ([`DeviceSample::xids_watched`]); absent on one whose are
    /// not, where no XID could be seen. GPU instances have none of their own.
    LastXid,
    /// Not served, for the reason given (listed in the migration guide).
    NotServed(&'static str),
}

/// A DCGM field equivalent to the whole family.
const fn dcgm(
    field: &'static str,
    unit: &'static str,
    kind: MetricKind,
    help: &'static str,
) -> Dcgm {
    Dcgm {
        field,
        unit,
        label_value: None,
        kind,
        help,
        combine: Combine::Sum,
    }
}

/// A DCGM field equivalent to the series with one label value.
const fn dcgm_for(
    label_value: &'static str,
    field: &'static str,
    unit: &'static str,
    kind: MetricKind,
    help: &'static str,
) -> Dcgm {
    Dcgm {
        label_value: Some(label_value),
        ..dcgm(field, unit, kind, help)
    }
}

impl Dcgm {
    /// The same field, its value made by `combine` instead of a sum.
    const fn combined(self, combine: Combine) -> Dcgm {
        Dcgm { combine, ..self }
    }
}

/// DCGM's raw NVLink bandwidth counter, the equivalent of both NVLink byte counters.
const NVLINK_BANDWIDTH_TOTAL: Dcgm = dcgm(
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "",
    MetricKind::Counter,
    "",
)
.combined(Combine::NotServed(
    "DCGM's NVLink throughput field: a counter in 4.8.2's counter file, a gauge in 4.8.3's, \
     \"in MB/s\" in 4.8.4's help. How DCGM derives it from NVML's link counters (which bytes, \
     which megabyte) no NVIDIA text at hand says, and a guess served under its name would make \
     queries compute wrong numbers. Use rate(nvidia_gpu_nvlink_links_transmit_bytes_total) and \
     _receive_bytes_total, or nvidia_gpu_nvlink_gpm_transmit_bytes_per_second and \
     _receive_bytes_per_second.",
));

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Full metric name, unit suffix included.
    pub name: &'static str,
    /// The collector group it belongs to: off, it is neither sampled nor served.
    pub group: Group,
    /// `# HELP` text.
    pub help: &'static str,
    /// Prometheus type.
    pub kind: MetricKind,
    /// Base unit the value is in ("" when dimensionless); the name carries it too.
    pub unit: &'static str,
    /// Label names beyond the identity labels (`gpu`, `uuid`) of per-device families.
    pub labels: &'static [&'static str],
    /// Labels that take a closed set of values, with that set (for the docs, and so tests can
    /// check the readers against it).
    pub closed_labels: &'static [(&'static str, LabelValues)],
    /// dcgm-exporter equivalents, empty when there is none.
    pub dcgm: &'static [Dcgm],
    /// How the values are read.
    pub source: Source,
}

/// Lists the values of a closed label set.
pub type LabelValues = fn() -> Vec<&'static str>;

/// The label values of a [`crate::sample`] label enum, in its declaration order.
fn values_of<T: Copy>(all: &[T], label: fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|v| label(*v)).collect()
}

/// The help text of the catalog row `name`, so that the metrics kept in a `prometheus` registry
/// share the catalog's wording; empty for a name not in the catalog.
pub fn help(name: &str) -> &'static str {
    find(name).map_or("", |d| d.help)
}

impl MetricDef {
    /// All label names of a series, identity labels first.
    pub fn all_labels(&self) -> Vec<&'static str> {
        let identity: &[&'static str] = if self.source.is_per_device() {
            IDENTITY_LABELS
        } else {
            &[]
        };
        identity.iter().chain(self.labels).copied().collect()
    }
}

/// Labels on every per-GPU series.
pub const IDENTITY_LABELS: &[&str] = &["gpu", "uuid"];

/// The container a GPU is assigned to: labels of `nvidia_gpu_pod_info`, and added after all
/// others to every per-GPU series of a GPU assigned to exactly one container.
pub const POD_LABELS: &[&str] = &["namespace", "pod", "container"];

/// Labels a MIG GPU instance's series add after the family's own: the GPU instance id and its
/// profile ("1g.10gb"). The parent GPU's series of the same family have neither.
pub const MIG_LABELS: &[&str] = &["gpu_instance", "mig_profile"];

/// Labels of a per-process series, before [`POD_LABELS`] (present when its container is known,
/// absent otherwise — the rule per-GPU series follow for their owner).
pub const PROCESS_LABELS: &[&str] = &["pid", "process_name"];

/// Name of the tick-duration histogram (kept by the encoder's registry).
pub const SAMPLE_DURATION_SECONDS: &str = "nvml_exporter_sample_duration_seconds";
/// Name of the scrape counter (kept by the HTTP routes in the exporter's registry).
pub const SCRAPES_TOTAL: &str = "nvml_exporter_scrapes_total";
/// Name of the open-connections gauge (kept by the HTTP server in the exporter's registry).
pub const HTTP_CONNECTIONS: &str = "nvml_exporter_http_connections";
/// Name of the closed-connections counter (kept by the HTTP server in the exporter's registry).
pub const HTTP_CONNECTIONS_CLOSED_TOTAL: &str = "nvml_exporter_http_connections_closed_total";
/// The `reason` values of [`HTTP_CONNECTIONS_CLOSED_TOTAL`], in the order of the server's
/// `http::connections::CloseReason`, which takes its labels from here.
pub const CLOSE_REASONS: &[&str] = &[
    "completed",
    "idle_timeout",
    "head_timeout",
    "handshake_timeout",
    "write_timeout",
    "reclaimed",
    "request_limit",
    "refused",
    "error",
];
/// Name of the gauge saying whether the last configuration reload succeeded (kept by the
/// reloader in the exporter's registry).
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "nvml_exporter_config_last_reload_successful";
/// Name of the gauge holding when the configuration last loaded successfully (kept by the
/// reloader in the exporter's registry).
pub const CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS: &str =
    "nvml_exporter_config_last_reload_success_timestamp_seconds";
/// Name of the counter of OTLP export requests by result (kept by the OTLP push in the
/// exporter's registry).
pub const OTLP_EXPORTS_TOTAL: &str = "nvml_exporter_otlp_exports_total";
/// The `result` values of [`OTLP_EXPORTS_TOTAL`].
pub const OTLP_EXPORT_RESULTS: &[&str] = &[
    "success",
    "partial_success",
    "unavailable",
    "timeout",
    "rejected",
];
/// Name of the counter of OTLP data points by what became of them (kept by the OTLP push).
pub const OTLP_POINTS_TOTAL: &str = "nvml_exporter_otlp_points_total";
/// The `result` values of [`OTLP_POINTS_TOTAL`].
pub const OTLP_POINT_RESULTS: &[&str] = &["sent", "rejected", "dropped"];
/// Name of the counter of OTLP request bytes sent (kept by the OTLP push).
pub const OTLP_REQUEST_BYTES_TOTAL: &str = "nvml_exporter_otlp_request_bytes_total";
/// Name of the gauge of OTLP requests waiting to be sent (kept by the OTLP push).
pub const OTLP_QUEUE_BATCHES: &str = "nvml_exporter_otlp_queue_batches";
/// Name of the gauge of the time of the last OTLP request the receiver accepted (kept by the
/// OTLP push).
pub const OTLP_LAST_SUCCESS_TIMESTAMP_SECONDS: &str =
    "nvml_exporter_otlp_last_success_timestamp_seconds";
/// Name of the gauge of series served per collector group (kept by the encoder's registry).
pub const SERIES: &str = "nvml_exporter_series";
/// Name of the counter of series `--max-series` dropped (kept by the encoder's registry).
pub const SERIES_DROPPED_TOTAL: &str = "nvml_exporter_series_dropped_total";
/// Name of the gauge of the last exposition's size (kept by the encoder's registry).
pub const EXPOSITION_BYTES: &str = "nvml_exporter_exposition_bytes";

/// The crate version, `nvml_exporter_build_info{version}`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Git revision of the build, "unknown" without git (`build.rs`).
pub const REVISION: &str = env!("NVML_EXPORTER_REVISION");
/// `rustc --version` of the build (`build.rs`).
pub const RUSTC: &str = env!("NVML_EXPORTER_RUSTC");

/// Shorthand for the common case: a gauge/counter per device with no extra labels.
macro_rules! device {
    ($group:ident, $name:literal, $kind:ident, $unit:literal, $help:literal, [$($dcgm:expr),*], $read:expr) => {
        MetricDef {
            name: $name,
            group: Group::$group,
            help: $help,
            kind: MetricKind::$kind,
            unit: $unit,
            labels: &[],
            closed_labels: &[],
            dcgm: &[$($dcgm),*],
            source: Source::Device($read),
        }
    };
}

/// Every family, in exposition order: device metrics, then exporter self-metrics.
pub static CATALOG: &[MetricDef] = &[
    // --- Device identity and health -------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_info",
        group: Group::Core,
        help: "Static identity of the GPU; always 1.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[
            "name",
            "brand",
            "architecture",
            "pci_bus_id",
            "serial",
            "vbios_version",
            "driver_version",
            "cuda_driver_version",
            "compute_capability",
            "minor_number",
        ],
        closed_labels: &[],
        dcgm: &[],
        source: Source::DeviceIdentity(|sys, d, out| {
            let i = &d.info;
            out.labelled(
                &[
                    &i.name,
                    &i.brand,
                    &i.architecture,
                    &i.pci_bus_id,
                    &i.serial,
                    &i.vbios_version,
                    &sys.driver_version,
                    &sys.cuda_driver_version,
                    &i.compute_capability,
                    &i.minor_number,
                ],
                1.0,
            )
        }),
    },
    MetricDef {
        name: "nvidia_gpu_up",
        group: Group::Core,
        help: "1 when the last tick read the GPU, 0 when it is lost or unreachable (its other series are then absent).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::DeviceIdentity(|_, d, out| out.flag(d.up)),
    },
    MetricDef {
        name: "nvidia_gpu_pod_info",
        group: Group::Core,
        help: "The kubelet assigned the GPU to this container; always 1 (with --kubernetes). With --kubernetes-dra, claim names the resource claims through which the container holds it (absent for a device plugin's GPU). Where the kubelet's pod list is read, also the pod's controller_kind and controller_name (a Deployment for its ReplicaSet) and the label_* and annotation_* copied by --kubernetes-pod-labels and --kubernetes-pod-annotations, each when the pod has it.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::PodAssignments,
    },
    // --- Utilization ----------------------------------------------------------------------
    device!(
        Utilization,
        "nvidia_gpu_utilization_ratio",
        Gauge,
        "ratio",
        "Share of the last sample period during which at least one kernel ran (not how much of the GPU it used).",
        [dcgm(
            "DCGM_FI_DEV_GPU_UTIL",
            "%",
            Gauge,
            "GPU utilization (in %)."
        )],
        |_, d, out| out.opt(d.utilization)
    ),
    device!(
        Utilization,
        "nvidia_gpu_utilization_seconds_total",
        Counter,
        "seconds",
        "Seconds in which at least one kernel ran: each reading of nvidia_gpu_utilization_ratio times the time since the previous one, added up by the exporter at every tick (never across a tick the GPU was unreadable or stale), so rate() over any window is the mean utilization, whatever the scrape interval. Exact when --interval is at most NVML's utilization sample period (1/6 s to 1 s by product); sampled at that period when longer. Starts at 0 when the exporter (or NVML) starts.",
        [],
        |_, d, out| out.opt(d.busy.utilization)
    ),
    device!(
        Utilization,
        "nvidia_gpu_memory_utilization_ratio",
        Gauge,
        "ratio",
        "Share of the last sample period during which device memory was read or written.",
        [dcgm(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "%",
            Gauge,
            "Memory utilization (in %)."
        )],
        |_, d, out| out.opt(d.memory_utilization)
    ),
    device!(
        Media,
        "nvidia_gpu_encoder_utilization_ratio",
        Gauge,
        "ratio",
        "Share of the last sample period during which the video encoder was busy.",
        [dcgm(
            "DCGM_FI_DEV_ENC_UTIL",
            "%",
            Gauge,
            "Encoder utilization (in %)."
        )],
        |_, d, out| out.opt(d.encoder_utilization)
    ),
    device!(
        Media,
        "nvidia_gpu_decoder_utilization_ratio",
        Gauge,
        "ratio",
        "Share of the last sample period during which the video decoder was busy.",
        [dcgm(
            "DCGM_FI_DEV_DEC_UTIL",
            "%",
            Gauge,
            "Decoder utilization (in %)."
        )],
        |_, d, out| out.opt(d.decoder_utilization)
    ),
    // --- Saturation (NVML GPM, Hopper and newer) -------------------------------------------
    // Averages over the last sampling interval from two GPM samples; absent on the first tick
    // after a (re)start and on GPUs without GPM (`nvidia_gpu_gpm_supported 0`).
    device!(
        Saturation,
        "nvidia_gpu_gpm_supported",
        Gauge,
        "",
        "1 when the GPU supports NVML GPM (Hopper and newer), which the saturation metrics come from; 0 when it does not, and they are absent.",
        [],
        |_, d, out| out.opt_flag(d.gpm_supported)
    ),
    // In the pipes group, off by default: like utilization it says busy, not saturated, and the
    // default budget (40 series per GPU) goes to the SM-active integral instead.
    device!(
        Pipes,
        "nvidia_gpu_graphics_engine_active_ratio",
        Gauge,
        "ratio",
        "Share of the last sampling interval during which the graphics/compute engine was active (GPM). Like utilization this says busy, not saturated.",
        [dcgm(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "ratio",
            Gauge,
            "Ratio of time the graphics engine is active."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.graphics_engine_active))
    ),
    device!(
        Saturation,
        "nvidia_gpu_sm_active_ratio",
        Gauge,
        "ratio",
        "Share of SMs with at least one warp resident, averaged over the last sampling interval (GPM): how much of the GPU the work spreads over. High utilization with low SM activity means busy but far from saturated.",
        [dcgm(
            "DCGM_FI_PROF_SM_ACTIVE",
            "ratio",
            Gauge,
            "The ratio of cycles an SM has at least 1 warp assigned."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.sm_active))
    ),
    device!(
        Saturation,
        "nvidia_gpu_sm_active_seconds_total",
        Counter,
        "seconds",
        "nvidia_gpu_sm_active_ratio integrated over time (GPM): seconds of the whole GPU's SMs with a warp resident, added up at every tick over the exact window of each GPM reading (never across a tick the GPU was unreadable or stale). rate() over any window is the mean SM activity, whatever the scrape interval. Starts at 0 when the exporter (or NVML) starts.",
        [],
        |_, d, out| out.opt(d.busy.sm_active)
    ),
    device!(
        Saturation,
        "nvidia_gpu_sm_occupancy_ratio",
        Gauge,
        "ratio",
        "Resident warps as a share of the maximum the SMs can hold, averaged over the last sampling interval (GPM): how fully the SMs are loaded.",
        [dcgm(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "ratio",
            Gauge,
            "The ratio of number of warps resident on an SM."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.sm_occupancy))
    ),
    device!(
        Saturation,
        "nvidia_gpu_tensor_active_ratio",
        Gauge,
        "ratio",
        "Share of the last sampling interval during which any tensor-core pipe was active (GPM): high for dense matrix work, low when the GPU is busy with little math.",
        [dcgm(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "ratio",
            Gauge,
            "Ratio of cycles the tensor (HMMA) pipe is active."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.tensor_active))
    ),
    device!(
        Saturation,
        "nvidia_gpu_dram_active_ratio",
        Gauge,
        "ratio",
        "Share of the last sampling interval during which the device memory interface was busy (GPM); near 1 means memory-bandwidth bound.",
        [dcgm(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "ratio",
            Gauge,
            "Ratio of cycles the device memory interface is active sending or receiving data."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.dram_active))
    ),
    MetricDef {
        name: "nvidia_gpu_pipe_active_ratio",
        group: Group::Pipes,
        help: "Share of the last sampling interval during which each SM pipe was active (GPM): non-tensor FP64, FP32, FP16 and integer math, and the DFMA, HMMA and IMMA tensor pipes.",
        kind: MetricKind::Gauge,
        unit: "ratio",
        labels: &["pipe"],
        closed_labels: &[("pipe", || values_of(GpmPipe::ALL, GpmPipe::label))],
        dcgm: &[
            dcgm_for(
                "fp64",
                "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
                "ratio",
                Gauge,
                "Ratio of cycles the fp64 pipes are active.",
            ),
            dcgm_for(
                "fp32",
                "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
                "ratio",
                Gauge,
                "Ratio of cycles the fp32 pipes are active.",
            ),
            dcgm_for(
                "fp16",
                "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
                "ratio",
                Gauge,
                "Ratio of cycles the fp16 pipes are active.",
            ),
        ],
        source: Source::Device(|_, d, out| {
            for (p, v) in sorted(gpm(d).map_or(&[][..], |g| &g.pipes)) {
                out.labelled(&[GpmPipe::label(p)], v);
            }
        }),
    },
    device!(
        Pipes,
        "nvidia_gpu_sm_occupancy_seconds_total",
        Counter,
        "seconds",
        "nvidia_gpu_sm_occupancy_ratio integrated over time (GPM), as nvidia_gpu_sm_active_seconds_total: rate() is the mean occupancy over any window.",
        [],
        |_, d, out| out.opt(d.busy.sm_occupancy)
    ),
    device!(
        Pipes,
        "nvidia_gpu_tensor_active_seconds_total",
        Counter,
        "seconds",
        "Seconds in which a tensor-core pipe was active: nvidia_gpu_tensor_active_ratio integrated over time (GPM), as nvidia_gpu_sm_active_seconds_total.",
        [],
        |_, d, out| out.opt(d.busy.tensor_active)
    ),
    device!(
        Pipes,
        "nvidia_gpu_dram_active_seconds_total",
        Counter,
        "seconds",
        "Seconds in which the device memory interface was busy: nvidia_gpu_dram_active_ratio integrated over time (GPM), as nvidia_gpu_sm_active_seconds_total.",
        [],
        |_, d, out| out.opt(d.busy.dram_active)
    ),
    device!(
        Bandwidth,
        "nvidia_gpu_pcie_gpm_transmit_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "PCIe transmit rate (GPU to host) averaged over the whole last sampling interval (GPM).",
        [dcgm(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "B/s",
            Gauge,
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.pcie_transmit_bytes_per_second))
    ),
    device!(
        Bandwidth,
        "nvidia_gpu_pcie_gpm_receive_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "PCIe receive rate (host to GPU) averaged over the whole last sampling interval (GPM).",
        [dcgm(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "B/s",
            Gauge,
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.pcie_receive_bytes_per_second))
    ),
    device!(
        Bandwidth,
        "nvidia_gpu_nvlink_gpm_transmit_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "NVLink transmit rate over all links, averaged over the last sampling interval (GPM).",
        [dcgm(
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "B/s",
            Gauge,
            "Rate of data transmitted over NVLink (in bytes per second)."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.nvlink_transmit_bytes_per_second))
    ),
    device!(
        Bandwidth,
        "nvidia_gpu_nvlink_gpm_receive_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "NVLink receive rate over all links, averaged over the last sampling interval (GPM).",
        [dcgm(
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "B/s",
            Gauge,
            "Rate of data received over NVLink (in bytes per second)."
        )],
        |_, d, out| out.opt(gpm(d).and_then(|g| g.nvlink_receive_bytes_per_second))
    ),
    MetricDef {
        name: "nvidia_gpu_media_engine_active_ratio",
        group: Group::Media,
        help: "Share of the last sampling interval during which each video decoder (NVDEC), JPEG decoder (NVJPG) and optical-flow engine (NVOFA) was busy (GPM).",
        kind: MetricKind::Gauge,
        unit: "ratio",
        labels: &["engine"],
        closed_labels: &[("engine", || values_of(MediaEngine::ALL, MediaEngine::label))],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for (e, v) in sorted(gpm(d).map_or(&[][..], |g| &g.media_engines)) {
                out.labelled(&[MediaEngine::label(e)], v);
            }
        }),
    },
    // --- Memory ---------------------------------------------------------------------------
    device!(
        Memory,
        "nvidia_gpu_memory_total_bytes",
        Gauge,
        "bytes",
        "Total device (framebuffer) memory.",
        [dcgm(
            "DCGM_FI_DEV_FB_TOTAL",
            "MiB",
            Gauge,
            "Framebuffer memory total (in MiB)."
        )],
        |_, d, out| out.opt(d.memory.map(|m| m.total_bytes))
    ),
    device!(
        Memory,
        "nvidia_gpu_memory_used_bytes",
        Gauge,
        "bytes",
        "Device memory allocated by processes.",
        [dcgm(
            "DCGM_FI_DEV_FB_USED",
            "MiB",
            Gauge,
            "Framebuffer memory used (in MiB)."
        )],
        |_, d, out| out.opt(d.memory.map(|m| m.used_bytes))
    ),
    device!(
        Memory,
        "nvidia_gpu_memory_free_bytes",
        Gauge,
        "bytes",
        "Device memory available for allocation.",
        [dcgm(
            "DCGM_FI_DEV_FB_FREE",
            "MiB",
            Gauge,
            "Framebuffer memory free (in MiB)."
        )],
        |_, d, out| out.opt(d.memory.map(|m| m.free_bytes))
    ),
    device!(
        Memory,
        "nvidia_gpu_memory_reserved_bytes",
        Gauge,
        "bytes",
        "Device memory reserved by the driver and firmware.",
        [dcgm(
            "DCGM_FI_DEV_FB_RESERVED",
            "MiB",
            Gauge,
            "Framebuffer memory reserved (in MiB)."
        )],
        |_, d, out| out.opt(d.memory.map(|m| m.reserved_bytes))
    ),
    device!(
        Bar1,
        "nvidia_gpu_bar1_memory_total_bytes",
        Gauge,
        "bytes",
        "Total BAR1 memory (the CPU-mappable window into device memory).",
        [],
        |_, d, out| out.opt(d.bar1_memory.map(|m| m.total_bytes))
    ),
    device!(
        Bar1,
        "nvidia_gpu_bar1_memory_used_bytes",
        Gauge,
        "bytes",
        "Used BAR1 memory.",
        [],
        |_, d, out| out.opt(d.bar1_memory.map(|m| m.used_bytes))
    ),
    // --- Power ----------------------------------------------------------------------------
    device!(
        Power,
        "nvidia_gpu_power_watts",
        Gauge,
        "watts",
        "Power drawn by the board.",
        [dcgm(
            "DCGM_FI_DEV_POWER_USAGE",
            "W",
            Gauge,
            "Power draw (in W)."
        )],
        |_, d, out| out.opt(d.power_watts)
    ),
    device!(
        Power,
        "nvidia_gpu_power_limit_watts",
        Gauge,
        "watts",
        "Power limit the driver enforces, after all limiters (at most nvidia_gpu_power_management_limit_watts).",
        [dcgm(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            "W",
            Gauge,
            "Effective power limit enforced by the driver after all limiters (in W)."
        )],
        |_, d, out| out.opt(d.power_limit_watts)
    ),
    // Off by default: it equals the enforced limit on nearly every GPU, and the default budget
    // (40 series per GPU) has no room for a reading that rarely says more.
    device!(
        PowerLimits,
        "nvidia_gpu_power_management_limit_watts",
        Gauge,
        "watts",
        "Power limit set for the board (NVML's power management limit, what nvidia-smi -pl sets). The driver enforces nvidia_gpu_power_limit_watts, lower than this when another limiter caps the board.",
        [dcgm(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT",
            "W",
            Gauge,
            "Configured power management limit (in W)."
        )],
        |_, d, out| out.opt(d.power_management_limit_watts)
    ),
    device!(
        Power,
        "nvidia_gpu_energy_joules_total",
        Counter,
        "joules",
        "Energy consumed since the driver was loaded.",
        [dcgm(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "mJ",
            Counter,
            "Total energy consumption since boot (in mJ)."
        )],
        |_, d, out| out.opt(d.energy_joules)
    ),
    // --- Thermals -------------------------------------------------------------------------
    device!(
        Thermal,
        "nvidia_gpu_temperature_celsius",
        Gauge,
        "celsius",
        "GPU core temperature.",
        [dcgm(
            "DCGM_FI_DEV_GPU_TEMP",
            "°C",
            Gauge,
            "GPU temperature (in C)."
        )],
        |_, d, out| out.opt(d.temperature_celsius)
    ),
    device!(
        Thermal,
        "nvidia_gpu_memory_temperature_celsius",
        Gauge,
        "celsius",
        "Device memory (HBM) temperature.",
        [dcgm(
            "DCGM_FI_DEV_MEMORY_TEMP",
            "°C",
            Gauge,
            "Memory temperature (in C)."
        )],
        |_, d, out| out.opt(d.memory_temperature_celsius)
    ),
    device!(
        Thermal,
        "nvidia_gpu_thermal_slowdown_active",
        Gauge,
        "",
        "1 while a thermal slowdown holds the clocks down (the clock-event reason sw_thermal_slowdown or hw_thermal_slowdown is active), 0 otherwise.",
        [],
        |_, d, out| out.opt_flag(thermal_slowdown(d))
    ),
    MetricDef {
        name: "nvidia_gpu_temperature_threshold_celsius",
        group: Group::ThermalThresholds,
        help: "Temperature at which the GPU slows down or shuts down, and the maximum operating temperatures.",
        kind: MetricKind::Gauge,
        unit: "celsius",
        labels: &["threshold"],
        closed_labels: &[("threshold", || {
            values_of(TemperatureThreshold::ALL, TemperatureThreshold::label)
        })],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for (t, v) in sorted(&d.temperature_thresholds) {
                out.labelled(&[TemperatureThreshold::label(t)], v);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_fan_speed_ratio",
        group: Group::Thermal,
        help: "Fan speed as a share of its maximum.",
        kind: MetricKind::Gauge,
        unit: "ratio",
        labels: &["fan"],
        closed_labels: &[],
        dcgm: &[
            dcgm("DCGM_FI_DEV_FAN_SPEED", "%", Gauge, "Fan speed (in %).").combined(Combine::First),
        ],
        source: Source::Device(|_, d, out| {
            for (fan, v) in sorted(&d.fan_speeds) {
                out.labelled(&[&fan.to_string()], v);
            }
        }),
    },
    // --- Clocks and performance -----------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_clock_hertz",
        group: Group::Clocks,
        help: "Current clock frequency by clock domain.",
        kind: MetricKind::Gauge,
        unit: "hertz",
        labels: &["clock"],
        closed_labels: &[("clock", || values_of(ClockDomain::ALL, ClockDomain::label))],
        dcgm: &[
            dcgm_for(
                "sm",
                "DCGM_FI_DEV_SM_CLOCK",
                "MHz",
                Gauge,
                "SM clock frequency (in MHz).",
            ),
            dcgm_for(
                "memory",
                "DCGM_FI_DEV_MEM_CLOCK",
                "MHz",
                Gauge,
                "Memory clock frequency (in MHz).",
            ),
        ],
        source: Source::Device(|_, d, out| {
            for (c, v) in sorted(&d.clocks_hertz) {
                out.labelled(&[ClockDomain::label(c)], v);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_max_clock_hertz",
        group: Group::Clocks,
        help: "Maximum clock frequency by clock domain.",
        kind: MetricKind::Gauge,
        unit: "hertz",
        labels: &["clock"],
        closed_labels: &[("clock", || values_of(ClockDomain::ALL, ClockDomain::label))],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for (c, v) in sorted(&d.max_clocks_hertz) {
                out.labelled(&[ClockDomain::label(c)], v);
            }
        }),
    },
    device!(
        Clocks,
        "nvidia_gpu_performance_state",
        Gauge,
        "",
        "Performance state (P-state), 0 (maximum performance) to 15 (minimum).",
        [dcgm(
            "DCGM_FI_DEV_PSTATE",
            "",
            Gauge,
            "Performance state (P-state) 0-15, 0 is the highest."
        )],
        |_, d, out| out.opt(d.performance_state.map(f64::from))
    ),
    MetricDef {
        name: "nvidia_gpu_clock_event_active",
        group: Group::ClockEvents,
        help: "1 while the clock-event (throttle) reason holds clocks down, 0 otherwise.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["reason"],
        closed_labels: &[("reason", || {
            values_of(ClockEventReason::ALL, ClockEventReason::label)
        })],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for (r, active) in sorted(&d.clock_events) {
                out.labelled(&[ClockEventReason::label(r)], f64::from(u8::from(active)));
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_throttle_seconds_total",
        group: Group::ClockEvents,
        help: "Time clocks were held down, by violation policy.",
        kind: MetricKind::Counter,
        unit: "seconds",
        labels: &["reason"],
        closed_labels: &[("reason", || {
            values_of(ThrottleReason::ALL, ThrottleReason::label)
        })],
        dcgm: &[
            dcgm_for(
                "power",
                "DCGM_FI_DEV_POWER_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to power constraints (in ns).",
            ),
            dcgm_for(
                "thermal",
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to thermal constraints (in ns).",
            ),
            dcgm_for(
                "sync_boost",
                "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to sync-boost constraints (in ns).",
            ),
            dcgm_for(
                "board_limit",
                "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to board limit constraints (in ns).",
            ),
            dcgm_for(
                "low_utilization",
                "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to low utilization (in ns).",
            ),
            dcgm_for(
                "reliability",
                "DCGM_FI_DEV_RELIABILITY_VIOLATION",
                "ns",
                Counter,
                "Throttling duration due to reliability constraints (in ns).",
            ),
        ],
        source: Source::Device(|_, d, out| {
            for (r, v) in sorted(&d.throttle_seconds) {
                out.labelled(&[ThrottleReason::label(r)], v);
            }
        }),
    },
    // --- PCIe -----------------------------------------------------------------------------
    device!(
        Pcie,
        "nvidia_gpu_pcie_transmit_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "PCIe transmit throughput (GPU to host) over the driver's last sampling window.",
        [],
        |_, d, out| out.opt(d.pcie.transmit_bytes_per_second)
    ),
    device!(
        Pcie,
        "nvidia_gpu_pcie_receive_bytes_per_second",
        Gauge,
        "bytes_per_second",
        "PCIe receive throughput (host to GPU) over the driver's last sampling window.",
        [],
        |_, d, out| out.opt(d.pcie.receive_bytes_per_second)
    ),
    device!(
        Pcie,
        "nvidia_gpu_pcie_replay_errors_total",
        Counter,
        "",
        "PCIe replay (retransmission) events.",
        [dcgm(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "",
            Counter,
            "Total number of PCIe retries."
        )],
        |_, d, out| out.opt(d.pcie.replay_errors.map(|n| n as f64))
    ),
    MetricDef {
        name: "nvidia_gpu_pcie_link_generation",
        group: Group::PcieLink,
        help: "PCIe link generation, current and maximum supported.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["link"],
        closed_labels: &[("link", || vec!["current", "max"])],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            out.labelled_opt(&["current"], d.pcie.link_generation_current.map(f64::from));
            out.labelled_opt(&["max"], d.pcie.link_generation_max.map(f64::from));
        }),
    },
    MetricDef {
        name: "nvidia_gpu_pcie_link_width",
        group: Group::PcieLink,
        help: "PCIe link width in lanes, current and maximum supported.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["link"],
        closed_labels: &[("link", || vec!["current", "max"])],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            out.labelled_opt(&["current"], d.pcie.link_width_current.map(f64::from));
            out.labelled_opt(&["max"], d.pcie.link_width_max.map(f64::from));
        }),
    },
    // --- Memory errors --------------------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_ecc_errors_total",
        group: Group::Ecc,
        help: "ECC errors since the driver was loaded (volatile counters).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["error_type"],
        closed_labels: &[("error_type", || vec!["corrected", "uncorrected"])],
        dcgm: &[
            dcgm_for(
                "corrected",
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                "",
                Counter,
                "Total number of single-bit volatile ECC errors.",
            ),
            dcgm_for(
                "uncorrected",
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "",
                Counter,
                "Total number of double-bit volatile ECC errors.",
            ),
        ],
        source: Source::Device(|_, d, out| {
            if let Some(e) = d.ecc_volatile {
                out.labelled(&["corrected"], e.corrected as f64);
                out.labelled(&["uncorrected"], e.uncorrected as f64);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_ecc_lifetime_errors",
        group: Group::EccLifetime,
        help: "ECC errors over the GPU's lifetime (aggregate counters, kept in the InfoROM).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["error_type"],
        closed_labels: &[("error_type", || vec!["corrected", "uncorrected"])],
        dcgm: &[
            dcgm_for(
                "corrected",
                "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
                "",
                Counter,
                "Total number of single-bit persistent ECC errors.",
            ),
            dcgm_for(
                "uncorrected",
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                "",
                Counter,
                "Total number of double-bit persistent ECC errors.",
            ),
        ],
        source: Source::Device(|_, d, out| {
            if let Some(e) = d.ecc_aggregate {
                out.labelled(&["corrected"], e.corrected as f64);
                out.labelled(&["uncorrected"], e.uncorrected as f64);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_remapped_rows",
        group: Group::EccLifetime,
        help: "Memory rows remapped after ECC errors (Ampere and newer).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["error_type"],
        closed_labels: &[("error_type", || vec!["correctable", "uncorrectable"])],
        dcgm: &[
            dcgm_for(
                "correctable",
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "",
                Counter,
                "Number of remapped rows for correctable errors",
            ),
            dcgm_for(
                "uncorrectable",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "",
                Counter,
                "Number of remapped rows for uncorrectable errors",
            ),
        ],
        source: Source::Device(|_, d, out| {
            if let Some(r) = d.remapped_rows {
                out.labelled(&["correctable"], r.correctable as f64);
                out.labelled(&["uncorrectable"], r.uncorrectable as f64);
            }
        }),
    },
    device!(
        RowRemap,
        "nvidia_gpu_row_remap_pending",
        Gauge,
        "",
        "1 when a row remapping is pending (takes effect at the next GPU reset).",
        [dcgm(
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "",
            Gauge,
            "Whether remapping of rows is pending."
        )],
        |_, d, out| out.opt_flag(d.remapped_rows.map(|r| r.pending))
    ),
    device!(
        RowRemap,
        "nvidia_gpu_row_remap_failed",
        Gauge,
        "",
        "1 when a row remapping failed (the GPU needs service).",
        [dcgm(
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "",
            Gauge,
            "Whether remapping of rows has failed"
        )],
        |_, d, out| out.opt_flag(d.remapped_rows.map(|r| r.failed))
    ),
    MetricDef {
        name: "nvidia_gpu_retired_pages",
        group: Group::RowRemap,
        help: "Memory pages retired after ECC errors (before Ampere).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["cause"],
        closed_labels: &[("cause", || vec!["single_bit_ecc", "double_bit_ecc"])],
        dcgm: &[
            dcgm_for(
                "single_bit_ecc",
                "DCGM_FI_DEV_RETIRED_SBE",
                "",
                Counter,
                "Total number of retired pages due to single-bit errors.",
            ),
            dcgm_for(
                "double_bit_ecc",
                "DCGM_FI_DEV_RETIRED_DBE",
                "",
                Counter,
                "Total number of retired pages due to double-bit errors.",
            ),
        ],
        source: Source::Device(|_, d, out| {
            if let Some(p) = d.retired_pages {
                out.labelled(&["single_bit_ecc"], p.single_bit_ecc as f64);
                out.labelled(&["double_bit_ecc"], p.double_bit_ecc as f64);
            }
        }),
    },
    // --- Health -----------------------------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_health_state",
        group: Group::Health,
        help: "The GPU's health verdict: 0 healthy, 1 degraded, 2 failed (the worst of its active reasons; rules in docs/health.md). Served while the GPU is down too.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::DeviceIdentity(|_, d, out| {
            if let Some(h) = &d.health {
                out.value(h.state as u8 as f64);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_health_reason",
        group: Group::Health,
        help: "Each active reason of the GPU's health verdict, with the action it asks for; always 1, absent when the GPU is healthy.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["reason", "action"],
        closed_labels: &[
            ("reason", || {
                crate::health::rules::RULES
                    .iter()
                    .filter(|r| r.state != HealthState::Healthy && !r.signal.is_node())
                    .map(|r| r.reason)
                    .collect()
            }),
            ("action", || {
                values_of(HealthAction::ALL, HealthAction::label)
            }),
        ],
        dcgm: &[],
        source: Source::DeviceIdentity(|_, d, out| {
            for r in d.health.iter().flat_map(|h| &h.reasons) {
                out.labelled(&[r.reason, r.action.label()], 1.0);
            }
        }),
    },
    // --- XID events -----------------------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_xid_errors_total",
        group: Group::Xid,
        help: "XID error events seen by this exporter, by XID code.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["xid"],
        closed_labels: &[],
        dcgm: &[dcgm(
            "DCGM_FI_DEV_XID_ERRORS",
            "",
            Gauge,
            "Value of the last XID error encountered.",
        )
        .combined(Combine::LastXid)],
        source: Source::Device(|_, d, out| {
            // A BTreeMap iterates in key order: numeric XID order, not string order.
            for (xid, n) in &d.xid_counts {
                out.labelled(&[&xid.to_string()], *n as f64);
            }
        }),
    },
    device!(
        Xid,
        "nvidia_gpu_last_xid_timestamp_seconds",
        Gauge,
        "seconds",
        "When the last XID event arrived, seconds since the Unix epoch.",
        [],
        |_, d, out| out.opt(d.last_xid_timestamp_seconds)
    ),
    // --- NVLink ---------------------------------------------------------------------------
    // Per GPU, summed over its links (the nvlink group); per link after them (nvlink-links).
    device!(
        Nvlink,
        "nvidia_gpu_nvlink_links_up",
        Gauge,
        "",
        "Number of the GPU's NVLink links that are active (absent on a GPU without NVLink, and when NVML did not say for a link).",
        [],
        |_, d, out| out.opt(
            (!d.nvlinks.is_empty() && d.nvlinks.iter().all(|l| l.up.is_some())).then(|| {
                sorted_links(d)
                    .iter()
                    .filter(|l| l.up == Some(true))
                    .count() as f64
            })
        )
    ),
    MetricDef {
        name: "nvidia_gpu_nvlink_links_transmit_bytes_total",
        group: Group::Nvlink,
        help: "Data bytes transmitted over all the GPU's NVLink links.",
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &[],
        closed_labels: &[],
        dcgm: &[NVLINK_BANDWIDTH_TOTAL],
        source: Source::Device(|_, d, out| out.opt(link_sum(d, |l| l.transmit_bytes))),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_links_receive_bytes_total",
        group: Group::Nvlink,
        help: "Data bytes received over all the GPU's NVLink links.",
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &[],
        closed_labels: &[],
        dcgm: &[NVLINK_BANDWIDTH_TOTAL],
        source: Source::Device(|_, d, out| out.opt(link_sum(d, |l| l.receive_bytes))),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_links_errors_total",
        group: Group::Nvlink,
        help: "NVLink errors by error type, summed over the GPU's links.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["error_type"],
        closed_labels: &[("error_type", || {
            values_of(NvLinkErrorType::ALL, NvLinkErrorType::label)
        })],
        dcgm: &[
            dcgm_for(
                "crc_flit",
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "",
                Counter,
                "Total number of NVLink flow-control CRC errors.",
            ),
            dcgm_for(
                "crc_data",
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                "",
                Counter,
                "Total number of NVLink data CRC errors.",
            ),
            dcgm_for(
                "replay",
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                "",
                Counter,
                "Total number of NVLink retries.",
            ),
            dcgm_for(
                "recovery",
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                "",
                Counter,
                "Total number of NVLink recovery errors.",
            ),
        ],
        source: Source::Device(|_, d, out| {
            for t in NvLinkErrorType::ALL {
                let sum = link_sum(d, |l| l.errors.iter().find(|(k, _)| k == t).map(|(_, n)| n));
                out.labelled_opt(&[NvLinkErrorType::label(*t)], sum);
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_up",
        group: Group::NvlinkLinks,
        help: "1 when the NVLink link is active (absent when NVML did not say).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["link"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for l in sorted_links(d) {
                let mut link = itoa::Buffer::new();
                out.labelled_opt(
                    &[link.format(l.link)],
                    l.up.map(|up| f64::from(u8::from(up))),
                );
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_transmit_bytes_total",
        group: Group::NvlinkLinks,
        help: "Data bytes transmitted over the NVLink link.",
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &["link"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for l in sorted_links(d) {
                let mut link = itoa::Buffer::new();
                out.labelled_opt(&[link.format(l.link)], l.transmit_bytes.map(|b| b as f64));
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_receive_bytes_total",
        group: Group::NvlinkLinks,
        help: "Data bytes received over the NVLink link.",
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &["link"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for l in sorted_links(d) {
                let mut link = itoa::Buffer::new();
                out.labelled_opt(&[link.format(l.link)], l.receive_bytes.map(|b| b as f64));
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_nvlink_errors_total",
        group: Group::NvlinkLinks,
        help: "NVLink errors by link and error type.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["link", "error_type"],
        closed_labels: &[("error_type", || {
            values_of(NvLinkErrorType::ALL, NvLinkErrorType::label)
        })],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for l in sorted_links(d) {
                let mut link = itoa::Buffer::new();
                let link = link.format(l.link);
                for (t, n) in l.errors.iter() {
                    out.labelled(&[link, NvLinkErrorType::label(t)], n as f64);
                }
            }
        }),
    },
    // --- NVLink fabric (NVSwitch systems) ---------------------------------------------------
    device!(
        Fabric,
        "nvidia_gpu_fabric_state",
        Gauge,
        "",
        "The GPU's registration with the NVLink fabric of an NVSwitch system (Fabric Manager): 1 not started, 2 in progress, 3 completed, 4 completed with an error (nvidia_gpu_fabric_info's status says which), as DCGM numbers its Fabric Manager status. Absent where the GPU is on no fabric.",
        [],
        |_, d, out| {
            if let Some(f) = &d.fabric {
                out.value(match f.state {
                    _ if f.registration_failed() => 4.0,
                    FabricState::NotStarted => 1.0,
                    FabricState::InProgress => 2.0,
                    FabricState::Completed => 3.0,
                });
            }
        }
    ),
    MetricDef {
        name: "nvidia_gpu_fabric_info",
        group: Group::FabricHealth,
        help: "The GPU's NVLink fabric: its clique and cluster, how its registration ended (status: an NVML error name, success, or empty before it completed) and what the health mask says of the fabric's configuration (configuration: correct, or what is wrong; empty where the driver does not say); always 1.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["clique_id", "cluster_uuid", "status", "configuration"],
        closed_labels: &[("configuration", || {
            values_of(FabricConfiguration::ALL, FabricConfiguration::label)
        })],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            if let Some(f) = &d.fabric {
                let mut clique = itoa::Buffer::new();
                out.labelled(
                    &[
                        clique.format(f.clique_id),
                        &f.cluster_uuid,
                        f.status.unwrap_or(""),
                        f.configuration.map_or("", FabricConfiguration::label),
                    ],
                    1.0,
                );
            }
        }),
    },
    MetricDef {
        name: "nvidia_gpu_fabric_condition",
        group: Group::FabricHealth,
        help: "Each condition of the GPU's NVLink fabric health mask: 1 while it holds, 0 while it does not; absent where the driver does not report it (the mask came with R550, most conditions with R570, incorrect_configuration with R580).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["condition"],
        closed_labels: &[("condition", || {
            values_of(FabricCondition::ALL, FabricCondition::label)
        })],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for (c, on) in d.fabric.iter().flat_map(|f| &f.conditions) {
                out.labelled(&[c.label()], if *on { 1.0 } else { 0.0 });
            }
        }),
    },
    device!(
        FabricHealth,
        "nvidia_gpu_fabric_health",
        Gauge,
        "",
        "The driver's summary of the GPU's NVLink fabric health, as NVML numbers it: 1 healthy, 2 unhealthy, 3 limited capacity. Absent before R580.",
        [],
        |_, d, out| out.opt(
            d.fabric
                .as_ref()
                .and_then(|f| f.summary)
                .map(|s| f64::from(s.code()))
        )
    ),
    // --- MIG ------------------------------------------------------------------------------
    device!(
        Mig,
        "nvidia_gpu_mig_mode",
        Gauge,
        "",
        "1 when MIG (multi-instance GPU) mode is enabled.",
        [],
        |_, d, out| out.opt_flag(d.mig_mode)
    ),
    MetricDef {
        name: "nvidia_gpu_mig_instance_info",
        group: Group::Mig,
        help: "One MIG device (compute instance) of a GPU instance; always 1. mig_uuid is what nvidia-smi -L and CUDA_VISIBLE_DEVICES name it by. On a GPU in MIG mode the memory and GPM saturation families have, next to the GPU's own series, one series per GPU instance with the labels gpu_instance and mig_profile: aggregations over such a GPU must pick either the GPU's series (gpu_instance=\"\") or the instances' (gpu_instance!=\"\"), never both.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[
            "gpu_instance",
            "mig_profile",
            "mig_uuid",
            "compute_instance",
        ],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Device(|_, d, out| {
            for i in &d.mig_instances {
                let gi = i.gpu_instance.to_string();
                for c in &i.compute_instances {
                    let ci = c.compute_instance.to_string();
                    out.labelled(&[&gi, &i.profile, &c.uuid, &ci], 1.0);
                }
            }
        }),
    },
    // --- Processes (--processes) ----------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_process_memory_used_bytes",
        group: Group::Processes,
        help: "Device memory held by the process (with --processes; at most --max-processes-per-gpu series per GPU, the largest by memory). namespace, pod and container when its container is known.",
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: PROCESS_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::Processes(ProcessField::MemoryUsed),
    },
    MetricDef {
        name: "nvidia_gpu_process_sm_utilization_ratio",
        group: Group::Processes,
        help: "Share of the last sampling interval the process had a kernel running on the SMs; 0 when the driver has no sample of it in that interval (with --processes; same series limit).",
        kind: MetricKind::Gauge,
        unit: "ratio",
        labels: PROCESS_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::Processes(ProcessField::SmUtilization),
    },
    MetricDef {
        name: "nvidia_gpu_pod_memory_used_bytes",
        group: Group::Processes,
        help: "Device memory held by the container's processes on the GPU, summed over all of them (with --processes and --kubernetes).",
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::PodProcesses(ProcessField::MemoryUsed),
    },
    MetricDef {
        name: "nvidia_gpu_pod_sm_utilization_ratio",
        group: Group::Processes,
        help: "Sum of the SM utilization of the container's processes on the GPU (with --processes and --kubernetes).",
        kind: MetricKind::Gauge,
        unit: "ratio",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::PodProcesses(ProcessField::SmUtilization),
    },
    MetricDef {
        name: "nvidia_gpu_memory_outside_allocation_bytes",
        group: Group::Processes,
        help: "Device memory held by processes on the GPU whose pod holds neither the GPU nor their MIG GPU instance: host processes, processes left by ended pods, pods that see the GPU without requesting it; 0 when none (with --processes and --kubernetes; a process whose cgroup cannot be read is not counted).",
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::OutsideAllocation,
    },
    // --- GPU-seconds per workload (--kubernetes) ----------------------------------------------
    MetricDef {
        name: "nvidia_gpu_pod_gpu_seconds_total",
        group: Group::Workloads,
        help: "GPU-seconds the container held the GPU or MIG GPU instance (with --kubernetes): the time the exporter read it, a MIG instance counting as its compute slices over the GPU's, a GPU several containers hold split by their own SM utilization (--processes) or else evenly. Counted from when the exporter saw the container hold it; the series ends when the container lets go (its pod ended or is gone).",
        kind: MetricKind::Counter,
        unit: "seconds",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::Workloads(|w| Some(w.held)),
    },
    MetricDef {
        name: "nvidia_gpu_pod_idle_gpu_seconds_total",
        group: Group::Workloads,
        help: "Of nvidia_gpu_pod_gpu_seconds_total, the GPU-seconds in which the device was idle: its SM activity, or its utilization where GPM does not answer, below --idle-threshold (default 0.05) at the reading that counted them. Idle GPU-hours per namespace over 30 days: sum by (namespace) (increase(nvidia_gpu_pod_idle_gpu_seconds_total[30d])) / 3600.",
        kind: MetricKind::Counter,
        unit: "seconds",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::Workloads(|w| Some(w.idle)),
    },
    MetricDef {
        name: "nvidia_gpu_pod_sm_active_gpu_seconds_total",
        group: Group::Workloads,
        help: "SM-active GPU-seconds of the container: the device's SM activity (GPM) integrated over time and split as nvidia_gpu_pod_gpu_seconds_total; its rate over that one's is the container's mean SM activity. Absent without GPM.",
        kind: MetricKind::Counter,
        unit: "seconds",
        labels: POD_LABELS,
        closed_labels: &[],
        dcgm: &[],
        source: Source::Workloads(|w| w.sm_active),
    },
    // --- HPC jobs ---------------------------------------------------------------------------
    MetricDef {
        name: "nvidia_gpu_job_info",
        group: Group::Jobs,
        help: "An HPC job runs on the GPU, or on its MIG GPU instance (gpu_instance, mig_profile); always 1 (with --hpc-job-mapping-dir). hpc_job is the ID its mapping file holds, dcgm-exporter's label; one series per job.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["hpc_job"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Jobs,
    },
    // --- The node's inventory (--host-sys) -----------------------------------------------------
    MetricDef {
        name: "nvidia_node_gpus_missing",
        group: Group::Inventory,
        help: "GPUs the node's PCI bus lists (NVIDIA display controllers bound to the nvidia driver or to none) that NVML does not enumerate: GPUs the driver lost. Absent when it cannot be told (the bus unreadable, NVML not answering).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            if let Some(missing) = &s.missing_gpus {
                out.value(missing.len() as f64);
            }
        }),
    },
    MetricDef {
        name: "nvidia_node_missing_gpu_info",
        group: Group::Inventory,
        help: "A GPU the node's PCI bus lists that NVML does not enumerate, by PCI address (sysfs' form, 0000:1b:00.0), device id and bound driver (empty when none is); always 1.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["pci_bus_id", "device_id", "driver"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            for g in s.missing_gpus.iter().flatten() {
                out.labelled(&[&g.address, &g.device_id, &g.driver], 1.0);
            }
        }),
    },
    // --- Exporter self-metrics ------------------------------------------------------------
    MetricDef {
        name: "nvml_exporter_build_info",
        group: Group::Core,
        help: "Build of the running exporter; always 1.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["version", "revision", "rustc"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|_, out| out.labelled(&[VERSION, REVISION, RUSTC], 1.0)),
    },
    MetricDef {
        name: "nvml_exporter_nvml_up",
        group: Group::Core,
        help: "1 when NVML is initialised and answering.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| out.flag(s.nvml_up)),
    },
    MetricDef {
        name: "nvml_exporter_gpus",
        group: Group::Core,
        help: "GPUs discovered, lost ones included.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| out.value(s.devices.len() as f64)),
    },
    MetricDef {
        name: SAMPLE_DURATION_SECONDS,
        group: Group::Core,
        help: "Wall time of one sampling tick over all GPUs.",
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: "nvml_exporter_last_sample_timestamp_seconds",
        group: Group::Core,
        help: "End of the last complete sampling tick, seconds since the Unix epoch (staleness: time() - this).",
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| out.opt(s.last_tick_timestamp_seconds)),
    },
    MetricDef {
        name: "nvml_exporter_nvml_errors_total",
        group: Group::Core,
        help: "NVML calls that failed with anything but NOT_SUPPORTED, by function and error.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["function", "error"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            for ((function, error), n) in &s.nvml_errors {
                out.labelled(&[function, error], *n as f64);
            }
        }),
    },
    MetricDef {
        name: "nvml_exporter_kubernetes_up",
        group: Group::Core,
        help: "1 when the last call to the kubelet pod-resources API succeeded (with --kubernetes).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            if let Some(k) = &s.kubernetes {
                out.flag(k.up);
            }
        }),
    },
    MetricDef {
        name: "nvml_exporter_kubernetes_errors_total",
        group: Group::Core,
        help: "Failed calls to the kubelet and the API server, by reason (with --kubernetes): the pod-resources API, the kubelet's pod list (pods_*, where it is read), the DRA ResourceSlices (dra_*, with --kubernetes-dra) and the node condition (node_condition_*, with --kubernetes-node-condition).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["reason"],
        closed_labels: &[("reason", || {
            values_of(KubeletError::ALL, KubeletError::label)
        })],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            for (reason, n) in s.kubernetes.iter().flat_map(|k| &k.errors) {
                out.labelled(&[reason.label()], *n as f64);
            }
        }),
    },
    MetricDef {
        name: "nvml_exporter_health_state_errors_total",
        group: Group::Core,
        help: "Failed reads and writes of the file that keeps the health verdicts held until a GPU reset across restarts (with --health-state-file): a failed read at start lost the verdicts held before it, so a GPU may read healthy that needs a reset; a failed write means those held now would not survive a restart.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["operation"],
        closed_labels: &[("operation", || vec!["read", "write"])],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            if let Some(e) = &s.health_state {
                out.labelled(&["read"], e.read as f64);
                out.labelled(&["write"], e.write as f64);
            }
        }),
    },
    MetricDef {
        name: "nvml_exporter_jobs_errors_total",
        group: Group::Core,
        help: "HPC job mapping files left out (their GPU shows no job), by reason, counted at every read (with --hpc-job-mapping-dir): the directory unreadable, a file unreadable, malformed (not text, too large), naming a GPU or MIG GPU instance not seen, or too many job IDs (over 64 in a file, or past 1024 on the node).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["reason"],
        closed_labels: &[("reason", || values_of(JobsError::ALL, JobsError::label))],
        dcgm: &[],
        source: Source::Exporter(|s, out| {
            for (reason, n) in s.jobs.iter().flat_map(|j| &j.errors) {
                out.labelled(&[reason.label()], *n as f64);
            }
        }),
    },
    MetricDef {
        name: SERIES,
        group: Group::Core,
        help: "Series of the GPU families served by collector group, in this exposition (the exporter's own families not counted; dcgm-exporter's names neither, and with --dcgm-compat=dcgm it is absent).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &["group"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: SERIES_DROPPED_TOTAL,
        group: Group::Core,
        help: "Series left out because the exposition was over --max-series, by collector group (from the first group dropped on).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["group"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: EXPOSITION_BYTES,
        group: Group::Core,
        help: "Size of the previous exposition of /metrics, uncompressed (from the second on).",
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: SCRAPES_TOTAL,
        group: Group::Core,
        help: "Requests to /metrics by HTTP status code (counted up to the previous sampling tick).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["code"],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: HTTP_CONNECTIONS,
        group: Group::Core,
        help: "HTTP connections open (as of the previous sampling tick).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: HTTP_CONNECTIONS_CLOSED_TOTAL,
        group: Group::Core,
        help: "HTTP connections closed, by reason (counted up to the previous sampling tick): the client finished, a timeout (idle, head, TLS handshake, or a response not read), reclaimed to make room for a new connection, the per-connection request limit, refused over the cap, or an error.",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["reason"],
        closed_labels: &[("reason", || CLOSE_REASONS.to_vec())],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: CONFIG_LAST_RELOAD_SUCCESSFUL,
        group: Group::Core,
        help: "1 when the last configuration reload (SIGHUP, or a change of the --config or --web-config file) succeeded, 0 while the previous configuration stays in force because the new one was refused.",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
        group: Group::Core,
        help: "When the configuration last loaded successfully (at start or by a reload), seconds since the Unix epoch.",
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    // --- OTLP push (--otlp-endpoint) ------------------------------------------------------
    MetricDef {
        name: OTLP_EXPORTS_TOTAL,
        group: Group::Core,
        help: "OTLP export requests by result (with --otlp-endpoint): accepted whole (success) or in part (partial_success: the receiver rejected some points); not delivered and retried, for want of a connection or a refusal OTLP says to retry (unavailable: gRPC UNAVAILABLE, RESOURCE_EXHAUSTED with RetryInfo, HTTP 429, 502, 503, 504) or no answer within --otlp-timeout (timeout); refused for good and dropped (rejected).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["result"],
        closed_labels: &[("result", || OTLP_EXPORT_RESULTS.to_vec())],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: OTLP_POINTS_TOTAL,
        group: Group::Core,
        help: "OTLP data points by what became of them (with --otlp-endpoint): accepted by the receiver (sent), refused by it (rejected: a partial success's rejected points, or a request refused for good), or dropped unsent because the queue was full while the receiver was away (dropped, oldest first).",
        kind: MetricKind::Counter,
        unit: "",
        labels: &["result"],
        closed_labels: &[("result", || OTLP_POINT_RESULTS.to_vec())],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: OTLP_REQUEST_BYTES_TOTAL,
        group: Group::Core,
        help: "Bytes of the OTLP requests sent, every try counted, as encoded protobuf before compression (with --otlp-endpoint).",
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: OTLP_QUEUE_BATCHES,
        group: Group::Core,
        help: "OTLP requests waiting to be sent (with --otlp-endpoint): one per --otlp-interval while the receiver does not take them, at most 10 (then the oldest is dropped).",
        kind: MetricKind::Gauge,
        unit: "",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
    MetricDef {
        name: OTLP_LAST_SUCCESS_TIMESTAMP_SECONDS,
        group: Group::Core,
        help: "When the OTLP receiver last accepted a request, seconds since the Unix epoch; 0 before the first (with --otlp-endpoint).",
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &[],
        closed_labels: &[],
        dcgm: &[],
        source: Source::Registry,
    },
];

/// The catalog row named `name`.
pub fn find(name: &str) -> Option<&'static MetricDef> {
    CATALOG.iter().find(|d| d.name == name)
}

/// `(key, value)` pairs sorted by key, first occurrence kept on duplicates: the sampler's order
/// must not change the exposition, and a duplicate series would make the scrape invalid.
fn sorted<K: Ord + Copy, V: Copy>(pairs: &[(K, V)]) -> impl Iterator<Item = (K, V)> + '_ {
    // The sampler fills these in key order, so the list is served as it is, without a copy.
    let pairs: Cow<'_, [(K, V)]> = if pairs.windows(2).all(|w| w[0].0 < w[1].0) {
        Cow::Borrowed(pairs)
    } else {
        let mut copy = pairs.to_vec();
        // A stable sort, so that of duplicates the first stays first and is the one kept.
        copy.sort_by_key(|(k, _)| *k);
        copy.dedup_by_key(|(k, _)| *k);
        Cow::Owned(copy)
    };
    (0..pairs.len()).map(move |i| pairs[i])
}

/// The device's GPM averages, when the last tick closed a GPM window.
fn gpm(d: &DeviceSample) -> Option<&GpmMetrics> {
    d.gpm.as_ref()
}

/// Whether a thermal slowdown holds the clocks down, when the clock-event reasons were read.
pub(crate) fn thermal_slowdown(d: &DeviceSample) -> Option<bool> {
    (!d.clock_events.is_empty()).then(|| {
        d.clock_events.iter().any(|(r, active)| {
            *active
                && matches!(
                    r,
                    ClockEventReason::SwThermalSlowdown | ClockEventReason::HwThermalSlowdown
                )
        })
    })
}

/// The sum of one counter over the device's links (duplicates dropped), `None` when no link has
/// a reading of it.
fn link_sum(
    d: &DeviceSample,
    read: impl Fn(&crate::sample::NvLinkSample) -> Option<u64>,
) -> Option<f64> {
    sorted_links(d)
        .into_iter()
        .filter_map(read)
        .fold(None, |sum, n| Some(sum.unwrap_or(0) + n))
        .map(|n| n as f64)
}

/// The device's NVLink links by link number, duplicates dropped (see [`sorted`]).
fn sorted_links(d: &DeviceSample) -> Vec<&crate::sample::NvLinkSample> {
    let mut links: Vec<_> = d.nvlinks.iter().collect();
    links.sort_by_key(|l| l.link);
    links.dedup_by_key(|l| l.link);
    links
}

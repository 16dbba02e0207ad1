//! The OTLP mapping: how each family of the [catalog](crate::metrics::catalog) is pushed, one
//! row per family, declared once here (docs/otlp.md is rendered from it, and a test fails on a
//! served family without a row).
//!
//! Where OpenTelemetry's semantic conventions define the metric (`hw.gpu.*`, `hw.power`,
//! `hw.energy`, `hw.temperature`, `hw.errors`, `hw.status`), the row takes its name, unit,
//! instrument and attributes; every other family gets a name of the exporter's own in OTel's
//! style (`nvidia.gpu.*` for the GPUs, `nvml_exporter.*` for the exporter itself: dotted
//! namespaces, the unit in the unit field and not in the name). Every point of a GPU carries
//! the attributes of the hardware it measures (`convert`): `hw.id` (the GPU's UUID, or
//! the MIG device's), `hw.type` `gpu`, `hw.name`, `hw.vendor`, `hw.model`, and for a MIG GPU
//! instance `hw.parent` (the GPU's UUID) with [`MIG_ATTRIBUTES`]; a series with pod labels
//! carries [`POD_ATTRIBUTES`] instead.

use crate::metrics::catalog::{MIG_LABELS, POD_LABELS};

/// What a family is pushed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instrument {
    /// A value that goes up and down: an OTLP gauge.
    Gauge,
    /// A count that only grows until it resets: a monotonic cumulative sum.
    Counter,
    /// An amount that goes up and down (memory in use, a state): a non-monotonic cumulative
    /// sum, as the semantic conventions declare their `UpDownCounter`s.
    UpDownCounter,
}

impl Instrument {
    /// The instrument's name in OpenTelemetry's words.
    pub fn as_str(self) -> &'static str {
        match self {
            Instrument::Gauge => "Gauge",
            Instrument::Counter => "Counter",
            Instrument::UpDownCounter => "UpDownCounter",
        }
    }
}

/// An attribute's value type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The label's text.
    Text,
    /// The label's text as an integer (a pid, a link or instance number).
    Int,
}

/// One label of a family and the attribute it is pushed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribute {
    /// The Prometheus label.
    pub label: &'static str,
    /// The OTLP attribute.
    pub key: &'static str,
    /// Its value type.
    pub kind: Kind,
}

/// A label pushed as a text attribute.
const fn text(label: &'static str, key: &'static str) -> Attribute {
    Attribute {
        label,
        key,
        kind: Kind::Text,
    }
}

/// A label pushed as an integer attribute.
const fn int(label: &'static str, key: &'static str) -> Attribute {
    Attribute {
        label,
        key,
        kind: Kind::Int,
    }
}

/// The attributes the MIG labels ([`MIG_LABELS`]) are pushed as, on a MIG GPU instance's points.
pub const MIG_ATTRIBUTES: [Attribute; 2] = [
    int("gpu_instance", "nvidia.gpu.mig.gpu_instance"),
    text("mig_profile", "nvidia.gpu.mig.profile"),
];

/// The attributes the pod labels ([`POD_LABELS`]) are pushed as: the Kubernetes semantic
/// conventions' names.
pub const POD_ATTRIBUTES: [Attribute; 3] = [
    text("namespace", "k8s.namespace.name"),
    text("pod", "k8s.pod.name"),
    text("container", "k8s.container.name"),
];

/// The states `hw.status` takes, by the value of `nvidia_gpu_health_state`.
pub const HEALTH_STATES: &[(f64, &str)] = &[(0.0, "ok"), (1.0, "degraded"), (2.0, "failed")];

/// How a family is pushed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// The OTLP metric name.
    pub name: &'static str,
    /// Its instrument.
    pub instrument: Instrument,
    /// Its unit (UCUM).
    pub unit: &'static str,
    /// Attributes every point of the family has (`hw.gpu.task` of `hw.gpu.utilization`): what
    /// tells apart families pushed under one name.
    pub fixed: &'static [(&'static str, &'static str)],
    /// The family's own labels (those beyond the identity, MIG and pod labels).
    pub attributes: &'static [Attribute],
    /// The description of a metric several families are pushed under, or of one the semantic
    /// conventions define; `None`: the family's help.
    pub description: Option<&'static str>,
    /// Name, unit and instrument are the semantic conventions'.
    pub semconv: bool,
    /// Each point is a state set: one point per [`HEALTH_STATES`] entry, under `hw.state`, 1 for
    /// the value's state and 0 for the others (`hw.status`).
    pub states: bool,
}

/// How one family of the catalog is pushed, or why it is not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Push {
    /// Pushed as this metric.
    Metric(Metric),
    /// Not pushed, for this reason.
    Not(&'static str),
}

/// One row: a catalog family and how it is pushed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// The family's Prometheus name.
    pub family: &'static str,
    /// How it is pushed.
    pub push: Push,
}

/// A family pushed under a name of the exporter's own, with its help as description.
const fn own(
    family: &'static str,
    name: &'static str,
    instrument: Instrument,
    unit: &'static str,
    attributes: &'static [Attribute],
) -> Row {
    Row {
        family,
        push: Push::Metric(Metric {
            name,
            instrument,
            unit,
            fixed: &[],
            attributes,
            description: None,
            semconv: false,
            states: false,
        }),
    }
}

impl Row {
    /// The same, each point with the attributes `fixed` (what tells apart families pushed
    /// under one name).
    const fn fixed(self, fixed: &'static [(&'static str, &'static str)]) -> Row {
        match self.push {
            Push::Metric(mut m) => {
                m.fixed = fixed;
                Row {
                    family: self.family,
                    push: Push::Metric(m),
                }
            }
            Push::Not(_) => self,
        }
    }

    /// The same, with a description of what its name holds (a name several families share).
    const fn described(self, description: &'static str) -> Row {
        match self.push {
            Push::Metric(mut m) => {
                m.description = Some(description);
                Row {
                    family: self.family,
                    push: Push::Metric(m),
                }
            }
            Push::Not(_) => self,
        }
    }

    /// The same, a metric of the semantic conventions, described as they do.
    const fn semconv(self, description: &'static str) -> Row {
        match self.described(description).push {
            Push::Metric(mut m) => {
                m.semconv = true;
                Row {
                    family: self.family,
                    push: Push::Metric(m),
                }
            }
            Push::Not(_) => self,
        }
    }
}

/// A family that is not pushed.
const fn not(family: &'static str, reason: &'static str) -> Row {
    Row {
        family,
        push: Push::Not(reason),
    }
}

use Instrument::{Counter, Gauge, UpDownCounter};

/// Why the families the exporter's registry keeps are not pushed.
const REGISTRY: &str = "The exporter's own state for /metrics (its HTTP server, reloads, series counts, the tick histogram, the push itself): read it by scraping /metrics.";

/// What `hw.gpu.utilization` says.
const UTILIZATION: &str = "Fraction of time spent in a specific task (hw.gpu.task): general, a kernel running; encoder and decoder, the video engines busy.";

/// What `hw.temperature` says.
const TEMPERATURE: &str = "Temperature in degrees Celsius, of the GPU core (hw.sensor_location gpu) or its memory (memory).";

/// What `nvidia.gpu.pcie.gpm.throughput` says.
const PCIE_GPM: &str = "PCIe throughput averaged over the whole last sampling interval (GPM), by direction: transmit (GPU to host) or receive.";

/// What `nvidia.gpu.nvlink.gpm.throughput` says.
const NVLINK_GPM: &str = "NVLink throughput over all links averaged over the last sampling interval (GPM), by direction.";

/// What `nvidia.gpu.pcie.throughput` says.
const PCIE: &str = "PCIe throughput over the driver's last sampling window, by direction: transmit (GPU to host) or receive.";

/// What `hw.errors` says.
const ECC: &str = "Number of errors encountered by the component: the GPU's volatile ECC errors, corrected or uncorrected (error.type), since the driver was loaded.";

/// What `hw.gpu.io` says.
const GPU_IO: &str = "Received and transmitted bytes by the GPU: its data bytes over all its NVLink links (PCIe traffic is in nvidia.gpu.pcie.throughput).";

/// What `nvidia.gpu.nvlink.link.io` says.
const NVLINK_LINK_IO: &str =
    "Data bytes over one NVLink link (nvidia.gpu.nvlink.index), by direction.";

/// Every family of the catalog, in catalog order, and how it is pushed.
pub static MAPPING: &[Row] = &[
    own(
        "nvidia_gpu_info",
        "nvidia.gpu.info",
        Gauge,
        "1",
        &[
            text("name", "hw.model"),
            text("brand", "nvidia.gpu.brand"),
            text("architecture", "nvidia.gpu.architecture"),
            text("pci_bus_id", "nvidia.gpu.pci_bus_id"),
            text("serial", "hw.serial_number"),
            text("vbios_version", "hw.firmware_version"),
            text("driver_version", "hw.driver_version"),
            text("cuda_driver_version", "nvidia.gpu.cuda_driver_version"),
            text("compute_capability", "nvidia.gpu.compute_capability"),
            text("minor_number", "nvidia.gpu.minor_number"),
        ],
    ),
    own("nvidia_gpu_up", "nvidia.gpu.up", Gauge, "1", &[]),
    own(
        "nvidia_gpu_pod_info",
        "nvidia.gpu.pod.info",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_utilization_ratio",
        "hw.gpu.utilization",
        Gauge,
        "1",
        &[],
    )
    .fixed(&[("hw.gpu.task", "general")])
    .semconv(UTILIZATION),
    own(
        "nvidia_gpu_utilization_seconds_total",
        "nvidia.gpu.busy_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_memory_utilization_ratio",
        "nvidia.gpu.memory.activity",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_encoder_utilization_ratio",
        "hw.gpu.utilization",
        Gauge,
        "1",
        &[],
    )
    .fixed(&[("hw.gpu.task", "encoder")])
    .semconv(UTILIZATION),
    own(
        "nvidia_gpu_decoder_utilization_ratio",
        "hw.gpu.utilization",
        Gauge,
        "1",
        &[],
    )
    .fixed(&[("hw.gpu.task", "decoder")])
    .semconv(UTILIZATION),
    own(
        "nvidia_gpu_gpm_supported",
        "nvidia.gpu.gpm.supported",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_graphics_engine_active_ratio",
        "nvidia.gpu.graphics.activity",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_sm_active_ratio",
        "nvidia.gpu.sm.activity",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_sm_active_seconds_total",
        "nvidia.gpu.sm.active_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_sm_occupancy_ratio",
        "nvidia.gpu.sm.occupancy",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_tensor_active_ratio",
        "nvidia.gpu.tensor.activity",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_dram_active_ratio",
        "nvidia.gpu.dram.activity",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_pipe_active_ratio",
        "nvidia.gpu.pipe.activity",
        Gauge,
        "1",
        &[text("pipe", "nvidia.gpu.pipe.name")],
    ),
    own(
        "nvidia_gpu_sm_occupancy_seconds_total",
        "nvidia.gpu.sm.occupancy_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_tensor_active_seconds_total",
        "nvidia.gpu.tensor.active_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_dram_active_seconds_total",
        "nvidia.gpu.dram.active_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_pcie_gpm_transmit_bytes_per_second",
        "nvidia.gpu.pcie.gpm.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "transmit")])
    .described(PCIE_GPM),
    own(
        "nvidia_gpu_pcie_gpm_receive_bytes_per_second",
        "nvidia.gpu.pcie.gpm.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "receive")])
    .described(PCIE_GPM),
    own(
        "nvidia_gpu_nvlink_gpm_transmit_bytes_per_second",
        "nvidia.gpu.nvlink.gpm.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "transmit")])
    .described(NVLINK_GPM),
    own(
        "nvidia_gpu_nvlink_gpm_receive_bytes_per_second",
        "nvidia.gpu.nvlink.gpm.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "receive")])
    .described(NVLINK_GPM),
    own(
        "nvidia_gpu_media_engine_active_ratio",
        "nvidia.gpu.media_engine.activity",
        Gauge,
        "1",
        &[text("engine", "nvidia.gpu.media_engine.name")],
    ),
    own(
        "nvidia_gpu_memory_total_bytes",
        "hw.gpu.memory.limit",
        UpDownCounter,
        "By",
        &[],
    )
    .semconv("Size of the GPU memory."),
    own(
        "nvidia_gpu_memory_used_bytes",
        "hw.gpu.memory.usage",
        UpDownCounter,
        "By",
        &[],
    )
    .semconv("GPU memory used."),
    own(
        "nvidia_gpu_memory_free_bytes",
        "nvidia.gpu.memory.free",
        UpDownCounter,
        "By",
        &[],
    ),
    own(
        "nvidia_gpu_memory_reserved_bytes",
        "nvidia.gpu.memory.reserved",
        UpDownCounter,
        "By",
        &[],
    ),
    own(
        "nvidia_gpu_bar1_memory_total_bytes",
        "nvidia.gpu.bar1.limit",
        UpDownCounter,
        "By",
        &[],
    ),
    own(
        "nvidia_gpu_bar1_memory_used_bytes",
        "nvidia.gpu.bar1.usage",
        UpDownCounter,
        "By",
        &[],
    ),
    own("nvidia_gpu_power_watts", "hw.power", Gauge, "W", &[])
        .semconv("Instantaneous power consumed by the component."),
    own(
        "nvidia_gpu_power_limit_watts",
        "nvidia.gpu.power.limit",
        Gauge,
        "W",
        &[],
    ),
    own(
        "nvidia_gpu_power_management_limit_watts",
        "nvidia.gpu.power.management_limit",
        Gauge,
        "W",
        &[],
    ),
    own(
        "nvidia_gpu_energy_joules_total",
        "hw.energy",
        Counter,
        "J",
        &[],
    )
    .semconv("Energy consumed by the component."),
    own(
        "nvidia_gpu_temperature_celsius",
        "hw.temperature",
        Gauge,
        "Cel",
        &[],
    )
    .fixed(&[("hw.sensor_location", "gpu")])
    .semconv(TEMPERATURE),
    own(
        "nvidia_gpu_memory_temperature_celsius",
        "hw.temperature",
        Gauge,
        "Cel",
        &[],
    )
    .fixed(&[("hw.sensor_location", "memory")])
    .semconv(TEMPERATURE),
    own(
        "nvidia_gpu_thermal_slowdown_active",
        "nvidia.gpu.thermal_slowdown",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_temperature_threshold_celsius",
        "nvidia.gpu.temperature.threshold",
        Gauge,
        "Cel",
        &[text("threshold", "nvidia.gpu.temperature.threshold_type")],
    ),
    own(
        "nvidia_gpu_fan_speed_ratio",
        "nvidia.gpu.fan.speed",
        Gauge,
        "1",
        &[int("fan", "nvidia.gpu.fan.index")],
    ),
    own(
        "nvidia_gpu_clock_hertz",
        "nvidia.gpu.clock.frequency",
        Gauge,
        "Hz",
        &[text("clock", "nvidia.gpu.clock.domain")],
    ),
    own(
        "nvidia_gpu_max_clock_hertz",
        "nvidia.gpu.clock.max_frequency",
        Gauge,
        "Hz",
        &[text("clock", "nvidia.gpu.clock.domain")],
    ),
    own(
        "nvidia_gpu_performance_state",
        "nvidia.gpu.performance_state",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_clock_event_active",
        "nvidia.gpu.clock_event.active",
        Gauge,
        "1",
        &[text("reason", "nvidia.gpu.clock_event.reason")],
    ),
    own(
        "nvidia_gpu_throttle_seconds_total",
        "nvidia.gpu.throttle.time",
        Counter,
        "s",
        &[text("reason", "nvidia.gpu.throttle.reason")],
    ),
    own(
        "nvidia_gpu_pcie_transmit_bytes_per_second",
        "nvidia.gpu.pcie.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "transmit")])
    .described(PCIE),
    own(
        "nvidia_gpu_pcie_receive_bytes_per_second",
        "nvidia.gpu.pcie.throughput",
        Gauge,
        "By/s",
        &[],
    )
    .fixed(&[("network.io.direction", "receive")])
    .described(PCIE),
    own(
        "nvidia_gpu_pcie_replay_errors_total",
        "nvidia.gpu.pcie.replays",
        Counter,
        "{replay}",
        &[],
    ),
    own(
        "nvidia_gpu_pcie_link_generation",
        "nvidia.gpu.pcie.link.generation",
        Gauge,
        "1",
        &[text("link", "nvidia.gpu.pcie.link.kind")],
    ),
    own(
        "nvidia_gpu_pcie_link_width",
        "nvidia.gpu.pcie.link.width",
        Gauge,
        "{lane}",
        &[text("link", "nvidia.gpu.pcie.link.kind")],
    ),
    own(
        "nvidia_gpu_ecc_errors_total",
        "hw.errors",
        Counter,
        "{error}",
        &[text("error_type", "error.type")],
    )
    .semconv(ECC),
    own(
        "nvidia_gpu_ecc_lifetime_errors",
        "nvidia.gpu.ecc.lifetime_errors",
        Gauge,
        "{error}",
        &[text("error_type", "error.type")],
    ),
    own(
        "nvidia_gpu_remapped_rows",
        "nvidia.gpu.memory.remapped_rows",
        Gauge,
        "{row}",
        &[text("error_type", "error.type")],
    ),
    own(
        "nvidia_gpu_row_remap_pending",
        "nvidia.gpu.memory.row_remap.pending",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_row_remap_failed",
        "nvidia.gpu.memory.row_remap.failed",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_retired_pages",
        "nvidia.gpu.memory.retired_pages",
        Gauge,
        "{page}",
        &[text("cause", "nvidia.gpu.page_retirement.cause")],
    ),
    Row {
        family: "nvidia_gpu_health_state",
        push: Push::Metric(Metric {
            name: "hw.status",
            instrument: UpDownCounter,
            unit: "1",
            fixed: &[],
            attributes: &[],
            description: Some(
                "Operational status: 1 (true) or 0 (false) for each of the possible states (hw.state): the GPU's health verdict, ok, degraded or failed.",
            ),
            semconv: true,
            states: true,
        }),
    },
    own(
        "nvidia_gpu_health_reason",
        "nvidia.gpu.health.reasons",
        Gauge,
        "1",
        &[
            text("reason", "nvidia.gpu.health.reason"),
            text("action", "nvidia.gpu.health.action"),
        ],
    ),
    own(
        "nvidia_gpu_xid_errors_total",
        "nvidia.gpu.xid.errors",
        Counter,
        "{event}",
        &[int("xid", "nvidia.gpu.xid.code")],
    ),
    own(
        "nvidia_gpu_last_xid_timestamp_seconds",
        "nvidia.gpu.xid.last_timestamp",
        Gauge,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_nvlink_links_up",
        "nvidia.gpu.nvlink.links_up",
        Gauge,
        "{link}",
        &[],
    ),
    own(
        "nvidia_gpu_nvlink_links_transmit_bytes_total",
        "hw.gpu.io",
        Counter,
        "By",
        &[],
    )
    .fixed(&[
        ("network.io.direction", "transmit"),
        ("nvidia.gpu.interconnect", "nvlink"),
    ])
    .semconv(GPU_IO),
    own(
        "nvidia_gpu_nvlink_links_receive_bytes_total",
        "hw.gpu.io",
        Counter,
        "By",
        &[],
    )
    .fixed(&[
        ("network.io.direction", "receive"),
        ("nvidia.gpu.interconnect", "nvlink"),
    ])
    .semconv(GPU_IO),
    own(
        "nvidia_gpu_nvlink_links_errors_total",
        "nvidia.gpu.nvlink.errors",
        Counter,
        "{error}",
        &[text("error_type", "error.type")],
    ),
    own(
        "nvidia_gpu_nvlink_up",
        "nvidia.gpu.nvlink.link.up",
        Gauge,
        "1",
        &[int("link", "nvidia.gpu.nvlink.index")],
    ),
    own(
        "nvidia_gpu_nvlink_transmit_bytes_total",
        "nvidia.gpu.nvlink.link.io",
        Counter,
        "By",
        &[int("link", "nvidia.gpu.nvlink.index")],
    )
    .fixed(&[("network.io.direction", "transmit")])
    .described(NVLINK_LINK_IO),
    own(
        "nvidia_gpu_nvlink_receive_bytes_total",
        "nvidia.gpu.nvlink.link.io",
        Counter,
        "By",
        &[int("link", "nvidia.gpu.nvlink.index")],
    )
    .fixed(&[("network.io.direction", "receive")])
    .described(NVLINK_LINK_IO),
    own(
        "nvidia_gpu_nvlink_errors_total",
        "nvidia.gpu.nvlink.link.errors",
        Counter,
        "{error}",
        &[
            int("link", "nvidia.gpu.nvlink.index"),
            text("error_type", "error.type"),
        ],
    ),
    own(
        "nvidia_gpu_fabric_state",
        "nvidia.gpu.fabric.state",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_fabric_info",
        "nvidia.gpu.fabric.info",
        Gauge,
        "1",
        &[
            text("clique_id", "nvidia.gpu.fabric.clique_id"),
            text("cluster_uuid", "nvidia.gpu.fabric.cluster_uuid"),
            text("status", "nvidia.gpu.fabric.status"),
            text("configuration", "nvidia.gpu.fabric.configuration"),
        ],
    ),
    own(
        "nvidia_gpu_fabric_condition",
        "nvidia.gpu.fabric.condition",
        Gauge,
        "1",
        &[text("condition", "nvidia.gpu.fabric.health_condition")],
    ),
    own(
        "nvidia_gpu_fabric_health",
        "nvidia.gpu.fabric.health_summary",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_mig_mode",
        "nvidia.gpu.mig.mode",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_mig_instance_info",
        "nvidia.gpu.mig.device.info",
        Gauge,
        "1",
        &[
            text("mig_uuid", "nvidia.gpu.mig.uuid"),
            int("compute_instance", "nvidia.gpu.mig.compute_instance"),
        ],
    ),
    own(
        "nvidia_gpu_process_memory_used_bytes",
        "nvidia.gpu.process.memory.usage",
        UpDownCounter,
        "By",
        &[
            int("pid", "process.pid"),
            text("process_name", "process.executable.name"),
        ],
    ),
    own(
        "nvidia_gpu_process_sm_utilization_ratio",
        "nvidia.gpu.process.sm.utilization",
        Gauge,
        "1",
        &[
            int("pid", "process.pid"),
            text("process_name", "process.executable.name"),
        ],
    ),
    own(
        "nvidia_gpu_pod_memory_used_bytes",
        "nvidia.gpu.pod.memory.usage",
        UpDownCounter,
        "By",
        &[],
    ),
    own(
        "nvidia_gpu_pod_sm_utilization_ratio",
        "nvidia.gpu.pod.sm.utilization",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvidia_gpu_memory_outside_allocation_bytes",
        "nvidia.gpu.memory.outside_allocation",
        UpDownCounter,
        "By",
        &[],
    ),
    own(
        "nvidia_gpu_pod_gpu_seconds_total",
        "nvidia.gpu.pod.gpu_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_pod_idle_gpu_seconds_total",
        "nvidia.gpu.pod.idle_gpu_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_pod_sm_active_gpu_seconds_total",
        "nvidia.gpu.pod.sm_active_gpu_time",
        Counter,
        "s",
        &[],
    ),
    own(
        "nvidia_gpu_job_info",
        "nvidia.gpu.job.info",
        Gauge,
        "1",
        &[text("hpc_job", "nvidia.gpu.job.id")],
    ),
    own(
        "nvidia_node_gpus_missing",
        "nvidia.node.gpus.missing",
        Gauge,
        "{gpu}",
        &[],
    ),
    own(
        "nvidia_node_missing_gpu_info",
        "nvidia.node.missing_gpu.info",
        Gauge,
        "1",
        &[
            text("pci_bus_id", "nvidia.gpu.pci_bus_id"),
            text("device_id", "nvidia.gpu.pci.device_id"),
            text("driver", "nvidia.gpu.pci.driver"),
        ],
    ),
    not(
        "nvml_exporter_build_info",
        "The resource's service.version says the version.",
    ),
    own(
        "nvml_exporter_nvml_up",
        "nvml_exporter.nvml.up",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvml_exporter_gpus",
        "nvml_exporter.gpus",
        Gauge,
        "{gpu}",
        &[],
    ),
    not("nvml_exporter_sample_duration_seconds", REGISTRY),
    own(
        "nvml_exporter_last_sample_timestamp_seconds",
        "nvml_exporter.last_sample.timestamp",
        Gauge,
        "s",
        &[],
    ),
    own(
        "nvml_exporter_nvml_errors_total",
        "nvml_exporter.nvml.errors",
        Counter,
        "{error}",
        &[
            text("function", "nvml_exporter.nvml.function"),
            text("error", "error.type"),
        ],
    ),
    own(
        "nvml_exporter_kubernetes_up",
        "nvml_exporter.kubernetes.up",
        Gauge,
        "1",
        &[],
    ),
    own(
        "nvml_exporter_kubernetes_errors_total",
        "nvml_exporter.kubernetes.errors",
        Counter,
        "{error}",
        &[text("reason", "error.type")],
    ),
    own(
        "nvml_exporter_health_state_errors_total",
        "nvml_exporter.health_state.errors",
        Counter,
        "{error}",
        &[text("operation", "nvml_exporter.health_state.operation")],
    ),
    own(
        "nvml_exporter_jobs_errors_total",
        "nvml_exporter.jobs.errors",
        Counter,
        "{error}",
        &[text("reason", "error.type")],
    ),
    not("nvml_exporter_series", REGISTRY),
    not("nvml_exporter_series_dropped_total", REGISTRY),
    not("nvml_exporter_exposition_bytes", REGISTRY),
    not("nvml_exporter_scrapes_total", REGISTRY),
    not("nvml_exporter_http_connections", REGISTRY),
    not("nvml_exporter_http_connections_closed_total", REGISTRY),
    not("nvml_exporter_config_last_reload_successful", REGISTRY),
    not(
        "nvml_exporter_config_last_reload_success_timestamp_seconds",
        REGISTRY,
    ),
    not("nvml_exporter_otlp_exports_total", REGISTRY),
    not("nvml_exporter_otlp_points_total", REGISTRY),
    not("nvml_exporter_otlp_request_bytes_total", REGISTRY),
    not("nvml_exporter_otlp_queue_batches", REGISTRY),
    not(
        "nvml_exporter_otlp_last_success_timestamp_seconds",
        REGISTRY,
    ),
];

/// The row of family `name`.
pub fn row(name: &str) -> Option<&'static Row> {
    MAPPING.iter().find(|r| r.family == name)
}

/// Whether `label` is one the writers add to a family's own: a MIG or a pod label.
pub fn is_context_label(label: &str) -> bool {
    MIG_LABELS.contains(&label) || POD_LABELS.contains(&label)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::metrics::catalog::{CATALOG, MetricKind, Source};

    #[test]
    fn every_family_of_the_catalog_has_one_row_in_catalog_order() {
        let families: Vec<&str> = CATALOG.iter().map(|d| d.name).collect();
        let rows: Vec<&str> = MAPPING.iter().map(|r| r.family).collect();
        assert_eq!(
            rows, families,
            "src/otlp/mapping.rs: MAPPING must list every catalog family once, in catalog order"
        );
    }

    #[test]
    fn every_served_family_read_from_a_snapshot_is_pushed() {
        for def in CATALOG {
            let pushed = matches!(row(def.name).unwrap().push, Push::Metric(_));
            let from_snapshot = !matches!(def.source, Source::Registry);
            // build_info is the one family read from the snapshot that the resource replaces.
            if def.name != "nvml_exporter_build_info" {
                assert_eq!(pushed, from_snapshot, "{}", def.name);
            }
        }
    }

    #[test]
    fn every_label_of_a_pushed_family_has_an_attribute() {
        for def in CATALOG {
            let Push::Metric(m) = row(def.name).unwrap().push else {
                continue;
            };
            let own: Vec<&str> = def
                .labels
                .iter()
                .copied()
                .filter(|l| !is_context_label(l))
                .collect();
            let mapped: Vec<&str> = m.attributes.iter().map(|a| a.label).collect();
            assert_eq!(
                mapped, own,
                "{}: its labels and the row's attributes",
                def.name
            );
        }
    }

    #[test]
    fn counters_stay_counters_and_names_are_otel_style() {
        for def in CATALOG {
            let Push::Metric(m) = row(def.name).unwrap().push else {
                continue;
            };
            assert_eq!(
                m.instrument == Counter,
                def.kind == MetricKind::Counter,
                "{}: a Prometheus counter is pushed as a monotonic sum, nothing else is",
                def.name
            );
            assert!(
                m.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._".contains(c)),
                "{}",
                m.name
            );
            assert!(
                !m.name.ends_with("_total") && !m.name.ends_with("_seconds"),
                "{}: the unit goes in the unit field",
                m.name
            );
            assert!(
                !m.unit.is_empty(),
                "{}: a UCUM unit, 1 when dimensionless",
                m.name
            );
        }
    }

    #[test]
    fn families_pushed_under_one_name_agree_and_are_told_apart() {
        let mut by_name: BTreeMap<&str, Vec<(&str, Metric)>> = BTreeMap::new();
        for r in MAPPING {
            if let Push::Metric(m) = r.push {
                by_name.entry(m.name).or_default().push((r.family, m));
            }
        }
        for (name, rows) in &by_name {
            let (_, first) = rows[0];
            let mut fixed = BTreeSet::new();
            for (family, m) in rows {
                assert_eq!(
                    (m.instrument, m.unit, m.description, m.semconv),
                    (
                        first.instrument,
                        first.unit,
                        first.description,
                        first.semconv
                    ),
                    "{family} and the other families pushed as {name}"
                );
                if rows.len() > 1 {
                    assert!(
                        m.description.is_some(),
                        "{family}: {name} needs a description"
                    );
                    assert!(
                        fixed.insert(m.fixed),
                        "{family}: {name} cannot tell it apart"
                    );
                }
            }
        }
    }

    #[test]
    fn a_metric_name_is_no_namespace_of_another_or_of_an_attribute() {
        let mut names: BTreeSet<&str> = BTreeSet::new();
        for r in MAPPING {
            if let Push::Metric(m) = r.push {
                names.insert(m.name);
                names.extend(m.attributes.iter().map(|a| a.key));
                names.extend(m.fixed.iter().map(|(k, _)| *k));
            }
        }
        for name in &names {
            let prefix = format!("{name}.");
            if let Some(under) = names.iter().find(|n| n.starts_with(&prefix)) {
                panic!("{name} is both a name and the namespace of {under}");
            }
        }
    }
}

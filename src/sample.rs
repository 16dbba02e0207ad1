//! Plain data produced by one sampling tick, in base units (bytes, seconds, joules, watts, hertz,
//! celsius, ratios in 0..1).
//!
//! This is the only interface between the sampler (which talks to NVML) and the metrics encoder
//! (which talks Prometheus). Nothing here knows about either: a field is `None` (or an empty
//! `Vec`) when the device does not support the reading or the call failed this tick, and the
//! encoder omits the series — it never invents a zero.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything the exporter knows after one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// NVML initialised and answering (`nvml_exporter_nvml_up`).
    pub nvml_up: bool,
    /// Why NVML is not up (for `/readyz` and the node page); `None` when it is.
    pub nvml_error: Option<String>,
    /// System-wide versions, empty when unknown.
    pub system: SystemInfo,
    /// One entry per device discovered at (re)initialisation, in NVML index order. A device that
    /// is lost or missed its deadline stays here with `up == false` / `stale == true`. Shared:
    /// the sampler keeps each device's last reading to serve it again, stale, when the next
    /// tick misses it.
    pub devices: Vec<Arc<DeviceSample>>,
    /// Cumulative count of failed NVML calls by (function, error name); NOT_SUPPORTED never counts.
    pub nvml_errors: BTreeMap<(String, String), u64>,
    /// Wall time of the tick that produced this snapshot, in seconds.
    pub tick_duration_seconds: Option<f64>,
    /// End of the last complete tick, seconds since the Unix epoch.
    pub last_tick_timestamp_seconds: Option<f64>,
    /// What the kubelet said last (`--kubernetes`); `None` when attribution is off. Not read from
    /// NVML: attached to the snapshot when it is published.
    pub kubernetes: Option<KubernetesState>,
    /// The HPC job mapping files (`--hpc-job-mapping-dir`), read when the snapshot is
    /// published; `None` when off.
    pub jobs: Option<JobsState>,
    /// GPU-seconds per container and GPU (or MIG instance) the kubelet assigned it, split from
    /// the devices' busy time when a tick is published (`--kubernetes`); `None` when off.
    pub workloads: Option<Arc<[WorkloadSeconds]>>,
    /// Failures of the file the held health verdicts are kept in (`--health-state-file`);
    /// `None` without one.
    pub health_state: Option<HealthStateErrors>,
    /// The GPUs the PCI bus lists that NVML does not enumerate (`--host-sys`, the `inventory`
    /// group), by address; `None` when the group is off or it cannot be told (the bus
    /// unreadable, NVML not answering, a GPU whose bus id NVML did not give): unknown, never
    /// "none missing".
    pub missing_gpus: Option<Vec<PciGpu>>,
    /// The node's own verdict: the reasons no GPU's UUID can carry (a GPU the driver lost).
    /// `None` while the `health` group is off or the node cannot be judged.
    pub node_health: Option<Health>,
}

/// Failed reads and writes of the held-verdict file since start
/// (`nvml_exporter_health_state_errors_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthStateErrors {
    /// The file could not be read or parsed at start: the verdicts it held are lost.
    pub read: u64,
    /// Writes that failed: the verdicts held now would not survive a restart.
    pub write: u64,
}

/// An NVIDIA GPU on the PCI bus, as sysfs lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciGpu {
    /// Domain:bus:device.function as sysfs writes it, e.g. "0000:1b:00.0".
    pub address: String,
    /// The PCI device id, e.g. "0x2330".
    pub device_id: String,
    /// The kernel driver bound to it (`nvidia`); empty when none is.
    pub driver: String,
}

/// What one container used of one GPU or MIG GPU instance it holds, in GPU-seconds (a MIG
/// instance counts as its fraction of the GPU; a GPU several containers hold is split between
/// them), since the exporter first saw it hold the device.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSeconds {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The MIG GPU instance; `None` for a whole GPU.
    pub gpu_instance: Option<u32>,
    /// The container.
    pub container: ContainerRef,
    /// GPU-seconds held.
    pub held: f64,
    /// GPU-seconds held while the device was idle.
    pub idle: f64,
    /// SM-active GPU-seconds; `None` without GPM.
    pub sm_active: Option<f64>,
}

/// The HPC jobs on each GPU, as the mapping directory said at the last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobsState {
    /// One entry per (GPU or GPU instance, job ID) of every well-formed file naming a GPU of
    /// this snapshot, sorted and without duplicates.
    pub jobs: Arc<[JobAssignment]>,
    /// Mapping files (or reads of the directory) left out since start, by reason; every
    /// reason is present (from 0).
    pub errors: BTreeMap<JobsError, u64>,
}

/// One job on one GPU or MIG GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobAssignment {
    /// The GPU's NVML index (the `gpu` label).
    pub gpu: u32,
    /// The GPU instance (`gpu_instance` label) for a file named `<gpu>.<gpu_instance>`.
    pub gpu_instance: Option<u32>,
    /// The job ID, as the file wrote it.
    pub job: String,
}

/// The kubelet side of pod attribution, as of the last `List` call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesState {
    /// The last `List` call succeeded (`nvml_exporter_kubernetes_up`).
    pub up: bool,
    /// Failed `List` calls since start, by reason; every reason is present (from 0).
    pub errors: BTreeMap<KubeletError, u64>,
    /// GPU assignments from the last successful `List`, sorted and without duplicates. Kept while
    /// the kubelet is unreachable (`up == false`): running containers keep their GPUs across a
    /// kubelet restart. Shared, because every published snapshot carries it.
    pub assignments: Arc<[PodAssignment]>,
    /// The pods the kubelet runs on this node (its `/pods` list), sorted by UID: how a process's
    /// cgroup (pod UID, container ID) is named. Empty unless per-process attribution asks the
    /// kubelet for it (`--processes` with `--kubernetes`); kept while the kubelet is unreachable.
    pub pods: Arc<[PodIdentity]>,
    /// What `nvidia_gpu_pod_info` adds for a pod, by (namespace, name), from the kubelet's pod
    /// list: its controller and the labels and annotations copied. Only pods with something to
    /// add; empty unless the pod list is fetched; kept while the kubelet is unreachable.
    pub pod_meta: Arc<BTreeMap<(String, String), PodMeta>>,
}

/// What the pod list says of a pod besides its containers, served on `nvidia_gpu_pod_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    /// The kind and name of its controller (the owner reference marked `controller`), a
    /// ReplicaSet named by its Deployment where the `pod-template-hash` label shows it.
    pub controller: Option<(String, String)>,
    /// (Prometheus label name, value) of each label and annotation copied, in option order.
    pub labels: Vec<(String, String)>,
}

impl KubernetesState {
    /// Not yet asked: down, no assignments, every error reason at 0.
    pub fn new() -> KubernetesState {
        KubernetesState {
            up: false,
            errors: KubeletError::ALL.iter().map(|r| (*r, 0)).collect(),
            assignments: Arc::from([]),
            pods: Arc::from([]),
            pod_meta: Arc::default(),
        }
    }
}

/// One device the kubelet assigned to one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodAssignment {
    /// The container the device is assigned to.
    pub container: ContainerRef,
    /// The device, as the device plugin named it (or as the DRA driver's ResourceSlice
    /// resolves the claimed device).
    pub device: DeviceRef,
    /// The resource claim that allocated the device (DRA); empty for a device plugin's device.
    pub claim: String,
}

/// A container of a pod: the `namespace`, `pod` and `container` label values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name in the pod spec.
    pub container: String,
}

/// A pod running on this node, as the kubelet's pod list names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodIdentity {
    /// `metadata.uid`, e.g. "6f5e…-…" (the form in cgroup paths, with `-` or `_`, is normalised
    /// to this one by whoever compares).
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub pod: String,
    /// Its containers with their runtime IDs, sorted by ID.
    pub containers: Vec<ContainerIdentity>,
}

/// A container of a [`PodIdentity`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerIdentity {
    /// Runtime container ID without the scheme: "containerd://abc…" → "abc…" (64 hex digits for
    /// containerd, CRI-O and Docker).
    pub id: String,
    /// The container's name in the pod spec (the `container` label value).
    pub name: String,
}

/// How a device plugin names a device in the kubelet's pod-resources answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceRef {
    /// A GPU UUID, "GPU-…" (the NVIDIA device plugin).
    GpuUuid(String),
    /// A device minor number: "nvidia3" is /dev/nvidia3 (GKE's device plugin).
    Minor(u32),
    /// A MIG device UUID, "MIG-…" (the NVIDIA device plugin's MIG strategies): the GPU instance
    /// holding the compute instance with that UUID.
    MigUuid(String),
    /// A GPU instance named by the GPU's device minor number and the instance's GI id:
    /// "nvidia0/gi3" (GKE's device plugin with MIG partitions).
    MinorGpuInstance {
        /// The GPU's device minor number.
        minor: u32,
        /// The GPU instance id.
        gpu_instance: u32,
    },
    /// A MIG device NVIDIA's DRA driver creates when it is allocated, named by its parent GPU's
    /// UUID, its profile and the first memory slice of its placement: the GPU instance there.
    MigPlacement {
        /// The parent GPU's UUID, "GPU-…".
        parent_uuid: String,
        /// The profile, e.g. "1g.10gb".
        profile: String,
        /// The first memory slice of the instance's placement.
        placement_start: u32,
    },
    /// An ID of a known resource in no format above; never matches a GPU.
    Other(String),
}

/// System-wide facts (`nvmlSystemGet*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemInfo {
    /// Driver version, e.g. "550.54.15".
    pub driver_version: String,
    /// NVML library version, e.g. "12.550.54.15".
    pub nvml_version: String,
    /// CUDA driver API version as "major.minor", e.g. "12.4".
    pub cuda_driver_version: String,
}

/// One device's readings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSample {
    /// NVML index ("gpu" label).
    pub index: u32,
    /// "GPU-…" ("uuid" label).
    pub uuid: String,
    /// Static identity, read at discovery; shared, not copied, by every sample of the device.
    pub info: Arc<DeviceInfo>,
    /// The last tick read the device (`nvidia_gpu_up`). False when the device is lost, or has been
    /// stale (missed its deadline, or failed every call) for longer than the grace period.
    pub up: bool,
    /// The values below are from an earlier tick: the device missed this tick's deadline.
    pub stale: bool,
    /// What NVML answered when it called the device lost (then `up` is false and the readings
    /// are empty); `None` otherwise.
    pub lost: Option<Lost>,

    /// `nvmlDeviceGetUtilizationRates.gpu`: share of time any kernel ran.
    pub utilization: Option<f64>,
    /// `nvmlDeviceGetUtilizationRates.memory`: share of time device memory was read or written.
    pub memory_utilization: Option<f64>,
    /// Share of time the video encoder was busy.
    pub encoder_utilization: Option<f64>,
    /// Share of time the video decoder was busy.
    pub decoder_utilization: Option<f64>,

    /// Device memory (framebuffer).
    pub memory: Option<MemoryInfo>,
    /// The BAR1 aperture through which the host maps device memory.
    pub bar1_memory: Option<Bar1MemoryInfo>,

    /// Power draw.
    pub power_watts: Option<f64>,
    /// The power limit the driver enforces after all limiters (`nvmlDeviceGetEnforcedPowerLimit`).
    pub power_limit_watts: Option<f64>,
    /// The power management limit set for the board (`nvmlDeviceGetPowerManagementLimit`): the
    /// requested limit, above the enforced one when another limiter caps the board.
    pub power_management_limit_watts: Option<f64>,
    /// Energy since the driver was loaded.
    pub energy_joules: Option<f64>,

    /// GPU core temperature.
    pub temperature_celsius: Option<f64>,
    /// HBM temperature (field value `NVML_FI_DEV_MEMORY_TEMP`).
    pub memory_temperature_celsius: Option<f64>,
    /// Temperatures at which the GPU slows down or shuts down, and the operating maxima.
    pub temperature_thresholds: Vec<(TemperatureThreshold, f64)>,
    /// (fan index, speed as a ratio of its maximum).
    pub fan_speeds: Vec<(u32, f64)>,

    /// Current clock of each domain.
    pub clocks_hertz: Vec<(ClockDomain, f64)>,
    /// Maximum clock of each domain.
    pub max_clocks_hertz: Vec<(ClockDomain, f64)>,
    /// P-state 0..15 (0 = maximum performance).
    pub performance_state: Option<u32>,
    /// Every known clock-event (throttle) reason and whether it is active now; empty when unsupported.
    pub clock_events: Vec<(ClockEventReason, bool)>,
    /// Cumulative time clocks were held down, by violation policy.
    pub throttle_seconds: Vec<(ThrottleReason, f64)>,

    /// PCIe throughput, replays and link state.
    pub pcie: PcieSample,

    /// Volatile (since driver load) ECC counts.
    pub ecc_volatile: Option<EccCounts>,
    /// Aggregate (lifetime) ECC counts.
    pub ecc_aggregate: Option<EccCounts>,
    /// Ampere and newer.
    pub remapped_rows: Option<RemappedRows>,
    /// Before Ampere.
    pub retired_pages: Option<RetiredPages>,
    /// The driver's unrepairable-memory flag (`nvmlDeviceGetUnrepairableMemoryFlag_v1`, R590 and
    /// newer): memory errors the GPU can no longer repair by remapping.
    pub unrepairable_memory: Option<bool>,
    /// The SRAM uncorrectable error threshold of NVIDIA's field diagnostic is exceeded
    /// (`nvmlDeviceGetSramEccErrorStatus`, `bThresholdExceeded`; root only).
    pub sram_threshold_exceeded: Option<bool>,
    /// The recovery action the driver asks for (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, R565 and
    /// newer): the raw `nvmlDeviceGpuRecoveryAction_t` value, 0 for none. `None` where the
    /// driver does not give it.
    pub recovery_action: Option<u64>,

    /// Cumulative XID events seen by this exporter, by XID code.
    pub xid_counts: BTreeMap<u64, u64>,
    /// When the last XID event arrived, seconds since the Unix epoch.
    pub last_xid_timestamp_seconds: Option<f64>,
    /// The code of the last XID event seen (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: Option<u64>,
    /// Whether the device's XID events are watched (registered with the event thread): only
    /// then does the absence of `last_xid` mean that none has happened.
    pub xids_watched: bool,

    /// Each NVLink link, by link number.
    pub nvlinks: Vec<NvLinkSample>,
    /// Current MIG mode (true = enabled); `None` on devices without MIG.
    pub mig_mode: Option<bool>,
    /// The GPU's place in the NVLink fabric of an NVSwitch system; `None` where it is on none
    /// (NVML answers NOT_SUPPORTED, or a state of NOT_SUPPORTED).
    pub fabric: Option<FabricSample>,

    /// Whether the device supports NVML GPM (Hopper and newer); `None` when NVML could not say.
    pub gpm_supported: Option<bool>,
    /// Saturation averages over the last sampling interval, from two consecutive GPM samples;
    /// `None` on the first tick after (re)start, and on devices without GPM.
    pub gpm: Option<GpmMetrics>,

    /// Compute and graphics processes on the device (read only with `--processes`).
    pub processes: Vec<ProcessSample>,

    /// The GPU instances of a GPU in MIG mode, by GI id; empty when MIG is off or unsupported.
    /// Enumerated every tick, so a reconfiguration shows at the next tick.
    pub mig_instances: Vec<MigInstanceSample>,

    /// Busy time integrated by the sampler over this NVML session's readings (not read from
    /// NVML): the `_seconds_total` counters.
    pub busy: BusySeconds,

    /// The health verdict the sampler gave this reading (not read from NVML: see
    /// `crate::health`); `None` while the `health` group is off.
    pub health: Option<Health>,
}

/// A GPU's health verdict: the worst state of its active reasons, and each reason with the action
/// it asks for (`nvidia_gpu_health_state`, `nvidia_gpu_health_reason`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The worst state among `reasons`; healthy when there are none.
    pub state: HealthState,
    /// Every active reason, in rule-table order, each once.
    pub reasons: Vec<HealthReason>,
}

/// One active reason of a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthReason {
    /// Short and stable (`xid_79`, `nvlink_down`): the `reason` label.
    pub reason: &'static str,
    /// What the reason asks of an operator: the `action` label.
    pub action: HealthAction,
    /// The state the reason puts the GPU in.
    pub state: HealthState,
}

/// Busy time of a GPU or MIG GPU instance, integrated by the sampler: each reading times the
/// time since the previous reading, added up, never across a gap (a device unanswered, lost, or
/// read more than an interval and a deadline after its previous reading). Each field is `None`
/// until a reading had the value it integrates, and then only grows; it restarts at 0 with the
/// NVML session (a driver restart, a restart of the exporter).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BusySeconds {
    /// Seconds in which a kernel ran: ∫ [`DeviceSample::utilization`].
    pub utilization: Option<f64>,
    /// SM-seconds with a warp resident, as a share of the SMs: ∫ [`GpmMetrics::sm_active`].
    pub sm_active: Option<f64>,
    /// ∫ [`GpmMetrics::sm_occupancy`].
    pub sm_occupancy: Option<f64>,
    /// ∫ [`GpmMetrics::tensor_active`].
    pub tensor_active: Option<f64>,
    /// ∫ [`GpmMetrics::dram_active`].
    pub dram_active: Option<f64>,
    /// Seconds integrated over (the sum of the time each reading counted for); not served, but
    /// what the GPU-seconds per workload are split from.
    pub sampled: f64,
    /// Of those, seconds in which the reading's activity (SM activity where GPM gave it, else
    /// utilization) was below the idle threshold (`--idle-threshold`); a reading with neither is
    /// not idle. Not served.
    pub idle: f64,
}

/// One MIG GPU instance (GI) of a GPU, read through its MIG device handles. Memory and GPM belong
/// to the GI, so they are read once per GI however many compute instances it has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigInstanceSample {
    /// GPU instance id (`gpu_instance` label).
    pub gpu_instance: u32,
    /// Profile name without the "MIG " prefix, e.g. "1g.10gb" (`mig_profile` label); empty when
    /// NVML could not say.
    pub profile: String,
    /// The first memory slice of its placement (`nvmlGpuInstanceInfo_t.placement.start`);
    /// `None` when NVML could not say.
    pub placement_start: Option<u32>,
    /// The instance's own memory (total = the profile's size).
    pub memory: Option<MemoryInfo>,
    /// GPM averages of this GPU instance over the last interval (`nvmlGpmMigSampleGet`); `None`
    /// on the first tick of the instance, and on GPUs without GPM.
    pub gpm: Option<GpmMetrics>,
    /// Its compute instances (the MIG devices CUDA sees), by CI id.
    pub compute_instances: Vec<ComputeInstanceSample>,
    /// The instance's own busy time (from its GPM readings), integrated by the sampler.
    pub busy: BusySeconds,
    /// The share of the GPU it is: its compute slices over the GPU's (the largest profile of the
    /// board's table), e.g. 3/7 for a 3g.40gb of an H100; `None` when a profile name does not say.
    pub gpu_fraction: Option<f64>,
}

/// One MIG device: a compute instance of a GPU instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputeInstanceSample {
    /// Compute instance id within its GPU instance (`compute_instance` label).
    pub compute_instance: u32,
    /// "MIG-…": what `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` name it by (`mig_uuid` label).
    pub uuid: String,
}

/// Static identity of a device (`nvidia_gpu_info` labels). Empty strings when a value is unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Product name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Brand, e.g. "nvidia", "tesla".
    pub brand: String,
    /// Architecture, e.g. "hopper".
    pub architecture: String,
    /// Domain:bus:device.function, e.g. "00000000:18:00.0".
    pub pci_bus_id: String,
    /// Board serial number.
    pub serial: String,
    /// VBIOS version.
    pub vbios_version: String,
    /// "major.minor", e.g. "9.0".
    pub compute_capability: String,
    /// N of /dev/nvidiaN.
    pub minor_number: String,
}

/// Device memory (`nvmlDeviceGetMemoryInfo_v2`), or a MIG instance's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryInfo {
    /// Installed memory (a MIG instance: its profile's size).
    pub total_bytes: f64,
    /// Allocated by processes and the driver.
    pub used_bytes: f64,
    /// Not allocated.
    pub free_bytes: f64,
    /// Reserved by the driver and firmware (`nvmlMemory_v2_t.reserved`).
    pub reserved_bytes: f64,
}

/// The BAR1 aperture (`nvmlDeviceGetBAR1MemoryInfo`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bar1MemoryInfo {
    /// Size of the aperture.
    pub total_bytes: f64,
    /// Mapped now.
    pub used_bytes: f64,
}

/// ECC error counts of one counter type (volatile or aggregate).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EccCounts {
    /// Single-bit errors the ECC corrected.
    pub corrected: u64,
    /// Double-bit errors it could not correct.
    pub uncorrected: u64,
}

/// Row remapping (`nvmlDeviceGetRemappedRows`, Ampere and newer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemappedRows {
    /// Rows remapped after correctable errors.
    pub correctable: u64,
    /// Rows remapped after uncorrectable errors.
    pub uncorrectable: u64,
    /// A remapping takes effect at the next GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failed: bool,
}

/// Memory pages retired after ECC errors (`nvmlDeviceGetRetiredPages`, before Ampere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetiredPages {
    /// Retired after multiple single-bit errors.
    pub single_bit_ecc: u64,
    /// Retired after a double-bit error.
    pub double_bit_ecc: u64,
    /// A page waits for the next reboot or GPU reset to be retired
    /// (`nvmlDeviceGetRetiredPagesPendingStatus`); `None` when that call failed.
    pub pending: Option<bool>,
}

/// PCIe readings of a device.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PcieSample {
    /// GPU to host throughput over NVML's last sample window.
    pub transmit_bytes_per_second: Option<f64>,
    /// Host to GPU throughput over NVML's last sample window.
    pub receive_bytes_per_second: Option<f64>,
    /// Link-level replays (retransmissions) since the driver was loaded.
    pub replay_errors: Option<u64>,
    /// The generation the link runs at now.
    pub link_generation_current: Option<u32>,
    /// The highest generation the link supports.
    pub link_generation_max: Option<u32>,
    /// The lanes in use now.
    pub link_width_current: Option<u32>,
    /// The most lanes the link supports.
    pub link_width_max: Option<u32>,
}

/// One NVLink link of a device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvLinkSample {
    /// Link number.
    pub link: u32,
    /// The link is active; `None` when NVML did not say this tick (the call failed).
    pub up: Option<bool>,
    /// Data bytes sent since the counters were last reset.
    pub transmit_bytes: Option<u64>,
    /// Data bytes received since the counters were last reset.
    pub receive_bytes: Option<u64>,
    /// Error counters by type.
    pub errors: NvLinkErrors,
}

/// A link's error counters by [`NvLinkErrorType`], one slot per type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvLinkErrors([Option<u64>; 4]);

impl NvLinkErrors {
    /// Sets the counter of `kind`.
    pub fn set(&mut self, kind: NvLinkErrorType, count: u64) {
        self.0[kind as usize] = Some(count);
    }

    /// The counters that were read, in [`NvLinkErrorType::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (NvLinkErrorType, u64)> + '_ {
        NvLinkErrorType::ALL
            .iter()
            .zip(&self.0)
            .filter_map(|(kind, count)| count.map(|n| (*kind, n)))
    }
}

impl FromIterator<(NvLinkErrorType, u64)> for NvLinkErrors {
    /// Of a counter given twice, the first is kept.
    fn from_iter<I: IntoIterator<Item = (NvLinkErrorType, u64)>>(pairs: I) -> Self {
        let mut errors = NvLinkErrors::default();
        for (kind, count) in pairs {
            errors.0[kind as usize].get_or_insert(count);
        }
        errors
    }
}

/// GPM metrics (`nvmlGpmMetricsGet`) averaged over the interval between two samples. Each field
/// is `None` (or the pair absent) when NVML answered that metric with an error.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpmMetrics {
    /// Share of time the graphics/compute engine was active (GRAPHICS_UTIL).
    pub graphics_engine_active: Option<f64>,
    /// Average share of SMs that had at least one warp resident (SM_UTIL).
    pub sm_active: Option<f64>,
    /// Average resident warps as a share of the maximum (SM_OCCUPANCY).
    pub sm_occupancy: Option<f64>,
    /// Share of cycles any tensor pipe was active (ANY_TENSOR_UTIL).
    pub tensor_active: Option<f64>,
    /// Share of cycles the DRAM interface was busy (DRAM_BW_UTIL).
    pub dram_active: Option<f64>,
    /// Per-pipe activity ratios.
    pub pipes: Vec<(GpmPipe, f64)>,
    /// PCIe transmit rate, GPU to host (PCIE_TX_PER_SEC).
    pub pcie_transmit_bytes_per_second: Option<f64>,
    /// PCIe receive rate, host to GPU (PCIE_RX_PER_SEC).
    pub pcie_receive_bytes_per_second: Option<f64>,
    /// NVLink transmit rate over all links (NVLINK_TOTAL_TX_PER_SEC).
    pub nvlink_transmit_bytes_per_second: Option<f64>,
    /// NVLink receive rate over all links (NVLINK_TOTAL_RX_PER_SEC).
    pub nvlink_receive_bytes_per_second: Option<f64>,
    /// Per media engine (NVDEC, NVJPG, NVOFA instance) activity ratios.
    pub media_engines: Vec<(MediaEngine, f64)>,
}

/// One process on a GPU (`--processes`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSample {
    /// Host pid.
    pub pid: u32,
    /// Process name, from the host's procfs or NVML.
    pub name: String,
    /// Device memory it holds.
    pub used_memory_bytes: Option<f64>,
    /// Share of the last sampling interval it had a kernel on the SMs.
    pub sm_utilization: Option<f64>,
    /// The pod and container its cgroup names; `None` when `/proc/<pid>/cgroup` was unreadable.
    pub cgroup: Option<ProcessCgroup>,
    /// The MIG GPU instance it runs in (`gpuInstanceId`); `None` on a GPU with MIG off.
    pub gpu_instance: Option<u32>,
    /// The compute instance within that GPU instance (`computeInstanceId`); `None` with MIG off.
    pub compute_instance: Option<u32>,
}

/// Where a process runs, as its cgroup path says. Both `None` for a process outside containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessCgroup {
    /// Pod UID in the kubelet's spelling (`metadata.uid`: lowercase, `-` separated).
    pub pod_uid: Option<String>,
    /// Runtime container ID without the scheme: 64 lowercase hex digits.
    pub container_id: Option<String>,
}

/// Declares a closed set of label values: the enum, `ALL`, and `label()` (the Prometheus label
/// value), so that the values are written once.
macro_rules! label_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $label:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[allow(missing_docs, reason = "each variant is its label value, listed in the macro call")]
        pub enum $name { $($variant),+ }
        impl $name {
            /// Every value, in catalog order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The label value served for this variant.
            pub fn label(self) -> &'static str {
                match self { $($name::$variant => $label),+ }
            }
        }
    };
}

label_enum!(
    /// A GPU's health, from best to worst: `nvidia_gpu_health_state` serves its position (0, 1, 2).
    HealthState {
        Healthy => "healthy",
        Degraded => "degraded",
        Failed => "failed",
    }
);

#[allow(
    clippy::derivable_impls,
    reason = "label_enum! declares the variants and takes no #[default]"
)]
impl Default for HealthState {
    fn default() -> Self {
        HealthState::Healthy
    }
}

label_enum!(
    /// `action` label of `nvidia_gpu_health_reason`: what a reason asks of an operator, from the
    /// least to the most disruptive.
    HealthAction {
        None => "none",
        RestartWorkload => "restart_workload",
        DrainP2p => "drain_p2p",
        Investigate => "investigate",
        ResetGpu => "reset_gpu",
        RebootNode => "reboot_node",
        DrainAndService => "drain_and_service",
    }
);

/// What NVML answered when it called a device lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// NVML_ERROR_GPU_IS_LOST (or the device left the driver's list): fallen off the bus or
    /// otherwise inaccessible.
    OffTheBus,
    /// NVML_ERROR_RESET_REQUIRED: the GPU needs a reset before it can be used again.
    ResetRequired,
}

label_enum!(
    /// `threshold` label of `nvidia_gpu_temperature_threshold_celsius`.
    TemperatureThreshold {
        Slowdown => "slowdown",
        Shutdown => "shutdown",
        GpuMax => "gpu_max",
        MemoryMax => "memory_max",
    }
);

label_enum!(
    /// `clock` label of the clock metrics.
    ClockDomain {
        Graphics => "graphics",
        Sm => "sm",
        Memory => "memory",
        Video => "video",
    }
);

label_enum!(
    /// `reason` label of `nvidia_gpu_clock_event_active` (nvmlClocksEventReason* bits).
    ClockEventReason {
        GpuIdle => "gpu_idle",
        ApplicationsClocksSetting => "applications_clocks_setting",
        SwPowerCap => "sw_power_cap",
        HwSlowdown => "hw_slowdown",
        SyncBoost => "sync_boost",
        SwThermalSlowdown => "sw_thermal_slowdown",
        HwThermalSlowdown => "hw_thermal_slowdown",
        HwPowerBrakeSlowdown => "hw_power_brake_slowdown",
        DisplayClockSetting => "display_clock_setting",
    }
);

impl ClockEventReason {
    /// The bit of this reason in `nvmlDeviceGetCurrentClocksEventReasons`' mask (nvml.h).
    pub fn mask(self) -> u64 {
        match self {
            ClockEventReason::GpuIdle => 0x1,
            ClockEventReason::ApplicationsClocksSetting => 0x2,
            ClockEventReason::SwPowerCap => 0x4,
            ClockEventReason::HwSlowdown => 0x8,
            ClockEventReason::SyncBoost => 0x10,
            ClockEventReason::SwThermalSlowdown => 0x20,
            ClockEventReason::HwThermalSlowdown => 0x40,
            ClockEventReason::HwPowerBrakeSlowdown => 0x80,
            ClockEventReason::DisplayClockSetting => 0x100,
        }
    }
}

label_enum!(
    /// `reason` label of `nvidia_gpu_throttle_seconds_total` (nvmlPerfPolicyType_t).
    ThrottleReason {
        Power => "power",
        Thermal => "thermal",
        SyncBoost => "sync_boost",
        BoardLimit => "board_limit",
        LowUtilization => "low_utilization",
        Reliability => "reliability",
        AppClocks => "app_clocks",
        BaseClocks => "base_clocks",
    }
);

label_enum!(
    /// `error_type` label of `nvidia_gpu_nvlink_errors_total` (nvmlNvLinkErrorCounter_t).
    NvLinkErrorType {
        CrcFlit => "crc_flit",
        CrcData => "crc_data",
        Replay => "replay",
        Recovery => "recovery",
    }
);

label_enum!(
    /// `pipe` label of `nvidia_gpu_pipe_active_ratio` (GPM *_UTIL pipe metrics).
    GpmPipe {
        Fp64 => "fp64",
        Fp32 => "fp32",
        Fp16 => "fp16",
        Integer => "integer",
        DfmaTensor => "dfma_tensor",
        HmmaTensor => "hmma_tensor",
        ImmaTensor => "imma_tensor",
    }
);

label_enum!(
    /// `engine` label of `nvidia_gpu_media_engine_active_ratio` (GPM NVDEC/NVJPG/NVOFA metrics).
    MediaEngine {
        Nvdec0 => "nvdec0",
        Nvdec1 => "nvdec1",
        Nvdec2 => "nvdec2",
        Nvdec3 => "nvdec3",
        Nvdec4 => "nvdec4",
        Nvdec5 => "nvdec5",
        Nvdec6 => "nvdec6",
        Nvdec7 => "nvdec7",
        Nvjpg0 => "nvjpg0",
        Nvjpg1 => "nvjpg1",
        Nvjpg2 => "nvjpg2",
        Nvjpg3 => "nvjpg3",
        Nvjpg4 => "nvjpg4",
        Nvjpg5 => "nvjpg5",
        Nvjpg6 => "nvjpg6",
        Nvjpg7 => "nvjpg7",
        Nvofa0 => "nvofa0",
    }
);

label_enum!(
    /// `reason` label of `nvml_exporter_kubernetes_errors_total`: why a `List` call failed, or
    /// (`pods_*`, only with the pod list) why a `/pods` call did, or (`dra_*`, only with
    /// `--kubernetes-dra`) why the ResourceSlices were not read or a claimed device not resolved.
    KubeletError {
        Unavailable => "unavailable",
        Timeout => "timeout",
        Rpc => "rpc",
        PodsUnavailable => "pods_unavailable",
        PodsTimeout => "pods_timeout",
        PodsTls => "pods_tls",
        PodsAuth => "pods_auth",
        PodsHttp => "pods_http",
        PodsParse => "pods_parse",
        PodsTooLarge => "pods_too_large",
        DraSlices => "dra_slices",
        DraTooLarge => "dra_too_large",
        DraUnknownDevice => "dra_unknown_device",
        DraMalformed => "dra_malformed",
        NodeConditionForbidden => "node_condition_forbidden",
        NodeConditionConflict => "node_condition_conflict",
        NodeConditionHttp => "node_condition_http",
        NodeConditionTimeout => "node_condition_timeout",
        NodeConditionUnavailable => "node_condition_unavailable",
    }
);

label_enum!(
    /// `reason` label of `nvml_exporter_jobs_errors_total`: why the mapping directory, or one
    /// of its files, was not used.
    JobsError {
        Directory => "directory",
        Unreadable => "unreadable",
        Malformed => "malformed",
        UnknownGpu => "unknown_gpu",
        TooManyJobs => "too_many_jobs",
    }
);

/// A GPU's registration with the NVLink fabric and the fabric's health, as NVML reports them
/// (`nvmlDeviceGetGpuFabricInfoV`, or `nvmlDeviceGetGpuFabricInfo` on drivers without it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricSample {
    /// Where the registration with Fabric Manager stands.
    pub state: FabricState,
    /// How the registration ended, the NVML error name ("success" when it did not fail); `None`
    /// until it completed (`nvml.h`: the status is meaningful only then).
    pub status: Option<&'static str>,
    /// The fabric clique the GPU belongs to.
    pub clique_id: u32,
    /// The fabric cluster's UUID, 8-4-4-4-12 lowercase hex.
    pub cluster_uuid: String,
    /// Each condition of the health mask the driver reports, and whether it holds; empty on
    /// drivers before R550 (no mask) and for conditions the driver marks not supported.
    pub conditions: Vec<(FabricCondition, bool)>,
    /// What the mask says of the fabric's configuration; `None` where the driver does not say.
    pub configuration: Option<FabricConfiguration>,
    /// The driver's own summary of the fabric's health (R580 and newer); `None` before.
    pub summary: Option<FabricSummary>,
}

impl FabricSample {
    /// Whether the registration completed with an error status.
    pub fn registration_failed(&self) -> bool {
        self.state == FabricState::Completed && self.status.is_some_and(|s| s != "success")
    }

    /// Whether `condition` holds (false where the driver does not report it).
    pub fn holds(&self, condition: FabricCondition) -> bool {
        self.conditions.contains(&(condition, true))
    }
}

/// Where a GPU's registration with the NVLink fabric stands (`NVML_GPU_FABRIC_STATE_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FabricState {
    /// Fabric Manager has not started registering the GPU.
    #[default]
    NotStarted,
    /// The registration is under way.
    InProgress,
    /// The registration ended; its status says how.
    Completed,
}

label_enum!(
    /// `condition` label of `nvidia_gpu_fabric_condition`: the conditions of the fabric health
    /// mask (`NVML_GPU_FABRIC_HEALTH_MASK_*`), each true, false or not reported.
    FabricCondition {
        DegradedBandwidth => "degraded_bandwidth",
        RouteRecovery => "route_recovery",
        RouteUnhealthy => "route_unhealthy",
        AccessTimeoutRecovery => "access_timeout_recovery",
        IncorrectConfiguration => "incorrect_configuration",
    }
);

label_enum!(
    /// `configuration` label of `nvidia_gpu_fabric_info`: the health mask's configuration field
    /// (`NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*`).
    FabricConfiguration {
        Correct => "correct",
        IncorrectSysguid => "incorrect_sysguid",
        IncorrectChassisSn => "incorrect_chassis_sn",
        NoPartition => "no_partition",
        InsufficientNvlinks => "insufficient_nvlinks",
        IncompatibleGpuFirmware => "incompatible_gpu_firmware",
        InvalidLocation => "invalid_location",
        GpuStateInvalid => "gpu_state_invalid",
        Unknown => "unknown",
    }
);

label_enum!(
    /// The driver's summary of a GPU's fabric health (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`).
    FabricSummary {
        Healthy => "healthy",
        Unhealthy => "unhealthy",
        LimitedCapacity => "limited_capacity",
    }
);

impl FabricSummary {
    /// NVML's number for it, as `nvidia_gpu_fabric_health` serves it.
    pub fn code(self) -> u8 {
        match self {
            FabricSummary::Healthy => 1,
            FabricSummary::Unhealthy => 2,
            FabricSummary::LimitedCapacity => 3,
        }
    }
}

/// Seconds since the Unix epoch: the clock of the snapshot's timestamps and of the exporter's
/// own time series.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_event_masks_are_distinct_single_bits() {
        let mut seen = 0u64;
        for r in ClockEventReason::ALL {
            assert_eq!(r.mask().count_ones(), 1, "{r:?}");
            assert_eq!(seen & r.mask(), 0, "{r:?} overlaps");
            seen |= r.mask();
        }
    }

    #[test]
    fn label_values_are_snake_case_and_unique() {
        let labels: Vec<&str> = ThrottleReason::ALL.iter().map(|r| r.label()).collect();
        let mut sorted = labels.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), labels.len());
        assert!(
            labels
                .iter()
                .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }
}

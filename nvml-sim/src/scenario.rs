//! The scenario file: TOML schema, model-preset merging and validation.
//!
//! A `[[gpu]]` table names a `model` preset (see `models.toml`); the preset's keys are merged under
//! the GPU's own keys (tables merge key by key, everything else is replaced), and the result is
//! deserialized strictly, so a misspelt key is an error rather than a silently ignored setting.
//! The architecture and brand names a GPU may give map to their NVML codes here.

use crate::load::Load;
use crate::mig::{self, MigSpec};
use crate::replay::{ProcessReplay, Replay};
use nvml_wrapper_sys::bindings as b;
use serde::Deserialize;
use std::collections::HashSet;

/// The compiled-in default scenario: eight H100 SXM5 GPUs on an NVLink node.
pub const DEFAULT_SCENARIO: &str = include_str!("../scenarios/h100x8.toml");

/// The compiled-in model presets.
pub const MODEL_PRESETS: &str = include_str!("models.toml");

/// Most GPUs a scenario may describe (the size of the handle table).
pub const MAX_GPUS: usize = 64;

/// Bytes in a MiB, the unit of every `*_mib` key.
pub const MIB: u64 = 1024 * 1024;

/// A fully resolved scenario: presets merged, every value checked.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Driver identity reported by the system queries.
    pub driver: Driver,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<GpuSpec>,
    /// XID events.
    pub events: Vec<EventSpec>,
    /// Injected faults.
    pub faults: Vec<FaultSpec>,
}

/// Versions the simulated driver reports.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Driver {
    /// `nvmlSystemGetDriverVersion`. Kept below 580.82 by default: nvml-wrapper renumbers field
    /// IDs 251–273 for newer drivers.
    pub version: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 12040 for CUDA 12.4.
    pub cuda_version: i32,
}

impl Driver {
    /// The driver branch: the major number of `version` (550 for "550.127.05"); 0 if unreadable.
    pub fn branch(&self) -> u32 {
        self.version
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .unwrap_or(0)
    }
}

impl Default for Driver {
    fn default() -> Self {
        Driver {
            version: "550.127.05".into(),
            nvml_version: "12.550.127.05".into(),
            cuda_version: 12040,
        }
    }
}

/// One GPU: its identity, its hardware facts and its load over time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// The preset this GPU was built from.
    pub model: String,
    /// `nvmlDeviceGetName`.
    pub name: String,
    /// `nvmlDeviceGetUUID`, "GPU-…".
    pub uuid: String,
    /// PCI bus id, "00000000:18:00.0".
    pub pci_bus_id: String,
    /// Board serial number.
    pub serial: String,
    /// VBIOS version string.
    pub vbios: String,
    /// "hopper", "ampere", "ada", "volta", …
    pub architecture: String,
    /// "nvidia", "nvidia_rtx", "tesla", …
    pub brand: String,
    /// CUDA compute capability [major, minor].
    pub compute_capability: [i32; 2],
    /// PCI device id (device << 16 | vendor).
    pub pci_device_id: u32,
    /// PCI subsystem id.
    pub pci_subsystem_id: u32,
    /// Device minor number (/dev/nvidiaN); defaults to the index.
    pub minor_number: Option<u32>,
    /// Framebuffer size.
    pub memory_total_mib: u64,
    /// Framebuffer reserved by the driver/firmware (never free, never used).
    pub memory_reserved_mib: u64,
    /// BAR1 aperture size.
    pub bar1_total_mib: u64,
    /// BAR1 in use.
    pub bar1_used_mib: u64,
    /// Whether the board supports MIG (`nvmlDeviceGetMigMode` answers instead of NOT_SUPPORTED).
    pub mig_capable: bool,
    /// The board's GPU-instance profile table (see `mig::board`), e.g. "h100-80gb".
    pub mig_board: Option<String>,
    /// MIG mode and instance layout.
    #[serde(default)]
    pub mig: MigSpec,
    /// Encoder utilization is answered (H100/A100 lack NVENC but still answer 0 %).
    pub encoder: bool,
    /// Decoder utilization is answered.
    pub decoder: bool,
    /// Number of fans (0: passively cooled, fan queries answer NOT_SUPPORTED).
    pub fans: u32,
    /// Lowest fan duty, percent.
    #[serde(default = "default_fan_min")]
    pub fan_min_percent: f64,
    /// Performance state while idle (active is always P0).
    pub idle_pstate: u32,
    /// Power limits and idle draw.
    pub power: PowerSpec,
    /// Clock domains.
    pub clocks: ClockSpec,
    /// Temperatures.
    pub thermal: ThermalSpec,
    /// PCIe link.
    pub pcie: PcieSpec,
    /// NVLink links.
    pub nvlink: NvlinkSpec,
    /// ECC mode and error counts.
    pub ecc: EccSpec,
    /// Row remapper state (Ampere and newer only).
    #[serde(default)]
    pub remapped_rows: RemapSpec,
    /// Retired pages (before Ampere only).
    #[serde(default)]
    pub retired_pages: RetiredSpec,
    /// The recovery action the driver asks for (field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`,
    /// drivers of R565 and newer); absent: none.
    pub recovery_action: Option<RecoverySpec>,
    /// The unrepairable-memory flag (`nvmlDeviceGetUnrepairableMemoryFlag_v1`, R590 and newer,
    /// Hopper and newer).
    #[serde(default)]
    pub unrepairable_memory: bool,
    /// The SRAM error threshold of the field diagnostic is exceeded
    /// (`nvmlDeviceGetSramEccErrorStatus`, Ampere and newer, privileged callers only).
    #[serde(default)]
    pub sram_threshold_exceeded: bool,
    /// Media engine instances, as GPM reports them per engine.
    #[serde(default)]
    pub media: MediaSpec,
    /// Load over time.
    #[serde(default)]
    pub load: Load,
    /// Processes holding a context on this GPU.
    #[serde(default, rename = "process")]
    pub processes: Vec<ProcessSpec>,
    /// Recorded readings played back instead of `load` and the physics (see `replay`).
    #[serde(default)]
    pub replay: Option<Replay>,
    /// The GPU's NVLink fabric (NVSwitch systems); absent: on none.
    #[serde(default)]
    pub fabric: Option<crate::fabric::FabricSpec>,
}

fn default_fan_min() -> f64 {
    30.0
}

/// Power limits (W).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerSpec {
    /// The power management limit (what `nvidia-smi -pl` sets); below `default_limit_w` models
    /// an administrator cap.
    pub limit_w: f64,
    /// The limit another limiter (an out-of-band cap, a facility power budget) holds the board
    /// to, below `limit_w`; absent, the driver enforces `limit_w`.
    #[serde(default)]
    pub enforced_limit_w: Option<f64>,
    /// The board's default limit (TDP); full load draws this much when uncapped.
    pub default_limit_w: f64,
    /// Lowest settable limit.
    pub min_limit_w: f64,
    /// Highest settable limit.
    pub max_limit_w: f64,
    /// Draw when idle.
    pub idle_w: f64,
}

impl PowerSpec {
    /// The limit the driver enforces after all limiters.
    pub fn enforced_w(&self) -> f64 {
        self.enforced_limit_w.unwrap_or(self.limit_w)
    }
}

/// One clock domain (MHz): idle, base (sustained) and maximum (boost).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockRange {
    /// Clock when the GPU is idle.
    pub idle: f64,
    /// Base clock.
    pub base: f64,
    /// Maximum boost clock.
    pub max: f64,
}

/// Clock domains (graphics follows sm).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    /// SM and graphics clock.
    pub sm: ClockRange,
    /// Memory clock.
    pub memory: ClockRange,
    /// Video (NVDEC/NVENC) clock.
    pub video: ClockRange,
}

/// Temperatures (°C).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThermalSpec {
    /// Temperature at zero power.
    pub ambient_c: f64,
    /// Temperature when drawing the default power limit.
    pub at_tdp_c: f64,
    /// Multiplies the rise over ambient: > 1 models poor cooling.
    #[serde(default = "one")]
    pub heat_factor: f64,
    /// Memory runs this much hotter than the GPU; absent: no memory sensor (field NOT_SUPPORTED).
    pub memory_offset_c: Option<f64>,
    /// Shutdown threshold.
    pub shutdown_c: f64,
    /// Hardware slowdown threshold.
    pub slowdown_c: f64,
    /// Maximum operating temperature (software thermal slowdown above it).
    pub gpu_max_c: f64,
    /// Memory maximum operating temperature; absent: NOT_SUPPORTED.
    pub memory_max_c: Option<f64>,
}

fn one() -> f64 {
    1.0
}

/// A counter that starts at `initial` and grows by `per_hour` (floored to whole counts).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Counter {
    /// Value at t = 0.
    pub initial: u64,
    /// Growth per hour of simulated time.
    pub per_hour: f64,
}

impl Counter {
    /// The count at time `t` (monotonic in t: a negative rate counts as 0).
    pub fn at(&self, t: f64) -> u64 {
        self.initial + (self.per_hour.max(0.0) * t.max(0.0) / 3600.0).floor() as u64
    }
}

/// PCIe link.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieSpec {
    /// Maximum link generation.
    pub max_generation: u32,
    /// Maximum link width.
    pub max_width: u32,
    /// Current generation (default: max).
    pub generation: Option<u32>,
    /// Current width (default: max).
    pub width: Option<u32>,
    /// Replay counter.
    #[serde(default)]
    pub replays: Counter,
}

/// NVLink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlinkSpec {
    /// Number of links (0: no NVLink, queries answer NOT_SUPPORTED).
    pub links: u32,
    /// Links that are down.
    #[serde(default)]
    pub down: Vec<u32>,
    /// When the `down` links are down (absent: always); up again outside the window.
    pub down_window: Option<Window>,
    /// Per-link error counters (every active link counts the same).
    #[serde(default)]
    pub errors: NvlinkErrors,
}

/// A time window `from <= t < to`, repeating every `repeat` seconds if set.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Start (seconds).
    #[serde(default)]
    pub from: f64,
    /// End (seconds, exclusive).
    pub to: f64,
    /// Period after which the window repeats.
    pub repeat: Option<f64>,
}

impl Window {
    /// Whether the window covers `t`.
    pub fn active(&self, t: f64) -> bool {
        let t = match self.repeat {
            Some(period) if t >= self.from => self.from + (t - self.from).rem_euclid(period),
            _ => t,
        };
        t >= self.from && t < self.to
    }
}

/// NVLink error counters per link.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvlinkErrors {
    /// Data-link replays.
    pub replay: Counter,
    /// Data-link recoveries.
    pub recovery: Counter,
    /// Flow-control-unit CRC errors.
    pub crc_flit: Counter,
    /// Data CRC errors.
    pub crc_data: Counter,
}

/// ECC.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccSpec {
    /// ECC mode (current = pending). Off: error counters answer NOT_SUPPORTED.
    pub enabled: bool,
    /// Corrected errors since the driver loaded.
    #[serde(default)]
    pub corrected: Counter,
    /// Uncorrected errors since the driver loaded.
    #[serde(default)]
    pub uncorrected: Counter,
    /// Corrected errors over the board's life before this driver load.
    #[serde(default)]
    pub lifetime_corrected: u64,
    /// Uncorrected errors over the board's life before this driver load.
    #[serde(default)]
    pub lifetime_uncorrected: u64,
}

/// Row remapper state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemapSpec {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed.
    pub failure: bool,
}

/// The driver's recovery action: `action` (an `nvmlDeviceGpuRecoveryAction_t` value) while
/// `window` is active (always without one), none (0) outside it. Each change delivers a
/// recovery action event to the sets registered for it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverySpec {
    /// The value (1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ...).
    pub action: u64,
    /// When it is asked for; absent: always.
    pub window: Option<Window>,
}

impl RecoverySpec {
    /// The value at `t`.
    pub fn at(&self, t: f64) -> u64 {
        if self.window.is_none_or(|w| w.active(t)) {
            self.action
        } else {
            0
        }
    }
}

/// Retired pages (physical addresses).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetiredSpec {
    /// Pages retired for multiple single-bit errors.
    pub single_bit: Vec<u64>,
    /// Pages retired for a double-bit error.
    pub double_bit: Vec<u64>,
    /// A page waits for the next reboot (or GPU reset) to be retired.
    pub pending: bool,
}

/// Media engine counts (NVDEC, NVJPG, NVOFA instances). GPM answers NOT_SUPPORTED for the
/// per-engine metrics of instances the board does not have.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaSpec {
    /// Video decoders.
    pub nvdec: u32,
    /// JPEG decoders.
    pub nvjpg: u32,
    /// Optical flow accelerators.
    pub nvofa: u32,
}

/// A process with a context on the GPU.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// Process id.
    pub pid: u32,
    /// Process name (nvmlSystemGetProcessName).
    pub name: String,
    /// Device memory the process holds.
    pub used_memory_mib: u64,
    /// "compute", "graphics" or "both".
    #[serde(default = "compute")]
    pub kind: String,
    /// Present from this time (default: always).
    pub from: Option<f64>,
    /// Gone from this time (default: never).
    pub to: Option<f64>,
    /// GPU instance id the process runs in (required when MIG is enabled, refused otherwise).
    pub gpu_instance: Option<u32>,
    /// Compute instance id within that GPU instance (default 0).
    pub compute_instance: Option<u32>,
    /// Recorded per-process utilization, in place of the GPU's split by memory share.
    #[serde(default)]
    pub replay: Option<ProcessReplay>,
}

fn compute() -> String {
    "compute".into()
}

impl ProcessSpec {
    /// Whether the process exists at time `t`.
    pub fn alive(&self, t: f64) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t < e)
    }
    /// Listed by the compute-process queries.
    pub fn is_compute(&self) -> bool {
        self.kind == "compute" || self.kind == "both"
    }
    /// Listed by the graphics-process queries.
    pub fn is_graphics(&self) -> bool {
        self.kind == "graphics" || self.kind == "both"
    }
}

/// An XID event.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// When it happens (seconds).
    pub t: f64,
    /// GPU index.
    pub gpu: usize,
    /// The XID number.
    pub xid: u64,
    /// Happens again every `repeat` seconds.
    pub repeat: Option<f64>,
    /// A storm: occurrences per second, from `t` for `seconds` (absent: one occurrence).
    pub rate: Option<f64>,
    /// How long a storm lasts (seconds); required with `rate`.
    pub seconds: Option<f64>,
    /// A recovery action change (from a GPU's `recovery_action` window), not an XID.
    #[serde(skip)]
    pub recovery: bool,
}

/// Most occurrences one storm may have: keeps a typo in `rate` from building a scenario that
/// takes hours to deliver.
pub const MAX_STORM_EVENTS: f64 = 1_000_000.0;

impl EventSpec {
    /// Occurrences per burst (1 for a plain event) and the spacing between them (seconds).
    pub fn burst(&self) -> (u64, f64) {
        match (self.rate, self.seconds) {
            (Some(rate), Some(seconds)) => ((rate * seconds).ceil() as u64, 1.0 / rate),
            _ => (1, 0.0),
        }
    }
}

/// The kinds of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Calls (optionally only `function`) on the GPU return `error`.
    Error,
    /// The GPU fell off the bus: every call on it returns NVML_ERROR_GPU_IS_LOST.
    Lost,
    /// Calls (optionally only `function`) on the GPU block for `seconds` before answering.
    Hang,
    /// nvmlInit returns `error` until `to` seconds after the first attempt.
    Init,
    /// The driver is unloaded and loaded again: in the window every call answers `error`
    /// (default UNINITIALIZED) and nvmlInit answers DRIVER_NOT_LOADED; after each window the GPUs
    /// in `drop_gpus` are absent (odd-numbered restarts) or back (even-numbered ones).
    DriverRestart,
}

/// An injected fault, active for `from <= t < to` (repeating every `repeat` seconds if set).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// What goes wrong.
    pub kind: FaultKind,
    /// GPU index (absent: every GPU).
    pub gpu: Option<usize>,
    /// NVML function name, with or without a `_vN` suffix (absent: every function).
    pub function: Option<String>,
    /// Error name, e.g. "UNKNOWN" or "NVML_ERROR_TIMEOUT" (for `error` and `init`).
    pub error: Option<String>,
    /// Start of the window (seconds).
    #[serde(default)]
    pub from: f64,
    /// End of the window (seconds, exclusive).
    pub to: f64,
    /// How long a hanging call blocks (seconds).
    pub seconds: Option<f64>,
    /// Period after which the window repeats.
    pub repeat: Option<f64>,
    /// For `driver_restart`: GPUs that disappear after odd-numbered restarts and come back
    /// after even-numbered ones.
    #[serde(default)]
    pub drop_gpus: Vec<usize>,
    /// The resolved error code.
    #[serde(skip)]
    pub code: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    driver: Driver,
    #[serde(default)]
    gpu: Vec<toml::Table>,
    #[serde(default)]
    event: Vec<EventSpec>,
    #[serde(default)]
    fault: Vec<FaultSpec>,
}

/// Merges `over` into `base`: tables recursively, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

impl Scenario {
    /// Parses and validates a scenario; the error names the offending GPU/key.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| e.to_string())?;
        let presets: toml::Table =
            toml::from_str(MODEL_PRESETS).map_err(|e| format!("model presets: {e}"))?;
        if raw.gpu.is_empty() {
            return Err("a scenario needs at least one [[gpu]]".into());
        }
        if raw.gpu.len() > MAX_GPUS {
            return Err(format!("at most {MAX_GPUS} GPUs, got {}", raw.gpu.len()));
        }
        let mut gpus = Vec::with_capacity(raw.gpu.len());
        let mut mig_uuids = HashSet::new();
        for (i, table) in raw.gpu.into_iter().enumerate() {
            let model = table
                .get("model")
                .and_then(|m| m.as_str())
                .ok_or_else(|| format!("gpu {i}: `model` is required"))?
                .to_owned();
            let mut merged = match presets.get(&model) {
                Some(toml::Value::Table(t)) => t.clone(),
                _ => {
                    let known: Vec<_> = presets.keys().cloned().collect();
                    return Err(format!(
                        "gpu {i}: unknown model {model:?} (known: {})",
                        known.join(", ")
                    ));
                }
            };
            merge(&mut merged, table);
            let mut spec: GpuSpec = merged
                .try_into()
                .map_err(|e: toml::de::Error| format!("gpu {i}: {}", e.message()))?;
            spec.validate().map_err(|e| format!("gpu {i}: {e}"))?;
            for uuid in spec.validate_mig().map_err(|e| format!("gpu {i}: {e}"))? {
                if !mig_uuids.insert(uuid.to_ascii_lowercase()) {
                    return Err(format!("gpu {i}: duplicate MIG uuid {uuid}"));
                }
            }
            gpus.push(spec);
        }
        let mut events = raw.event;
        // The recovery action changes at both ends of its window: an event at each.
        for (gpu, spec) in gpus.iter().enumerate() {
            let Some(w) = spec.recovery_action.and_then(|r| r.window) else {
                continue;
            };
            for t in [w.from, w.to] {
                events.push(EventSpec {
                    t,
                    gpu,
                    xid: 0,
                    repeat: w.repeat,
                    rate: None,
                    seconds: None,
                    recovery: true,
                });
            }
        }
        let mut scenario = Scenario {
            driver: raw.driver,
            gpus,
            events,
            faults: raw.fault,
        };
        scenario.validate()?;
        Ok(scenario)
    }

    fn validate(&mut self) -> Result<(), String> {
        let n = self.gpus.len();
        let mut uuids = HashSet::new();
        let mut buses = HashSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if !uuids.insert(g.uuid.to_ascii_lowercase()) {
                return Err(format!("gpu {i}: duplicate uuid {}", g.uuid));
            }
            let bus = parse_bus_id(&g.pci_bus_id)
                .ok_or_else(|| format!("gpu {i}: bad pci_bus_id {:?}", g.pci_bus_id))?;
            if !buses.insert(bus) {
                return Err(format!("gpu {i}: duplicate pci_bus_id {}", g.pci_bus_id));
            }
        }
        for (i, e) in self.events.iter().enumerate() {
            if e.gpu >= n {
                return Err(format!("event {i}: gpu {} out of range (0..{n})", e.gpu));
            }
            if e.repeat.is_some_and(|r| r.is_nan() || r <= 0.0) {
                return Err(format!("event {i}: repeat must be > 0"));
            }
            match (e.rate, e.seconds) {
                (None, None) => {}
                (Some(rate), Some(seconds)) => {
                    if !(rate > 0.0 && seconds > 0.0 && rate * seconds <= MAX_STORM_EVENTS) {
                        return Err(format!(
                            "event {i}: need rate > 0, seconds > 0 and at most \
                             {MAX_STORM_EVENTS} events per storm"
                        ));
                    }
                    if e.repeat.is_some_and(|r| r < seconds) {
                        return Err(format!("event {i}: repeat must be at least `seconds`"));
                    }
                }
                _ => return Err(format!("event {i}: `rate` and `seconds` go together")),
            }
        }
        for (i, f) in self.faults.iter_mut().enumerate() {
            let ctx = |m: String| format!("fault {i}: {m}");
            if f.gpu.is_some_and(|g| g >= n) {
                return Err(ctx(format!("gpu out of range (0..{n})")));
            }
            if f.to.partial_cmp(&f.from) != Some(std::cmp::Ordering::Greater) {
                return Err(ctx("`to` must be after `from`".into()));
            }
            if f.repeat.is_some_and(|r| r < f.to - f.from || r <= 0.0) {
                return Err(ctx("`repeat` must be at least the window length".into()));
            }
            match f.kind {
                FaultKind::Error | FaultKind::Init => {
                    let name = f
                        .error
                        .as_deref()
                        .ok_or_else(|| ctx("`error` is required".into()))?;
                    f.code = crate::errors::code_from_name(name)
                        .ok_or_else(|| ctx(format!("unknown error {name:?}")))?;
                }
                FaultKind::Hang => {
                    if !f.seconds.is_some_and(|s| s > 0.0 && s.is_finite()) {
                        return Err(ctx("`seconds` (> 0) is required for a hang".into()));
                    }
                }
                FaultKind::DriverRestart => {
                    let name = f.error.as_deref().unwrap_or("UNINITIALIZED");
                    f.code = crate::errors::code_from_name(name)
                        .ok_or_else(|| ctx(format!("unknown error {name:?}")))?;
                    if let Some(g) = f.drop_gpus.iter().find(|&&g| g >= n) {
                        return Err(ctx(format!("drop_gpus: gpu {g} out of range (0..{n})")));
                    }
                }
                FaultKind::Lost => {}
            }
            let global = matches!(f.kind, FaultKind::Init | FaultKind::DriverRestart);
            if global && (f.gpu.is_some() || f.function.is_some()) {
                return Err(ctx(
                    "init and driver_restart faults take no `gpu` or `function`".into(),
                ));
            }
            if f.kind != FaultKind::DriverRestart && !f.drop_gpus.is_empty() {
                return Err(ctx("only a driver_restart fault takes `drop_gpus`".into()));
            }
        }
        Ok(())
    }
}

impl GpuSpec {
    fn validate(&self) -> Result<(), String> {
        if !self.uuid.starts_with("GPU-") {
            return Err(format!("uuid must start with \"GPU-\": {:?}", self.uuid));
        }
        arch_code(&self.architecture)
            .ok_or_else(|| format!("unknown architecture {:?}", self.architecture))?;
        brand_code(&self.brand).ok_or_else(|| format!("unknown brand {:?}", self.brand))?;
        if self.memory_reserved_mib >= self.memory_total_mib {
            return Err("memory_reserved_mib must be below memory_total_mib".into());
        }
        let held: u64 = self.processes.iter().map(|p| p.used_memory_mib).sum();
        if held > self.memory_total_mib - self.memory_reserved_mib {
            return Err(format!(
                "processes hold {held} MiB, more than the usable memory"
            ));
        }
        for p in &self.processes {
            if let Some(replay) = &p.replay {
                replay
                    .validate()
                    .map_err(|e| format!("process {}: {e}", p.pid))?;
            }
            if !["compute", "graphics", "both"].contains(&p.kind.as_str()) {
                return Err(format!(
                    "process {}: kind must be compute|graphics|both",
                    p.pid
                ));
            }
        }
        let p = &self.power;
        if !(p.idle_w >= 0.0 && p.idle_w < p.default_limit_w && p.limit_w > 0.0) {
            return Err("power: need 0 <= idle_w < default_limit_w and limit_w > 0".into());
        }
        if p.enforced_limit_w
            .is_some_and(|w| !(w > 0.0 && w <= p.limit_w))
        {
            return Err("power: need 0 < enforced_limit_w <= limit_w".into());
        }
        if self.nvlink.down.iter().any(|&l| l >= self.nvlink.links) {
            return Err("nvlink.down names a link beyond nvlink.links".into());
        }
        if let Some(w) = self.nvlink.down_window
            && !(w.from < w.to && w.repeat.is_none_or(|r| r >= w.to - w.from))
        {
            return Err("nvlink.down_window: need from < to and repeat >= to - from".into());
        }
        self.load.validate()?;
        if let Some(replay) = &self.replay {
            replay.validate(self.fans, self.nvlink.links)?;
        }
        if let Some(fabric) = &self.fabric {
            fabric.cluster_uuid_bytes()?;
        }
        Ok(())
    }
}

impl GpuSpec {
    /// Validates `gpu.mig` against the model and the processes against the instances; resolves
    /// the instances' profiles and loads. Returns the MIG UUIDs the GPU uses (for the
    /// scenario-wide uniqueness check).
    fn validate_mig(&mut self) -> Result<Vec<String>, String> {
        let mig = &self.mig;
        if (mig.enabled || mig.pending == Some(true) || !mig.instances.is_empty())
            && !self.mig_capable
        {
            return Err(format!("mig: model {} does not support MIG", self.model));
        }
        if !mig.enabled && !mig.instances.is_empty() {
            return Err("mig: instances need `enabled = true`".into());
        }
        if !mig.enabled {
            if let Some(p) = self.processes.iter().find(|p| p.gpu_instance.is_some()) {
                return Err(format!("process {}: gpu_instance needs MIG enabled", p.pid));
            }
            return Ok(Vec::new());
        }
        let profiles = mig::board(self.mig_board.as_deref());
        if profiles.is_empty() {
            return Err(format!(
                "mig: model {} has no `mig_board` profile table",
                self.model
            ));
        }
        self.mig.resolve(profiles)?;
        self.check_mig_processes()?;
        self.mig.uuids(&self.uuid)
    }

    /// On a MIG GPU every process runs in a compute instance that exists for its whole life, and
    /// an instance's processes fit its memory.
    fn check_mig_processes(&self) -> Result<(), String> {
        for p in &self.processes {
            let gi_id = p.gpu_instance.ok_or_else(|| {
                format!(
                    "process {}: MIG is enabled, `gpu_instance` is required",
                    p.pid
                )
            })?;
            let ci_id = p.compute_instance.unwrap_or(0);
            let from = p.from.unwrap_or(f64::NEG_INFINITY);
            let to = p.to.unwrap_or(f64::INFINITY);
            let host = self.mig.instances.iter().find(|gi| {
                gi.id == gi_id
                    && gi.from.unwrap_or(f64::NEG_INFINITY) <= from
                    && to <= gi.to.unwrap_or(f64::INFINITY)
                    && gi.compute_instances().iter().any(|ci| ci.id == ci_id)
            });
            if host.is_none() {
                return Err(format!(
                    "process {}: no GPU instance {gi_id} with compute instance {ci_id} exists for \
                     the whole life of the process",
                    p.pid
                ));
            }
        }
        for gi in &self.mig.instances {
            let held: u64 = self
                .processes
                .iter()
                .filter(|p| {
                    p.gpu_instance == Some(gi.id)
                        && gi.from.unwrap_or(f64::NEG_INFINITY)
                            <= p.from.unwrap_or(f64::NEG_INFINITY)
                        && p.to.unwrap_or(f64::INFINITY) <= gi.to.unwrap_or(f64::INFINITY)
                })
                .map(|p| p.used_memory_mib)
                .sum();
            if held > gi.profile().memory_mib {
                return Err(format!(
                    "mig instance {}: processes hold {held} MiB, the instance has {}",
                    gi.id,
                    gi.profile().memory_mib
                ));
            }
        }
        Ok(())
    }
}

/// The `nvmlDeviceArchitecture_t` value of an `architecture` name.
pub fn arch_code(name: &str) -> Option<u32> {
    Some(match name {
        "kepler" => b::NVML_DEVICE_ARCH_KEPLER,
        "maxwell" => b::NVML_DEVICE_ARCH_MAXWELL,
        "pascal" => b::NVML_DEVICE_ARCH_PASCAL,
        "volta" => b::NVML_DEVICE_ARCH_VOLTA,
        "turing" => b::NVML_DEVICE_ARCH_TURING,
        "ampere" => b::NVML_DEVICE_ARCH_AMPERE,
        "ada" => b::NVML_DEVICE_ARCH_ADA,
        "hopper" => b::NVML_DEVICE_ARCH_HOPPER,
        "blackwell" => b::NVML_DEVICE_ARCH_BLACKWELL,
        _ => return None,
    })
}

/// The `nvmlBrandType_t` value of a `brand` name.
pub fn brand_code(name: &str) -> Option<u32> {
    Some(match name {
        "quadro" => b::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        "tesla" => b::nvmlBrandType_enum_NVML_BRAND_TESLA,
        "geforce" => b::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        "titan" => b::nvmlBrandType_enum_NVML_BRAND_TITAN,
        "nvidia_rtx" => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        "nvidia" => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        _ => return None,
    })
}

/// Parses "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" or "BB:DD.F" (hex) into (domain, bus, device, function).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim().trim_end_matches('\0');
    let (rest, function) = s.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match parts.as_slice() {
        [d, b, dev] => (*d, *b, *dev),
        [b, dev] => ("0", *b, *dev),
        _ => return None,
    };
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_every_form() {
        assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18, 0, 0)));
        assert_eq!(parse_bus_id("0000:1a:00.0"), Some((0, 0x1a, 0, 0)));
        assert_eq!(parse_bus_id("1A:00.0"), Some((0, 0x1a, 0, 0)));
        assert_eq!(parse_bus_id("nonsense"), None);
    }

    #[test]
    fn every_shipped_scenario_parses() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let s =
                    Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(!s.gpus.is_empty());
                names.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        names.sort();
        for required in [
            "a100x4.toml",
            "faults.toml",
            "h100x8.toml",
            "l4x2.toml",
            "rtx6000ada.toml",
        ] {
            assert!(names.iter().any(|n| n == required), "missing {required}");
        }
        assert_eq!(Scenario::parse(DEFAULT_SCENARIO).unwrap().gpus.len(), 8);
    }

    #[test]
    fn preset_values_are_merged_and_overridable() {
        let s = Scenario::parse(
            r#"
            [[gpu]]
            model = "H100-SXM5-80GB"
            uuid = "GPU-1"
            pci_bus_id = "0000:18:00.0"
            serial = "1"
            power = { limit_w = 500 }
            "#,
        )
        .unwrap();
        let g = &s.gpus[0];
        assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.power.limit_w, 500.0);
        assert_eq!(g.power.default_limit_w, 700.0);
        assert_eq!(s.driver.version, "550.127.05");
    }

    #[test]
    fn mistakes_are_reported() {
        let base =
            "[[gpu]]\nmodel = \"L4\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\nserial = \"1\"\n";
        assert!(Scenario::parse(base).is_ok());
        let typo = format!("{base}utilisation = 1\n");
        assert!(Scenario::parse(&typo).unwrap_err().contains("utilisation"));
        let unknown = base.replace("L4", "L5");
        assert!(
            Scenario::parse(&unknown)
                .unwrap_err()
                .contains("unknown model")
        );
        let bad_fault = format!("{base}[[fault]]\nkind = \"error\"\nto = 5\nerror = \"NOPE\"\n");
        assert!(
            Scenario::parse(&bad_fault)
                .unwrap_err()
                .contains("unknown error")
        );
        let bad_event = format!("{base}[[event]]\nt = 1\ngpu = 3\nxid = 79\n");
        assert!(
            Scenario::parse(&bad_event)
                .unwrap_err()
                .contains("out of range")
        );
        let event = format!("{base}[[event]]\nt = 1\ngpu = 0\nxid = 31\n");
        let err = |extra: &str| Scenario::parse(&format!("{event}{extra}")).unwrap_err();
        assert!(err("rate = 10\n").contains("go together"));
        assert!(err("rate = 1e7\nseconds = 1\n").contains("at most"));
        assert!(err("rate = 10\nseconds = 5\nrepeat = 2\n").contains("at least"));
        assert!(Scenario::parse(&format!("{event}rate = 10\nseconds = 5\n")).is_ok());
        let restart = format!("{base}[[fault]]\nkind = \"driver_restart\"\nto = 5\n");
        assert!(Scenario::parse(&restart).is_ok());
        let err = |extra: &str| Scenario::parse(&format!("{restart}{extra}")).unwrap_err();
        assert!(err("drop_gpus = [1]\n").contains("out of range"));
        assert!(err("gpu = 0\n").contains("take no `gpu`"));
        let limiter = |w: u32| format!("{base}power = {{ enforced_limit_w = {w} }}\n");
        assert_eq!(
            Scenario::parse(&limiter(50)).unwrap().gpus[0]
                .power
                .enforced_w(),
            50.0
        );
        assert!(
            Scenario::parse(&limiter(80))
                .unwrap_err()
                .contains("enforced_limit_w <= limit_w"),
            "above the L4's 72 W management limit it limits nothing"
        );
        let hang_drop =
            format!("{base}[[fault]]\nkind = \"hang\"\nto = 5\nseconds = 1\ndrop_gpus = [0]\n");
        assert!(
            Scenario::parse(&hang_drop)
                .unwrap_err()
                .contains("only a driver_restart")
        );
    }
}

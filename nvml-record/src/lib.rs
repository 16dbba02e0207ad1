//! nvml-record: reads a GPU node through NVML and writes a scenario file that nvml-sim replays.
//!
//! A [`Recorder`] reads each GPU's static facts once (identity, memory, limits, maximum clocks,
//! thresholds, links, ECC and MIG mode, driver versions) and then, at every [`Recorder::sample`],
//! every reading nvml-exporter makes (utilization, memory, power, energy, temperatures, clocks,
//! P-state, clock-event reasons, fans, PCIe, violation time, ECC and NVLink counters, processes).
//! [`Recorder::scenario`] writes them as nvml-sim's TOML: the facts as the `[[gpu]]` keys, the
//! readings as the GPU's `[gpu.replay]` table, one value per sampling period in the unit the NVML
//! call returned. A reading the GPU answered `NOT_SUPPORTED` is left out, and the simulator then
//! answers `NOT_SUPPORTED` for it too; a reading is never written as a zero it did not have.
//!
//! The binary samples on a timer; a caller can drive [`Recorder::sample`] itself (the round-trip
//! test steps a pinned simulator clock between samples).

mod raw;

use std::collections::BTreeMap;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{self as sys, field_id};
use toml::{Table, Value};

/// Bytes in a MiB, the unit of the scenario's memory keys.
const MIB: u64 = 1024 * 1024;

/// Links probed for NVLink (`NVML_NVLINK_MAX_LINKS` of the CUDA 13 `nvml.h`); probing stops at
/// the first link the GPU rejects.
const NVLINK_MAX_LINKS: u32 = 36;

/// The violation policies, in the order and with the names of the scenario's `violation_ns`.
const POLICIES: [(&str, PerformancePolicy); 8] = [
    ("power", PerformancePolicy::Power),
    ("thermal", PerformancePolicy::Thermal),
    ("sync_boost", PerformancePolicy::SyncBoost),
    ("board_limit", PerformancePolicy::BoardLimit),
    ("low_utilization", PerformancePolicy::LowUtilization),
    ("reliability", PerformancePolicy::Reliability),
    ("total_app_clocks", PerformancePolicy::TotalAppClocks),
    ("total_base_clocks", PerformancePolicy::TotalBaseClocks),
];

/// The NVLink error counters, with the names of the scenario's `nvlink_*` series.
const NVLINK_ERRORS: [(&str, ErrorCounter); 4] = [
    ("nvlink_replay", ErrorCounter::DlReplay),
    ("nvlink_recovery", ErrorCounter::DlRecovery),
    ("nvlink_crc_flit", ErrorCounter::DlCrcFlit),
    ("nvlink_crc_data", ErrorCounter::DlCrcData),
];

/// The GPM metrics recorded: each becomes the `load` key nvml-sim derives it from, divided by
/// `divisor` (percent → ratio; MiB/s → MB/s for PCIe and GB/s for NVLink, over all links).
const GPM_METRICS: [(GpmMetricId, &str, f64); 19] = [
    (GpmMetricId::GraphicsUtil, "graphics_active", 100.0),
    (GpmMetricId::SmUtil, "sm_active", 100.0),
    (GpmMetricId::SmOccupancy, "sm_occupancy", 100.0),
    (GpmMetricId::IntegerUtil, "integer_active", 100.0),
    (GpmMetricId::AnyTensorUtil, "tensor_active", 100.0),
    (GpmMetricId::DfmaTensorUtil, "dfma_tensor_active", 100.0),
    (GpmMetricId::HmmaTensorUtil, "hmma_tensor_active", 100.0),
    (GpmMetricId::ImmaTensorUtil, "imma_tensor_active", 100.0),
    (GpmMetricId::DramBwUtil, "dram_active", 100.0),
    (GpmMetricId::Fp64Util, "fp64_active", 100.0),
    (GpmMetricId::Fp32Util, "fp32_active", 100.0),
    (GpmMetricId::Fp16Util, "fp16_active", 100.0),
    (GpmMetricId::PcieTxPerSec, "pcie_tx_mb_s", 1e6 / MIB as f64),
    (GpmMetricId::PcieRxPerSec, "pcie_rx_mb_s", 1e6 / MIB as f64),
    (GpmMetricId::Nvdec0Util, "decoder", 100.0),
    (GpmMetricId::Nvjpg0Util, "nvjpg", 100.0),
    (GpmMetricId::Nvofa0Util, "nvofa", 100.0),
    (
        GpmMetricId::NvlinkTotalTxPerSec,
        "nvlink_tx_gb_s",
        1e9 / MIB as f64,
    ),
    (
        GpmMetricId::NvlinkTotalRxPerSec,
        "nvlink_rx_gb_s",
        1e9 / MIB as f64,
    ),
];

/// What a recording keeps from one NVML session between two [`Recorder::sample_over_time`]
/// calls: each GPU's previous GPM sample and the XID event set (both belong to the session that
/// made them).
pub struct Session<'nvml> {
    nvml: &'nvml Nvml,
    gpm: Vec<Option<GpmSample<'nvml>>>,
    /// By (GPU position, GPU instance id).
    instance_gpm: BTreeMap<(usize, u32), GpmSample<'nvml>>,
    xids: Option<EventSet<'nvml>>,
}

impl<'nvml> Session<'nvml> {
    /// Registers for the XID events of every GPU that reports them.
    pub fn new(nvml: &'nvml Nvml) -> Session<'nvml> {
        let mut xids = nvml.create_event_set().ok();
        let count = nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            let reports = device
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if let (true, Some(set)) = (reports, xids.take()) {
                // A failed registration frees the set: the rest of the recording has no XIDs.
                xids = device
                    .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                    .ok();
            }
        }
        Session {
            nvml,
            gpm: Vec::new(),
            instance_gpm: BTreeMap::new(),
            xids,
        }
    }
}

/// Appends each GPM metric's average between `before` and `now` to its `load` key's list.
fn gpm_window<'nvml>(
    nvml: &'nvml Nvml,
    before: &GpmSample<'nvml>,
    now: &GpmSample<'nvml>,
    into: &mut BTreeMap<&'static str, Vec<f64>>,
) {
    let ids: Vec<GpmMetricId> = GPM_METRICS.iter().map(|(id, _, _)| *id).collect();
    if let Ok(results) = gpm_metrics_get(nvml, before, now, &ids) {
        for ((_, key, divisor), result) in GPM_METRICS.iter().zip(results) {
            if let Ok(r) = result {
                into.entry(key).or_default().push(r.value / divisor);
            }
        }
    }
}

/// GPM averages as `load` patterns: window k (between samples k and k + 1) is step k, the last
/// step repeats the last window. Keys with a window missing are left out (the simulator's
/// defaults stand in).
fn gpm_load(gpm: &BTreeMap<&'static str, Vec<f64>>, step: f64, samples: usize) -> Table {
    gpm.iter()
        .filter(|(_, windows)| windows.len() + 1 == samples)
        .map(|(key, windows)| {
            let mut values = windows.clone();
            values.push(*windows.last().expect("at least one window"));
            let pattern = if values.iter().all(|v| *v == values[0]) {
                float(values[0])
            } else {
                table([
                    ("shape", Value::String("steps".into())),
                    ("step", float(step)),
                    (
                        "values",
                        Value::Array(values.into_iter().map(float).collect()),
                    ),
                ])
            };
            (key.to_string(), pattern)
        })
        .collect()
}

/// Why recording could not start or go on.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn fail(what: &str, e: NvmlError) -> Error {
    Error(format!("{what}: {e}"))
}

/// The calls a GPU does not have: NOT_SUPPORTED, or a library without the function.
fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// An error of the same kind for the trace (NvmlError is not Clone): unsupported or failed.
fn same_kind(e: &NvmlError) -> NvmlError {
    if unsupported(e) {
        NvmlError::NotSupported
    } else {
        NvmlError::Unknown
    }
}

/// One reading over the samples: a value, a gap (the call failed this time), or unsupported.
#[derive(Debug, Default)]
struct Trace {
    values: Vec<Option<u64>>,
    unsupported: bool,
    failures: usize,
}

impl Trace {
    fn push<T: Into<u64>>(&mut self, result: Result<T, NvmlError>) {
        match result {
            Ok(v) => self.values.push(Some(v.into())),
            Err(e) => {
                if unsupported(&e) {
                    self.unsupported = true;
                } else {
                    self.failures += 1;
                }
                self.values.push(None);
            }
        }
    }

    /// The scenario's series: a number when it never changed, else one value per sample. A gap
    /// repeats the value before it (the first known value for leading gaps), which keeps
    /// counters monotonic. `None` when unsupported or never answered.
    fn series(&self) -> Option<Value> {
        if self.unsupported {
            return None;
        }
        let mut last = self.values.iter().flatten().next().copied()?;
        let filled: Vec<u64> = self
            .values
            .iter()
            .map(|v| {
                if let Some(v) = v {
                    last = *v;
                }
                last
            })
            .collect();
        if filled.iter().all(|v| *v == filled[0]) {
            Some(int(filled[0]))
        } else {
            Some(Value::Array(filled.into_iter().map(int).collect()))
        }
    }

    fn min(&self) -> Option<u64> {
        self.values.iter().flatten().min().copied()
    }
}

/// One series per link or fan: supported only when every one of them is.
fn list_series(traces: &[Trace]) -> Option<Value> {
    traces
        .iter()
        .map(Trace::series)
        .collect::<Option<Vec<_>>>()
        .filter(|l| !l.is_empty())
        .map(Value::Array)
}

fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

fn float(v: f64) -> Value {
    Value::Float(v)
}

/// A process seen on a GPU: when first and last, as what, holding how much.
#[derive(Debug)]
struct SeenProcess {
    name: String,
    compute: bool,
    graphics: bool,
    used_bytes: u64,
    first: usize,
    last: usize,
    /// (GPU instance, compute instance) on a GPU in MIG mode.
    instance: Option<(u32, u32)>,
    /// `nvmlDeviceGetProcessUtilization` per sample: sm, memory, encoder, decoder (percent).
    utilization: [Trace; 4],
}

/// The readings of one GPU, one entry per sample.
#[derive(Debug, Default)]
struct Traces {
    /// GPM averages per `load` key, one per window between two samples.
    gpm: BTreeMap<&'static str, Vec<f64>>,
    single: BTreeMap<&'static str, Trace>,
    violations: BTreeMap<&'static str, Trace>,
    fans: Vec<Trace>,
    links: BTreeMap<&'static str, Vec<Trace>>,
}

impl Traces {
    fn single(&mut self, key: &'static str) -> &mut Trace {
        self.single.entry(key).or_default()
    }
}

/// A MIG GPU instance as it was when the recording started.
#[derive(Debug)]
struct InstanceRecording {
    id: u32,
    profile: String,
    start: u32,
    computes: Vec<ComputeRecording>,
    /// Memory used, bytes, from its MIG devices.
    memory: Trace,
    /// GPM averages per `load` key.
    gpm: BTreeMap<&'static str, Vec<f64>>,
}

/// A compute instance (a MIG device) of a GPU instance.
#[derive(Debug)]
struct ComputeRecording {
    id: u32,
    uuid: String,
    /// Its compute slices and those of its GPU instance (`nvmlDeviceGetAttributes`).
    slices: Option<(u32, u32)>,
}

/// The `load` keys a MIG instance takes: links belong to the whole board.
fn instance_load_key(key: &str) -> bool {
    !key.starts_with("pcie_") && !key.starts_with("nvlink_")
}

/// The MIG devices of `d` now: (GPU instance id, compute instance id, handle).
fn mig_devices<'nvml>(d: &Device<'nvml>) -> Vec<(u32, u32, Device<'nvml>)> {
    let max = d.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|i| {
            let mig = d.mig_device_by_index(i).ok()?;
            let (gi, ci) = raw::mig_ids(&mig).ok()?;
            Some((gi, ci, mig))
        })
        .collect()
}

/// The GPU instances of `d` (MIG mode on) with their compute instances, by GPU instance id.
fn read_instances(d: &Device) -> Result<Vec<InstanceRecording>, NvmlError> {
    let profiles: BTreeMap<u32, String> = raw::gpu_instance_profiles(d).into_iter().collect();
    let mut instances: BTreeMap<u32, InstanceRecording> = BTreeMap::new();
    for (gi, ci, mig) in mig_devices(d) {
        let instance = match instances.entry(gi) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let (profile_id, start) = raw::gpu_instance_placement(d, gi)?;
                let profile = profiles.get(&profile_id).ok_or(NvmlError::NotFound)?;
                e.insert(InstanceRecording {
                    id: gi,
                    profile: profile.clone(),
                    start,
                    computes: Vec::new(),
                    memory: Trace::default(),
                    gpm: BTreeMap::new(),
                })
            }
        };
        let compute = ComputeRecording {
            id: ci,
            uuid: mig.uuid()?,
            slices: mig
                .attributes()
                .ok()
                .map(|a| (a.compute_instance_slice_count, a.gpu_instance_slice_count)),
        };
        instance.computes.push(compute);
    }
    Ok(instances.into_values().collect())
}

impl InstanceRecording {
    /// The `[[gpu.mig.instance]]` table.
    fn table(&self, step: f64, samples: usize) -> Value {
        let mut t = Table::new();
        t.insert("id".into(), int(self.id.into()));
        t.insert("profile".into(), Value::String(self.profile.clone()));
        t.insert("start".into(), int(self.start.into()));
        match self.computes.as_slice() {
            // One compute instance spanning the GPU instance: the simulator's default.
            [c] if c.id == 0 && c.slices.is_none_or(|(ci, gi)| ci == gi) => {
                t.insert("uuid".into(), Value::String(c.uuid.clone()));
            }
            computes => {
                let computes = computes
                    .iter()
                    .map(|c| {
                        let mut ct = Table::new();
                        ct.insert("id".into(), int(c.id.into()));
                        ct.insert("uuid".into(), Value::String(c.uuid.clone()));
                        if let Some((slices, _)) = c.slices {
                            ct.insert("slices".into(), int(slices.into()));
                        }
                        Value::Table(ct)
                    })
                    .collect();
                t.insert("compute".into(), Value::Array(computes));
            }
        }
        let mut load = gpm_load(&self.gpm, step, samples);
        load.retain(|k, _| instance_load_key(k));
        if !load.is_empty() {
            t.insert("load".into(), Value::Table(load));
        }
        if let Some(memory) = self.memory.series() {
            t.insert(
                "replay".into(),
                table([("step", float(step)), ("memory_used_bytes", memory)]),
            );
        }
        Value::Table(t)
    }
}

/// One GPU being recorded.
#[derive(Debug)]
struct GpuRecording {
    index: u32,
    /// The `[[gpu]]` keys read once.
    facts: Table,
    links: u32,
    /// MIG mode (current, pending), when the GPU has MIG.
    mig: Option<(bool, bool)>,
    /// The GPU instances, when MIG mode is on.
    instances: Vec<InstanceRecording>,
    /// Newest per-process utilization sample read (µs), and whether the GPU has none to give.
    process_utilization: (u64, bool),
    traces: Traces,
    processes: BTreeMap<u32, SeenProcess>,
}

/// Records every GPU of an NVML session: static facts at creation, readings at each sample.
#[derive(Debug)]
pub struct Recorder {
    period: Duration,
    driver: Table,
    gpus: Vec<GpuRecording>,
    samples: usize,
    /// XID events: (sample, GPU index, XID).
    xids: Vec<(usize, u32, u64)>,
}

impl Recorder {
    /// Reads the driver versions and every GPU's static facts; readings are taken every
    /// `period` (the scenario's step).
    pub fn new(nvml: &Nvml, period: Duration) -> Result<Recorder, Error> {
        let mut driver = Table::new();
        let version = nvml
            .sys_driver_version()
            .map_err(|e| fail("nvmlSystemGetDriverVersion", e))?;
        driver.insert("version".into(), Value::String(version));
        if let Ok(v) = nvml.sys_nvml_version() {
            driver.insert("nvml_version".into(), Value::String(v));
        }
        if let Ok(v) = nvml.sys_cuda_driver_version() {
            driver.insert("cuda_version".into(), Value::Integer(v.into()));
        }
        let count = nvml
            .device_count()
            .map_err(|e| fail("nvmlDeviceGetCount", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| fail(&format!("GPU {index}: nvmlDeviceGetHandleByIndex"), e))?;
            gpus.push(GpuRecording::new(index, &device)?);
        }
        Ok(Recorder {
            period,
            driver,
            gpus,
            samples: 0,
            xids: Vec::new(),
        })
    }

    /// Takes one sample of every GPU's readings (and their processes). `nvml` must list the same
    /// GPUs as the session the recorder was created on.
    pub fn sample(&mut self, nvml: &Nvml) -> Result<(), Error> {
        for gpu in &mut self.gpus {
            let device = nvml
                .device_by_index(gpu.index)
                .map_err(|e| fail(&format!("GPU {}: nvmlDeviceGetHandleByIndex", gpu.index), e))?;
            gpu.sample(nvml, &device, self.samples);
        }
        self.samples += 1;
        Ok(())
    }

    /// What only time passing shows, since the previous call with the same `session`: each
    /// GPU's GPM averages over the window (nothing on the first call) and the XID events that
    /// arrived (dated at this sample). Called right after [`Recorder::sample`].
    pub fn sample_over_time(&mut self, session: &mut Session<'_>) {
        let k = self.samples.saturating_sub(1);
        if let Some(set) = &session.xids {
            while let Ok(event) = set.wait(0) {
                let (Ok(index), Some(XidError::Value(xid))) =
                    (event.device.index(), event.event_data)
                else {
                    continue;
                };
                self.xids.push((k, index, xid));
            }
        }
        let nvml = session.nvml;
        session.gpm.resize_with(self.gpus.len(), || None);
        for (gpu, prev) in self.gpus.iter_mut().zip(&mut session.gpm) {
            let Ok(device) = nvml.device_by_index(gpu.index) else {
                continue;
            };
            if !device.gpm_support().unwrap_or(false) {
                continue;
            }
            let Ok(now) = device.gpm_sample() else {
                *prev = None;
                continue;
            };
            if let Some(before) = prev.take() {
                gpm_window(nvml, &before, &now, &mut gpu.traces.gpm);
            }
            *prev = Some(now);
        }
        for (position, gpu) in self.gpus.iter_mut().enumerate() {
            let Ok(device) = nvml.device_by_index(gpu.index) else {
                continue;
            };
            for instance in &mut gpu.instances {
                let key = (position, instance.id);
                let Ok(now) = device.gpm_mig_sample(instance.id) else {
                    session.instance_gpm.remove(&key);
                    continue;
                };
                if let Some(before) = session.instance_gpm.remove(&key) {
                    gpm_window(nvml, &before, &now, &mut instance.gpm);
                }
                session.instance_gpm.insert(key, now);
            }
        }
    }

    /// Samples taken so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Readings that failed (other than NOT_SUPPORTED) and were filled from the sample before:
    /// (GPU index, reading, failures).
    pub fn gaps(&self) -> Vec<(u32, String, usize)> {
        let mut gaps = Vec::new();
        for gpu in &self.gpus {
            let t = &gpu.traces;
            let named = t
                .single
                .iter()
                .chain(&t.violations)
                .map(|(k, tr)| (k.to_string(), tr))
                .chain(
                    t.fans
                        .iter()
                        .enumerate()
                        .map(|(i, tr)| (format!("fan {i}"), tr)),
                )
                .chain(t.links.iter().flat_map(|(k, l)| {
                    l.iter()
                        .enumerate()
                        .map(move |(i, tr)| (format!("{k}[{i}]"), tr))
                }));
            for (name, trace) in named {
                if trace.failures > 0 {
                    gaps.push((gpu.index, name, trace.failures));
                }
            }
        }
        gaps
    }

    /// The scenario file: `[driver]`, one `[[gpu]]` per GPU with its facts, its processes and
    /// its `[gpu.replay]` table (step = the sampling period).
    pub fn scenario(&self) -> String {
        let step = self.period.as_secs_f64();
        let mut root = Table::new();
        root.insert("driver".into(), Value::Table(self.driver.clone()));
        let gpus = self
            .gpus
            .iter()
            .map(|g| Value::Table(g.table(step, self.samples)))
            .collect();
        root.insert("gpu".into(), Value::Array(gpus));
        // Each XID at the sample that saw it, again every pass of the replay.
        let events: Vec<Value> = self
            .xids
            .iter()
            .map(|&(k, gpu, xid)| {
                table([
                    ("t", float(k as f64 * step)),
                    ("gpu", int(gpu.into())),
                    ("xid", int(xid)),
                    ("repeat", float(self.samples as f64 * step)),
                ])
            })
            .collect();
        if !events.is_empty() {
            root.insert("event".into(), Value::Array(events));
        }
        let header = format!(
            "# Recorded by nvml-record: {} GPU(s), {} samples every {} s. Replay with nvml-sim\n\
             # (NVML_SIM_SCENARIO=this file); the readings cycle, counters keep growing.\n\n",
            self.gpus.len(),
            self.samples,
            step
        );
        header + &toml::to_string(&root).expect("a TOML table serializes")
    }
}

/// The nvml-sim preset whose facts fill in what NVML cannot tell (idle and base clocks, the
/// thermal model, media engines): by name, else by architecture. Every fact NVML does tell is
/// written over it.
fn preset(name: &str, architecture: &str, memory_total_mib: u64) -> &'static str {
    let n = name.to_ascii_uppercase();
    if n.contains("H100") {
        "H100-SXM5-80GB"
    } else if n.contains("A100") && memory_total_mib > 48 * 1024 {
        "A100-SXM4-80GB"
    } else if n.contains("A100") {
        "A100-SXM4-40GB"
    } else if n.contains("L4") && !n.contains("L40") {
        "L4"
    } else if n.contains("V100") {
        "V100-SXM2-32GB"
    } else {
        match architecture {
            "hopper" | "blackwell" => "H100-SXM5-80GB",
            "ampere" => "A100-SXM4-40GB",
            "volta" | "pascal" | "maxwell" | "kepler" => "V100-SXM2-32GB",
            _ => "RTX6000-Ada",
        }
    }
}

fn architecture_name(code: u32) -> Option<&'static str> {
    Some(match code {
        sys::NVML_DEVICE_ARCH_KEPLER => "kepler",
        sys::NVML_DEVICE_ARCH_MAXWELL => "maxwell",
        sys::NVML_DEVICE_ARCH_PASCAL => "pascal",
        sys::NVML_DEVICE_ARCH_VOLTA => "volta",
        sys::NVML_DEVICE_ARCH_TURING => "turing",
        sys::NVML_DEVICE_ARCH_AMPERE => "ampere",
        sys::NVML_DEVICE_ARCH_ADA => "ada",
        sys::NVML_DEVICE_ARCH_HOPPER => "hopper",
        sys::NVML_DEVICE_ARCH_BLACKWELL => "blackwell",
        _ => return None,
    })
}

fn brand_name(code: u32) -> &'static str {
    match code {
        sys::nvmlBrandType_enum_NVML_BRAND_QUADRO => "quadro",
        sys::nvmlBrandType_enum_NVML_BRAND_TESLA => "tesla",
        sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE => "geforce",
        sys::nvmlBrandType_enum_NVML_BRAND_TITAN => "titan",
        sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX => "nvidia_rtx",
        _ => "nvidia",
    }
}

fn table(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Table(table_of(pairs))
}

fn table_of(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Table {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn watts(mw: u32) -> Value {
    float(f64::from(mw) / 1000.0)
}

impl GpuRecording {
    fn new(index: u32, d: &Device) -> Result<GpuRecording, Error> {
        let what = |call: &str| format!("GPU {index}: {call}");
        let mut f = Table::new();
        let mut put = |k: &str, v: Value| {
            f.insert(k.to_string(), v);
        };
        let name = d.name().map_err(|e| fail(&what("nvmlDeviceGetName"), e))?;
        let architecture = d
            .architecture()
            .ok()
            .and_then(|a| architecture_name(a.as_c()))
            .unwrap_or("ampere");
        let memory = d
            .memory_info()
            .map_err(|e| fail(&what("nvmlDeviceGetMemoryInfo_v2"), e))?;
        let total_mib = memory.total / MIB;
        put(
            "model",
            Value::String(preset(&name, architecture, total_mib).into()),
        );
        put("name", Value::String(name));
        put(
            "uuid",
            Value::String(d.uuid().map_err(|e| fail(&what("nvmlDeviceGetUUID"), e))?),
        );
        let pci = d
            .pci_info()
            .map_err(|e| fail(&what("nvmlDeviceGetPciInfo_v3"), e))?;
        put("pci_bus_id", Value::String(pci.bus_id.clone()));
        put("pci_device_id", int(pci.pci_device_id.into()));
        if let Some(sub) = pci.pci_sub_system_id {
            put("pci_subsystem_id", int(sub.into()));
        }
        // A board without a serial (consumer cards) answers NOT_SUPPORTED; the scenario needs
        // one, so the UUID stands in, as unique as the serial would be.
        let serial = d.serial().or_else(|_| d.uuid()).unwrap_or_default();
        put("serial", Value::String(serial));
        if let Ok(v) = d.vbios_version() {
            put("vbios", Value::String(v));
        }
        put("architecture", Value::String(architecture.into()));
        if let Ok(b) = d.brand() {
            put("brand", Value::String(brand_name(b.as_c()).into()));
        }
        if let Ok(cc) = d.cuda_compute_capability() {
            put(
                "compute_capability",
                Value::Array(vec![cc.major.into(), cc.minor.into()]),
            );
        }
        if let Ok(minor) = d.minor_number() {
            put("minor_number", int(minor.into()));
        }
        put("memory_total_mib", int(total_mib));
        put("memory_reserved_mib", int(memory.reserved.div_ceil(MIB)));
        if let Ok(bar1) = d.bar1_memory_info() {
            put("bar1_total_mib", int(bar1.total / MIB));
            put("bar1_used_mib", int(bar1.used / MIB));
        }
        let mig = d.mig_mode().ok().map(|m| (m.current != 0, m.pending != 0));
        put("mig_capable", Value::Boolean(mig.is_some()));
        let instances = match mig {
            Some((true, _)) => {
                read_instances(d).map_err(|e| fail(&what("reading the MIG instances"), e))?
            }
            _ => Vec::new(),
        };
        let fans = d.num_fans().unwrap_or(0);
        put("fans", int(fans.into()));

        let mut power = Vec::new();
        if let Ok(mw) = d.enforced_power_limit() {
            power.push(("limit_w", watts(mw)));
        }
        if let Ok(mw) = d.power_management_limit_default() {
            power.push(("default_limit_w", watts(mw)));
        }
        if let Ok(c) = d.power_management_limit_constraints() {
            power.push(("min_limit_w", watts(c.min_limit)));
            power.push(("max_limit_w", watts(c.max_limit)));
        }
        put("power", table(power));

        let max = |c: Clock| {
            d.max_clock_info(c)
                .ok()
                .map(|m| table([("max", float(m.into()))]))
        };
        let clocks: Vec<_> = [
            ("sm", Clock::SM),
            ("memory", Clock::Memory),
            ("video", Clock::Video),
        ]
        .into_iter()
        .filter_map(|(k, c)| Some((k, max(c)?)))
        .collect();
        put("clocks", table(clocks));

        let thresholds: Vec<_> = [
            ("shutdown_c", TemperatureThreshold::Shutdown),
            ("slowdown_c", TemperatureThreshold::Slowdown),
            ("gpu_max_c", TemperatureThreshold::GpuMax),
            ("memory_max_c", TemperatureThreshold::MemoryMax),
        ]
        .into_iter()
        .filter_map(|(k, th)| Some((k, float(d.temperature_threshold(th).ok()?.into()))))
        .collect();
        put("thermal", table(thresholds));

        let mut pcie = Vec::new();
        for (k, v) in [
            ("max_generation", d.max_pcie_link_gen()),
            ("max_width", d.max_pcie_link_width()),
            ("generation", d.current_pcie_link_gen()),
            ("width", d.current_pcie_link_width()),
        ] {
            if let Ok(v) = v {
                pcie.push((k, int(v.into())));
            }
        }
        put("pcie", table(pcie));

        let mut links = 0;
        let mut down = Vec::new();
        while links < NVLINK_MAX_LINKS {
            match d.link_wrapper_for(links).is_active() {
                Ok(active) => {
                    if !active {
                        down.push(int(links.into()));
                    }
                    links += 1;
                }
                Err(_) => break,
            }
        }
        put(
            "nvlink",
            table([("links", int(links.into())), ("down", Value::Array(down))]),
        );

        let ecc_enabled = d.is_ecc_enabled().is_ok_and(|m| m.currently_enabled);
        let mut ecc = vec![("enabled", Value::Boolean(ecc_enabled))];
        if ecc_enabled {
            for (k, err) in [
                ("lifetime_corrected", MemoryError::Corrected),
                ("lifetime_uncorrected", MemoryError::Uncorrected),
            ] {
                let aggregate = d.total_ecc_errors(err, EccCounter::Aggregate);
                let volatile = d.total_ecc_errors(err, EccCounter::Volatile);
                if let (Ok(a), Ok(v)) = (aggregate, volatile) {
                    ecc.push((k, int(a.saturating_sub(v))));
                }
            }
        }
        put("ecc", table(ecc));

        if let Ok((correctable, uncorrectable, pending, failure)) = raw::remapped_rows(d) {
            put(
                "remapped_rows",
                table([
                    ("correctable", int(correctable.into())),
                    ("uncorrectable", int(uncorrectable.into())),
                    ("pending", Value::Boolean(pending)),
                    ("failure", Value::Boolean(failure)),
                ]),
            );
        }

        // Page retirement (before Ampere): the addresses; the simulator dates them all before
        // its start.
        let pages = |cause| {
            d.retired_pages(cause)
                .map(|p| Value::Array(p.iter().map(|p| int(p.address)).collect()))
        };
        if let (Ok(single), Ok(double)) = (
            pages(RetirementCause::MultipleSingleBitEccErrors),
            pages(RetirementCause::DoubleBitEccError),
        ) {
            put(
                "retired_pages",
                table([("single_bit", single), ("double_bit", double)]),
            );
        }

        let mut traces = Traces {
            fans: (0..fans).map(|_| Trace::default()).collect(),
            ..Traces::default()
        };
        for key in ["nvlink_tx_kib", "nvlink_rx_kib"]
            .into_iter()
            .chain(NVLINK_ERRORS.iter().map(|(k, _)| *k))
        {
            traces
                .links
                .insert(key, (0..links).map(|_| Trace::default()).collect());
        }
        Ok(GpuRecording {
            index,
            facts: f,
            links,
            mig,
            instances,
            process_utilization: (0, false),
            traces,
            processes: BTreeMap::new(),
        })
    }

    fn sample(&mut self, nvml: &Nvml, d: &Device, k: usize) {
        let t = &mut self.traces;
        let rates = d.utilization_rates();
        t.single("utilization")
            .push(rates.as_ref().map(|u| u.gpu).map_err(same_kind));
        t.single("memory_utilization").push(rates.map(|u| u.memory));
        t.single("encoder")
            .push(d.encoder_utilization().map(|u| u.utilization));
        t.single("decoder")
            .push(d.decoder_utilization().map(|u| u.utilization));
        t.single("memory_used_bytes")
            .push(d.memory_info().map(|m| m.used));
        t.single("power_mw").push(d.power_usage());
        t.single("temperature_c")
            .push(d.temperature(TemperatureSensor::Gpu));
        for (key, clock) in [
            ("graphics_mhz", Clock::Graphics),
            ("sm_mhz", Clock::SM),
            ("memory_mhz", Clock::Memory),
            ("video_mhz", Clock::Video),
        ] {
            t.single(key).push(d.clock_info(clock));
        }
        t.single("pstate")
            .push(d.performance_state().map(|p| p.as_c() as u64));
        t.single("clocks_event_reasons")
            .push(raw::clocks_event_reasons(d));
        for (fan, trace) in t.fans.iter_mut().enumerate() {
            trace.push(d.fan_speed(fan as u32));
        }
        t.single("pcie_tx_kb_s")
            .push(d.pcie_throughput(PcieUtilCounter::Send));
        t.single("pcie_rx_kb_s")
            .push(d.pcie_throughput(PcieUtilCounter::Receive));
        t.single("energy_mj").push(d.total_energy_consumption());
        for (key, policy) in POLICIES {
            t.violations
                .entry(key)
                .or_default()
                .push(d.violation_status(policy).map(|v| v.violation_time));
        }
        t.single("pcie_replays").push(d.pcie_replay_counter());
        for (key, err) in [
            ("ecc_corrected", MemoryError::Corrected),
            ("ecc_uncorrected", MemoryError::Uncorrected),
        ] {
            t.single(key)
                .push(d.total_ecc_errors(err, EccCounter::Volatile));
        }

        // Memory temperature and the NVLink data counters are field values: one call.
        let mut requests = vec![(field_id::NVML_FI_DEV_MEMORY_TEMP, 0)];
        for link in 0..self.links {
            requests.push((field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link));
            requests.push((field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link));
        }
        let answers = match raw::field_values(d, &requests) {
            Ok(answers) => answers,
            Err(e) => requests.iter().map(|_| Err(same_kind(&e))).collect(),
        };
        let mut answers = answers.into_iter();
        t.single("memory_temperature_c")
            .push(answers.next().unwrap_or(Err(NvmlError::Unknown)));
        for link in 0..self.links as usize {
            for key in ["nvlink_tx_kib", "nvlink_rx_kib"] {
                let answer = answers.next().unwrap_or(Err(NvmlError::Unknown));
                t.links.get_mut(key).expect("created with the GPU")[link].push(answer);
            }
        }
        for (key, counter) in NVLINK_ERRORS {
            for link in 0..self.links {
                let value = d.link_wrapper_for(link).error_counter(counter);
                t.links.get_mut(key).expect("created with the GPU")[link as usize].push(value);
            }
        }

        if !self.instances.is_empty() {
            let mut used: BTreeMap<u32, u64> = BTreeMap::new();
            for (gi, _, mig) in mig_devices(d) {
                if let Ok(m) = mig.memory_info() {
                    used.entry(gi).or_insert(m.used);
                }
            }
            for instance in &mut self.instances {
                let memory = used.get(&instance.id).copied().ok_or(NvmlError::NotFound);
                instance.memory.push(memory);
            }
        }

        // Per-process utilization: the average of the driver's samples since the last read.
        let mut utilization: BTreeMap<u32, ([u64; 4], u64)> = BTreeMap::new();
        match d.process_utilization_stats(self.process_utilization.0) {
            Ok(samples) => {
                for s in samples
                    .iter()
                    .filter(|s| s.timestamp > self.process_utilization.0)
                {
                    let (sum, n) = utilization.entry(s.pid).or_default();
                    let values = [s.sm_util, s.mem_util, s.enc_util, s.dec_util];
                    for (total, v) in sum.iter_mut().zip(values) {
                        *total += u64::from(v);
                    }
                    *n += 1;
                }
                if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                    self.process_utilization.0 = self.process_utilization.0.max(newest);
                }
            }
            Err(e) if unsupported(&e) => self.process_utilization.1 = true,
            Err(_) => {}
        }

        for (graphics, processes) in [
            (false, d.running_compute_processes()),
            (true, d.running_graphics_processes()),
        ] {
            for p in processes.unwrap_or_default() {
                let used = match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                };
                let seen = self.processes.entry(p.pid).or_insert_with(|| SeenProcess {
                    name: nvml.sys_process_name(p.pid, 256).unwrap_or_default(),
                    compute: false,
                    graphics: false,
                    used_bytes: used,
                    first: k,
                    last: k,
                    instance: p
                        .gpu_instance_id
                        .map(|gi| (gi, p.compute_instance_id.unwrap_or(0))),
                    utilization: Default::default(),
                });
                let average = utilization
                    .get(&p.pid)
                    .map(|(sum, n)| sum.map(|total| (total + n / 2) / n));
                for (i, trace) in seen.utilization.iter_mut().enumerate() {
                    // Samples before the process appeared take its first known value; a
                    // process in both lists is counted once per sample.
                    while trace.values.len() < k {
                        trace.values.push(None);
                    }
                    if trace.values.len() == k {
                        trace.values.push(average.map(|a| a[i]));
                    }
                }
                seen.last = k;
                seen.used_bytes = used;
                if graphics {
                    seen.graphics = true;
                } else {
                    seen.compute = true;
                }
            }
        }
    }

    /// The `[[gpu]]` table: facts, processes and the replay of `samples` samples `step` apart.
    fn table(&self, step: f64, samples: usize) -> Table {
        let mut gpu = self.facts.clone();
        let t = &self.traces;
        let supported = |key: &str| t.single.get(key).is_some_and(|tr| tr.series().is_some());
        gpu.insert("encoder".into(), Value::Boolean(supported("encoder")));
        gpu.insert("decoder".into(), Value::Boolean(supported("decoder")));
        // The idle draw only feeds the simulator's physics, which the replay bypasses; the least
        // power recorded keeps the scenario's check (idle below the default limit) true.
        if let Some(Value::Table(power)) = gpu.get_mut("power") {
            let default = power
                .get("default_limit_w")
                .and_then(Value::as_float)
                .unwrap_or(f64::MAX);
            let least = t
                .single
                .get("power_mw")
                .and_then(Trace::min)
                .map_or(0.0, |mw| mw as f64 / 1000.0);
            power.insert("idle_w".into(), float(least.min(default / 2.0)));
        }
        let mut replay = Table::new();
        replay.insert("step".into(), float(step));
        for (key, trace) in &t.single {
            if let Some(series) = trace.series() {
                replay.insert(key.to_string(), series);
            }
        }
        let violations: Table = t
            .violations
            .iter()
            .filter_map(|(k, tr)| Some((k.to_string(), tr.series()?)))
            .collect();
        if !violations.is_empty() {
            replay.insert("violation_ns".into(), Value::Table(violations));
        }
        if let Some(fans) = list_series(&t.fans) {
            replay.insert("fan_percent".into(), fans);
        }
        for (key, traces) in &t.links {
            if let Some(links) = list_series(traces) {
                replay.insert(key.to_string(), links);
            }
        }
        gpu.insert("replay".into(), Value::Table(replay));

        if let Some((enabled, pending)) = self.mig {
            let mut mig = Table::new();
            mig.insert("enabled".into(), Value::Boolean(enabled));
            mig.insert("pending".into(), Value::Boolean(pending));
            let instances: Vec<Value> = self
                .instances
                .iter()
                .map(|i| i.table(step, samples))
                .collect();
            if !instances.is_empty() {
                mig.insert("instance".into(), Value::Array(instances));
            }
            gpu.insert("mig".into(), Value::Table(mig));
        }

        // GPM averages feed the simulator's GPM counters through `load`.
        let load = gpm_load(&t.gpm, step, samples);
        if !load.is_empty() {
            gpu.insert("load".into(), Value::Table(load));
        }

        let processes: Vec<Value> = self
            .processes
            .iter()
            .map(|(pid, p)| {
                let kind = match (p.compute, p.graphics) {
                    (true, true) => "both",
                    (false, true) => "graphics",
                    _ => "compute",
                };
                let mut table = Table::new();
                table.insert("pid".into(), int((*pid).into()));
                table.insert("name".into(), Value::String(p.name.clone()));
                table.insert("used_memory_mib".into(), int(p.used_bytes / MIB));
                table.insert("kind".into(), Value::String(kind.into()));
                if p.first > 0 {
                    table.insert("from".into(), float(p.first as f64 * step));
                }
                if p.last + 1 < samples {
                    table.insert("to".into(), float((p.last + 1) as f64 * step));
                }
                if let Some((gi, ci)) = p.instance {
                    table.insert("gpu_instance".into(), int(gi.into()));
                    table.insert("compute_instance".into(), int(ci.into()));
                }
                let series: Option<Vec<Value>> = p.utilization.iter().map(Trace::series).collect();
                if let (false, Some([sm, memory, encoder, decoder])) = (
                    self.process_utilization.1,
                    series.and_then(|s| <[Value; 4]>::try_from(s).ok()),
                ) {
                    table.insert(
                        "replay".into(),
                        Value::Table(table_of([
                            ("step", float(step)),
                            ("sm", sm),
                            ("memory", memory),
                            ("encoder", encoder),
                            ("decoder", decoder),
                        ])),
                    );
                }
                Value::Table(table)
            })
            .collect();
        if !processes.is_empty() {
            gpu.insert("process".into(), Value::Array(processes));
        }
        gpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(results: Vec<Result<u64, NvmlError>>) -> Trace {
        let mut t = Trace::default();
        for r in results {
            t.push(r);
        }
        t
    }

    #[test]
    fn gaps_repeat_the_value_before_and_unsupported_is_left_out() {
        let t = trace(vec![
            Err(NvmlError::Timeout),
            Ok(5),
            Err(NvmlError::Unknown),
            Ok(9),
        ]);
        assert_eq!(t.failures, 2);
        let want = Value::Array(vec![int(5), int(5), int(5), int(9)]);
        assert_eq!(t.series(), Some(want));
        assert_eq!(trace(vec![Ok(3), Ok(3)]).series(), Some(int(3)));
        assert_eq!(
            trace(vec![Ok(3), Err(NvmlError::NotSupported)]).series(),
            None
        );
        assert_eq!(trace(vec![Err(NvmlError::Unknown)]).series(), None);
        // One unsupported link makes the whole per-link list unsupported.
        let links = [
            trace(vec![Ok(1)]),
            trace(vec![Err(NvmlError::NotSupported)]),
        ];
        assert_eq!(list_series(&links), None);
        assert_eq!(list_series(&[]), None);
    }

    #[test]
    fn the_preset_follows_the_name_then_the_architecture() {
        assert_eq!(
            preset("NVIDIA H100 80GB HBM3", "hopper", 81559),
            "H100-SXM5-80GB"
        );
        assert_eq!(
            preset("NVIDIA A100-SXM4-80GB", "ampere", 81920),
            "A100-SXM4-80GB"
        );
        assert_eq!(
            preset("NVIDIA A100-PCIE-40GB", "ampere", 40960),
            "A100-SXM4-40GB"
        );
        assert_eq!(preset("NVIDIA L4", "ada", 23034), "L4");
        assert_eq!(preset("NVIDIA L40S", "ada", 46068), "RTX6000-Ada");
        assert_eq!(preset("NVIDIA A10", "ampere", 23028), "A100-SXM4-40GB");
    }
}

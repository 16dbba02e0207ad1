//! One GPU being recorded: its static facts, read once, and its readings at each sample, written
//! as the scenario's `[[gpu]]` table.

use std::collections::BTreeMap;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{self as sys, field_id};
use toml::{Table, Value};

use crate::gpm::gpm_load;
use crate::mig::{InstanceRecording, mig_devices, read_instances};
use crate::trace::{
    Trace, float, int, list_series, same_kind, table, table_of, unsupported, watts,
};
use nvml_exporter::nvml::raw;

use crate::{Error, MIB, fail};

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

/// A process seen on a GPU: when first and last, as what, holding how much.
#[derive(Debug)]
pub(crate) struct SeenProcess {
    pub(crate) name: String,
    pub(crate) compute: bool,
    pub(crate) graphics: bool,
    pub(crate) used_bytes: u64,
    pub(crate) first: usize,
    pub(crate) last: usize,
    /// (GPU instance, compute instance) on a GPU in MIG mode.
    pub(crate) instance: Option<(u32, u32)>,
    /// `nvmlDeviceGetProcessUtilization` per sample: sm, memory, encoder, decoder (percent).
    pub(crate) utilization: [Trace; 4],
}

/// The readings of one GPU, one entry per sample.
#[derive(Debug, Default)]
pub(crate) struct Traces {
    /// GPM averages per `load` key, one per window between two samples.
    pub(crate) gpm: BTreeMap<&'static str, Vec<f64>>,
    pub(crate) single: BTreeMap<&'static str, Trace>,
    pub(crate) violations: BTreeMap<&'static str, Trace>,
    pub(crate) fans: Vec<Trace>,
    pub(crate) links: BTreeMap<&'static str, Vec<Trace>>,
}

impl Traces {
    fn single(&mut self, key: &'static str) -> &mut Trace {
        self.single.entry(key).or_default()
    }
}

/// One GPU being recorded.
#[derive(Debug)]
pub(crate) struct GpuRecording {
    pub(crate) index: u32,
    /// The `[[gpu]]` keys read once.
    pub(crate) facts: Table,
    pub(crate) links: u32,
    /// MIG mode (current, pending), when the GPU has MIG.
    pub(crate) mig: Option<(bool, bool)>,
    /// The GPU instances, when MIG mode is on.
    pub(crate) instances: Vec<InstanceRecording>,
    /// Newest per-process utilization sample read (µs), and whether the GPU has none to give.
    pub(crate) process_utilization: (u64, bool),
    pub(crate) traces: Traces,
    pub(crate) processes: BTreeMap<u32, SeenProcess>,
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

impl GpuRecording {
    pub(crate) fn new(index: u32, d: &Device) -> Result<GpuRecording, Error> {
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
        // The management limit, and the enforced one where another limiter holds the board
        // below it (a board that answers only one of them gets it as its limit).
        let management = d.power_management_limit().ok();
        let enforced = d.enforced_power_limit().ok();
        if let Some(mw) = management.or(enforced) {
            power.push(("limit_w", watts(mw)));
        }
        if let (Some(m), Some(e)) = (management, enforced)
            && e < m
        {
            power.push(("enforced_limit_w", watts(e)));
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

        if let Ok(rows) = raw::remapped_rows(d) {
            put(
                "remapped_rows",
                table([
                    ("correctable", int(rows.correctable.into())),
                    ("uncorrectable", int(rows.uncorrectable.into())),
                    ("pending", Value::Boolean(rows.pending)),
                    ("failure", Value::Boolean(rows.failure_occurred)),
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
            let pending = d.are_pages_pending_retired().unwrap_or(false);
            put(
                "retired_pages",
                table([
                    ("single_bit", single),
                    ("double_bit", double),
                    ("pending", Value::Boolean(pending)),
                ]),
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

    pub(crate) fn sample(&mut self, nvml: &Nvml, d: &Device, k: usize) {
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
            .push(clocks_event_reasons(d));
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
        // Every field the recorder asks for is an integer.
        let answers: Vec<Result<u64, NvmlError>> = match raw::field_values(d, &requests) {
            Ok(answers) => answers
                .into_iter()
                .map(|a| a.and_then(|v| v.as_u64().ok_or(NvmlError::Unknown)))
                .collect(),
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
    pub(crate) fn table(&self, step: f64, samples: usize) -> Table {
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

/// The active clock-event reasons as the raw bitmask, read as the exporter reads it: the call's
/// CUDA 12.2 name, else (an older library) nvml-wrapper's throttle reasons.
fn clocks_event_reasons(d: &Device) -> Result<u64, NvmlError> {
    match raw::current_clocks_event_reasons(d) {
        Err(NvmlError::FailedToLoadSymbol(_)) => d.current_throttle_reasons().map(|r| r.bits()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

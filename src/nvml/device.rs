//! Reading one device for one tick: every row of the "Device metrics" table in METRICS.md and
//! the GPM saturation metrics (see [`super::gpm`]), in base units. Every call goes through the
//! read's call ledger ([`super::ledger`]), which skips what the device does not support, sorts
//! failures into "device lost", "driver gone" and "counted error", and gives the read's
//! [`Verdict`].

use std::sync::Arc;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor, TemperatureThreshold as NvmlThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter as NvLinkCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};

use super::discovery::device_identity;
use super::error::ErrorCounter;
use super::gpm::{GpmState, read_gpm};
use super::ledger::{CallLedger, Unsupported, Verdict};
use super::mig::MigReader;
use super::processes::ProcessReader;
use super::raw;
use super::units::{kib_to_bytes, mhz_to_hz, mj_to_j, mw_to_w, ns_to_s, percent_to_ratio};
use crate::groups::{Group, Groups};
use crate::health::rules::{self, Reading};
use crate::sample::{
    Bar1MemoryInfo, ClockDomain, ClockEventReason, DeviceInfo, DeviceSample, EccCounts, Lost,
    MemoryInfo, NvLinkErrorType, NvLinkSample, RemappedRows, RetiredPages, TemperatureThreshold,
    ThrottleReason,
};

/// Upper bound of NVLink link indices probed (`NVML_NVLINK_MAX_LINKS` in the CUDA 13 `nvml.h`;
/// nvml-wrapper-sys 0.10 still says 18). Probing stops at the first link the device rejects.
pub const NVLINK_MAX_LINKS: u32 = 36;

/// The result of reading a device once.
#[derive(Debug, Clone)]
pub struct ReadOutcome {
    /// The readings; `up` is true when the verdict is [`Verdict::Up`]. `stale` is always false
    /// here.
    pub sample: DeviceSample,
    /// What the read says of the device: lost (its readings are then empty), driver gone,
    /// unanswered (nothing read: not a reading), or up.
    pub verdict: Verdict,
    /// The driver no longer lists a device at this index (the handle lookup answered
    /// INVALID_ARGUMENT or NOT_FOUND): the device set changed and needs rediscovery.
    pub vanished: bool,
}

/// Reads one device, tick after tick, remembering what it does not support and its previous GPM
/// sample. Holds the `Nvml` it reads from (one NVML session), so it owns everything a read needs
/// and can move from one reader thread to another.
pub struct DeviceReader {
    nvml: Arc<Nvml>,
    index: u32,
    errors: Arc<ErrorCounter>,
    /// uuid and static info, read on the first successful attempt, and again after the device
    /// was lost (another GPU may answer at this index when it comes back).
    identity: Option<(String, Arc<DeviceInfo>)>,
    /// The device was lost or vanished: read the identity again once it answers.
    recheck_identity: bool,
    /// (C function, argument) pairs that answered NOT_SUPPORTED: skipped from then on.
    unsupported: Unsupported,
    /// Number of NVLink links, found on the first tick that could probe them.
    nvlink_count: Option<u32>,
    /// The previous GPM samples (the GPU's and its MIG instances') and GPM support.
    gpm: GpmState,
    /// Reads the device's processes each tick (`--processes`); `None` when off.
    processes: Option<ProcessReader>,
    /// Reads the GPU instances while MIG mode is on.
    mig: MigReader,
    /// The collector groups: a call no group on needs is not made.
    groups: Groups,
    /// A read has panicked (a bug): logged the first time only.
    panicked: bool,
}

impl DeviceReader {
    /// A reader for the device at NVML `index` of `nvml`; failures are counted in `errors`.
    pub fn new(nvml: Arc<Nvml>, index: u32, errors: Arc<ErrorCounter>) -> Self {
        DeviceReader {
            nvml,
            index,
            errors,
            identity: None,
            recheck_identity: false,
            unsupported: Unsupported::default(),
            nvlink_count: None,
            gpm: GpmState::new(),
            processes: None,
            mig: MigReader::new(),
            groups: Groups::all(),
            panicked: false,
        }
    }

    /// Makes only the calls that the families of `groups` need from the next read on (every call
    /// until set).
    pub fn set_groups(&mut self, groups: Groups) {
        self.groups = groups;
        self.gpm.set_groups(groups);
    }

    /// Reads the device's processes from the next read on, looking them up below `host_proc`;
    /// `None`: no longer reads them. A reader already using that procfs is kept, with its cache.
    pub fn set_processes(&mut self, host_proc: Option<&std::path::Path>) {
        match host_proc {
            None => self.processes = None,
            Some(root)
                if self
                    .processes
                    .as_ref()
                    .is_some_and(|p| p.host_proc() == root) => {}
            Some(root) => self.processes = Some(ProcessReader::new(root)),
        }
    }

    /// The device's NVML index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The device's uuid, once it has been read.
    pub fn uuid(&self) -> Option<&str> {
        self.identity.as_ref().map(|(u, _)| u.as_str())
    }

    /// The outcome of a read that panicked (a bug): nothing read, as when every call fails, so
    /// the GPU is served stale, then down, and is read again at the next tick. The GPM window
    /// and the identity start again, since the read may have stopped halfway. Logged the first
    /// time only, so a read that panics every tick does not flood the log.
    pub fn panicked(&mut self) -> ReadOutcome {
        if !self.panicked {
            self.panicked = true;
            tracing::error!(
                gpu = self.index,
                "reading the device panicked; it counts as a failed read (logged once)"
            );
        }
        self.gpm.forget();
        self.recheck_identity = true;
        let mut sample = DeviceSample {
            index: self.index,
            ..DeviceSample::default()
        };
        if let Some((uuid, info)) = &self.identity {
            sample.uuid = uuid.clone();
            sample.info = info.clone();
        }
        ReadOutcome {
            sample,
            verdict: Verdict::Unanswered,
            vanished: false,
        }
    }

    /// Reads every device metric once, as tick number `tick_number` of the session. Never
    /// fails: what cannot be read is `None`/empty.
    pub fn read(&mut self, tick_number: u64) -> ReadOutcome {
        let DeviceReader {
            nvml,
            index,
            errors,
            identity,
            recheck_identity,
            unsupported,
            nvlink_count,
            gpm,
            processes,
            mig,
            groups,
            panicked: _,
        } = self;
        let groups = *groups;
        let index = *index;
        gpm.begin_tick(tick_number);
        let mut ledger = CallLedger::new(index, errors, unsupported);
        // The handle is fetched per tick (cheap) so no `Device<'nvml>` outlives this call. It is
        // never remembered as unsupported: without a handle there is nothing else to read. Its
        // success is no answer: the driver resolves a handle for a board that answers nothing.
        ledger.count_call();
        let mut vanished = false;
        let device = match nvml.device_by_index(index) {
            Ok(d) => Some(d),
            Err(e) => {
                vanished = matches!(e, NvmlError::InvalidArg | NvmlError::NotFound);
                ledger.fail("nvmlDeviceGetHandleByIndex_v2", 0, &e);
                ledger.forget_unsupported("nvmlDeviceGetHandleByIndex_v2", 0);
                None
            }
        };
        let mut sample = DeviceSample {
            index,
            ..DeviceSample::default()
        };
        if let Some(device) = device {
            if identity.is_none() || *recheck_identity {
                let found = device_identity(&device, index, errors);
                // An empty uuid means the device did not answer (e.g. lost): try again next tick.
                if !found.0.is_empty() {
                    *identity = Some(found);
                    *recheck_identity = false;
                }
            }
            // GPM first: its sample then falls at the same point of every tick, so the windows
            // stay close to one interval whatever the other calls cost.
            if groups.any(GPM_GROUPS) {
                (sample.gpm_supported, sample.gpm) = read_gpm(&mut ledger, nvml, &device, gpm);
            }
            read_metrics(&mut ledger, &device, nvlink_count, &mut sample, groups);
            // Processes in MIG instances are attributed to them, so they need the instances too;
            // the health verdict needs only the mode.
            let instances = groups.contains(Group::Mig) || processes.is_some();
            if instances || reads(groups, &[], Reading::MigMode) {
                sample.mig_mode = ledger
                    .call("nvmlDeviceGetMigMode", 0, || device.mig_mode())
                    .map(|m| m.current == 1);
            }
            // Enumerated every tick (a reconfiguration shows at once); MIG off drops the
            // instances' GPM windows so a later layout starts clean.
            let mig_mode = instances && sample.mig_mode == Some(true);
            let mut mig_handles = Vec::new();
            if mig_mode {
                (sample.mig_instances, mig_handles) = mig.read(&mut ledger, nvml, &device, gpm);
            } else {
                gpm.retain_instances(&[]);
            }
            if let Some(reader) = processes {
                let mig_handles = mig_mode.then_some(mig_handles.as_slice());
                sample.processes = reader.read(&mut ledger, nvml, &device, mig_handles);
            }
        } else {
            gpm.forget();
        }
        if let Some((uuid, info)) = identity.as_ref() {
            sample.uuid = uuid.clone();
            sample.info = info.clone();
        }
        let verdict = if vanished {
            Verdict::Lost
        } else {
            ledger.verdict()
        };
        let lost = match ledger.lost_kind() {
            Some(kind) => Some(kind),
            None if vanished => Some(Lost::OffTheBus),
            None => None,
        };
        if verdict == Verdict::Lost {
            *recheck_identity = true;
            // The next sample after a loss must not close a window that spans it.
            gpm.forget();
            // A lost device serves only info + up=0: drop whatever was read before the loss.
            sample = DeviceSample {
                index: sample.index,
                uuid: sample.uuid,
                info: sample.info,
                lost,
                ..DeviceSample::default()
            };
        }
        sample.up = verdict == Verdict::Up;
        ReadOutcome {
            sample,
            verdict,
            vanished,
        }
    }
}

/// The groups whose families come from GPM.
const GPM_GROUPS: &[Group] = &[
    Group::Saturation,
    Group::Pipes,
    Group::Media,
    Group::Bandwidth,
];

fn read_metrics(
    t: &mut CallLedger,
    d: &Device,
    nvlink_count: &mut Option<u32>,
    s: &mut DeviceSample,
    groups: Groups,
) {
    if groups.contains(Group::Utilization) {
        read_utilization(t, d, s);
    }
    if groups.contains(Group::Media) {
        read_media(t, d, s);
    }
    if groups.contains(Group::Memory) {
        s.memory = t
            .call("nvmlDeviceGetMemoryInfo_v2", 0, || d.memory_info())
            .map(|m| MemoryInfo {
                total_bytes: m.total as f64,
                used_bytes: m.used as f64,
                free_bytes: m.free as f64,
                reserved_bytes: m.reserved as f64,
            });
    }
    if groups.contains(Group::Bar1) {
        s.bar1_memory = t
            .call("nvmlDeviceGetBAR1MemoryInfo", 0, || d.bar1_memory_info())
            .map(|m| Bar1MemoryInfo {
                total_bytes: m.total as f64,
                used_bytes: m.used as f64,
            });
    }
    if groups.contains(Group::Power) {
        read_power(t, d, s);
    }
    if groups.contains(Group::PowerLimits) {
        s.power_management_limit_watts = t
            .call("nvmlDeviceGetPowerManagementLimit", 0, || {
                d.power_management_limit()
            })
            .map(mw_to_w);
    }
    read_thermal(t, d, s, groups);
    read_clocks(t, d, s, groups);
    read_pcie(t, d, s, groups);
    read_memory_errors(t, d, s, groups);
    read_driver_flags(t, d, s, groups);
    if groups.any(&[Group::Nvlink, Group::NvlinkLinks]) {
        s.nvlinks = read_nvlinks(t, d, nvlink_count);
    } else if reads(groups, &[], Reading::LinkStates) {
        s.nvlinks = link_states(t, d, nvlink_count);
    }
    if reads(
        groups,
        &[Group::Fabric, Group::FabricHealth],
        Reading::Fabric,
    ) {
        s.fabric = super::fabric::read_fabric(t, d);
    }
}

/// What the driver itself says the GPU needs: its recovery action (R565 and newer), the
/// unrepairable-memory flag (R590 and newer) and the SRAM error threshold (root only). Only the
/// health verdict reads them.
fn read_driver_flags(t: &mut CallLedger, d: &Device, s: &mut DeviceSample, groups: Groups) {
    if reads(groups, &[], Reading::RecoveryAction) {
        let field = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
        let fields = t.batch("nvmlDeviceGetFieldValues", field, || {
            raw::field_values(d, &[(field, 0)])
        });
        if let Some(r) = fields.and_then(|mut v| v.pop()) {
            s.recovery_action = t
                .field("nvmlDeviceGetFieldValues", field, r)
                .and_then(raw::FieldValue::as_u64);
        }
    }
    if reads(groups, &[], Reading::UnrepairableMemory) {
        s.unrepairable_memory = t.call("nvmlDeviceGetUnrepairableMemoryFlag_v1", 0, || {
            raw::unrepairable_memory(d)
        });
    }
    if reads(groups, &[], Reading::SramErrors) {
        s.sram_threshold_exceeded = t.call_as_root("nvmlDeviceGetSramEccErrorStatus", 0, || {
            raw::sram_threshold_exceeded(d)
        });
    }
}

/// Whether `reading` is read: a group of `on` is on, or the health group is and a rule of its
/// table reads it ([`rules::needs`]).
fn reads(groups: Groups, on: &[Group], reading: Reading) -> bool {
    groups.any(on) || (groups.contains(Group::Health) && rules::needs(reading))
}

fn read_utilization(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    if let Some(u) = t.call("nvmlDeviceGetUtilizationRates", 0, || d.utilization_rates()) {
        s.utilization = Some(percent_to_ratio(u.gpu));
        s.memory_utilization = Some(percent_to_ratio(u.memory));
    }
}

fn read_media(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    s.encoder_utilization = t
        .call("nvmlDeviceGetEncoderUtilization", 0, || {
            d.encoder_utilization()
        })
        .map(|u| percent_to_ratio(u.utilization));
    s.decoder_utilization = t
        .call("nvmlDeviceGetDecoderUtilization", 0, || {
            d.decoder_utilization()
        })
        .map(|u| percent_to_ratio(u.utilization));
}

fn read_power(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    s.power_watts = t
        .call("nvmlDeviceGetPowerUsage", 0, || d.power_usage())
        .map(mw_to_w);
    s.power_limit_watts = t
        .call("nvmlDeviceGetEnforcedPowerLimit", 0, || {
            d.enforced_power_limit()
        })
        .map(mw_to_w);
    s.energy_joules = t
        .call("nvmlDeviceGetTotalEnergyConsumption", 0, || {
            d.total_energy_consumption()
        })
        .map(mj_to_j);
}

fn read_thermal(t: &mut CallLedger, d: &Device, s: &mut DeviceSample, groups: Groups) {
    if groups.contains(Group::ThermalThresholds) {
        read_thresholds(t, d, s);
    }
    if !groups.contains(Group::Thermal) {
        return;
    }
    s.temperature_celsius = t
        .call("nvmlDeviceGetTemperature", 0, || {
            d.temperature(TemperatureSensor::Gpu)
        })
        .map(f64::from);
    let fields = t.batch("nvmlDeviceGetFieldValues", NVML_FI_DEV_MEMORY_TEMP, || {
        raw::field_values(d, &[(NVML_FI_DEV_MEMORY_TEMP, 0)])
    });
    if let Some(r) = fields.and_then(|mut v| v.pop()) {
        s.memory_temperature_celsius = t
            .field("nvmlDeviceGetFieldValues", NVML_FI_DEV_MEMORY_TEMP, r)
            .map(raw::FieldValue::as_f64);
    }
    let fans = t
        .call("nvmlDeviceGetNumFans", 0, || d.num_fans())
        .unwrap_or(0);
    for fan in 0..fans {
        if let Some(pct) = t.call("nvmlDeviceGetFanSpeed_v2", fan, || d.fan_speed(fan)) {
            s.fan_speeds.push((fan, percent_to_ratio(pct)));
        }
    }
}

fn read_thresholds(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    for (i, (ours, theirs)) in [
        (TemperatureThreshold::Slowdown, NvmlThreshold::Slowdown),
        (TemperatureThreshold::Shutdown, NvmlThreshold::Shutdown),
        (TemperatureThreshold::GpuMax, NvmlThreshold::GpuMax),
        (TemperatureThreshold::MemoryMax, NvmlThreshold::MemoryMax),
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(c) = t.call("nvmlDeviceGetTemperatureThreshold", i as u32, || {
            d.temperature_threshold(theirs)
        }) {
            s.temperature_thresholds.push((ours, f64::from(c)));
        }
    }
}

fn read_clocks(t: &mut CallLedger, d: &Device, s: &mut DeviceSample, groups: Groups) {
    if groups.contains(Group::Clocks) {
        read_frequencies(t, d, s);
    }
    // The thermal group's slowdown flag is read from the clock-event reasons too.
    if reads(
        groups,
        &[Group::ClockEvents, Group::Thermal],
        Reading::ClockEvents,
    ) {
        read_clock_events(t, d, s);
    }
    if groups.contains(Group::ClockEvents) {
        for (i, reason) in ThrottleReason::ALL.iter().enumerate() {
            if let Some(v) = t.call("nvmlDeviceGetViolationStatus", i as u32, || {
                d.violation_status(perf_policy(*reason))
            }) {
                s.throttle_seconds
                    .push((*reason, ns_to_s(v.violation_time)));
            }
        }
    }
}

fn read_frequencies(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    for (i, (ours, theirs)) in [
        (ClockDomain::Graphics, Clock::Graphics),
        (ClockDomain::Sm, Clock::SM),
        (ClockDomain::Memory, Clock::Memory),
        (ClockDomain::Video, Clock::Video),
    ]
    .into_iter()
    .enumerate()
    {
        let arg = i as u32;
        if let Some(mhz) = t.call("nvmlDeviceGetClockInfo", arg, || d.clock_info(theirs)) {
            s.clocks_hertz.push((ours, mhz_to_hz(mhz)));
        }
        if let Some(mhz) = t.call("nvmlDeviceGetMaxClockInfo", arg, || {
            d.max_clock_info(theirs)
        }) {
            s.max_clocks_hertz.push((ours, mhz_to_hz(mhz)));
        }
    }
    s.performance_state = t
        .call("nvmlDeviceGetPerformanceState", 0, || d.performance_state())
        .map(|p| p.as_c())
        // NVML_PSTATE_UNKNOWN (32) is not a state: omit it rather than export a sentinel.
        .filter(|p| *p <= 15);
}

fn read_clock_events(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    // The new name first; a library older than CUDA 12.2 only exports the ThrottleReasons name,
    // whose bits are the same.
    let has_new_name = d
        .nvml()
        .lib()
        .nvmlDeviceGetCurrentClocksEventReasons
        .is_ok();
    let mask = if has_new_name {
        t.call("nvmlDeviceGetCurrentClocksEventReasons", 0, || {
            raw::current_clocks_event_reasons(d)
        })
    } else {
        t.call("nvmlDeviceGetCurrentClocksThrottleReasons", 0, || {
            d.current_throttle_reasons().map(|r| r.bits())
        })
    };
    if let Some(mask) = mask {
        s.clock_events = decode_clock_events(mask);
    }
}

/// Every known clock-event reason with whether its bit is set in `mask`.
pub fn decode_clock_events(mask: u64) -> Vec<(ClockEventReason, bool)> {
    ClockEventReason::ALL
        .iter()
        .map(|r| (*r, mask & r.mask() != 0))
        .collect()
}

/// The `nvmlPerfPolicyType_t` behind each throttle reason label.
fn perf_policy(reason: ThrottleReason) -> PerformancePolicy {
    match reason {
        ThrottleReason::Power => PerformancePolicy::Power,
        ThrottleReason::Thermal => PerformancePolicy::Thermal,
        ThrottleReason::SyncBoost => PerformancePolicy::SyncBoost,
        ThrottleReason::BoardLimit => PerformancePolicy::BoardLimit,
        ThrottleReason::LowUtilization => PerformancePolicy::LowUtilization,
        ThrottleReason::Reliability => PerformancePolicy::Reliability,
        ThrottleReason::AppClocks => PerformancePolicy::TotalAppClocks,
        ThrottleReason::BaseClocks => PerformancePolicy::TotalBaseClocks,
    }
}

fn read_pcie(t: &mut CallLedger, d: &Device, s: &mut DeviceSample, groups: Groups) {
    let p = &mut s.pcie;
    if groups.contains(Group::Pcie) {
        p.transmit_bytes_per_second = t
            .call("nvmlDeviceGetPcieThroughput", 0, || {
                d.pcie_throughput(PcieUtilCounter::Send)
            })
            .map(|kb| kib_to_bytes(u64::from(kb)) as f64);
        p.receive_bytes_per_second = t
            .call("nvmlDeviceGetPcieThroughput", 1, || {
                d.pcie_throughput(PcieUtilCounter::Receive)
            })
            .map(|kb| kib_to_bytes(u64::from(kb)) as f64);
    }
    if reads(groups, &[Group::Pcie], Reading::PcieReplays) {
        p.replay_errors = t
            .call("nvmlDeviceGetPcieReplayCounter", 0, || {
                d.pcie_replay_counter()
            })
            .map(u64::from);
    }
    if reads(groups, &[Group::PcieLink], Reading::PcieLink) {
        read_pcie_link(t, d, s);
    }
}

fn read_pcie_link(t: &mut CallLedger, d: &Device, s: &mut DeviceSample) {
    let p = &mut s.pcie;
    p.link_generation_current = t.call("nvmlDeviceGetCurrPcieLinkGeneration", 0, || {
        d.current_pcie_link_gen()
    });
    p.link_generation_max = t.call("nvmlDeviceGetMaxPcieLinkGeneration", 0, || {
        d.max_pcie_link_gen()
    });
    p.link_width_current = t.call("nvmlDeviceGetCurrPcieLinkWidth", 0, || {
        d.current_pcie_link_width()
    });
    p.link_width_max = t.call("nvmlDeviceGetMaxPcieLinkWidth", 0, || {
        d.max_pcie_link_width()
    });
}

fn read_memory_errors(t: &mut CallLedger, d: &Device, s: &mut DeviceSample, groups: Groups) {
    let ecc = |t: &mut CallLedger, base: u32, counter: EccCounter| {
        let corrected = t.call("nvmlDeviceGetTotalEccErrors", base, || {
            d.total_ecc_errors(MemoryError::Corrected, counter)
        })?;
        let uncorrected = t.call("nvmlDeviceGetTotalEccErrors", base + 1, || {
            d.total_ecc_errors(MemoryError::Uncorrected, counter)
        })?;
        Some(EccCounts {
            corrected,
            uncorrected,
        })
    };
    if reads(groups, &[Group::Ecc], Reading::EccVolatile) {
        s.ecc_volatile = ecc(t, 0, EccCounter::Volatile);
    }
    if groups.contains(Group::EccLifetime) {
        s.ecc_aggregate = ecc(t, 2, EccCounter::Aggregate);
    }
    let memory = [Group::RowRemap, Group::EccLifetime];
    if reads(groups, &memory, Reading::RemappedRows) {
        s.remapped_rows = t
            .call("nvmlDeviceGetRemappedRows", 0, || raw::remapped_rows(d))
            .map(|r| RemappedRows {
                correctable: u64::from(r.correctable),
                uncorrectable: u64::from(r.uncorrectable),
                pending: r.pending,
                failed: r.failure_occurred,
            });
    }
    if !reads(groups, &memory, Reading::RetiredPages) {
        return;
    }

    let single = t.call("nvmlDeviceGetRetiredPages_v2", 0, || {
        d.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
    });
    let double = t.call("nvmlDeviceGetRetiredPages_v2", 1, || {
        d.retired_pages(RetirementCause::DoubleBitEccError)
    });
    if let (Some(single), Some(double)) = (single, double) {
        s.retired_pages = Some(RetiredPages {
            single_bit_ecc: single.len() as u64,
            double_bit_ecc: double.len() as u64,
            pending: t.call("nvmlDeviceGetRetiredPagesPendingStatus", 0, || {
                d.are_pages_pending_retired()
            }),
        });
    }
}

fn read_nvlinks(
    t: &mut CallLedger,
    d: &Device,
    nvlink_count: &mut Option<u32>,
) -> Vec<NvLinkSample> {
    let mut links = link_states(t, d, nvlink_count);
    if !links.is_empty() {
        read_link_throughput(t, d, &mut links);
        read_link_errors(t, d, &mut links);
    }
    links
}

/// Each link and whether it is up; on the first tick, probing how many links there are.
fn link_states(
    t: &mut CallLedger,
    d: &Device,
    nvlink_count: &mut Option<u32>,
) -> Vec<NvLinkSample> {
    let mut links = Vec::new();
    match *nvlink_count {
        Some(count) => {
            for link in 0..count {
                // A call that failed says nothing of the link: neither up nor down.
                let up = t.call("nvmlDeviceGetNvLinkState", link, || {
                    d.link_wrapper_for(link).is_active()
                });
                links.push(NvLinkSample {
                    link,
                    up,
                    ..NvLinkSample::default()
                });
            }
        }
        None => {
            // First tick: probe links until the device rejects an index. Rejection is how NVML
            // says "no such link", so it is neither counted nor remembered as unsupported.
            for link in 0..NVLINK_MAX_LINKS {
                if t.lost() {
                    return links;
                }
                t.count_call();
                match d.link_wrapper_for(link).is_active() {
                    Ok(up) => {
                        t.count_answer();
                        links.push(NvLinkSample {
                            link,
                            up: Some(up),
                            ..NvLinkSample::default()
                        });
                    }
                    Err(
                        NvmlError::NotSupported
                        | NvmlError::InvalidArg
                        | NvmlError::NotFound
                        | NvmlError::FailedToLoadSymbol(_),
                    ) => break,
                    Err(e) => {
                        // The probe was cut short by a real failure: try again next tick.
                        t.fail("nvmlDeviceGetNvLinkState", link, &e);
                        return Vec::new();
                    }
                }
            }
            *nvlink_count = Some(links.len() as u32);
        }
    }
    links
}

/// The bytes each link has transmitted and received.
fn read_link_throughput(t: &mut CallLedger, d: &Device, links: &mut [NvLinkSample]) {
    // TX/RX data counters of every link in one field-value call; scope = link.
    let requests: Vec<(u32, u32)> = links
        .iter()
        .flat_map(|l| {
            [
                (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, l.link),
                (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, l.link),
            ]
        })
        .collect();
    if let Some(values) = t.batch(
        "nvmlDeviceGetFieldValues",
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        || raw::field_values(d, &requests),
    ) {
        let mut values = values.into_iter();
        for l in links.iter_mut() {
            let (Some(tx), Some(rx)) = (values.next(), values.next()) else {
                break;
            };
            let link = l.link;
            let mut kib = |field: u32, r: Result<raw::FieldValue, NvmlError>| {
                // A per-link key, distinct from the whole call's, so one link's NOT_SUPPORTED
                // does not switch off the call for every link.
                t.field("nvmlDeviceGetFieldValues", field | ((link + 1) << 16), r)
                    .and_then(raw::FieldValue::as_u64)
                    .map(kib_to_bytes)
            };
            l.transmit_bytes = kib(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, tx);
            l.receive_bytes = kib(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, rx);
        }
    }
}

/// Each link's error counters.
fn read_link_errors(t: &mut CallLedger, d: &Device, links: &mut [NvLinkSample]) {
    for l in links.iter_mut() {
        for (i, (ours, theirs)) in [
            (NvLinkErrorType::CrcFlit, NvLinkCounter::DlCrcFlit),
            (NvLinkErrorType::CrcData, NvLinkCounter::DlCrcData),
            (NvLinkErrorType::Replay, NvLinkCounter::DlReplay),
            (NvLinkErrorType::Recovery, NvLinkCounter::DlRecovery),
        ]
        .into_iter()
        .enumerate()
        {
            // One argument per (link, counter) so NOT_SUPPORTED is remembered for exactly that.
            let arg = l.link * 4 + i as u32;
            if let Some(n) = t.call("nvmlDeviceGetNvLinkErrorCounter", arg, || {
                d.link_wrapper_for(l.link).error_counter(theirs)
            }) {
                l.errors.set(ours, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_event_mask_decodes_every_reason() {
        let events = decode_clock_events(0x4 | 0x40);
        assert_eq!(events.len(), ClockEventReason::ALL.len());
        let active: Vec<_> = events
            .iter()
            .filter(|(_, on)| *on)
            .map(|(r, _)| *r)
            .collect();
        assert_eq!(
            active,
            vec![
                ClockEventReason::SwPowerCap,
                ClockEventReason::HwThermalSlowdown
            ]
        );
        assert!(decode_clock_events(0).iter().all(|(_, on)| !on));
    }

    #[test]
    fn throttle_reasons_map_to_distinct_policies() {
        let policies: std::collections::HashSet<u32> = ThrottleReason::ALL
            .iter()
            .map(|r| perf_policy(*r).as_c())
            .collect();
        assert_eq!(policies.len(), ThrottleReason::ALL.len());
    }
}

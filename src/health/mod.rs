//! Each GPU's health verdict, given by the sampler every tick from the GPU's reading: the rules of
//! [`rules::RULES`] that are active, the worst state among them, and each reason with its action.
//!
//! It sits just above `sample.rs` (it reads a [`DeviceSample`] and gives a [`Health`]); the
//! sampler's session owns one [`Tracker`] and calls it when the `health` group is on. Each signal
//! says which part of the reading it needs ([`rules::Signal::reads`]), and the device reader makes
//! those calls with the `health` group on whatever other groups are ([`rules::needs`]): a new
//! signal is its rule row, its `reads` and its test here, not a special case in the reader.
//!
//! How long a verdict holds:
//! - A condition NVML shows (ECC, row remapping, NVLink, PCIe width, slowdown, lost) is active
//!   while the reading shows it, and clears with it (links back up, the remap applied by a reset).
//! - An XID is news when its count grew since the previous tick (for the first reading, since the
//!   session started: the exporter's start, or the driver's re-initialisation). One whose action
//!   is a reset, a reboot or service holds until the GPU is seen reset: NVML answered
//!   GPU_IS_LOST or GPU_REQUIRES_RESET and then answers again, or the driver was re-initialised
//!   (a new NVML session), or the exporter restarted with the node. Any other XID holds
//!   [`XID_WINDOW`] after its last event.
//! - A GPU's registration with the NVLink fabric may take until the fabric registration timeout
//!   after the session's first tick (a node that just booted, its Fabric Manager still
//!   training); not completed after it, it is a reason.
//!
//! The node has a verdict of its own ([`node_verdict`]), from the rules of node signals: a GPU
//! the PCI bus lists that NVML does not enumerate has no UUID to carry a reason.

pub mod docs;
pub mod rules;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::sample::{
    ClockEventReason, DeviceSample, FabricSample, FabricState, Health, HealthAction, HealthReason,
    HealthState, PciGpu,
};
use rules::{RULES, Signal, xid_rule};

/// How long an XID that needs no reset keeps its reason after its last event: the window of the
/// `NvidiaGpuXidError` alert.
pub const XID_WINDOW: Duration = Duration::from_secs(600);

/// How long a GPU may take to register with the NVLink fabric after the session's first tick,
/// unless `--fabric-registration-timeout` says otherwise.
pub const FABRIC_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// What the verdicts remember between ticks, for one NVML session.
#[derive(Debug, Default)]
pub struct Tracker {
    /// XID counts already seen when the session started, by GPU UUID: not news.
    baseline: HashMap<String, BTreeMap<u64, u64>>,
    gpus: HashMap<String, Memory>,
    fabric: FabricWait,
}

/// When the GPUs of the session began to register with the NVLink fabric, and how long they may.
#[derive(Debug)]
struct FabricWait {
    /// The session's first tick.
    since: Option<Instant>,
    timeout: Duration,
}

impl Default for FabricWait {
    fn default() -> Self {
        FabricWait {
            since: None,
            timeout: FABRIC_REGISTRATION_TIMEOUT,
        }
    }
}

#[derive(Debug, Default)]
struct Memory {
    /// The XID counts of the previous reading.
    seen: BTreeMap<u64, u64>,
    /// XIDs whose reason is active, with their last event.
    held: BTreeMap<u64, Instant>,
    /// NVML said the GPU was lost: when it answers again, it was reset.
    lost: bool,
}

impl Tracker {
    /// A tracker for a new session; `baseline` holds the XID counts seen before it, by UUID.
    pub fn new(baseline: HashMap<String, BTreeMap<u64, u64>>) -> Tracker {
        Tracker {
            baseline,
            ..Tracker::default()
        }
    }

    /// How long a GPU may take to register with the NVLink fabric after the session's first
    /// tick (`--fabric-registration-timeout`), from the next verdict on.
    pub fn set_fabric_registration_timeout(&mut self, timeout: Duration) {
        self.fabric.timeout = timeout;
    }

    /// The verdict of `d`'s reading taken into account at `now`.
    pub fn evaluate(&mut self, d: &DeviceSample, now: Instant) -> Health {
        let since = *self.fabric.since.get_or_insert(now);
        let fabric_late = now.saturating_duration_since(since) >= self.fabric.timeout;
        let lost = !d.up && !d.stale;
        let none = BTreeMap::new();
        let held = if d.uuid.is_empty() {
            &none
        } else {
            let baseline = self.baseline.get(&d.uuid);
            let memory = self.gpus.entry(d.uuid.clone()).or_insert_with(|| Memory {
                seen: baseline.cloned().unwrap_or_default(),
                ..Memory::default()
            });
            memory.update(d, lost, now);
            &memory.held
        };
        verdict(|signal| match signal {
            Signal::Xid(code) => held.contains_key(&code),
            Signal::Lost => lost,
            Signal::Unreadable => !d.up && d.stale,
            _ if !d.up => false,
            Signal::EccUncorrectable => d.ecc_volatile.is_some_and(|e| e.uncorrected > 0),
            Signal::RowRemapFailure => d.remapped_rows.is_some_and(|r| r.failed),
            Signal::RowRemapPending => d.remapped_rows.is_some_and(|r| r.pending),
            Signal::RetiredPagesPending => d.retired_pages.is_some_and(|r| r.pending == Some(true)),
            Signal::NvlinkDown => d.nvlinks.iter().any(|l| !l.up),
            Signal::PcieWidth => matches!(
                (d.pcie.link_width_current, d.pcie.link_width_max),
                (Some(now), Some(max)) if now < max
            ),
            Signal::ThermalSlowdown => active(
                d,
                &[
                    ClockEventReason::SwThermalSlowdown,
                    ClockEventReason::HwThermalSlowdown,
                ],
            ),
            Signal::PowerSlowdown => active(d, &[ClockEventReason::HwPowerBrakeSlowdown]),
            Signal::FabricNotRegistered => {
                fabric_late
                    && d.fabric
                        .as_ref()
                        .is_some_and(|f| f.state != FabricState::Completed)
            }
            Signal::FabricRegistrationFailed => d
                .fabric
                .as_ref()
                .is_some_and(FabricSample::registration_failed),
            Signal::Fabric(condition) => d.fabric.as_ref().is_some_and(|f| f.holds(condition)),
            // The node's, never a GPU's.
            Signal::GpusMissing => false,
        })
    }
}

/// The node's verdict, from the rules of node signals: `missing` are the GPUs the PCI bus lists
/// that NVML does not enumerate.
pub fn node_verdict(missing: &[PciGpu]) -> Health {
    verdict(|signal| match signal {
        Signal::GpusMissing => !missing.is_empty(),
        _ => false,
    })
}

impl Memory {
    fn update(&mut self, d: &DeviceSample, lost: bool, now: Instant) {
        for (code, count) in &d.xid_counts {
            let news = *count > self.seen.get(code).copied().unwrap_or(0);
            if news && xid_rule(*code).is_some_and(|r| r.state != HealthState::Healthy) {
                self.held.insert(*code, now);
            }
        }
        self.seen.clone_from(&d.xid_counts);
        if lost {
            self.lost = true;
        } else if d.up && self.lost {
            // Answering again after NVML called it lost: the GPU was reset (or re-seated).
            self.lost = false;
            self.held.clear();
        }
        self.held.retain(|code, at| {
            xid_rule(*code).is_some_and(|r| needs_reset(r.action))
                || now.saturating_duration_since(*at) < XID_WINDOW
        });
    }
}

/// Whether an XID asking for `action` holds until the GPU is reset.
fn needs_reset(action: HealthAction) -> bool {
    matches!(
        action,
        HealthAction::ResetGpu | HealthAction::RebootNode | HealthAction::DrainAndService
    )
}

fn active(d: &DeviceSample, reasons: &[ClockEventReason]) -> bool {
    d.clock_events
        .iter()
        .any(|(r, on)| *on && reasons.contains(r))
}

/// The verdict of the rules whose signal `is_active` says is on; healthy rules never count.
fn verdict(is_active: impl Fn(Signal) -> bool) -> Health {
    let reasons: Vec<HealthReason> = RULES
        .iter()
        .filter(|r| r.state != HealthState::Healthy && is_active(r.signal))
        .map(|r| HealthReason {
            reason: r.reason,
            action: r.action,
            state: r.state,
        })
        .collect();
    Health {
        state: reasons.iter().map(|r| r.state).max().unwrap_or_default(),
        reasons,
    }
}

#[cfg(test)]
mod tests;

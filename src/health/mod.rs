//! Each GPU's health verdict, given by the sampler every tick from the GPU's reading: the rules of
//! [`rules::RULES`] that are active, the worst state among them, and each reason with its action.
//!
//! It sits just above `sample.rs` (it reads a [`DeviceSample`] and gives a [`Health`]); the
//! sampler owns one [`Tracker`] for its whole life and calls it when the `health` group is on.
//! Each signal says which parts of the reading it needs ([`rules::Signal::reads`]), and the device
//! reader makes those calls with the `health` group on whatever other groups are
//! ([`rules::needs`]): a new signal is its rule row, its `reads` and its test here, not a special
//! case in the reader.
//!
//! How long a verdict holds:
//! - A condition NVML shows (the driver's recovery action, ECC, row remapping, NVLink, a
//!   slowdown, a lost GPU) is active while the reading shows it, and clears with it.
//! - An XID is news when its count grew since the previous tick (for the first reading, since the
//!   exporter started). One whose action is a reset, a reboot or service holds until the GPU is
//!   seen reset: NVML answered GPU_IS_LOST or RESET_REQUIRED and then answers again, the driver's
//!   recovery action went from a reset or reboot back to none, the driver was re-initialised, or
//!   the node rebooted. With a state file ([`store`]) such holds survive a restart of the
//!   exporter. Any other XID holds [`XID_WINDOW`] after its last event.
//! - Where the driver gives its recovery action, the XIDs the catalogue links to it change no
//!   verdict by themselves: the driver holds its action until the reset.
//! - A GPU's registration with the NVLink fabric may take until the fabric registration timeout
//!   after the sampler's first tick, or the driver's re-initialisation (a node that just booted,
//!   its Fabric Manager still training); not completed after it, it is a reason.
//!
//! The node has a verdict of its own ([`node_verdict`]), from the rules of node signals: a GPU
//! the PCI bus lists that NVML does not enumerate has no UUID to carry a reason.

pub mod docs;
pub mod rules;
pub mod store;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sample::{
    ClockEventReason, DeviceSample, FabricSample, FabricState, Health, HealthAction, HealthReason,
    HealthState, HealthStateErrors, Lost, PciGpu, unix_now,
};
use rules::{RULES, Recovery, Rule, Signal, unlisted_xid_rule, xid_rule};
use store::{GpuHolds, Store};

/// How long an XID that needs no reset keeps its reason after its last event: the window of the
/// `NvidiaGpuXidError` alert.
pub const XID_WINDOW: Duration = Duration::from_secs(600);

/// The window over which PCIe replays are counted: DCGM's minute.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(60);

/// How long a GPU may take to register with the NVLink fabric after the sampler's first tick,
/// unless `--fabric-registration-timeout` says otherwise.
pub const FABRIC_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// What one GPU's verdict needs to know of the others and of the node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Node {
    /// A GPU of the node is in MIG mode: drivers then report NVLink links down.
    pub mig: bool,
    /// The GPUs have had their time to register with the NVLink fabric (set by the tracker).
    fabric_late: bool,
}

impl Node {
    /// The node of `devices`.
    pub fn of<'a>(devices: impl IntoIterator<Item = &'a DeviceSample>) -> Node {
        Node {
            mig: devices.into_iter().any(|d| d.mig_mode == Some(true)),
            fabric_late: false,
        }
    }
}

/// What the verdicts remember between ticks, for the life of the sampler.
#[derive(Debug, Default)]
pub struct Tracker {
    gpus: HashMap<String, Memory>,
    /// Holds read from the state file, by UUID, until the GPU's first reading takes them.
    loaded: BTreeMap<String, GpuHolds>,
    store: Option<Store>,
    fabric: FabricWait,
}

/// When the GPUs began to register with the NVLink fabric, and how long they may.
#[derive(Debug)]
struct FabricWait {
    /// The first tick, or the first after the driver's re-initialisation.
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
    /// XIDs whose reason is active.
    held: BTreeMap<u64, Held>,
    /// NVML said the GPU was lost: when it answers again, it was reset.
    lost: bool,
    /// The driver's recovery action at the previous reading that had one.
    recovery: Option<u64>,
    /// The PCIe replay counter's readings of the last [`REPLAY_WINDOW`].
    replays: VecDeque<(Instant, u64)>,
    /// The energy counter when the loaded holds were written: a lower reading means the driver
    /// was reloaded since, which resets the GPU.
    energy_mark: Option<f64>,
    /// The last energy counter read.
    energy: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// The last event.
    at: Instant,
    /// The first event, seconds since the Unix epoch.
    since: f64,
}

impl Tracker {
    /// A tracker that keeps the holds that outlive a restart in the file at `path` (and starts
    /// with those it holds for this boot); without one they live in memory only.
    pub fn new(state_file: Option<PathBuf>) -> Tracker {
        match state_file {
            Some(path) => {
                let (store, loaded) = Store::open(path);
                Tracker::with_store(store, loaded)
            }
            None => Tracker::default(),
        }
    }

    /// A tracker writing to `store`, starting with `loaded` (by UUID).
    pub fn with_store(store: Store, loaded: BTreeMap<String, GpuHolds>) -> Tracker {
        Tracker {
            loaded,
            store: Some(store),
            ..Tracker::default()
        }
    }

    /// How long a GPU may take to register with the NVLink fabric (`--fabric-registration-timeout`),
    /// from the next verdict on.
    pub fn set_fabric_registration_timeout(&mut self, timeout: Duration) {
        self.fabric.timeout = timeout;
    }

    /// The driver was re-initialised (it went away and came back): its reload reset every GPU.
    pub fn driver_reloaded(&mut self) {
        self.loaded.clear();
        // The reloaded driver registers the GPUs with the fabric anew.
        self.fabric.since = None;
        for memory in self.gpus.values_mut() {
            memory.held.clear();
            memory.lost = false;
            memory.recovery = None;
            memory.energy_mark = None;
        }
    }

    /// The verdict of `d`'s reading taken into account at `now`, with `node` what the other GPUs
    /// say.
    pub fn evaluate(&mut self, d: &DeviceSample, node: Node, now: Instant) -> Health {
        let since = *self.fabric.since.get_or_insert(now);
        let node = Node {
            fabric_late: now.saturating_duration_since(since) >= self.fabric.timeout,
            ..node
        };
        let none = Memory::default();
        let memory = if d.uuid.is_empty() {
            &none
        } else {
            let loaded = self.loaded.remove(&d.uuid);
            let memory = self.gpus.entry(d.uuid.clone()).or_insert_with(|| Memory {
                held: loaded
                    .iter()
                    .flat_map(|h| &h.xids)
                    .map(|(code, since)| {
                        (
                            *code,
                            Held {
                                at: now,
                                since: *since,
                            },
                        )
                    })
                    .collect(),
                energy_mark: loaded.and_then(|h| h.energy_joules),
                ..Memory::default()
            });
            memory.update(d, now);
            memory
        };
        verdict(|rule| memory.active(rule, d, node))
    }

    /// Writes the holds that outlive a restart to the state file, if there is one and they
    /// changed; called once a tick, after every GPU's verdict.
    pub fn persist(&mut self) {
        let Some(store) = &mut self.store else {
            return;
        };
        let mut holds: BTreeMap<String, GpuHolds> = self
            .gpus
            .iter()
            .filter_map(|(uuid, m)| {
                let xids: BTreeMap<u64, f64> = m
                    .held
                    .iter()
                    .filter(|(code, _)| holds_until_reset(**code))
                    .map(|(code, h)| (*code, h.since))
                    .collect();
                (!xids.is_empty()).then(|| {
                    let energy_joules = m.energy.or(m.energy_mark);
                    (
                        uuid.clone(),
                        GpuHolds {
                            xids,
                            energy_joules,
                        },
                    )
                })
            })
            .collect();
        // A GPU not read yet keeps what the file held for it.
        holds.extend(self.loaded.iter().map(|(u, h)| (u.clone(), h.clone())));
        store.save(&holds);
    }

    /// The state file's failures; `None` without one.
    pub fn store_errors(&self) -> Option<HealthStateErrors> {
        self.store.as_ref().map(Store::errors)
    }
}

impl Memory {
    fn update(&mut self, d: &DeviceSample, now: Instant) {
        for (code, count) in &d.xid_counts {
            let seen = self.seen.get(code).copied().unwrap_or(0);
            // A count below the one seen restarted (the GPU left and came back): any is news.
            let news = *count > seen || (*count < seen && *count > 0);
            let judged = xid_rule(*code).is_none_or(|r| r.state != HealthState::Healthy);
            if news && judged {
                let since = self.held.get(code).map_or_else(unix_now, |h| h.since);
                self.held.insert(*code, Held { at: now, since });
            }
        }
        self.seen.clone_from(&d.xid_counts);
        if d.lost.is_some() {
            self.lost = true;
        } else if d.up && self.lost {
            // Answering again after NVML called it lost: the GPU was reset (or re-seated).
            self.lost = false;
            self.reset();
        }
        if d.up
            && let Some(action) = d.recovery_action
        {
            let was_reset = self
                .recovery
                .and_then(Recovery::of)
                .is_some_and(Recovery::is_reset);
            if was_reset && action == 0 {
                // The driver's reset or reboot was carried out.
                self.reset();
            }
            self.recovery = Some(action);
        }
        if let Some(energy) = d.energy_joules {
            if self.energy_mark.take().is_some_and(|mark| energy < mark) {
                // The driver was reloaded since the holds were written.
                self.reset();
            }
            self.energy = Some(energy);
        }
        self.held.retain(|code, h| {
            holds_until_reset(*code) || now.saturating_duration_since(h.at) < XID_WINDOW
        });
        if let Some(count) = d.pcie.replay_errors.filter(|_| d.up && !d.stale) {
            self.replays.push_back((now, count));
        }
        while self
            .replays
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > REPLAY_WINDOW)
        {
            self.replays.pop_front();
        }
    }

    /// The GPU was seen reset: nothing held survives it.
    fn reset(&mut self) {
        self.held.clear();
        self.energy_mark = None;
    }

    /// Whether `rule` is active for the reading `d`.
    fn active(&self, rule: &Rule, d: &DeviceSample, node: Node) -> bool {
        let driver_decides = rule.recovery_linked && d.recovery_action.is_some();
        match rule.signal {
            Signal::Xid(_) | Signal::Xids(_) => {
                !driver_decides && self.held.keys().any(|code| rule.signal.names_xid(*code))
            }
            Signal::XidUnlisted => self.held.keys().any(|code| xid_rule(*code).is_none()),
            Signal::Lost => d.lost == Some(Lost::OffTheBus),
            Signal::ResetRequired => d.lost == Some(Lost::ResetRequired),
            Signal::Unreadable => !d.up && d.stale,
            _ if !d.up => false,
            Signal::RecoveryAction(r) => d.recovery_action.and_then(Recovery::of) == Some(r),
            Signal::UnrepairableMemory => d.unrepairable_memory == Some(true),
            Signal::SramThreshold => d.sram_threshold_exceeded == Some(true),
            Signal::EccUncorrectable => d.ecc_volatile.is_some_and(|e| e.uncorrected > 0),
            Signal::RowRemapFailure => d.remapped_rows.is_some_and(|r| r.failed),
            Signal::RowRemapPending => d.remapped_rows.is_some_and(|r| r.pending),
            Signal::RetiredPagesPending => d.retired_pages.is_some_and(|r| r.pending == Some(true)),
            Signal::RetiredPagesLimit => d
                .retired_pages
                .is_some_and(|r| r.single_bit_ecc + r.double_bit_ecc >= RETIRED_PAGES_LIMIT),
            Signal::NvlinkDown => !node.mig && d.nvlinks.iter().any(|l| l.up == Some(false)),
            Signal::PcieReplayRate => self.replays_over_bound(d),
            Signal::PcieWidth => matches!(
                (d.pcie.link_width_current, d.pcie.link_width_max),
                (Some(now), Some(max)) if now < max
            ),
            Signal::ThermalSlowdown => clock_event(
                d,
                &[
                    ClockEventReason::SwThermalSlowdown,
                    ClockEventReason::HwThermalSlowdown,
                ],
            ),
            Signal::PowerSlowdown => clock_event(d, &[ClockEventReason::HwPowerBrakeSlowdown]),
            Signal::FabricNotRegistered => {
                node.fabric_late
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
        }
    }

    /// Whether the replays of the last minute exceed DCGM's bound for the link as it runs now.
    fn replays_over_bound(&self, d: &DeviceSample) -> bool {
        let (Some(generation), Some(width)) =
            (d.pcie.link_generation_current, d.pcie.link_width_current)
        else {
            return false;
        };
        let (Some((_, first)), Some((_, last))) = (self.replays.front(), self.replays.back())
        else {
            return false;
        };
        last.abs_diff(*first) > replay_bound(generation, width)
    }
}

/// The node's verdict, from the rules of node signals: `missing` are the GPUs the PCI bus lists
/// that NVML does not enumerate.
pub fn node_verdict(missing: &[PciGpu]) -> Health {
    verdict(|rule| match rule.signal {
        Signal::GpusMissing => !missing.is_empty(),
        _ => false,
    })
}

/// DCGM's limit of retired pages (`DCGM_LIMIT_MAX_RETIRED_PAGES`): as many fail the GPU.
pub const RETIRED_PAGES_LIMIT: u64 = 63;

/// DCGM's bound on PCIe replays per minute (`GetExpectedPcieReplayRate`): a bit error rate of
/// 1e-12 at the generation's rate per lane (2.5, 5, 8, 16, 32, 64 GT/s; newer ones capped at the
/// last), times the lanes, rounded up.
pub fn replay_bound(generation: u32, width: u32) -> u64 {
    const GIGATRANSFERS: [f64; 6] = [2.5, 5.0, 8.0, 16.0, 32.0, 64.0];
    let rate = GIGATRANSFERS[(generation.clamp(1, 6) - 1) as usize];
    (rate / 1000.0 * 60.0 * f64::from(width)).ceil() as u64
}

/// Whether an XID `code` holds until the GPU is reset (its action is a reset, a reboot or
/// service), rather than for [`XID_WINDOW`].
fn holds_until_reset(code: u64) -> bool {
    needs_reset(xid_rule(code).unwrap_or_else(unlisted_xid_rule).action)
}

/// Whether an XID asking for `action` holds until the GPU is reset.
fn needs_reset(action: HealthAction) -> bool {
    matches!(
        action,
        HealthAction::ResetGpu | HealthAction::RebootNode | HealthAction::DrainAndService
    )
}

fn clock_event(d: &DeviceSample, reasons: &[ClockEventReason]) -> bool {
    d.clock_events
        .iter()
        .any(|(r, on)| *on && reasons.contains(r))
}

/// The verdict of the rules `is_active` says are on; healthy rules never count.
fn verdict(is_active: impl Fn(&Rule) -> bool) -> Health {
    let reasons: Vec<HealthReason> = RULES
        .iter()
        .filter(|r| r.state != HealthState::Healthy && is_active(r))
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

//! The health rule table: every signal the verdict reads, with the state it puts a GPU in, its
//! reason label and the action it asks for, declared once. `docs/health.md` is generated from it.
//!
//! The XID rows follow NVIDIA's XID catalogue for Ampere and newer ("Analyzing Xid Errors with the
//! Xid Catalog", docs.nvidia.com/deploy/xid-errors: each code's immediate resolution bucket) and
//! the XID table of docs/alerts.md: the codes an application causes leave the GPU healthy, the
//! codes whose resolution is a GPU reset or a reboot hold until NVML shows the reset. An XID the
//! table does not list changes no verdict (it is still counted in `nvidia_gpu_xid_errors_total`).

use crate::sample::FabricCondition;
use crate::sample::HealthAction::{
    self, DrainAndService, None, RebootNode, ResetGpu, RestartWorkload,
};
use crate::sample::HealthState::{self, Degraded, Failed, Healthy};

/// What a rule reads from a GPU's reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// An event of this XID code since the previous tick (or since start).
    Xid(u64),
    /// Uncorrectable ECC errors since the driver loaded (volatile counter above 0).
    EccUncorrectable,
    /// NVML says a row remapping failed.
    RowRemapFailure,
    /// NVML says a row remapping waits for the next GPU reset.
    RowRemapPending,
    /// NVML says a page waits for the next reboot or reset to be retired (before Ampere).
    RetiredPagesPending,
    /// A link of the board's NVLink links (counted when the GPU was first read) is not active.
    NvlinkDown,
    /// The PCIe link runs on fewer lanes than its maximum (a lower generation alone is idle power
    /// saving, not a fault).
    PcieWidth,
    /// The clocks are held down for temperature (software or hardware thermal slowdown).
    ThermalSlowdown,
    /// The clocks are held down by the board's power brake.
    PowerSlowdown,
    /// NVML answered GPU_IS_LOST or GPU_REQUIRES_RESET.
    Lost,
    /// The GPU gave no fresh reading for longer than `--stale-grace` (hung or failing every call).
    Unreadable,
    /// The GPU's registration with the NVLink fabric has not completed
    /// `--fabric-registration-timeout` after the NVML session's first tick.
    FabricNotRegistered,
    /// The GPU's registration with the NVLink fabric completed with an error status.
    FabricRegistrationFailed,
    /// A condition of the fabric health mask holds.
    Fabric(FabricCondition),
    /// The node's PCI bus lists a GPU that NVML does not enumerate: a reason of the node's, which
    /// no GPU's reading carries.
    GpusMissing,
}

/// The part of a GPU's reading a signal looks at, which the device reader makes the NVML calls
/// for when the health group is on (whatever other groups are): a signal is declared with what it
/// needs here, once, and the reader asks [`needs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// XID events (`nvmlEventSetWait`, registered per device).
    XidEvents,
    /// The volatile ECC error counts (`nvmlDeviceGetTotalEccErrors`).
    EccVolatile,
    /// The row remapping state (`nvmlDeviceGetRemappedRows`).
    RemappedRows,
    /// The retired pages and their pending flag (`nvmlDeviceGetRetiredPages_v2`,
    /// `nvmlDeviceGetRetiredPagesPendingStatus`).
    RetiredPages,
    /// Whether each NVLink link is active (`nvmlDeviceGetNvLinkState`).
    LinkStates,
    /// The PCIe link's generation and width, current and maximum.
    PcieLink,
    /// The clock-event (throttle) reasons (`nvmlDeviceGetCurrentClocksEventReasons`).
    ClockEvents,
    /// The GPU's NVLink fabric registration and health (`nvmlDeviceGetGpuFabricInfoV`).
    Fabric,
}

impl Signal {
    /// What the signal reads beyond what every reading has (whether the GPU answered).
    pub const fn reads(self) -> Option<Reading> {
        match self {
            Signal::Xid(_) => Some(Reading::XidEvents),
            Signal::EccUncorrectable => Some(Reading::EccVolatile),
            Signal::RowRemapFailure | Signal::RowRemapPending => Some(Reading::RemappedRows),
            Signal::RetiredPagesPending => Some(Reading::RetiredPages),
            Signal::NvlinkDown => Some(Reading::LinkStates),
            Signal::PcieWidth => Some(Reading::PcieLink),
            Signal::ThermalSlowdown | Signal::PowerSlowdown => Some(Reading::ClockEvents),
            Signal::Lost | Signal::Unreadable => Option::None,
            Signal::FabricNotRegistered | Signal::FabricRegistrationFailed | Signal::Fabric(_) => {
                Some(Reading::Fabric)
            }
            Signal::GpusMissing => Option::None,
        }
    }

    /// Whether the signal is the node's rather than a GPU's (the node's verdict,
    /// [`super::node_verdict`]).
    pub const fn is_node(self) -> bool {
        matches!(self, Signal::GpusMissing)
    }
}

/// Whether a rule of the table reads `reading`: the device reader makes its calls with the health
/// group on.
pub fn needs(reading: Reading) -> bool {
    RULES
        .iter()
        .any(|r| r.state != HealthState::Healthy && r.signal.reads() == Some(reading))
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// What it reads.
    pub signal: Signal,
    /// The state it puts the GPU in; a healthy rule is documented but never active.
    pub state: HealthState,
    /// The `reason` label.
    pub reason: &'static str,
    /// The `action` label.
    pub action: HealthAction,
    /// One line for docs/health.md.
    pub doc: &'static str,
}

const fn rule(
    signal: Signal,
    state: HealthState,
    reason: &'static str,
    action: HealthAction,
    doc: &'static str,
) -> Rule {
    Rule {
        signal,
        state,
        reason,
        action,
        doc,
    }
}

/// Every rule, in the order a verdict lists its reasons.
pub const RULES: &[Rule] = &[
    rule(
        Signal::Lost,
        Failed,
        "lost",
        ResetGpu,
        "NVML answers GPU_IS_LOST or GPU_REQUIRES_RESET: the GPU is unusable until it is reset (a reboot if the reset fails).",
    ),
    rule(
        Signal::Unreadable,
        Failed,
        "unreadable",
        ResetGpu,
        "No call answered for longer than --stale-grace: the GPU or its driver hangs.",
    ),
    rule(
        Signal::Xid(79),
        Failed,
        "xid_79",
        RebootNode,
        "GPU has fallen off the bus: unusable until a reboot, often a cold power cycle.",
    ),
    rule(
        Signal::Xid(48),
        Failed,
        "xid_48",
        ResetGpu,
        "Double-bit (uncorrectable) ECC error: reset to retire the page or remap the row.",
    ),
    rule(
        Signal::Xid(63),
        Degraded,
        "xid_63",
        ResetGpu,
        "A page retirement or row remap was recorded: it takes effect at the next reset.",
    ),
    rule(
        Signal::Xid(64),
        Failed,
        "xid_64",
        ResetGpu,
        "A page retirement or row remap failed to record: reset; service if it repeats.",
    ),
    rule(
        Signal::Xid(74),
        Failed,
        "xid_74",
        ResetGpu,
        "NVLink error: reset the GPU (on NVSwitch systems, all GPUs of the baseboard).",
    ),
    rule(
        Signal::Xid(92),
        Degraded,
        "xid_92",
        DrainAndService,
        "High single-bit ECC error rate: the memory is wearing out; plan a replacement.",
    ),
    rule(
        Signal::Xid(94),
        Degraded,
        "xid_94",
        RestartWorkload,
        "Contained ECC error: the applications using that memory were stopped; the GPU serves others.",
    ),
    rule(
        Signal::Xid(95),
        Failed,
        "xid_95",
        ResetGpu,
        "Uncontained ECC error: every application on the GPU is affected; reset before reuse.",
    ),
    rule(
        Signal::Xid(119),
        Failed,
        "xid_119",
        ResetGpu,
        "GSP RPC timeout: the GPU System Processor firmware hangs; reset, or reboot if that fails.",
    ),
    rule(
        Signal::Xid(120),
        Failed,
        "xid_120",
        ResetGpu,
        "GSP error: the GPU System Processor firmware failed; reset, or reboot if that fails.",
    ),
    rule(
        Signal::Xid(13),
        Healthy,
        "xid_13",
        RestartWorkload,
        "Graphics engine exception: an application fault; the GPU stays healthy.",
    ),
    rule(
        Signal::Xid(31),
        Healthy,
        "xid_31",
        RestartWorkload,
        "GPU memory page fault: an application accessed an invalid address; the GPU stays healthy.",
    ),
    rule(
        Signal::Xid(43),
        Healthy,
        "xid_43",
        RestartWorkload,
        "GPU stopped processing: the faulting application's context was torn down; the GPU stays healthy.",
    ),
    rule(
        Signal::Xid(45),
        Healthy,
        "xid_45",
        None,
        "Preemptive cleanup after an earlier error or a killed process; the GPU stays healthy.",
    ),
    rule(
        Signal::RowRemapFailure,
        Failed,
        "row_remap_failure",
        DrainAndService,
        "A row remapping failed: the memory cannot repair itself; the board needs service.",
    ),
    rule(
        Signal::EccUncorrectable,
        Degraded,
        "ecc_uncorrectable",
        ResetGpu,
        "Uncorrectable ECC errors since the driver loaded: reset to retire or remap the memory (the counter restarts at 0).",
    ),
    rule(
        Signal::RowRemapPending,
        Degraded,
        "row_remap_pending",
        ResetGpu,
        "A row remapping waits for the next reset to take effect.",
    ),
    rule(
        Signal::RetiredPagesPending,
        Degraded,
        "retired_pages_pending",
        ResetGpu,
        "A memory page with ECC errors waits for the next reset (or reboot) to be retired (before Ampere).",
    ),
    rule(
        Signal::NvlinkDown,
        Degraded,
        "nvlink_down",
        ResetGpu,
        "An NVLink link of the board is down: traffic takes the other links or PCIe; reset to retrain it.",
    ),
    rule(
        Signal::PcieWidth,
        Degraded,
        "pcie_width",
        DrainAndService,
        "The PCIe link trained to fewer lanes than its maximum: reseat or service the GPU, riser or slot.",
    ),
    rule(
        Signal::ThermalSlowdown,
        Degraded,
        "thermal_slowdown",
        None,
        "Clocks held down for temperature: nothing to do to the GPU; check the node's cooling.",
    ),
    rule(
        Signal::PowerSlowdown,
        Degraded,
        "power_slowdown",
        None,
        "Clocks held down by the power brake: nothing to do to the GPU; check the node's power supply.",
    ),
    // The NVLink fabric (NVSwitch systems) and the PCI bus. DCGM's health watch (NVIDIA/DCGM,
    // modules/health/DcgmHealthWatch.cpp, MonitorFabricFields) fails a GPU for each of these
    // fabric conditions; the sources of each action are in docs/alerts.md.
    rule(
        Signal::FabricNotRegistered,
        Failed,
        "fabric_not_registered",
        ResetGpu,
        "Not registered with the NVLink fabric --fabric-registration-timeout after NVML started: no NVLink peer-to-peer. Check nvidia-fabricmanager first.",
    ),
    rule(
        Signal::FabricRegistrationFailed,
        Failed,
        "fabric_registration_failed",
        ResetGpu,
        "The registration with the NVLink fabric ended in an error: no NVLink peer-to-peer. Check nvidia-fabricmanager first.",
    ),
    fabric(
        FabricCondition::DegradedBandwidth,
        "fabric_degraded_bandwidth",
        "The fabric health mask says the GPU's NVLink bandwidth is degraded.",
    ),
    fabric(
        FabricCondition::RouteUnhealthy,
        "fabric_route_unhealthy",
        "The fabric health mask says a route of the GPU's NVLink fabric is unhealthy.",
    ),
    fabric(
        FabricCondition::RouteRecovery,
        "fabric_route_recovery",
        "The fabric health mask says a route recovery is in progress.",
    ),
    fabric(
        FabricCondition::AccessTimeoutRecovery,
        "fabric_access_timeout_recovery",
        "The fabric health mask says an access-timeout recovery is in progress.",
    ),
    fabric(
        FabricCondition::IncorrectConfiguration,
        "fabric_incorrect_configuration",
        "The fabric health mask says the fabric is configured wrongly for the GPU (nvidia_gpu_fabric_info's configuration says how).",
    ),
    rule(
        Signal::GpusMissing,
        Failed,
        "gpus_missing",
        RebootNode,
        "The node's: the PCI bus lists a GPU bound to the nvidia driver (or to none) that NVML does not enumerate; the driver lost it.",
    ),
];

/// A rule of a fabric health mask condition: failed, as DCGM's health watch judges each.
const fn fabric(condition: FabricCondition, reason: &'static str, doc: &'static str) -> Rule {
    rule(Signal::Fabric(condition), Failed, reason, ResetGpu, doc)
}

/// What an operator does for each action, for docs/health.md.
pub fn action_doc(action: HealthAction) -> &'static str {
    match action {
        None => {
            "Nothing to do to the GPU; the cause is outside it (cooling, power) or needs only watching."
        }
        RestartWorkload => "Restart the affected workload; the GPU itself is fine for others.",
        ResetGpu => {
            "Drain the GPU, then `nvidia-smi --gpu-reset -i GPU` (on NVSwitch systems reset the GPUs together); reboot if the reset fails."
        }
        RebootNode => "Drain the node and reboot it (often a cold power cycle).",
        DrainAndService => {
            "Drain the node and open a hardware ticket (reseat, replace or RMA the board)."
        }
    }
}

/// The table's row for an XID code, if it lists the code.
pub fn xid_rule(code: u64) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.signal == Signal::Xid(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_snake_case_and_signals_appear_once() {
        for (i, r) in RULES.iter().enumerate() {
            assert!(
                r.reason
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                r.reason
            );
            assert!(
                RULES[..i]
                    .iter()
                    .all(|o| o.reason != r.reason && o.signal != r.signal),
                "{} twice",
                r.reason
            );
        }
    }

    #[test]
    fn application_xids_leave_the_gpu_healthy_and_fallen_off_the_bus_fails_it() {
        for code in [13, 31, 43, 45] {
            assert_eq!(xid_rule(code).map(|r| r.state), Some(Healthy), "{code}");
        }
        for code in [48, 64, 74, 79, 95, 119, 120] {
            assert_eq!(xid_rule(code).map(|r| r.state), Some(Failed), "{code}");
        }
        assert_eq!(xid_rule(79).map(|r| r.action), Some(RebootNode));
        assert!(xid_rule(1).is_none());
    }
}

//! The health rule table: every signal the verdict reads, with the state it puts a GPU in, its
//! reason label, the action it asks for and the NVIDIA source it follows, declared once.
//! `docs/health.md` is generated from it, and so is the critical list of the `NvidiaGpuXidError`
//! alert.
//!
//! The sources, named in each row's `source` (their full titles and addresses are in
//! [`SOURCES`]): NVIDIA's XID catalogue for Ampere and newer (each code's immediate resolution
//! bucket, and whether the driver links it to a recovery action), DCGM's health watches, NVIDIA's
//! Kubernetes device plugin, NVSentinel's XID mapping, NVIDIA's GPU memory error management guide
//! and nvml.h. Where they disagree, the row's `source` says which one it follows and why.
//!
//! The driver's own recovery action (R565 and newer) is the first signal a verdict trusts: where
//! it is read, the XIDs the catalogue links to it ([`Rule::recovery_linked`]) change no verdict
//! by themselves; the driver holds its action until the GPU is reset. An XID the table does not
//! list degrades the GPU and asks for it to be looked up.

use crate::sample::FabricCondition;
use crate::sample::HealthAction::{
    self, DrainAndService, DrainP2p, Investigate, None, RebootNode, ResetGpu, RestartWorkload,
};
use crate::sample::HealthState::{self, Degraded, Failed, Healthy};

/// What the driver's recovery action asks for (`nvmlDeviceGpuRecoveryAction_t`, nvml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// `NVML_GPU_RECOVERY_ACTION_GPU_RESET` (1).
    GpuReset,
    /// `NVML_GPU_RECOVERY_ACTION_NODE_REBOOT` (2).
    NodeReboot,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_P2P` (3).
    DrainP2p,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET` (4, R570).
    DrainAndReset,
    /// Any other value but `NVML_GPU_RECOVERY_ACTION_NONE` (0): newer drivers keep adding them.
    Other,
}

impl Recovery {
    /// The class of a raw recovery action value; `None` for no action (0).
    pub fn of(value: u64) -> Option<Recovery> {
        match value {
            0 => Option::None,
            1 => Some(Recovery::GpuReset),
            2 => Some(Recovery::NodeReboot),
            3 => Some(Recovery::DrainP2p),
            4 => Some(Recovery::DrainAndReset),
            _ => Some(Recovery::Other),
        }
    }

    /// Whether the action is carried out by resetting the GPU or rebooting the node: when it goes
    /// back to none, the GPU was reset.
    pub fn is_reset(self) -> bool {
        matches!(
            self,
            Recovery::GpuReset | Recovery::NodeReboot | Recovery::DrainAndReset
        )
    }
}

/// What a rule reads from a GPU's reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The driver's recovery action is this one.
    RecoveryAction(Recovery),
    /// NVML answered GPU_IS_LOST (or the GPU left the driver's list).
    Lost,
    /// NVML answered RESET_REQUIRED.
    ResetRequired,
    /// The GPU gave no fresh reading for longer than `--stale-grace` (hung or failing every call).
    Unreadable,
    /// An event of this XID code since the previous tick (or since start).
    Xid(u64),
    /// An event of any of these XID codes: codes the table treats alike.
    Xids(&'static [u64]),
    /// An event of an XID code no other row lists.
    XidUnlisted,
    /// The driver's unrepairable-memory flag is set.
    UnrepairableMemory,
    /// The SRAM uncorrectable error threshold of NVIDIA's field diagnostic is exceeded.
    SramThreshold,
    /// NVML says a row remapping failed.
    RowRemapFailure,
    /// Uncorrectable ECC errors since the driver loaded (volatile counter above 0).
    EccUncorrectable,
    /// As many pages retired as DCGM's limit (before Ampere).
    RetiredPagesLimit,
    /// NVML says a row remapping waits for the next GPU reset.
    RowRemapPending,
    /// NVML says a page waits for the next reboot or reset to be retired (before Ampere).
    RetiredPagesPending,
    /// A link of the board's NVLink links (counted when the GPU was first read) is not active,
    /// and no GPU of the node is in MIG mode.
    NvlinkDown,
    /// More PCIe replays in the last minute than DCGM's bound for the link's generation and width.
    PcieReplayRate,
    /// The PCIe link runs on fewer lanes than its maximum.
    PcieWidth,
    /// The clocks are held down for temperature (software or hardware thermal slowdown).
    ThermalSlowdown,
    /// The clocks are held down by the board's power brake.
    PowerSlowdown,
    /// The GPU's registration with the NVLink fabric has not completed
    /// `--fabric-registration-timeout` after the sampler's first tick.
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
    /// The driver's recovery action (field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
    RecoveryAction,
    /// The volatile ECC error counts (`nvmlDeviceGetTotalEccErrors`).
    EccVolatile,
    /// The row remapping state (`nvmlDeviceGetRemappedRows`).
    RemappedRows,
    /// The retired pages and their pending flag (`nvmlDeviceGetRetiredPages_v2`,
    /// `nvmlDeviceGetRetiredPagesPendingStatus`).
    RetiredPages,
    /// The unrepairable-memory flag (`nvmlDeviceGetUnrepairableMemoryFlag_v1`).
    UnrepairableMemory,
    /// The SRAM error status (`nvmlDeviceGetSramEccErrorStatus`).
    SramErrors,
    /// Whether each NVLink link is active (`nvmlDeviceGetNvLinkState`).
    LinkStates,
    /// Whether MIG mode is on (`nvmlDeviceGetMigMode`).
    MigMode,
    /// The PCIe link's generation and width, current and maximum.
    PcieLink,
    /// The PCIe replay counter (`nvmlDeviceGetPcieReplayCounter`).
    PcieReplays,
    /// The clock-event (throttle) reasons (`nvmlDeviceGetCurrentClocksEventReasons`).
    ClockEvents,
    /// The GPU's NVLink fabric registration and health (`nvmlDeviceGetGpuFabricInfoV`).
    Fabric,
}

impl Signal {
    /// What the signal reads beyond what every reading has (whether the GPU answered).
    pub const fn reads(self) -> &'static [Reading] {
        match self {
            Signal::RecoveryAction(_) => &[Reading::RecoveryAction],
            Signal::Xid(_) | Signal::Xids(_) | Signal::XidUnlisted => &[Reading::XidEvents],
            Signal::UnrepairableMemory => &[Reading::UnrepairableMemory],
            Signal::SramThreshold => &[Reading::SramErrors],
            Signal::EccUncorrectable => &[Reading::EccVolatile],
            Signal::RowRemapFailure | Signal::RowRemapPending => &[Reading::RemappedRows],
            Signal::RetiredPagesPending | Signal::RetiredPagesLimit => &[Reading::RetiredPages],
            Signal::NvlinkDown => &[Reading::LinkStates, Reading::MigMode],
            Signal::PcieReplayRate => &[Reading::PcieReplays, Reading::PcieLink],
            Signal::PcieWidth => &[Reading::PcieLink],
            Signal::ThermalSlowdown | Signal::PowerSlowdown => &[Reading::ClockEvents],
            Signal::FabricNotRegistered | Signal::FabricRegistrationFailed | Signal::Fabric(_) => {
                &[Reading::Fabric]
            }
            Signal::Lost | Signal::ResetRequired | Signal::Unreadable | Signal::GpusMissing => &[],
        }
    }

    /// Whether the signal names XID code `code`.
    pub fn names_xid(self, code: u64) -> bool {
        match self {
            Signal::Xid(c) => c == code,
            Signal::Xids(codes) => codes.contains(&code),
            _ => false,
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
        .any(|r| r.state != HealthState::Healthy && r.signal.reads().contains(&reading))
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
    /// One line for docs/health.md: what it means and what to do.
    pub doc: &'static str,
    /// Which NVIDIA sources give the state and action, and the choice where they disagree.
    pub source: &'static str,
    /// An XID the catalogue links to the driver's recovery action ("Xid 154 linkage"): where the
    /// driver gives its recovery action, that decides and the XID alone changes no verdict.
    pub recovery_linked: bool,
}

const fn rule(
    signal: Signal,
    state: HealthState,
    reason: &'static str,
    action: HealthAction,
    doc: &'static str,
    source: &'static str,
) -> Rule {
    Rule {
        signal,
        state,
        reason,
        action,
        doc,
        source,
        recovery_linked: false,
    }
}

/// [`rule`] for an XID the catalogue links to the driver's recovery action.
const fn linked(rule: Rule) -> Rule {
    Rule {
        recovery_linked: true,
        ..rule
    }
}

/// The catalogue's RESTART_APP codes among those it lists for A100, H100, B100 or GB200, but
/// those with a row of their own: an application's fault, the GPU serves others.
const RESTART_APP: &[u64] = &[
    8, 11, 13, 25, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80, 82, 83, 84, 85, 86, 88,
    89, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 126, 127, 128, 129, 130, 131, 132, 133, 134,
    135, 139,
];

/// The catalogue's IGNORE codes among those it lists for A100, H100, B100 or GB200, but those
/// with a row of their own.
const IGNORE: &[u64] = &[
    14, 37, 38, 44, 66, 67, 93, 106, 107, 108, 121, 137, 141, 152, 153, 157, 161,
];

/// The Blackwell NVLink XIDs whose action depends on a decode of the kernel log line that NVML
/// events do not carry.
const NVLINK5: &[u64] = &[144, 145, 146, 147, 148, 149, 150];

/// Every rule, in the order a verdict lists its reasons.
pub const RULES: &[Rule] = &[
    // --- The driver's recovery action (R565 and newer) -------------------------------------
    rule(
        Signal::RecoveryAction(Recovery::GpuReset),
        Failed,
        "recovery_action_gpu_reset",
        ResetGpu,
        "The driver's recovery action is GPU_RESET: stop the GPU's processes and reset it; it holds until the reset.",
        "nvml.h (R565); memory guide: reset; DCGM: fail",
    ),
    rule(
        Signal::RecoveryAction(Recovery::NodeReboot),
        Failed,
        "recovery_action_node_reboot",
        RebootNode,
        "The driver's recovery action is NODE_REBOOT: the fault may have left the OS inconsistent; reboot the node.",
        "nvml.h (R565); memory guide: reboot; DCGM: fail",
    ),
    rule(
        Signal::RecoveryAction(Recovery::DrainAndReset),
        Failed,
        "recovery_action_drain_and_reset",
        ResetGpu,
        "The driver's recovery action is DRAIN_AND_RESET: schedule no new work, reset the GPU once the running work has drained.",
        "nvml.h (R570); DCGM: fail",
    ),
    rule(
        Signal::RecoveryAction(Recovery::DrainP2p),
        Degraded,
        "recovery_action_drain_p2p",
        DrainP2p,
        "The driver's recovery action is DRAIN_P2P: stop the work that uses peer-to-peer traffic; the GPU serves the rest.",
        "nvml.h (R565); DCGM: warn",
    ),
    rule(
        Signal::RecoveryAction(Recovery::Other),
        Failed,
        "recovery_action_other",
        Investigate,
        "A recovery action this table does not know (nvml.h names 5 RECOVER_IMEX_DOMAIN from R595, 6 BUS_RESET and 7 SYSTEM_REBOOT from R615): look it up and act on it.",
        "nvml.h; DCGM ignores values above 4; failed here: the driver asks for an action",
    ),
    // --- GPUs NVML cannot read -------------------------------------------------------------
    rule(
        Signal::Lost,
        Failed,
        "lost",
        RebootNode,
        "NVML answers GPU_IS_LOST: the GPU fell off the bus or is otherwise inaccessible; reboot the node (as XID 79).",
        "nvml.h: GPU_IS_LOST; catalogue: XID 79 RESTART_BM",
    ),
    rule(
        Signal::ResetRequired,
        Failed,
        "reset_required",
        ResetGpu,
        "NVML answers RESET_REQUIRED: the GPU must be reset before it can be used again.",
        "nvml.h: RESET_REQUIRED",
    ),
    rule(
        Signal::Unreadable,
        Failed,
        "unreadable",
        ResetGpu,
        "No call answered for longer than --stale-grace: the GPU or its driver hangs.",
        "the exporter's own judgement: no NVIDIA source judges a GPU that stops answering",
    ),
    // --- XIDs that need a reset or a reboot ------------------------------------------------
    linked(rule(
        Signal::Xid(79),
        Failed,
        "xid_79",
        RebootNode,
        "GPU has fallen off the bus: unusable until a reboot, often a cold power cycle.",
        "catalogue: RESTART_BM; DCGM: fail",
    )),
    linked(rule(
        Signal::Xid(48),
        Failed,
        "xid_48",
        ResetGpu,
        "Double-bit (uncorrectable) ECC error: reset to retire the page or remap the row.",
        "catalogue: WORKFLOW_XID_48 (alone RESET_GPU, with 63/64 DRAIN_AND_RESET); DCGM: fail",
    )),
    linked(rule(
        Signal::Xid(64),
        Failed,
        "xid_64",
        ResetGpu,
        "A page retirement or row remap failed to record: reset; contact support if it repeats.",
        "catalogue: RESET_GPU; DCGM: fail",
    )),
    linked(rule(
        Signal::Xid(74),
        Failed,
        "xid_74",
        ResetGpu,
        "NVLink error: a GPU reset (on NVSwitch systems, all GPUs of the baseboard) or a reboot clears it.",
        "catalogue: WORKFLOW_NVLINK_ERR (reset or reboot); DCGM: fail",
    )),
    linked(rule(
        Signal::Xid(95),
        Failed,
        "xid_95",
        ResetGpu,
        "Uncontained memory error: every application on the GPU is affected; reset before reuse.",
        "catalogue: RESET_GPU; DCGM: fail; device plugin: unhealthy; NVSentinel: RESET_GPU. None disagrees on the immediate action (the catalogue's follow-up, IGNORE (sympathetic), is about the ECC XID it comes with)",
    )),
    linked(rule(
        Signal::Xid(109),
        Failed,
        "xid_109",
        ResetGpu,
        "Context switch timeout: reset the GPU.",
        "catalogue: RESET_GPU (linked from R570); NVSentinel: RESET_GPU; the device plugin ignores it as an application error and DCGM does not list it: the catalogue is NVIDIA's newest word",
    )),
    rule(
        Signal::Xid(46),
        Failed,
        "xid_46",
        ResetGpu,
        "GPU stopped processing: reset the GPU.",
        "catalogue: RESET_GPU; device plugin: unhealthy",
    ),
    linked(rule(
        Signal::Xid(62),
        Failed,
        "xid_62",
        ResetGpu,
        "Internal micro-controller halt: reset the GPU.",
        "catalogue: RESET_GPU; DCGM warns, calling it a thermal violation: the catalogue describes the code",
    )),
    linked(rule(
        Signal::Xid(110),
        Failed,
        "xid_110",
        ResetGpu,
        "Security fault: reset; if it persists, undo recent hardware changes and cold-reset the system.",
        "catalogue: RESET_GPU",
    )),
    rule(
        Signal::Xid(119),
        Failed,
        "xid_119",
        ResetGpu,
        "GSP RPC timeout: the GPU System Processor firmware hangs; reset, or power-cycle the node if it persists.",
        "catalogue: RESET_GPU; DCGM: fail",
    ),
    linked(rule(
        Signal::Xid(120),
        Failed,
        "xid_120",
        ResetGpu,
        "GSP error: the GPU System Processor firmware failed; reset, or power-cycle the node if it persists.",
        "catalogue: RESET_GPU; DCGM: fail",
    )),
    linked(rule(
        Signal::Xid(136),
        Failed,
        "xid_136",
        ResetGpu,
        "NVLink link training failed: reset the GPU.",
        "catalogue: RESET_GPU",
    )),
    rule(
        Signal::Xid(140),
        Failed,
        "xid_140",
        ResetGpu,
        "Unrecovered ECC error escaped the driver's page retirement or row remapping: reset; contact the vendor if it persists.",
        "catalogue: RESET_GPU; DCGM: fail",
    ),
    linked(rule(
        Signal::Xid(143),
        Failed,
        "xid_143",
        ResetGpu,
        "GPU initialisation error: reset the GPU.",
        "catalogue: RESET_GPU (linked from R575)",
    )),
    linked(rule(
        Signal::Xid(155),
        Failed,
        "xid_155",
        ResetGpu,
        "NVLink link down by software (including a transition to sleep): reset the GPU.",
        "catalogue: RESET_GPU",
    )),
    linked(rule(
        Signal::Xid(156),
        Failed,
        "xid_156",
        ResetGpu,
        "Resource retirement event: reset the GPU for the retirement to take effect.",
        "catalogue: RESET_GPU",
    )),
    linked(rule(
        Signal::Xid(158),
        Failed,
        "xid_158",
        ResetGpu,
        "GPU fatal timeout: reset the GPU.",
        "catalogue: RESET_GPU",
    )),
    // --- XIDs that degrade ------------------------------------------------------------------
    linked(rule(
        Signal::Xid(94),
        Degraded,
        "xid_94",
        RestartWorkload,
        "Contained memory error: the application using that memory must restart; the GPU serves others and wants a reset when convenient.",
        "catalogue: RESTART_APP, and a reset when convenient; DCGM: warn. Degraded rather than healthy for that reset",
    )),
    rule(
        Signal::Xid(54),
        Degraded,
        "xid_54",
        DrainAndService,
        "Auxiliary power is not connected to the board: check its seating and connections.",
        "catalogue: CHECK_MECHANICALS; DCGM: warn",
    ),
    linked(rule(
        Signal::Xids(NVLINK5),
        Degraded,
        "xid_144_150",
        Investigate,
        "Blackwell NVLink error (XID 144-150): its action depends on the decode of the kernel log line; the driver's recovery action gives it where read.",
        "catalogue: WORKFLOW_NVLINK5_ERR (IGNORE to RESET_GPU by decode)",
    )),
    // --- XIDs that leave the GPU healthy ----------------------------------------------------
    rule(
        Signal::Xid(31),
        Healthy,
        "xid_31",
        RestartWorkload,
        "GPU memory page fault: an application accessed an invalid address; the GPU stays healthy.",
        "catalogue: RESTART_APP; device plugin: ignored; DCGM warns (memory): the catalogue and the device plugin agree it is the application's",
    ),
    rule(
        Signal::Xid(43),
        Healthy,
        "xid_43",
        None,
        "GPU stopped processing: the faulting application's context was torn down; the GPU stays healthy.",
        "catalogue: IGNORE (\"the GPU remains in a healthy state\"); device plugin: ignored; DCGM warns (memory): the catalogue says so in words",
    ),
    rule(
        Signal::Xid(45),
        Healthy,
        "xid_45",
        None,
        "Preemptive cleanup after an earlier error or a killed process; follow the XID it comes with.",
        "catalogue: WORKFLOW_XID_45 (not alone: follow the other XID); device plugin: ignored",
    ),
    rule(
        Signal::Xid(63),
        Healthy,
        "xid_63",
        None,
        "A page retirement or row remap was recorded: the pending flags (row_remap_pending, retired_pages_pending) carry what it asks.",
        "catalogue: IGNORE; DCGM: warn (pending retirement), which the pending-flag rules give",
    ),
    rule(
        Signal::Xid(92),
        Healthy,
        "xid_92",
        None,
        "High single-bit ECC error rate: corrected errors; watch the ECC counters.",
        "catalogue: IGNORE",
    ),
    rule(
        Signal::Xid(154),
        Healthy,
        "xid_154",
        None,
        "The driver's recovery action changed: the recovery action rules judge it.",
        "catalogue: XID_154 (follow the recovery action)",
    ),
    rule(
        Signal::Xid(160),
        Healthy,
        "xid_160",
        None,
        "Channel retirement event (B100, GB200).",
        "catalogue: IGNORE; NVSentinel: RESTART_BM: the catalogue is NVIDIA's own table and NVSentinel gives no reason",
    ),
    rule(
        Signal::Xids(RESTART_APP),
        Healthy,
        "xid_restart_app",
        RestartWorkload,
        "The catalogue's application faults (XID 8, 11, 13, 25, 32, 39-41, 60, 68-72, 75-77, 80, 82-86, 88, 89, 96-105, 126-135, 139): restart the application; the GPU stays healthy.",
        "catalogue: RESTART_APP; device plugin: 13 and 68 ignored; DCGM warns on 32, 39 and 60 under names that contradict the catalogue's mnemonics (PCIe, thermal): the catalogue's are the driver's",
    ),
    rule(
        Signal::Xids(IGNORE),
        Healthy,
        "xid_ignore",
        None,
        "The catalogue's informational codes (XID 14, 37, 38, 44, 66, 67, 93, 106-108, 121, 137, 141, 152, 153, 157, 161): no action.",
        "catalogue: IGNORE; DCGM warns on 38, 67, 121 and 137 (and 93 on Volta), several under names that contradict the catalogue's mnemonics",
    ),
    rule(
        Signal::XidUnlisted,
        Degraded,
        "xid_unlisted",
        Investigate,
        "An XID no row lists (unused codes, 78, 151, 159, 162 and newer, 999 unknown): look it up in NVIDIA's catalogue and act on it.",
        "device plugin: unhealthy (every XID but its application list); NVSentinel: contact support; catalogue: CONTACT_SUPPORT for unused codes. Degraded: nothing says the GPU must stop",
    ),
    // --- Memory -----------------------------------------------------------------------------
    rule(
        Signal::UnrepairableMemory,
        Failed,
        "unrepairable_memory",
        DrainAndService,
        "The driver flags memory it can no longer repair: run NVIDIA's field diagnostic; the board needs service.",
        "nvml.h (R590); DCGM: fail, run the field diagnostic",
    ),
    rule(
        Signal::SramThreshold,
        Failed,
        "sram_threshold",
        DrainAndService,
        "SRAM uncorrectable errors passed the field diagnostic's threshold: run the field diagnostic (NVIDIA's RMA flow). Read as root only.",
        "catalogue: WORKFLOW_XID_48 (threshold set: field diagnostic); DCGM: isolate",
    ),
    rule(
        Signal::RowRemapFailure,
        Failed,
        "row_remap_failure",
        DrainAndService,
        "A row remapping failed: the memory cannot repair itself; the board needs service.",
        "memory guide: an RMA condition; DCGM: fail (it says reset): the memory guide's RMA policy",
    ),
    rule(
        Signal::EccUncorrectable,
        Failed,
        "ecc_uncorrectable",
        ResetGpu,
        "Uncorrectable ECC errors since the driver loaded: drain the GPU and reset it (or reboot the node).",
        "DCGM: fail, \"drain the GPU and reset it or reboot the node\"",
    ),
    rule(
        Signal::RetiredPagesLimit,
        Failed,
        "retired_pages_limit",
        DrainAndService,
        "63 or more pages retired (before Ampere): run the field diagnostic; the board needs service.",
        "DCGM: fail at 63 retired pages (its rate rule over a week is not judged here)",
    ),
    rule(
        Signal::RowRemapPending,
        Degraded,
        "row_remap_pending",
        ResetGpu,
        "A row remapping waits for the next reset to take effect; running work is unaffected.",
        "memory guide: remapping happens at the next reset",
    ),
    rule(
        Signal::RetiredPagesPending,
        Degraded,
        "retired_pages_pending",
        ResetGpu,
        "A memory page with ECC errors waits for the next reset (or reboot) to be retired (before Ampere).",
        "DCGM: warn",
    ),
    // --- Links ------------------------------------------------------------------------------
    rule(
        Signal::NvlinkDown,
        Failed,
        "nvlink_down",
        ResetGpu,
        "An NVLink link of the board is down; links are not judged while a GPU of the node is in MIG mode, where drivers report them all down.",
        "DCGM: fail, and down links ignored in MIG mode (its bug 200682374)",
    ),
    rule(
        Signal::PcieReplayRate,
        Degraded,
        "pcie_replay_rate",
        DrainAndService,
        "More PCIe replays in a minute than 1e-12 of the link's bit rate (DCGM's bound per lane and generation): reseat the card, check the slot.",
        "DCGM: warn, \"reconnect PCIe card\"",
    ),
    rule(
        Signal::PcieWidth,
        Healthy,
        "pcie_width",
        None,
        "The PCIe link trained to fewer lanes than its maximum: reported (nvidia_gpu_pcie_link_width), not judged.",
        "DCGM's health watches do not judge the width; NVIDIA's tools only report it",
    ),
    // --- Clocks -----------------------------------------------------------------------------
    rule(
        Signal::ThermalSlowdown,
        Degraded,
        "thermal_slowdown",
        None,
        "Clocks held down for temperature: nothing to do to the GPU; check the node's cooling.",
        "DCGM: warn (thermal violation)",
    ),
    rule(
        Signal::PowerSlowdown,
        Degraded,
        "power_slowdown",
        None,
        "Clocks held down by the power brake: nothing to do to the GPU; check the node's power supply.",
        "DCGM: warn (power violation)",
    ),
    // --- The NVLink fabric (NVSwitch systems) and the PCI bus ---------------------------------
    // DCGM's health watch (NVIDIA/DCGM, modules/health/DcgmHealthWatch.cpp, MonitorFabricFields)
    // fails a GPU for each of these fabric conditions; the sources of each action are in
    // docs/alerts.md.
    rule(
        Signal::FabricNotRegistered,
        Failed,
        "fabric_not_registered",
        ResetGpu,
        "Not registered with the NVLink fabric --fabric-registration-timeout after the exporter or the driver started: no NVLink peer-to-peer. Check nvidia-fabricmanager first.",
        "DCGM: fail (fabric state not completed); the timeout is the exporter's, as NVIDIA documents none (NVSentinel proposes 300 s)",
    ),
    rule(
        Signal::FabricRegistrationFailed,
        Failed,
        "fabric_registration_failed",
        ResetGpu,
        "The registration with the NVLink fabric ended in an error: no NVLink peer-to-peer. Check nvidia-fabricmanager first.",
        "DCGM: fail (fabric status not success)",
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
        "NVSentinel: GpuTotalCountMismatch; reboot as for a GPU off the bus (catalogue: XID 79 RESTART_BM)",
    ),
];

/// The sources the rows name, with where to read them.
pub const SOURCES: &[(&str, &str)] = &[
    (
        "catalogue",
        "NVIDIA, \"Analyzing Xid Errors with the Xid Catalog\" (Ampere and newer): the immediate resolution bucket and the \"Xid 154 linkage\" of each code, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    ),
    (
        "DCGM",
        "NVIDIA DCGM 4.6.0, modules/health/DcgmHealthWatch.cpp (BuildXidMappings, the memory, PCIe, NVLink and recovery-action watches) and dcgm_errors.h/.c (next steps, severities), https://github.com/NVIDIA/DCGM",
    ),
    (
        "device plugin",
        "NVIDIA k8s-device-plugin, internal/rm/health.go: every XID marks the GPU unhealthy but 13, 31, 43, 45, 68 and 109, https://github.com/NVIDIA/k8s-device-plugin",
    ),
    (
        "NVSentinel",
        "NVIDIA NVSentinel, xiderrorsmapping.csv of its GPU health monitor chart, https://github.com/NVIDIA/NVSentinel",
    ),
    (
        "memory guide",
        "NVIDIA GPU Memory Error Management, \"Error Recovery and Response Flags\", https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/",
    ),
    (
        "nvml.h",
        "NVML's header (CUDA 13) and change log: the recovery action values, its field and event (R565), the unrepairable-memory flag (R590), the SRAM status (root only), https://docs.nvidia.com/deploy/nvml-api/",
    ),
];

/// A rule of a fabric health mask condition: failed, as DCGM's health watch judges each.
const fn fabric(condition: FabricCondition, reason: &'static str, doc: &'static str) -> Rule {
    rule(
        Signal::Fabric(condition),
        Failed,
        reason,
        ResetGpu,
        doc,
        "DCGM: fail (fabric health mask)",
    )
}

/// What an operator does for each action, for docs/health.md.
pub fn action_doc(action: HealthAction) -> &'static str {
    match action {
        None => {
            "Nothing to do to the GPU; the cause is outside it (cooling, power) or needs only watching."
        }
        RestartWorkload => "Restart the affected workload; the GPU itself is fine for others.",
        DrainP2p => {
            "Stop the workloads that use peer-to-peer traffic (NVLink or PCIe P2P) on the GPU and disable UVM persistence mode; the driver clears the action once drained."
        }
        Investigate => {
            "Look the code up (NVIDIA's XID catalogue, nvml.h) and act on what it says; `dmesg` has the driver's full message."
        }
        ResetGpu => {
            "Drain the GPU, then `nvidia-smi --gpu-reset -i GPU` (on NVSwitch systems reset the GPUs together); reboot if the reset fails."
        }
        RebootNode => "Drain the node and reboot it (often a cold power cycle).",
        DrainAndService => {
            "Drain the node and open a hardware ticket (reseat, run NVIDIA's field diagnostic, replace or RMA the board)."
        }
    }
}

/// The table's row for an XID code; `None` for an unlisted code.
pub fn xid_rule(code: u64) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.signal.names_xid(code))
}

/// The rule of XIDs no row lists.
pub fn unlisted_xid_rule() -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.signal == Signal::XidUnlisted)
        .expect("the table has a rule for unlisted XIDs")
}

/// The XID codes whose own row fails the GPU, in ascending order: the `NvidiaGpuXidError`
/// alert's critical ones.
pub fn critical_xids() -> Vec<u64> {
    let mut codes: Vec<u64> = RULES
        .iter()
        .filter(|r| r.state == Failed)
        .flat_map(|r| match r.signal {
            Signal::Xid(code) => vec![code],
            Signal::Xids(codes) => codes.to_vec(),
            _ => Vec::new(),
        })
        .collect();
    codes.sort_unstable();
    codes
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
            assert!(!r.source.is_empty(), "{} names no source", r.reason);
        }
    }

    #[test]
    fn an_xid_code_has_one_row_at_most() {
        for code in 0..=1000 {
            let rows = RULES.iter().filter(|r| r.signal.names_xid(code)).count();
            assert!(rows <= 1, "XID {code} in {rows} rows");
        }
    }

    #[test]
    fn xids_follow_the_catalogue_buckets() {
        // RESET_GPU and RESTART_BM fail the GPU; RESTART_APP and IGNORE leave it healthy.
        for code in [
            46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158,
        ] {
            assert_eq!(xid_rule(code).map(|r| r.state), Some(Failed), "{code}");
        }
        for code in [8, 13, 31, 43, 45, 63, 92, 121, 154, 160] {
            assert_eq!(xid_rule(code).map(|r| r.state), Some(Healthy), "{code}");
        }
        assert_eq!(xid_rule(79).map(|r| r.action), Some(RebootNode));
        assert!(xid_rule(1).is_none() && xid_rule(999).is_none());
        assert_eq!(unlisted_xid_rule().state, Degraded);
        assert_eq!(unlisted_xid_rule().action, Investigate);
    }

    #[test]
    fn recovery_action_values_map_to_their_class() {
        assert_eq!(Recovery::of(0), Option::None);
        assert_eq!(Recovery::of(1), Some(Recovery::GpuReset));
        assert_eq!(Recovery::of(4), Some(Recovery::DrainAndReset));
        assert_eq!(Recovery::of(7), Some(Recovery::Other));
        for r in [
            Recovery::GpuReset,
            Recovery::NodeReboot,
            Recovery::DrainP2p,
            Recovery::DrainAndReset,
            Recovery::Other,
        ] {
            assert!(
                RULES
                    .iter()
                    .any(|rule| rule.signal == Signal::RecoveryAction(r)),
                "{r:?}"
            );
        }
    }

    #[test]
    fn the_critical_xids_are_those_that_fail_the_gpu() {
        let critical = critical_xids();
        assert!(critical.contains(&140) && critical.contains(&79));
        assert!(!critical.contains(&31) && !critical.contains(&94));
        assert!(critical.windows(2).all(|w| w[0] < w[1]));
    }
}

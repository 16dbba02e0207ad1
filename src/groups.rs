//! Collector groups: every family of the [catalog](crate::metrics::catalog) belongs to one, and
//! a group that is off is neither sampled (its NVML calls are skipped) nor served. They sit on
//! the ground floor: the sampler, the encoder and the configuration all decide by them.
//!
//! `--collector.NAME` / `--no-collector.NAME` switch one group, `--collector.disable-defaults`
//! starts from none (node_exporter's convention; see `crate::config::Collectors`). The defaults
//! keep a GPU at a few dozen series: the detail that multiplies series (per link, per pipe, per
//! engine, per clock-event reason) and readings that rarely change are opt-in.

use std::fmt;

/// A named group of families. [`Group::Core`] (identity, `up`, pod assignments and the exporter's
/// own families) is always on; every other group can be switched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Group {
    /// `nvidia_gpu_info`, `nvidia_gpu_up`, `nvidia_gpu_pod_info` and `nvml_exporter_*`.
    Core,
    /// GPU and memory-controller utilization, and its busy-time counter.
    Utilization,
    /// Video encoder and decoder utilization and each media engine's activity (GPM).
    Media,
    /// GPM engine activity: graphics engine, SMs, tensor cores, DRAM.
    Saturation,
    /// GPM activity of each SM pipe; the GPM busy-time counters.
    Pipes,
    /// PCIe and NVLink bandwidth averaged over the sampling interval (GPM).
    Bandwidth,
    /// Device memory.
    Memory,
    /// BAR1 memory.
    Bar1,
    /// Power draw, limit and energy.
    Power,
    /// The power management (requested) limit beside the enforced one.
    PowerLimits,
    /// Temperatures, fans, thermal slowdown.
    Thermal,
    /// Temperature thresholds.
    ThermalThresholds,
    /// Clock frequencies and the performance state.
    Clocks,
    /// Clock-event (throttle) reasons and violation times.
    ClockEvents,
    /// PCIe throughput and replays.
    Pcie,
    /// PCIe link generation and width.
    PcieLink,
    /// Volatile ECC counters.
    Ecc,
    /// Lifetime ECC counters and remapped rows.
    EccLifetime,
    /// Row remapping state and retired pages.
    RowRemap,
    /// XID events.
    Xid,
    /// The health verdict of each GPU (`crate::health`).
    Health,
    /// NVLink summed over a GPU's links.
    Nvlink,
    /// NVLink per link.
    NvlinkLinks,
    /// MIG mode and instances.
    Mig,
    /// Per-process and per-pod usage (`--processes`).
    Processes,
    /// The HPC jobs on each GPU (`--hpc-job-mapping-dir`).
    Jobs,
    /// GPU-seconds held, held idle and SM-active per container (`--kubernetes`).
    Workloads,
    /// Each GPU's registration with the NVLink fabric (NVSwitch systems).
    Fabric,
    /// The NVLink fabric's health mask, summary and identity of each GPU.
    FabricHealth,
    /// The GPUs the PCI bus lists that NVML does not enumerate (`--host-sys`).
    Inventory,
}

/// What the docs, `--help` and the error for an unknown name say of a group.
#[derive(Debug, Clone, Copy)]
pub struct GroupInfo {
    /// The group.
    pub group: Group,
    /// Its name in `--collector.NAME`, the file and the environment.
    pub name: &'static str,
    /// On unless switched off.
    pub default: bool,
    /// One line for `--help` and the docs.
    pub help: &'static str,
}

/// Every group, [`Group::Core`] first, in the order `--help` and the docs list them.
pub const GROUPS: &[GroupInfo] = &[
    info(
        Group::Core,
        "core",
        true,
        "GPU identity, up, pod assignment and the exporter's own metrics (always on)",
    ),
    info(
        Group::Utilization,
        "utilization",
        true,
        "GPU and memory-controller utilization, and the seconds a kernel ran",
    ),
    info(
        Group::Saturation,
        "saturation",
        true,
        "GPM activity: SM active (and its busy-time counter) and occupancy, tensor cores, DRAM (Hopper and newer)",
    ),
    info(
        Group::Memory,
        "memory",
        true,
        "device memory total, used, free and reserved",
    ),
    info(
        Group::Power,
        "power",
        true,
        "power draw, enforced limit and energy",
    ),
    info(
        Group::Thermal,
        "thermal",
        true,
        "GPU and memory temperature, fan speeds, thermal slowdown",
    ),
    info(
        Group::Pcie,
        "pcie",
        true,
        "PCIe throughput and replay errors",
    ),
    info(Group::Ecc, "ecc", true, "volatile ECC error counters"),
    info(
        Group::RowRemap,
        "row-remap",
        true,
        "row remapping pending and failed (Ampere and newer) and retired pages (older GPUs)",
    ),
    info(Group::Xid, "xid", true, "XID error events"),
    info(
        Group::Health,
        "health",
        true,
        "each GPU's health verdict: state, and each active reason with its action (read whatever other groups are on)",
    ),
    info(
        Group::Nvlink,
        "nvlink",
        true,
        "NVLink per GPU: links up, bytes and errors summed over the links",
    ),
    info(
        Group::Fabric,
        "fabric",
        true,
        "each GPU's registration with the NVLink fabric of an NVSwitch system",
    ),
    info(
        Group::Inventory,
        "inventory",
        true,
        "the GPUs the PCI bus lists (--host-sys) that NVML does not enumerate, per node",
    ),
    info(
        Group::Mig,
        "mig",
        true,
        "MIG mode, instances, and the instances' own memory and GPM series",
    ),
    info(
        Group::Processes,
        "processes",
        true,
        "per-process and per-pod usage (served with --processes)",
    ),
    info(
        Group::Jobs,
        "jobs",
        true,
        "the HPC jobs on each GPU (served with --hpc-job-mapping-dir)",
    ),
    info(
        Group::Workloads,
        "workloads",
        true,
        "GPU-seconds each container held, held idle and kept SMs active (served with --kubernetes)",
    ),
    info(
        Group::NvlinkLinks,
        "nvlink-links",
        false,
        "NVLink per link: state, bytes and errors of each link",
    ),
    info(
        Group::Clocks,
        "clocks",
        false,
        "current and maximum clock frequencies by domain, performance state",
    ),
    info(
        Group::FabricHealth,
        "fabric-health",
        false,
        "the NVLink fabric's health per GPU: each condition of its health mask, the driver's summary, and the clique, cluster, status and configuration as info",
    ),
    info(
        Group::ClockEvents,
        "clock-events",
        false,
        "each clock-event (throttle) reason's state and time held down by violation policy",
    ),
    info(
        Group::ThermalThresholds,
        "thermal-thresholds",
        false,
        "temperature thresholds (slowdown, shutdown, maximum operating)",
    ),
    info(
        Group::PowerLimits,
        "power-limits",
        false,
        "the power management limit set for the board, above the enforced one when another limiter caps it",
    ),
    info(
        Group::PcieLink,
        "pcie-link",
        false,
        "PCIe link generation and width, current and maximum",
    ),
    info(
        Group::EccLifetime,
        "ecc-lifetime",
        false,
        "lifetime (InfoROM) ECC error counters and the rows remapped after them",
    ),
    info(Group::Bar1, "bar1", false, "BAR1 memory total and used"),
    info(
        Group::Pipes,
        "pipes",
        false,
        "GPM activity of each SM pipe (FP64, FP32, FP16, integer, tensor pipes) and of the graphics engine, and the SM-occupancy, tensor and DRAM busy-time counters",
    ),
    info(
        Group::Media,
        "media",
        false,
        "video encoder and decoder utilization, each media engine's activity (GPM)",
    ),
    info(
        Group::Bandwidth,
        "bandwidth",
        false,
        "PCIe and NVLink bandwidth averaged over the sampling interval (GPM)",
    ),
];

const fn info(group: Group, name: &'static str, default: bool, help: &'static str) -> GroupInfo {
    GroupInfo {
        group,
        name,
        default,
        help,
    }
}

impl Group {
    /// The group's row of [`GROUPS`].
    pub fn info(self) -> &'static GroupInfo {
        GROUPS
            .iter()
            .find(|g| g.group == self)
            .expect("every group has a row in GROUPS")
    }

    /// Its name in `--collector.NAME`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The group called `name`, if one is.
    pub fn from_name(name: &str) -> Option<Group> {
        GROUPS.iter().find(|g| g.name == name).map(|g| g.group)
    }

    /// Every group but [`Group::Core`]: those `--collector.NAME` switches.
    pub fn switchable() -> impl Iterator<Item = &'static GroupInfo> {
        GROUPS.iter().filter(|g| g.group != Group::Core)
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The order in which `--max-series` drops groups: the most detailed first (per process and
/// pod, per link, per engine, per pipe, per reason), the GPU's vital signs last. [`Group::Core`]
/// (identity, `up`) is never dropped.
pub const DROP_ORDER: &[Group] = &[
    Group::Processes,
    Group::Jobs,
    Group::Workloads,
    Group::NvlinkLinks,
    Group::FabricHealth,
    Group::Media,
    Group::Pipes,
    Group::ClockEvents,
    Group::ThermalThresholds,
    Group::PowerLimits,
    Group::Clocks,
    Group::PcieLink,
    Group::EccLifetime,
    Group::Bar1,
    Group::Bandwidth,
    Group::Mig,
    Group::Xid,
    Group::Fabric,
    Group::Nvlink,
    Group::Pcie,
    Group::RowRemap,
    Group::Ecc,
    Group::Thermal,
    Group::Power,
    Group::Memory,
    Group::Saturation,
    Group::Utilization,
    Group::Inventory,
    Group::Health,
];

/// The names `--collector.NAME` accepts, comma-separated, for error messages.
pub fn valid_names() -> String {
    Group::switchable()
        .map(|g| g.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A set of groups; [`Group::Core`] is always in it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Groups(u32);

impl Groups {
    /// Core only.
    pub const fn none() -> Groups {
        Groups(1 << Group::Core as u32)
    }

    /// The groups on by default.
    pub fn defaults() -> Groups {
        GROUPS
            .iter()
            .filter(|g| g.default)
            .fold(Groups::none(), |s, g| s.with(g.group))
    }

    /// Every group.
    pub fn all() -> Groups {
        GROUPS.iter().fold(Groups::none(), |s, g| s.with(g.group))
    }

    /// Whether `group` is in the set.
    pub fn contains(self, group: Group) -> bool {
        self.0 & group.bit() != 0
    }

    /// The set with `group` added.
    #[must_use]
    pub fn with(self, group: Group) -> Groups {
        Groups(self.0 | group.bit())
    }

    /// The set without `group` ([`Group::Core`] stays).
    #[must_use]
    pub fn without(self, group: Group) -> Groups {
        if group == Group::Core {
            self
        } else {
            Groups(self.0 & !group.bit())
        }
    }

    /// The set with `other`'s groups added.
    #[must_use]
    pub fn union(self, other: Groups) -> Groups {
        Groups(self.0 | other.0)
    }

    /// Whether any of `groups` is in the set.
    pub fn any(self, groups: &[Group]) -> bool {
        groups.iter().any(|g| self.contains(*g))
    }

    /// The groups of the set, in [`GROUPS`] order.
    pub fn iter(self) -> impl Iterator<Item = Group> {
        GROUPS
            .iter()
            .map(|g| g.group)
            .filter(move |g| self.contains(*g))
    }
}

impl Default for Groups {
    /// [`Groups::defaults`].
    fn default() -> Self {
        Groups::defaults()
    }
}

impl fmt::Debug for Groups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(Group::name)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_has_one_row_and_a_distinct_name() {
        for (i, g) in GROUPS.iter().enumerate() {
            assert_eq!(g.group.info().name, g.name);
            assert_eq!(Group::from_name(g.name), Some(g.group));
            assert!(
                GROUPS[..i]
                    .iter()
                    .all(|o| o.name != g.name && o.group != g.group),
                "{} twice",
                g.name
            );
            assert!(
                g.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
        }
        assert_eq!(GROUPS.len(), Group::Inventory as usize + 1);
    }

    #[test]
    fn every_group_but_core_is_in_the_drop_order_once() {
        for g in Group::switchable() {
            assert_eq!(
                DROP_ORDER.iter().filter(|d| **d == g.group).count(),
                1,
                "{}",
                g.name
            );
        }
        assert!(!DROP_ORDER.contains(&Group::Core));
    }

    #[test]
    fn core_is_always_in_the_set() {
        assert!(Groups::none().contains(Group::Core));
        assert!(Groups::none().without(Group::Core).contains(Group::Core));
        assert!(!Groups::none().contains(Group::Memory));
        let s = Groups::none().with(Group::Memory);
        assert!(s.contains(Group::Memory));
        assert!(!s.without(Group::Memory).contains(Group::Memory));
        assert!(Groups::defaults().contains(Group::Nvlink));
        assert!(!Groups::defaults().contains(Group::NvlinkLinks));
        assert!(Groups::all().contains(Group::NvlinkLinks));
    }
}

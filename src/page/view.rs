//! The node view: what the node page (`/`) and `/api/v1/gpus` show, one struct for both.
//!
//! [`NodeView::new`] builds it from the snapshot the current exposition was encoded from, through
//! the same resolve step as `/metrics` (owners, MIG instances, jobs), with each reading of
//! [`super::fields`] read by its family's catalog row, so its numbers are the served ones in the
//! same base units: a script pairs `last_tick_timestamp_seconds` with
//! `nvml_exporter_last_sample_timestamp_seconds` and reads equal values. A device that is down
//! shows no readings, as `/metrics` serves none.
//!
//! The marks are the alert rules' conditions (`deploy/prometheus/alerts.yaml`) on this tick's
//! values, without their 30 minutes: "busy, not saturated" is `NvidiaGpuLowSaturation`'s, and
//! "allocated, idle" `NvidiaGpuIdleWhileAllocated`'s with `--idle-threshold` for its 5 %. A failed
//! GPU gets neither, as the alerts leave it out.

use serde::Serialize;

pub use super::fields::Readings;
use crate::groups::{Group, Groups};
use crate::metrics::MetricsOptions;
use crate::metrics::catalog::VERSION;
use crate::metrics::resolve::{self, DeviceView, InstanceView};
use crate::sample::{ContainerRef, Health, HealthState, Snapshot, SystemInfo};

/// `NvidiaGpuLowSaturation`: kernels run at least this share of the time…
pub const BUSY_UTILIZATION: f64 = 0.9;
/// …while fewer than this share of the SMs are active.
pub const SATURATED_SM_ACTIVE: f64 = 0.3;
/// Without pod assignments, a GPU whose processes hold more than this much memory is allocated
/// (`gpu:nvidia_gpu_allocated:pod_info_or_memory_used`).
pub const ALLOCATED_MEMORY_BYTES: f64 = 1024.0 * 1024.0 * 1024.0;

/// Everything the page shows about the node.
#[derive(Debug, Serialize)]
pub struct NodeView {
    /// The node's name (`NODE_NAME`, else the host name).
    pub node: String,
    /// The exporter's version.
    pub exporter_version: &'static str,
    /// The NVIDIA driver's version; empty when unknown.
    pub driver_version: String,
    /// The CUDA driver API version, "major.minor"; empty when unknown.
    pub cuda_driver_version: String,
    /// NVML answers (`nvml_exporter_nvml_up`).
    pub nvml_up: bool,
    /// Why it does not, or why nothing was sampled yet.
    pub nvml_error: Option<String>,
    /// The collector groups on.
    pub collector_groups: Vec<&'static str>,
    /// End of the last complete tick, seconds since the Unix epoch
    /// (`nvml_exporter_last_sample_timestamp_seconds`).
    pub last_tick_timestamp_seconds: Option<f64>,
    /// How long ago that was when this view was built.
    pub last_tick_age_seconds: Option<f64>,
    /// The thresholds behind the marks.
    pub thresholds: Thresholds,
    /// The GPUs the PCI bus lists that NVML does not enumerate (`nvidia_node_missing_gpu_info`);
    /// `None` when that cannot be told or the `inventory` group is off.
    pub missing_gpus: Option<Vec<MissingGpuView>>,
    /// The node's own verdict: the reasons no GPU carries; `None` while the `health` group is
    /// off or the node cannot be judged.
    pub node_health: Option<HealthView>,
    /// Every GPU, by index.
    pub gpus: Vec<GpuView>,
}

/// A GPU the PCI bus lists that NVML does not enumerate.
#[derive(Debug, Serialize)]
pub struct MissingGpuView {
    /// Its PCI address, "0000:ca:00.0".
    pub pci_bus_id: String,
    /// Its PCI device id, "0x2330".
    pub device_id: String,
    /// The driver bound to it; empty when none is.
    pub driver: String,
}

/// The thresholds of the marks, as the alert rules set them (the idle one from
/// `--idle-threshold`).
#[derive(Debug, Serialize)]
pub struct Thresholds {
    /// Allocated and SM activity (utilization without GPM) below this: idle.
    pub idle_below: f64,
    /// Utilization from this…
    pub busy_utilization_from: f64,
    /// …with SM activity below this: busy, not saturated.
    pub saturated_sm_active_from: f64,
    /// Without pod assignments on the node, allocated means more memory used than this.
    pub allocated_memory_above_bytes: f64,
}

/// Whether a device's readings are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Read this tick.
    Up,
    /// Missed this tick's deadline: the readings are from an earlier tick.
    Stale,
    /// Lost, or without a fresh reading past `--stale-grace` (`nvidia_gpu_up 0`): no readings.
    Down,
}

impl DeviceState {
    /// Its name in the JSON and the page's `data-state`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceState::Up => "up",
            DeviceState::Stale => "stale",
            DeviceState::Down => "down",
        }
    }
}

/// A condition of the alert rules that holds for a device on this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Kernels run nearly all the time, on few SMs (`NvidiaGpuLowSaturation`).
    BusyNotSaturated,
    /// Held by a pod (or its processes hold memory) but idle (`NvidiaGpuIdleWhileAllocated`).
    AllocatedIdle,
}

impl Mark {
    /// Its name in the JSON and the page's `data-marks`.
    pub fn name(self) -> &'static str {
        match self {
            Mark::BusyNotSaturated => "busy_not_saturated",
            Mark::AllocatedIdle => "allocated_idle",
        }
    }

    /// What the page says.
    pub fn text(self) -> &'static str {
        match self {
            Mark::BusyNotSaturated => "busy, not saturated",
            Mark::AllocatedIdle => "allocated, idle",
        }
    }
}

impl Serialize for DeviceState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Serialize for Mark {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A container holding a GPU or MIG instance.
#[derive(Debug, Serialize)]
pub struct Holder {
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod.
    pub pod: String,
    /// The container.
    pub container: String,
}

/// The health verdict (`nvidia_gpu_health_state`, `nvidia_gpu_health_reason`).
#[derive(Debug, Serialize)]
pub struct HealthView {
    /// `healthy`, `degraded` or `failed`.
    pub state: &'static str,
    /// Each active reason with the action it asks for.
    pub reasons: Vec<ReasonView>,
}

/// One active reason of a verdict.
#[derive(Debug, Serialize)]
pub struct ReasonView {
    /// The `reason` label.
    pub reason: &'static str,
    /// The `action` label.
    pub action: &'static str,
}

/// One GPU.
#[derive(Debug, Serialize)]
pub struct GpuView {
    /// NVML index (the `gpu` label).
    pub gpu: u32,
    /// "GPU-…".
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Whether its readings are current.
    pub state: DeviceState,
    /// Its readings, one key per field of the page (none while down).
    #[serde(flatten)]
    pub readings: Readings,
    /// MIG mode; `None` on GPUs without MIG.
    pub mig_mode: Option<bool>,
    /// The containers the kubelet assigned the whole GPU to.
    pub holders: Vec<Holder>,
    /// The HPC jobs on the whole GPU.
    pub jobs: Vec<String>,
    /// Allocated, as the alert rules count it.
    pub allocated: bool,
    /// The conditions that hold now.
    pub marks: Vec<Mark>,
    /// The health verdict; `None` while the health group is off.
    pub health: Option<HealthView>,
    /// Its MIG GPU instances.
    pub mig_instances: Vec<MigInstanceView>,
}

/// One MIG GPU instance.
#[derive(Debug, Serialize)]
pub struct MigInstanceView {
    /// The GPU instance id (`gpu_instance` label).
    pub gpu_instance: u32,
    /// Its profile, e.g. "1g.10gb".
    pub profile: String,
    /// Its own readings: memory and GPM.
    #[serde(flatten)]
    pub readings: Readings,
    /// The containers the kubelet assigned it to.
    pub holders: Vec<Holder>,
    /// The HPC jobs on it.
    pub jobs: Vec<String>,
    /// Allocated, as the alert rules count it.
    pub allocated: bool,
    /// The conditions that hold now.
    pub marks: Vec<Mark>,
}

impl NodeView {
    /// The view of `snap` (what was encoded with `opts`) at `now` (seconds since the Unix
    /// epoch) on node `node`; `sampled` is false before the first tick.
    pub fn new(
        snap: &Snapshot,
        sampled: bool,
        opts: &MetricsOptions,
        node: &str,
        now: f64,
    ) -> NodeView {
        let devices = resolve::resolve(snap, opts);
        // As gpu:nvidia_gpu_allocated:pod_info_or_memory_used: where the kubelet assigned any
        // GPU of the node, assignments are the only allocations; elsewhere memory held is.
        let by_pods = devices.iter().any(|d| {
            !d.containers.is_empty() || d.instances.iter().any(|i| !i.containers.is_empty())
        });
        let judge = Judge {
            system: &snap.system,
            idle_below: opts.idle_threshold,
            by_pods,
        };
        NodeView {
            node: node.to_owned(),
            exporter_version: VERSION,
            driver_version: snap.system.driver_version.clone(),
            cuda_driver_version: snap.system.cuda_driver_version.clone(),
            nvml_up: snap.nvml_up,
            nvml_error: if sampled {
                snap.nvml_error.clone().filter(|_| !snap.nvml_up)
            } else {
                Some("no sample yet".into())
            },
            collector_groups: groups(opts.groups),
            last_tick_timestamp_seconds: snap.last_tick_timestamp_seconds,
            // A clock stepped backwards reads as fresh, as for /readyz.
            last_tick_age_seconds: snap.last_tick_timestamp_seconds.map(|t| (now - t).max(0.0)),
            thresholds: Thresholds {
                idle_below: opts.idle_threshold,
                busy_utilization_from: BUSY_UTILIZATION,
                saturated_sm_active_from: SATURATED_SM_ACTIVE,
                allocated_memory_above_bytes: ALLOCATED_MEMORY_BYTES,
            },
            missing_gpus: snap
                .missing_gpus
                .as_ref()
                .filter(|_| opts.groups.contains(Group::Inventory))
                .map(|missing| {
                    missing
                        .iter()
                        .map(|g| MissingGpuView {
                            pci_bus_id: g.address.clone(),
                            device_id: g.device_id.clone(),
                            driver: g.driver.clone(),
                        })
                        .collect()
                }),
            node_health: snap.node_health.as_ref().map(health_view),
            gpus: devices.iter().map(|d| judge.gpu(d)).collect(),
        }
    }
}

fn health_view(h: &Health) -> HealthView {
    HealthView {
        state: h.state.label(),
        reasons: h
            .reasons
            .iter()
            .map(|r| ReasonView {
                reason: r.reason,
                action: r.action.label(),
            })
            .collect(),
    }
}

fn groups(groups: Groups) -> Vec<&'static str> {
    groups.iter().map(|g| g.name()).collect()
}

/// The alert rules' conditions, with the node's allocation rule.
struct Judge<'a> {
    /// What the catalog's readers are given besides a device.
    system: &'a SystemInfo,
    idle_below: f64,
    /// Allocations are the kubelet's assignments (else memory held).
    by_pods: bool,
}

impl Judge<'_> {
    fn gpu(&self, d: &DeviceView<'_>) -> GpuView {
        let s = d.sample;
        let state = match (s.up, s.stale) {
            (false, _) => DeviceState::Down,
            (true, true) => DeviceState::Stale,
            (true, false) => DeviceState::Up,
        };
        let readings = if s.up {
            Readings::read(self.system, s)
        } else {
            Readings::default()
        };
        let failed = s
            .health
            .as_ref()
            .is_some_and(|h| h.state == HealthState::Failed);
        // A GPU in MIG mode is judged through its instances only (its memory is theirs).
        let mig = s.mig_mode == Some(true);
        let allocated = s.up && !mig && self.allocated(&d.containers, &readings);
        let mut marks = Vec::new();
        if s.up && !failed {
            if let (Some(u), Some(sm)) = (readings.get("utilization"), readings.get("sm_active")) {
                if u >= BUSY_UTILIZATION && sm < SATURATED_SM_ACTIVE {
                    marks.push(Mark::BusyNotSaturated);
                }
            }
            if allocated && self.idle(&readings) {
                marks.push(Mark::AllocatedIdle);
            }
        }
        GpuView {
            gpu: s.index,
            uuid: s.uuid.clone(),
            name: s.info.name.clone(),
            state,
            readings,
            mig_mode: s.mig_mode,
            holders: holders(&d.containers),
            jobs: d.jobs.iter().map(|j| (*j).to_owned()).collect(),
            allocated,
            marks,
            health: s.health.as_ref().map(health_view),
            mig_instances: if s.up {
                d.instances
                    .iter()
                    .map(|i| self.instance(i, failed))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    fn instance(&self, i: &InstanceView<'_>, gpu_failed: bool) -> MigInstanceView {
        let readings = Readings::read(self.system, &i.sample);
        let allocated = self.allocated(&i.containers, &readings);
        let marks = if !gpu_failed && allocated && self.idle(&readings) {
            vec![Mark::AllocatedIdle]
        } else {
            Vec::new()
        };
        MigInstanceView {
            gpu_instance: i.id,
            profile: i.profile.to_owned(),
            readings,
            holders: holders(&i.containers),
            jobs: i.jobs.iter().map(|j| (*j).to_owned()).collect(),
            allocated,
            marks,
        }
    }

    fn allocated(&self, containers: &[&ContainerRef], r: &Readings) -> bool {
        if self.by_pods {
            !containers.is_empty()
        } else {
            r.get("memory_used_bytes")
                .is_some_and(|m| m > ALLOCATED_MEMORY_BYTES)
        }
    }

    /// SM activity where GPM gives it, else utilization, below the idle threshold; a device
    /// with neither is not judged idle.
    fn idle(&self, r: &Readings) -> bool {
        r.get("sm_active")
            .or(r.get("utilization"))
            .is_some_and(|a| a < self.idle_below)
    }
}

fn holders(containers: &[&ContainerRef]) -> Vec<Holder> {
    containers
        .iter()
        .map(|c| Holder {
            namespace: c.namespace.clone(),
            pod: c.pod.clone(),
            container: c.container.clone(),
        })
        .collect()
}

//! Per-process metrics (`--processes`): who the processes NVML lists on a GPU are.
//!
//! NVML gives pids (host pids: the driver does not know pid namespaces), memory and SM
//! utilization ([`crate::nvml::processes`]). This module adds what only the host's procfs knows
//! — the process name ([`procfs`]) and its pod and container from `/proc/<pid>/cgroup`
//! ([`cgroup`]) — and, when a snapshot is encoded, names the container from the kubelet's pod
//! list and sums each container's usage of a GPU ([`attribution`]).

pub mod attribution;
pub mod cgroup;
pub mod procfs;

use crate::sample::ProcessSample;
use attribution::PodUsage;

/// Default of `--max-processes-per-gpu`.
pub const DEFAULT_MAX_PROCESSES_PER_GPU: usize = 32;

/// Which reading of a process (or sum over a container's processes) a family serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessField {
    /// Device memory held, bytes.
    MemoryUsed,
    /// Share of the sampling interval the process had a kernel on the SMs.
    SmUtilization,
}

impl ProcessField {
    /// The reading of one process.
    pub fn of_process(self, p: &ProcessSample) -> Option<f64> {
        match self {
            ProcessField::MemoryUsed => p.used_memory_bytes,
            ProcessField::SmUtilization => p.sm_utilization,
        }
    }

    /// The sum over one container's processes.
    pub fn of_pod(self, u: &PodUsage) -> Option<f64> {
        match self {
            ProcessField::MemoryUsed => u.memory_used_bytes,
            ProcessField::SmUtilization => u.sm_utilization,
        }
    }
}

//! The processes on one device for one tick (`--processes`): compute and graphics processes
//! merged by pid, their SM utilization since the previous tick, and who they are from the host's
//! procfs ([`crate::processes::procfs`]).
//!
//! Utilization: `nvmlDeviceGetProcessUtilization` returns the driver's recent samples newer
//! than a timestamp; the newest timestamp seen is kept, so each sample counts in exactly one
//! tick. Several samples of one pid in a tick are averaged. A running process with no new sample
//! was not scheduled on the SMs in that window: it reads 0, as `nvidia-smi pmon` shows it. When
//! the call itself fails or is unsupported every process's utilization is `None` instead — as on
//! a GPU in MIG mode, where the driver does not support it.
//!
//! MIG: the parent GPU's lists hold every instance's processes, each with the GPU instance and
//! compute instance it runs in (`0xFFFFFFFF`, i.e. `None`, with MIG off) — but `nvml.h` gives
//! that aggregate "only if the caller has appropriate privileges"; anyone else gets
//! NO_PERMISSION and must ask each MIG device handle for its own processes. So on a GPU in MIG
//! mode the parent is asked first (two calls per tick, and the only way that works in vGPU host
//! mode, where MIG handles cannot list processes); once it refuses, the reader asks the MIG
//! handles the tick already enumerated ([`super::mig`]) from then on — two calls per MIG device —
//! since the exporter's privileges do not change while it runs. The refusal is an expected
//! answer with a working way round, not a failure, so it is not counted as an NVML error.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use super::ledger::CallLedger;
use super::mig::{MIG_HANDLE, MigHandle};
use super::units::percent_to_ratio_f64;
use crate::processes::procfs::ProcTable;
use crate::sample::ProcessSample;

/// Longest process name asked of `nvmlSystemGetProcessName` (the fallback when procfs has none).
const NAME_LENGTH: usize = 64;

const COMPUTE: &str = "nvmlDeviceGetComputeRunningProcesses_v3";
const GRAPHICS: &str = "nvmlDeviceGetGraphicsRunningProcesses_v3";

/// Reads one device's processes, tick after tick. Part of the device's [`super::device::DeviceReader`].
#[derive(Debug)]
pub struct ProcessReader {
    procfs: ProcTable,
    /// Timestamp (µs) of the newest utilization sample taken; 0 before the first.
    last_seen: u64,
    /// The GPU in MIG mode refused its process lists (NO_PERMISSION, an unprivileged caller):
    /// the MIG device handles are asked instead.
    parent_refused: bool,
}

impl ProcessReader {
    /// A reader that looks processes up below `host_proc` (the host's `/proc`).
    pub fn new(host_proc: impl Into<PathBuf>) -> ProcessReader {
        ProcessReader {
            procfs: ProcTable::new(host_proc),
            last_seen: 0,
            parent_refused: false,
        }
    }

    /// The procfs processes are looked up in.
    pub fn host_proc(&self) -> &std::path::Path {
        self.procfs.root()
    }

    /// The device's processes now, by pid. Empty when neither process list could be read.
    /// `mig` is `Some` (the MIG device handles of this tick) when the GPU is in MIG mode.
    pub(super) fn read(
        &mut self,
        t: &mut CallLedger,
        nvml: &Nvml,
        d: &Device,
        mig: Option<&[MigHandle]>,
    ) -> Vec<ProcessSample> {
        let infos = match mig {
            None => parent_lists(t, d, false).unwrap_or_default(),
            Some(handles) if self.parent_refused => instance_lists(t, handles),
            Some(handles) => parent_lists(t, d, true).unwrap_or_else(|| {
                self.parent_refused = true;
                instance_lists(t, handles)
            }),
        };
        let memory = merge(infos.iter());

        let utilization = t
            .call("nvmlDeviceGetProcessUtilization", 0, || {
                // NOT_FOUND is the driver's "no sample newer than that": nothing ran.
                match d.process_utilization_stats(self.last_seen) {
                    Err(NvmlError::NotFound) => Ok(Vec::new()),
                    other => other,
                }
            })
            .map(|samples| {
                let (averages, newest) = average_new_samples(
                    samples.iter().map(|s| (s.pid, s.timestamp, s.sm_util)),
                    self.last_seen,
                );
                self.last_seen = newest;
                averages
            });

        let mut out = Vec::with_capacity(memory.len());
        for (&pid, held) in &memory {
            let info = self.procfs.lookup(pid).cloned().unwrap_or_default();
            let name = match info.name {
                Some(name) => name,
                None => t
                    .call("nvmlSystemGetProcessName", 0, || {
                        // The process may have exited since the list was taken.
                        match nvml.sys_process_name(pid, NAME_LENGTH) {
                            Err(NvmlError::NotFound) => Ok(String::new()),
                            other => other,
                        }
                    })
                    .unwrap_or_default(),
            };
            out.push(ProcessSample {
                pid,
                name,
                used_memory_bytes: held.used.map(|b| b as f64),
                sm_utilization: utilization
                    .as_ref()
                    .map(|u| u.get(&pid).copied().unwrap_or(0.0)),
                cgroup: info.cgroup,
                gpu_instance: held.gpu_instance,
                compute_instance: held.compute_instance,
            });
        }
        self.procfs.retain(|pid| memory.contains_key(&pid));
        out
    }
}

/// The compute and graphics lists of the GPU handle `d`, one after the other (a list that cannot
/// be read is counted and left out). With `refusable` (MIG mode), NO_PERMISSION is the driver's
/// "unprivileged caller" answer: not counted, and `None`.
fn parent_lists(t: &mut CallLedger, d: &Device, refusable: bool) -> Option<Vec<ProcessInfo>> {
    let refused = |r: Result<Vec<ProcessInfo>, NvmlError>| match r {
        Err(NvmlError::NoPermission) if refusable => Ok(None),
        other => other.map(Some),
    };
    let compute = t.call(COMPUTE, 0, || refused(d.running_compute_processes()));
    if let Some(None) = compute {
        return None;
    }
    let graphics = t.call(GRAPHICS, 0, || refused(d.running_graphics_processes()));
    if let Some(None) = graphics {
        return None;
    }
    Some(
        [compute.flatten(), graphics.flatten()]
            .into_iter()
            .flatten()
            .flatten()
            .collect(),
    )
}

/// The compute and graphics lists of every MIG device handle, each process given the instance
/// of the handle that lists it (what the parent's list would have said). Calls a handle does
/// not support (e.g. graphics) are remembered apart from the GPU handle's, under [`MIG_HANDLE`].
fn instance_lists(t: &mut CallLedger, handles: &[MigHandle]) -> Vec<ProcessInfo> {
    let mut out = Vec::new();
    for h in handles {
        let compute = t.call(COMPUTE, MIG_HANDLE, || h.handle.running_compute_processes());
        let graphics = t.call(GRAPHICS, MIG_HANDLE, || {
            h.handle.running_graphics_processes()
        });
        out.extend(
            [compute, graphics]
                .into_iter()
                .flatten()
                .flatten()
                .map(|p| ProcessInfo {
                    gpu_instance_id: Some(h.gpu_instance),
                    compute_instance_id: Some(h.compute_instance),
                    ..p
                }),
        );
    }
    out
}

/// What the process lists say of one pid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Held {
    /// Device memory, bytes; `None` when NVML could not say (`NVML_VALUE_NOT_AVAILABLE`, e.g.
    /// under WDDM).
    used: Option<u64>,
    /// MIG GPU instance and compute instance; `None` with MIG off.
    gpu_instance: Option<u32>,
    compute_instance: Option<u32>,
}

/// Memory and MIG instance per pid over the compute and graphics lists. A process in both (a
/// CUDA/OpenGL interop app) holds one allocation that both lists report, so the larger is kept,
/// not the sum. CUDA uses one MIG device per process, so a pid has one instance; the first entry
/// that names one is kept.
fn merge<'a>(infos: impl Iterator<Item = &'a ProcessInfo>) -> BTreeMap<u32, Held> {
    let mut memory: BTreeMap<u32, Held> = BTreeMap::new();
    for p in infos {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        let entry = memory.entry(p.pid).or_default();
        entry.used = entry.used.max(used);
        if entry.gpu_instance.is_none() {
            entry.gpu_instance = p.gpu_instance_id;
            entry.compute_instance = p.compute_instance_id;
        }
    }
    memory
}

/// Average SM utilization ratio per pid over the samples newer than `last_seen`
/// (pid, timestamp µs, percent), and the newest timestamp seen.
fn average_new_samples(
    samples: impl Iterator<Item = (u32, u64, u32)>,
    last_seen: u64,
) -> (BTreeMap<u32, f64>, u64) {
    let mut newest = last_seen;
    let mut sums: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    // The driver is asked for newer samples only; filtering again keeps a sample from counting
    // twice should it answer with old ones anyway.
    for (pid, timestamp, sm) in samples.filter(|(_, ts, _)| *ts > last_seen) {
        newest = newest.max(timestamp);
        let (sum, n) = sums.entry(pid).or_default();
        *sum += u64::from(sm);
        *n += 1;
    }
    let averages = sums
        .into_iter()
        .map(|(pid, (sum, n))| (pid, percent_to_ratio_f64(sum as f64 / f64::from(n))))
        .collect();
    (averages, newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn compute_and_graphics_merge_by_pid() {
        let list = [
            info(7, UsedGpuMemory::Used(100)),
            info(3, UsedGpuMemory::Unavailable),
            info(7, UsedGpuMemory::Used(100)),
            info(9, UsedGpuMemory::Unavailable),
            info(9, UsedGpuMemory::Used(5)),
        ];
        let m = merge(list.iter());
        assert_eq!(
            m.into_iter()
                .map(|(pid, h)| (pid, h.used))
                .collect::<Vec<_>>(),
            vec![(3, None), (7, Some(100)), (9, Some(5))]
        );
    }

    #[test]
    fn a_process_keeps_its_mig_instance() {
        let in_instance = |pid, gi, ci, mib: u64| ProcessInfo {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
            ..info(pid, UsedGpuMemory::Used(mib << 20))
        };
        let list = [
            in_instance(1, 2, 0, 30),
            in_instance(2, 9, 1, 2),
            info(3, UsedGpuMemory::Used(1)),
        ];
        let m = merge(list.iter());
        assert_eq!(
            m[&1],
            Held {
                used: Some(30 << 20),
                gpu_instance: Some(2),
                compute_instance: Some(0),
            }
        );
        assert_eq!(
            (m[&2].gpu_instance, m[&2].compute_instance),
            (Some(9), Some(1))
        );
        // MIG off: no instance.
        assert_eq!((m[&3].gpu_instance, m[&3].compute_instance), (None, None));
    }

    #[test]
    fn each_sample_counts_once_and_several_are_averaged() {
        let samples = [(1, 10, 40), (1, 20, 60), (2, 5, 90), (2, 20, 30)];
        let (avg, newest) = average_new_samples(samples.into_iter(), 0);
        assert_eq!(newest, 20);
        assert!((avg[&1] - 0.5).abs() < 1e-12);
        assert!((avg[&2] - 0.6).abs() < 1e-12);
        // The same samples again (a driver that ignores the timestamp): nothing new.
        let (avg, newest) = average_new_samples(samples.into_iter(), 20);
        assert!(avg.is_empty());
        assert_eq!(newest, 20);
        // Only the newer one of the next tick counts.
        let (avg, newest) = average_new_samples([(2, 20, 99), (2, 30, 10)].into_iter(), 20);
        assert_eq!(newest, 30);
        assert!((avg[&2] - 0.1).abs() < 1e-12);
    }
}

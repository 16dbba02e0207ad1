//! Running processes (compute and graphics, three struct versions) and per-process utilization.
//!
//! On a GPU in MIG mode the GPU handle's lists need a privileged caller (NO_PERMISSION
//! otherwise, see [`DeviceCall::require_privileged_on_mig_parent`]); a MIG device handle's list
//! answers anyone.

use crate::ffi::{DeviceCall, NOT_FOUND, device_fns, read, write_array};
use crate::replay::{Replay, Series};
use crate::scenario::{MIB, ProcessSpec};
use nvml_wrapper_sys::bindings::{
    nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t, nvmlProcessUtilizationSample_t,
};
use std::os::raw::{c_uint, c_ulonglong};

/// Without MIG a process belongs to no GPU/compute instance: NVML says 0xFFFFFFFF.
/// With MIG each process names its instances (on the GPU handle and on its MIG device's).
const NO_INSTANCE: c_uint = u32::MAX;

/// The processes of the GPU (or, on a MIG device handle, of that compute instance only).
fn alive<'a>(c: &'a DeviceCall, graphics: bool) -> impl Iterator<Item = &'a ProcessSpec> {
    let on_device = move |p: &ProcessSpec| match c.mig {
        Some(d) => p.gpu_instance == Some(d.gi.id) && p.compute_instance.unwrap_or(0) == d.ci.id,
        None => true,
    };
    c.gpu.processes.iter().filter(move |p| {
        p.alive(c.t)
            && on_device(p)
            && if graphics {
                p.is_graphics()
            } else {
                p.is_compute()
            }
    })
}

fn v1(c: &DeviceCall, graphics: bool) -> Vec<nvmlProcessInfo_v1_t> {
    alive(c, graphics)
        .map(|p| nvmlProcessInfo_v1_t {
            pid: p.pid,
            usedGpuMemory: p.used_memory_mib * MIB,
        })
        .collect()
}

fn v2(c: &DeviceCall, graphics: bool) -> Vec<nvmlProcessInfo_v2_t> {
    alive(c, graphics)
        .map(|p| nvmlProcessInfo_v2_t {
            pid: p.pid,
            usedGpuMemory: p.used_memory_mib * MIB,
            gpuInstanceId: p.gpu_instance.unwrap_or(NO_INSTANCE),
            computeInstanceId: p
                .gpu_instance
                .map_or(NO_INSTANCE, |_| p.compute_instance.unwrap_or(0)),
        })
        .collect()
}

device_fns! {
    /// Compute processes (v1 struct).
    fn nvmlDeviceGetComputeRunningProcesses(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v1(c, false))
    }
    /// Compute processes (v2 struct).
    fn nvmlDeviceGetComputeRunningProcesses_v2(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v2(c, false))
    }
    /// Compute processes (v2 struct, current entry point).
    fn nvmlDeviceGetComputeRunningProcesses_v3(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v2(c, false))
    }
    /// Graphics processes (v1 struct).
    fn nvmlDeviceGetGraphicsRunningProcesses(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v1(c, true))
    }
    /// Graphics processes (v2 struct).
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v2(c, true))
    }
    /// Graphics processes (v2 struct, current entry point).
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array(info_count, infos, &v2(c, true))
    }
    /// MPS compute processes (none: the simulator runs no MPS server).
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(info_count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) |c| {
        c.require_privileged_on_mig_parent()?;
        write_array::<nvmlProcessInfo_v2_t>(info_count, infos, &[])
    }
    /// Per-process utilization: the device's utilization split by the processes' memory share.
    /// NOT_FOUND when no process ran; NOT_SUPPORTED in MIG mode (`nvml.h`: "On MIG-enabled GPUs,
    /// querying process utilization is not currently supported").
    fn nvmlDeviceGetProcessUtilization(
        utilization: *mut nvmlProcessUtilizationSample_t,
        process_samples_count: *mut c_uint,
        _last_seen_time_stamp: c_ulonglong,
    ) |c| {
        c.require_no_mig()?;
        read(process_samples_count)?;
        let procs: Vec<_> = alive(c, false).collect();
        let held: u64 = procs.iter().map(|p| p.used_memory_mib).sum();
        if procs.is_empty() || held == 0 {
            return Err(NOT_FOUND);
        }
        let s = c.sample();
        // A recording has no per-process figures: its device readings are split the same way.
        let device = |pick: fn(&Replay) -> Option<&Series>, simulated: f64| {
            c.replayed(pick).ok().flatten().map_or(simulated, |percent| percent / 100.0)
        };
        let sm = device(|r| r.utilization.as_ref(), s.utilization);
        let mem = device(|r| r.memory_utilization.as_ref(), s.memory_utilization);
        let enc = device(|r| r.encoder.as_ref(), s.encoder);
        let dec = device(|r| r.decoder.as_ref(), s.decoder);
        let share = |p: &ProcessSpec, x: f64| ((x * 100.0 * p.used_memory_mib as f64 / held as f64).round()) as c_uint;
        let samples: Vec<_> = procs
            .iter()
            .map(|p| {
                let [sm, mem, enc, dec] = match &p.replay {
                    Some(recorded) => recorded.at(c.t),
                    None => [share(p, sm), share(p, mem), share(p, enc), share(p, dec)],
                };
                nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: (c.t * 1e6) as c_ulonglong,
                    smUtil: sm,
                    memUtil: mem,
                    encUtil: enc,
                    decUtil: dec,
                }
            })
            .collect();
        write_array(process_samples_count, utilization, &samples)
    }
}

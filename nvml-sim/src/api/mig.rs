//! Multi-Instance GPU entry points: MIG mode, MIG device handles and their ids, GPU instances
//! and the GPU-instance profile table (`nvmlMultiInstanceGPU` in `nvml.h`).
//!
//! Read-only: the layout comes from the scenario (and may change at scenario-given times);
//! creating or destroying instances through NVML is not simulated.

use crate::ffi::{
    self, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, NvmlResult, check_version, device_fns,
    plain_fns, read, write, write_array,
};
use crate::mig::{self, MAX_MIG_DEVICES, Profile};
use crate::state;
use nvml_wrapper_sys::bindings::{
    self as b, nvmlDevice_t, nvmlDeviceAttributes_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceProfileInfo_v3_t,
};
use std::os::raw::{c_char, c_uint};

/// `nvmlGpuInstanceProfileInfo_v3_t.capabilities`: none of these boards' profiles has P2P or
/// graphics support.
const NO_CAPABILITIES: c_uint = 0;

/// The profile selected by an `NVML_GPU_INSTANCE_PROFILE_*` value: out of the enum's range →
/// INVALID_ARGUMENT; not offered by this board → NOT_SUPPORTED.
fn profile_by_enum(c: &ffi::DeviceCall, profile: c_uint) -> Result<&'static Profile, u32> {
    c.require(c.gpu.mig_capable)?;
    if profile >= b::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    mig::board(c.gpu.mig_board.as_deref())
        .iter()
        .find(|p| p.nvml_profile == profile)
        .ok_or(NOT_SUPPORTED)
}

/// The profile with this profile id on this board.
fn profile_by_id(c: &ffi::DeviceCall, profile_id: c_uint) -> Result<&'static Profile, u32> {
    mig::board(c.gpu.mig_board.as_deref())
        .iter()
        .find(|p| p.id == profile_id)
        .ok_or(INVALID_ARGUMENT)
}

fn c_name<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

fn info_v1(p: &Profile) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.slices,
        instanceCount: p.starts.len() as c_uint,
        multiprocessorCount: p.sms,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: 0,
        jpegCount: p.jpegs,
        ofaCount: p.ofas,
        memorySizeMB: p.memory_mib,
    }
}

/// Writes a v2 or v3 profile info (chosen by the caller's version word).
fn write_info_versioned(info: *mut nvmlGpuInstanceProfileInfo_v2_t, p: &Profile) -> NvmlResult {
    let version = read(info)?.version;
    let v1 = info_v1(p);
    let name = format!("MIG {}", p.name);
    if check_version::<nvmlGpuInstanceProfileInfo_v2_t>(version, 2).is_ok() {
        return write(
            info,
            nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: v1.id,
                isP2pSupported: v1.isP2pSupported,
                sliceCount: v1.sliceCount,
                instanceCount: v1.instanceCount,
                multiprocessorCount: v1.multiprocessorCount,
                copyEngineCount: v1.copyEngineCount,
                decoderCount: v1.decoderCount,
                encoderCount: v1.encoderCount,
                jpegCount: v1.jpegCount,
                ofaCount: v1.ofaCount,
                memorySizeMB: v1.memorySizeMB,
                name: c_name(&name),
            },
        );
    }
    check_version::<nvmlGpuInstanceProfileInfo_v3_t>(version, 3)?;
    write(
        info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(),
        nvmlGpuInstanceProfileInfo_v3_t {
            version,
            id: v1.id,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            copyEngineCount: v1.copyEngineCount,
            decoderCount: v1.decoderCount,
            encoderCount: v1.encoderCount,
            jpegCount: v1.jpegCount,
            ofaCount: v1.ofaCount,
            memorySizeMB: v1.memorySizeMB,
            name: c_name(&name),
            capabilities: NO_CAPABILITIES,
        },
    )
}

fn attributes(c: &ffi::DeviceCall) -> Result<nvmlDeviceAttributes_t, u32> {
    // `nvml.h`: "This API currently only supports MIG device handles."
    let d = c.mig.ok_or(NOT_SUPPORTED)?;
    let p = d.gi.profile();
    let slices = d.ci.slices_in(d.gi);
    Ok(nvmlDeviceAttributes_t {
        multiprocessorCount: p.sms * slices / p.slices,
        sharedCopyEngineCount: p.copy_engines,
        sharedDecoderCount: p.decoders,
        sharedEncoderCount: 0,
        sharedJpegCount: p.jpegs,
        sharedOfaCount: p.ofas,
        gpuInstanceSliceCount: p.slices,
        computeInstanceSliceCount: slices,
        memorySizeMB: p.memory_mib,
    })
}

device_fns! {
    /// MIG mode (current, pending) from the scenario; NOT_SUPPORTED on boards without MIG.
    fn nvmlDeviceGetMigMode(current_mode: *mut c_uint, pending_mode: *mut c_uint) |c| {
        c.require(c.gpu.mig_capable)?;
        if current_mode.is_null() || pending_mode.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mig = &c.gpu.mig;
        write(current_mode, c_uint::from(mig.enabled))?;
        write(pending_mode, c_uint::from(mig.pending.unwrap_or(mig.enabled)))
    }
    /// Whether this handle is a MIG device handle.
    fn nvmlDeviceIsMigDeviceHandle(is_mig: *mut c_uint) |c| {
        write(is_mig, c_uint::from(c.mig.is_some()))
    }
    /// Most MIG devices the GPU can have: 7 with MIG enabled, 0 otherwise ("Returns zero if MIG
    /// is not supported or enabled").
    fn nvmlDeviceGetMaxMigDeviceCount(count: *mut c_uint) |c| {
        write(count, if c.gpu.mig.enabled { MAX_MIG_DEVICES } else { 0 })
    }
    /// The MIG device at `index` (0 ≤ index < the max count); NOT_FOUND where no compute
    /// instance has that index now.
    fn nvmlDeviceGetMigDeviceHandleByIndex(index: c_uint, mig_device: *mut nvmlDevice_t) |c| {
        c.require(c.gpu.mig_capable)?;
        if mig_device.is_null() || !c.gpu.mig.enabled || index >= MAX_MIG_DEVICES {
            return Err(INVALID_ARGUMENT);
        }
        let devices = c.gpu.mig.devices_at(c.t);
        let d = devices.get(index as usize).ok_or(NOT_FOUND)?;
        write(mig_device, ffi::mig_handle_of(c.index, d.gi.id, d.ci.id))
    }
    /// The parent GPU of a MIG device handle (INVALID_ARGUMENT for a GPU handle).
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(parent: *mut nvmlDevice_t) |c| {
        c.mig.ok_or(INVALID_ARGUMENT)?;
        write(parent, ffi::handle_of(c.index))
    }
    /// GPU instance id of a MIG device handle (INVALID_ARGUMENT for a GPU handle).
    fn nvmlDeviceGetGpuInstanceId(id: *mut c_uint) |c| {
        write(id, c.mig.ok_or(INVALID_ARGUMENT)?.gi.id)
    }
    /// Compute instance id of a MIG device handle (INVALID_ARGUMENT for a GPU handle).
    fn nvmlDeviceGetComputeInstanceId(id: *mut c_uint) |c| {
        write(id, c.mig.ok_or(INVALID_ARGUMENT)?.ci.id)
    }
    /// Engine counts, slices and memory of a MIG device (NOT_SUPPORTED for a GPU handle).
    fn nvmlDeviceGetAttributes(attributes_out: *mut nvmlDeviceAttributes_t) |c| {
        write(attributes_out, attributes(c)?)
    }
    /// Engine counts, slices and memory of a MIG device (NOT_SUPPORTED for a GPU handle).
    fn nvmlDeviceGetAttributes_v2(attributes_out: *mut nvmlDeviceAttributes_t) |c| {
        write(attributes_out, attributes(c)?)
    }
    /// Profile information for an `NVML_GPU_INSTANCE_PROFILE_*` value (MIG-capable boards).
    fn nvmlDeviceGetGpuInstanceProfileInfo(profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_t) |c| {
        let p = profile_by_enum(c, profile)?;
        write(info, info_v1(p))
    }
    /// Versioned profile information (v2 or v3 struct, with the profile name "MIG 1g.10gb");
    /// needs MIG enabled, as `nvml.h` says.
    fn nvmlDeviceGetGpuInstanceProfileInfoV(profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_v2_t) |c| {
        let p = profile_by_enum(c, profile)?;
        c.require(c.gpu.mig.enabled)?;
        write_info_versioned(info, p)
    }
    /// Every placement the board allows for a profile id, enabled or not.
    fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        profile_id: c_uint,
        placements: *mut nvmlGpuInstancePlacement_t,
        count: *mut c_uint,
    ) |c| {
        c.require(c.gpu.mig_capable)?;
        let p = profile_by_id(c, profile_id)?;
        let all: Vec<_> = p
            .starts
            .iter()
            .map(|&start| nvmlGpuInstancePlacement_t { start, size: p.memory_slices })
            .collect();
        // `nvml.h`: placements "Can be NULL to discover number of allowed placements".
        if placements.is_null() {
            return write(count, all.len() as c_uint);
        }
        write_array(count, placements, &all)
    }
    /// The GPU instances of a profile id that exist now.
    fn nvmlDeviceGetGpuInstances(profile_id: c_uint, gpu_instances: *mut nvmlGpuInstance_t, count: *mut c_uint) |c| {
        c.require(c.gpu.mig.enabled)?;
        let p = profile_by_id(c, profile_id)?;
        let handles: Vec<_> = c
            .gpu
            .mig
            .instances_at(c.t)
            .filter(|(_, gi)| std::ptr::eq(gi.profile(), p))
            .map(|(_, gi)| ffi::gi_handle_of(c.index, gi.id))
            .collect();
        // `count` is output only: the caller sized the buffer for the profile's instance count.
        if gpu_instances.is_null() || count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        for (i, h) in handles.iter().enumerate() {
            // SAFETY: the buffer holds the profile's instance count (at least `handles.len()`),
            // per the contract of this function.
            unsafe { gpu_instances.add(i).write_unaligned(*h) };
        }
        write(count, handles.len() as c_uint)
    }
    /// The GPU instance with this id (NOT_FOUND when none exists now).
    fn nvmlDeviceGetGpuInstanceById(id: c_uint, gpu_instance: *mut nvmlGpuInstance_t) |c| {
        c.require(c.gpu.mig.enabled)?;
        c.gpu.mig.instances_at(c.t).find(|(_, gi)| gi.id == id).ok_or(NOT_FOUND)?;
        write(gpu_instance, ffi::gi_handle_of(c.index, id))
    }
}

plain_fns! {
    /// Parent device, id, profile id and placement of a GPU instance; a destroyed instance's
    /// handle is INVALID_ARGUMENT.
    fn nvmlGpuInstanceGetInfo(gpu_instance: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) {
        let sim = state::sim()?;
        let (index, id) = ffi::gi_of(&sim, gpu_instance).ok_or(INVALID_ARGUMENT)?;
        ffi::inject_faults(&sim, index, "nvmlGpuInstanceGetInfo")?;
        let gpu = &sim.scenario.gpus[index];
        let (_, gi) = gpu
            .mig
            .instances_at(sim.now())
            .find(|(_, gi)| gi.id == id)
            .ok_or(INVALID_ARGUMENT)?;
        let p = gi.profile();
        write(
            info,
            nvmlGpuInstanceInfo_t {
                device: ffi::handle_of(index),
                id,
                profileId: p.id,
                placement: nvmlGpuInstancePlacement_t { start: gi.start, size: p.memory_slices },
            },
        )
    }
}

//! MIG on the h100-mig scenario at a pinned t = 30 s (before the reconfiguration): the mode,
//! MIG device handles and their ids, UUIDs, names, per-instance memory and attributes, the
//! GPU-instance profile table, processes with their instances, and what MIG mode makes
//! NOT_SUPPORTED. GPU1 has MIG off (pending on) and behaves as a whole GPU.

use crate::common::{self, Session};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    self as b, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlMemory_v2_t, nvmlProcessInfo_v2_t, nvmlReturn_t,
};
use std::os::raw::c_uint;

const MIB: u64 = 1024 * 1024;
const SUCCESS: nvmlReturn_t = b::nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_FOUND: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

fn session() -> Session {
    let scenario = common::scenario("h100-mig.toml");
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_TIME", Some("30")),
        ("NVML_SIM_START", None),
    ])
}

fn gpu(nvml: &Nvml, i: u32) -> Device<'_> {
    nvml.device_by_index(i).unwrap()
}

fn mig(nvml: &Nvml, i: u32) -> Device<'_> {
    gpu(nvml, 0).mig_device_by_index(i).unwrap()
}

/// (GPU instance id, compute instance id) of a MIG device handle, through the raw calls.
fn ids(d: &Device) -> (u32, u32) {
    let (mut gi, mut ci) = (u32::MAX, u32::MAX);
    // SAFETY: valid handle and out-pointers.
    unsafe {
        assert_eq!(
            d.nvml()
                .lib()
                .nvmlDeviceGetGpuInstanceId(d.handle(), &mut gi),
            SUCCESS
        );
        assert_eq!(
            d.nvml()
                .lib()
                .nvmlDeviceGetComputeInstanceId(d.handle(), &mut ci),
            SUCCESS
        );
    }
    (gi, ci)
}

fn not_supported<T: std::fmt::Debug>(r: Result<T, NvmlError>) -> bool {
    matches!(r, Err(NvmlError::NotSupported))
}

#[test]
fn mig_mode_and_device_count() {
    let nvml = session();
    let m = gpu(&nvml, 0).mig_mode().unwrap();
    assert_eq!((m.current, m.pending), (1, 1));
    assert_eq!(gpu(&nvml, 0).mig_device_count().unwrap(), 7);
    let m = gpu(&nvml, 1).mig_mode().unwrap();
    assert_eq!((m.current, m.pending), (0, 1));
    assert_eq!(gpu(&nvml, 1).mig_device_count().unwrap(), 0);
    assert!(matches!(
        gpu(&nvml, 1).mig_device_by_index(0),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn mig_devices_by_index_with_ids_uuids_and_names() {
    let nvml = session();
    let expected = [
        (2, "3g.40gb", "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b01"),
        (3, "2g.20gb", "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b02"),
        (9, "1g.10gb", "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b03"),
        (10, "1g.10gb", "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b04"),
    ];
    for (i, (gi, profile, uuid)) in expected.into_iter().enumerate() {
        let d = mig(&nvml, i as u32);
        assert!(d.mig_is_mig_device_handle().unwrap());
        assert_eq!(ids(&d), (gi, 0), "MIG device {i}");
        assert_eq!(d.uuid().unwrap(), uuid);
        assert_eq!(
            d.name().unwrap(),
            format!("NVIDIA H100 80GB HBM3 MIG {profile}")
        );
        assert_eq!(d.index().unwrap(), i as u32);
        let parent = d.mig_parent_device().unwrap();
        assert_eq!(
            parent.uuid().unwrap(),
            "GPU-8e1c4a7f-3b2d-4c6e-9a0f-5d7b9e1c3a21"
        );
    }
    // Slots 4..6 hold no MIG device; 7 is beyond the maximum.
    for i in 4..7 {
        assert!(
            matches!(
                gpu(&nvml, 0).mig_device_by_index(i),
                Err(NvmlError::NotFound)
            ),
            "{i}"
        );
    }
    assert!(matches!(
        gpu(&nvml, 0).mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    assert!(!gpu(&nvml, 0).mig_is_mig_device_handle().unwrap());
    let mut id = 0;
    // SAFETY: valid handle and out-pointer.
    let r = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceId(gpu(&nvml, 0).handle(), &mut id)
    };
    assert_eq!(r, INVALID_ARGUMENT, "a GPU handle has no GPU instance id");
    assert!(matches!(
        gpu(&nvml, 0).mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn per_instance_memory_and_the_gpu_aggregate() {
    let nvml = session();
    // 3g.40gb: 80 % of 40448 MiB by load (above its process's 30 GiB).
    let m = mig(&nvml, 0).memory_info().unwrap();
    assert_eq!(m.total, 40448 * MIB);
    assert_eq!(m.used, (0.8 * (40448 * MIB) as f64) as u64);
    assert_eq!(m.free, m.total - m.used);
    // The idle 1g.10gb holds only its process's 2 GiB.
    let idle = mig(&nvml, 2).memory_info().unwrap();
    assert_eq!((idle.total, idle.used), (9984 * MIB, 2048 * MIB));
    // v2 on a MIG handle: nothing reserved.
    let mut v2 = nvmlMemory_v2_t {
        version: std::mem::size_of::<nvmlMemory_v2_t>() as u32 | (2 << 24),
        total: 0,
        reserved: 1,
        free: 0,
        used: 0,
    };
    // SAFETY: valid handle and struct.
    let r = unsafe {
        nvml.lib()
            .nvmlDeviceGetMemoryInfo_v2(mig(&nvml, 2).handle(), &mut v2)
    };
    assert_eq!(r, SUCCESS);
    assert_eq!(
        (v2.total, v2.reserved, v2.used),
        (9984 * MIB, 0, 2048 * MIB)
    );
    // The GPU's used memory is the sum over its instances (nvml-wrapper reads the v2 struct,
    // which keeps the reserved part apart).
    let sum: u64 = (0..4)
        .map(|i| mig(&nvml, i).memory_info().unwrap().used)
        .sum();
    let parent = gpu(&nvml, 0).memory_info().unwrap();
    assert_eq!(parent.total, 81559 * MIB);
    assert_eq!(parent.used, sum);
}

#[test]
fn bar1_share_and_uncorrected_ecc_per_mig_device() {
    let nvml = session();
    // The H100's 128 GiB aperture (1 MiB used), shared by memory slices out of 8.
    let whole = gpu(&nvml, 0).bar1_memory_info().unwrap();
    assert_eq!((whole.total, whole.used), (131072 * MIB, MIB));
    for (i, slices) in [(0, 4), (1, 2), (2, 1), (3, 1)] {
        let b1 = mig(&nvml, i).bar1_memory_info().unwrap();
        assert_eq!(b1.total, 131072 * MIB * slices / 8, "MIG device {i}");
        assert_eq!(b1.used, MIB * slices / 8, "MIG device {i}");
        assert_eq!(b1.free, b1.total - b1.used, "MIG device {i}");
    }
    // nvml.h: per instance, only uncorrectable volatile errors; none in the instances' SRAM.
    let d = mig(&nvml, 0);
    assert_eq!(
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        0
    );
    assert!(not_supported(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
    ));
    assert!(not_supported(d.total_ecc_errors(
        MemoryError::Uncorrected,
        EccCounter::Aggregate
    )));
}

#[test]
fn attributes_of_mig_devices_only() {
    let nvml = session();
    let a = mig(&nvml, 1).attributes().unwrap();
    assert_eq!(a.gpu_instance_slice_count, 2);
    assert_eq!(a.compute_instance_slice_count, 2);
    assert_eq!(a.memory_size_mb, 20096);
    assert_eq!(a.multiprocessor_count, 32);
    assert!(not_supported(gpu(&nvml, 0).attributes()));
}

#[test]
fn profile_table_and_gpu_instances() {
    let nvml = session();
    // NVML_GPU_INSTANCE_PROFILE_1_SLICE on H100 80GB: profile id 19, 7 instances, 16 SMs.
    let p = gpu(&nvml, 0).profile_info(0).unwrap();
    assert_eq!((p.id, p.slice_count, p.instance_count), (19, 1, 7));
    assert_eq!((p.multiprocessor_count, p.memory_size_mb), (16, 9984));
    // 6_SLICE exists in the enum but not on this board; past the enum it is an invalid argument.
    assert!(not_supported(gpu(&nvml, 0).profile_info(6)));
    assert!(matches!(
        gpu(&nvml, 0).profile_info(99),
        Err(NvmlError::InvalidArg)
    ));
    let lib = nvml.lib();
    // 3g.40gb (profile id 9) may start at memory slice 0 or 4, 4 slices wide. (Raw calls:
    // nvml-wrapper 0.13's possible_placements never sets its vector's length.)
    let mut count: c_uint = 0;
    // SAFETY: a plain C struct; all-zero is valid.
    let mut placements: [nvmlGpuInstancePlacement_t; 4] = unsafe { std::mem::zeroed() };
    // SAFETY: valid handle; a null array asks for the count; then 4 entries are available.
    unsafe {
        let r = lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            gpu(&nvml, 0).handle(),
            9,
            std::ptr::null_mut(),
            &mut count,
        );
        assert_eq!((r, count), (SUCCESS, 2));
        count = 4;
        let r = lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            gpu(&nvml, 0).handle(),
            9,
            placements.as_mut_ptr(),
            &mut count,
        );
        assert_eq!(r, SUCCESS);
    }
    let got: Vec<_> = placements[..count as usize]
        .iter()
        .map(|p| (p.start, p.size))
        .collect();
    assert_eq!(got, [(0, 4), (4, 4)]);

    let mut info = nvmlGpuInstanceProfileInfo_v2_t {
        version: std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24),
        // SAFETY: a plain C struct; all-zero is valid.
        ..unsafe { std::mem::zeroed() }
    };
    // SAFETY: valid handle and struct with its version set.
    let r =
        unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(gpu(&nvml, 0).handle(), 2, &mut info) };
    assert_eq!(r, SUCCESS);
    // SAFETY: the name is NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(info.name.as_ptr()) };
    assert_eq!((info.id, name.to_str().unwrap()), (9, "MIG 3g.40gb"));

    // The exporter's path from a MIG device to its profile: GI id → GI handle → profile id.
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(gpu(&nvml, 0).handle(), 3, &mut gi),
            SUCCESS
        );
        let mut gi_info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info), SUCCESS);
        assert_eq!((gi_info.id, gi_info.profileId), (3, 14));
        assert_eq!((gi_info.placement.start, gi_info.placement.size), (0, 2));
        assert_eq!(gi_info.device, gpu(&nvml, 0).handle());
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(gpu(&nvml, 0).handle(), 7, &mut gi),
            NOT_FOUND
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(gpu(&nvml, 1).handle(), 3, &mut gi),
            NOT_SUPPORTED
        );
    }
}

#[test]
fn utilization_is_not_supported_in_mig_mode() {
    let nvml = session();
    for d in [gpu(&nvml, 0), mig(&nvml, 0)] {
        assert!(not_supported(d.utilization_rates()));
        assert!(not_supported(d.decoder_utilization()));
        assert!(not_supported(d.process_utilization_stats(0)));
    }
    // Board-level readings are not answered on a MIG handle.
    assert!(not_supported(mig(&nvml, 0).temperature(
        nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu
    )));
    assert!(not_supported(mig(&nvml, 0).power_usage()));
    // The GPU with MIG off answers as before.
    assert_eq!(gpu(&nvml, 1).utilization_rates().unwrap().gpu, 60);
    assert!(gpu(&nvml, 0).power_usage().is_ok());
}

fn processes(d: &Device) -> Vec<(u32, u32, u32, u64)> {
    let lib = d.nvml().lib();
    let mut count: c_uint = 8;
    // SAFETY: a plain C struct; all-zero is valid.
    let mut infos: [nvmlProcessInfo_v2_t; 8] = unsafe { std::mem::zeroed() };
    // SAFETY: valid handle, `count` entries available.
    let r = unsafe {
        lib.nvmlDeviceGetComputeRunningProcesses_v3(d.handle(), &mut count, infos.as_mut_ptr())
    };
    assert_eq!(r, SUCCESS);
    infos[..count as usize]
        .iter()
        .map(|p| {
            (
                p.pid,
                p.gpuInstanceId,
                p.computeInstanceId,
                p.usedGpuMemory / MIB,
            )
        })
        .collect()
}

#[test]
fn processes_carry_their_instance_ids() {
    let nvml = session();
    assert_eq!(
        processes(&gpu(&nvml, 0)),
        [
            (610001, 2, 0, 30720),
            (610002, 3, 0, 12288),
            (610003, 9, 0, 2048)
        ]
    );
    assert_eq!(processes(&mig(&nvml, 1)), [(610002, 3, 0, 12288)]);
    assert_eq!(processes(&mig(&nvml, 3)), []);
    assert_eq!(
        processes(&gpu(&nvml, 1)),
        [(610101, u32::MAX, u32::MAX, 40960)]
    );
}

#[test]
fn gpm_mig_samples_need_an_existing_instance() {
    let nvml = session();
    assert!(gpu(&nvml, 0).gpm_mig_sample(2).is_ok());
    assert!(matches!(
        gpu(&nvml, 0).gpm_mig_sample(7),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        gpu(&nvml, 1).gpm_mig_sample(2),
        Err(NvmlError::InvalidArg)
    ));
    assert!(mig(&nvml, 0).gpm_sample().is_ok());
}

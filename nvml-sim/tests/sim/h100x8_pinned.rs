//! The default scenario at a pinned t = 60 s, read through nvml-wrapper and the raw ABI:
//! identities, values, versioned structs, buffer protocols, NOT_SUPPORTED answers.

use crate::common::{self, Session};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as b;
use std::os::raw::c_uint;

const MIB: u64 = 1024 * 1024;

fn session() -> Session {
    common::session(&[
        ("NVML_SIM_SCENARIO", None),
        ("NVML_SIM_START", None),
        ("NVML_SIM_TIME", Some("60")),
    ])
}

fn gpu(nvml: &Nvml, i: u32) -> Device<'_> {
    nvml.device_by_index(i).unwrap()
}

#[test]
fn system_versions() {
    let nvml = session();
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.127.05");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.127.05");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.device_count().unwrap(), 8);
}

#[test]
fn identity_of_every_gpu() {
    let nvml = session();
    let uuids = [
        "GPU-3b1e5a5c-0c1d-4a6e-9f0b-6f2d1c9e8a01",
        "GPU-8f4c2d7e-1a3b-4c5d-8e9f-0a1b2c3d4e02",
        "GPU-c7a91b3e-5d2f-4e8a-b6c4-1d0e9f8a7b03",
        "GPU-2e6d8c1a-9b7f-4d3e-a5c1-8f2b0e4d6c04",
        "GPU-5a0f3e9d-7c1b-4f6a-8d2e-3b9c7a1f5e05",
        "GPU-d4b8e2f6-3a5c-4b7d-9e1f-6c8a0b2d4f06",
        "GPU-9e7c5a3b-1f2d-4e6c-8b0a-4d6f8e0c2a07",
        "GPU-1c3e5f7a-9b2d-4c6e-a8f0-7b9d1f3e5c08",
    ];
    for (i, uuid) in uuids.iter().enumerate() {
        let d = gpu(&nvml, i as u32);
        assert_eq!(d.index().unwrap(), i as u32);
        assert_eq!(d.name().unwrap(), "NVIDIA H100 80GB HBM3");
        assert_eq!(&d.uuid().unwrap(), uuid);
        assert_eq!(d.serial().unwrap(), format!("165492301010{}", i + 1));
        assert_eq!(d.cuda_compute_capability().unwrap().major, 9);
        assert_eq!(d.minor_number().unwrap(), i as u32);
        let by_uuid = nvml.device_by_uuid(*uuid).unwrap();
        assert_eq!(by_uuid.index().unwrap(), i as u32);
        let pci = d.pci_info().unwrap();
        assert_eq!(pci.pci_device_id, 0x2330_10DE);
        let by_bus = nvml.device_by_pci_bus_id(pci.bus_id.as_str()).unwrap();
        assert_eq!(by_bus.index().unwrap(), i as u32);
    }
    assert_eq!(gpu(&nvml, 4).pci_info().unwrap().bus_id, "00000000:9D:00.0");
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn values_at_t60_follow_the_scenario() {
    let nvml = session();
    // (utilization %, power W, temperature °C, reasons)
    let idle = ThrottleReasons::GPU_IDLE;
    let none = ThrottleReasons::empty();
    let capped_hot = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::SW_THERMAL_SLOWDOWN;
    let expected = [
        (0, 72.0, 34, idle),
        // The trap: ~100 % utilization at a third of the power (GPM shows 15 % SM activity).
        (99, 260.4, 44, none),
        (100, 656.04, 66, none),
        (100, 656.04, 66, none),
        (100, 417.4, 53, none),
        (100, 450.0, 88, capped_hot),
        (60, 448.8, 54, none),
        (0, 72.0, 34, idle),
    ];
    for (i, (util, watts, temp, reasons)) in expected.into_iter().enumerate() {
        let d = gpu(&nvml, i as u32);
        assert_eq!(
            d.utilization_rates().unwrap().gpu,
            util,
            "gpu {i} utilization"
        );
        let mw = d.power_usage().unwrap();
        assert!(
            (mw as f64 - watts * 1000.0).abs() <= 1.0,
            "gpu {i} power {mw} mW"
        );
        assert_eq!(
            d.temperature(TemperatureSensor::Gpu).unwrap(),
            temp,
            "gpu {i} temp"
        );
        assert_eq!(
            d.current_throttle_reasons().unwrap(),
            reasons,
            "gpu {i} reasons"
        );
    }
    assert_eq!(gpu(&nvml, 5).enforced_power_limit().unwrap(), 450_000);
    assert_eq!(gpu(&nvml, 0).enforced_power_limit().unwrap(), 700_000);
    // Power-capped and hot: the SM clock is well below max; the idle GPU sits at its idle clock.
    assert_eq!(gpu(&nvml, 5).clock_info(Clock::SM).unwrap(), 1666);
    assert_eq!(gpu(&nvml, 2).clock_info(Clock::SM).unwrap(), 1980);
    assert_eq!(gpu(&nvml, 0).clock_info(Clock::SM).unwrap(), 345);
    assert_eq!(gpu(&nvml, 0).max_clock_info(Clock::SM).unwrap(), 1980);
    assert_eq!(gpu(&nvml, 0).max_clock_info(Clock::Memory).unwrap(), 2619);
}

#[test]
fn memory_and_processes() {
    let nvml = session();
    let m = gpu(&nvml, 7).memory_info().unwrap();
    assert_eq!(m.total, 81559 * MIB);
    assert_eq!(m.reserved, 579 * MIB);
    assert_eq!(m.used, 20480 * MIB);
    assert_eq!(m.free, m.total - m.reserved - m.used);
    let procs = gpu(&nvml, 7).running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 412850);
    assert!(matches!(procs[0].used_gpu_memory, UsedGpuMemory::Used(b) if b == 20480 * MIB));
    assert_eq!(procs[0].gpu_instance_id, None);
    assert!(
        gpu(&nvml, 0)
            .running_compute_processes()
            .unwrap()
            .is_empty()
    );
    assert!(
        gpu(&nvml, 7)
            .running_graphics_processes()
            .unwrap()
            .is_empty()
    );
    assert_eq!(gpu(&nvml, 7).utilization_rates().unwrap().gpu, 0);
}

#[test]
fn counters_are_deterministic_and_consistent_with_power() {
    let nvml = session();
    // Pinned clock: identical answers on every call; energy = power × 60 s at constant load.
    let e0 = gpu(&nvml, 0).total_energy_consumption().unwrap();
    assert_eq!(e0, gpu(&nvml, 0).total_energy_consumption().unwrap());
    assert_eq!(e0, 72 * 60 * 1000);
    let e5 = gpu(&nvml, 5).total_energy_consumption().unwrap();
    assert_eq!(e5, 450 * 60 * 1000);
    use nvml_wrapper::enum_wrappers::device::PerformancePolicy;
    let v = gpu(&nvml, 5)
        .violation_status(PerformancePolicy::Power)
        .unwrap();
    assert_eq!(v.violation_time, 60_000_000_000);
    assert_eq!(
        gpu(&nvml, 0)
            .violation_status(PerformancePolicy::Power)
            .unwrap()
            .violation_time,
        0
    );
    let ecc = gpu(&nvml, 6)
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        .unwrap();
    assert_eq!(ecc, 14);
    let agg = gpu(&nvml, 6)
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)
        .unwrap();
    assert_eq!(agg, 354);
}

#[test]
fn passive_cooling_and_no_page_retirement_on_hopper() {
    let nvml = session();
    let d = gpu(&nvml, 0);
    assert_eq!(d.num_fans().unwrap(), 0);
    assert!(matches!(d.fan_speed(0), Err(NvmlError::NotSupported)));
    assert_eq!(d.encoder_utilization().unwrap().utilization, 0);
    assert!(d.decoder_utilization().is_ok());
    use nvml_wrapper::enum_wrappers::device::RetirementCause;
    assert!(matches!(
        d.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
        Err(NvmlError::NotSupported)
    ));
    let mig = d.mig_mode().unwrap();
    assert_eq!((mig.current, mig.pending), (0, 0));
}

#[test]
fn nvlink_state_errors_and_throughput_fields() {
    let nvml = session();
    let d = gpu(&nvml, 3);
    for link in 0..18 {
        assert!(d.link_wrapper_for(link).is_active().unwrap());
    }
    assert!(matches!(
        d.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    // 36 CRC flit errors per hour: 0.6 per link after 60 s, floored.
    assert_eq!(
        d.link_wrapper_for(0)
            .error_counter(ErrorCounter::DlCrcFlit)
            .unwrap(),
        0
    );

    // Per-link TX bytes need scopeId, which nvml-wrapper does not set: call the ABI directly.
    let mut values: Vec<b::nvmlFieldValue_t> = (0..3)
        .map(|i| {
            // SAFETY: plain C struct, all-zero is valid.
            let mut v: b::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = [
                b::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                b::field_id::NVML_FI_DEV_MEMORY_TEMP,
                9999,
            ][i];
            v.scopeId = 5;
            v
        })
        .collect();
    // SAFETY: valid handle and an array of 3 entries.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetFieldValues(d.handle(), 3, values.as_mut_ptr())
    };
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!(values[0].nvmlReturn, b::nvmlReturn_enum_NVML_SUCCESS);
    // 150 GB/s over 18 links for 60 s, in KiB.
    let expected = (150e9 * 60.0 / 18.0 / 1024.0) as u64;
    // SAFETY: the value type says which union member is set.
    let got = unsafe { values[0].value.ullVal };
    assert!(got.abs_diff(expected) <= 1, "{got} vs {expected}");
    assert_eq!(values[1].nvmlReturn, b::nvmlReturn_enum_NVML_SUCCESS);
    // SAFETY: as above.
    assert_eq!(unsafe { values[1].value.uiVal }, 72); // 66 °C + 6 °C HBM offset
    assert_eq!(
        values[2].nvmlReturn,
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    );
}

#[test]
fn remapped_rows_through_the_raw_abi() {
    let nvml = session();
    let (mut corr, mut unc, mut pending, mut failure) = (9, 9, 9, 9);
    // SAFETY: valid handle and four out-pointers.
    let rc = unsafe {
        nvml.lib().nvmlDeviceGetRemappedRows(
            gpu(&nvml, 0).handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    assert_eq!(rc, b::nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!((corr, unc, pending, failure), (0, 0, 0, 0));
}

#[test]
fn versioned_struct_and_buffer_protocols() {
    let nvml = session();
    let lib = nvml.lib();
    // SAFETY: valid handle; every pointer below is a live local.
    unsafe {
        let h = gpu(&nvml, 1).handle();
        let mut mem: b::nvmlMemory_v2_t = std::mem::zeroed();
        mem.version = 1 << 24 | std::mem::size_of::<b::nvmlMemory_v2_t>() as u32;
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(h, &mut mem),
            b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        mem.version = 2 << 24 | std::mem::size_of::<b::nvmlMemory_v2_t>() as u32;
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(h, &mut mem),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(mem.used, 18432 * MIB);

        let mut name = [0 as std::os::raw::c_char; 8];
        assert_eq!(
            lib.nvmlDeviceGetName(h, name.as_mut_ptr(), 8),
            b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(
            lib.nvmlDeviceGetName(h, std::ptr::null_mut(), 96),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        let mut count: c_uint = 0;
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, std::ptr::null_mut()),
            b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 1);
        let mut infos = [std::mem::zeroed::<b::nvmlProcessInfo_v2_t>(); 1];
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, infos.as_mut_ptr()),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!((count, infos[0].pid), (1, 412301));

        let bogus = 0x10 as b::nvmlDevice_t;
        let mut util: c_uint = 0;
        assert_eq!(
            lib.nvmlDeviceGetPowerUsage(bogus, &mut util),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetPowerUsage(h, std::ptr::null_mut()),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let msg = std::ffi::CStr::from_ptr(
            lib.nvmlErrorString(b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        );
        assert_eq!(msg.to_str().unwrap(), "GPU is lost");
    }
}

#[test]
fn concurrent_callers_see_the_same_answers() {
    let nvml = session();
    let read_all = || -> Vec<(u32, u32, u64, u64)> {
        (0..8)
            .map(|i| {
                let d = gpu(&nvml, i);
                (
                    d.power_usage().unwrap(),
                    d.temperature(TemperatureSensor::Gpu).unwrap(),
                    d.total_energy_consumption().unwrap(),
                    d.memory_info().unwrap().used,
                )
            })
            .collect()
    };
    let expected = read_all();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| (0..50).map(|_| read_all()).collect::<Vec<_>>()))
            .collect();
        for h in handles {
            for got in h.join().unwrap() {
                assert_eq!(got, expected);
            }
        }
    });
}

//! An unprivileged caller (`NVML_SIM_PRIVILEGED=0`) on h100-mig at t = 30 s: the process lists
//! of the GPU in MIG mode answer NO_PERMISSION, as `nvml.h` says the parent's aggregate needs
//! "appropriate privileges"; its MIG device handles still list their own processes, and the GPU
//! with MIG off lists its processes as for anyone.

use crate::common::{self, Session};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

fn session() -> Session {
    let scenario = common::scenario("h100-mig.toml");
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(scenario.as_str())),
        ("NVML_SIM_TIME", Some("30")),
        ("NVML_SIM_START", None),
        ("NVML_SIM_PRIVILEGED", Some("0")),
    ])
}

fn gpu(nvml: &Nvml, i: u32) -> Device<'_> {
    nvml.device_by_index(i).unwrap()
}

/// A listed process: pid, GPU instance, compute instance, MiB.
type Listed = (u32, Option<u32>, Option<u32>, u64);

/// The device's compute processes.
fn compute(d: &Device) -> Result<Vec<Listed>, NvmlError> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    Ok(d.running_compute_processes()?
        .into_iter()
        .map(|p| {
            let mib = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b >> 20,
                UsedGpuMemory::Unavailable => u64::MAX,
            };
            (p.pid, p.gpu_instance_id, p.compute_instance_id, mib)
        })
        .collect())
}

#[test]
fn the_mig_parent_refuses_its_process_lists() {
    let nvml = session();
    let parent = gpu(&nvml, 0);
    assert!(matches!(compute(&parent), Err(NvmlError::NoPermission)));
    assert!(matches!(
        parent.running_graphics_processes(),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        parent.running_compute_processes_count(),
        Err(NvmlError::NoPermission)
    ));
    // Only the process lists: the rest of the parent answers as for root.
    assert!(
        parent
            .temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu)
            .is_ok()
    );
    assert!(parent.mig_device_count().is_ok());
}

#[test]
fn mig_handles_list_their_own_processes() {
    let nvml = session();
    let parent = gpu(&nvml, 0);
    let by_handle: Vec<_> = (0..parent.mig_device_count().unwrap())
        .filter_map(|i| parent.mig_device_by_index(i).ok())
        .map(|m| compute(&m).unwrap())
        .collect();
    assert_eq!(
        by_handle,
        [
            vec![(610001, Some(2), Some(0), 30720)],
            vec![(610002, Some(3), Some(0), 12288)],
            vec![(610003, Some(9), Some(0), 2048)],
            vec![],
        ]
    );
}

#[test]
fn a_gpu_with_mig_off_lists_its_processes() {
    let nvml = session();
    assert_eq!(
        compute(&gpu(&nvml, 1)).unwrap(),
        [(610101, None, None, 40960)]
    );
}

//! MIG (multi-instance GPU): the GPU instances of a GPU in MIG mode, read every tick.
//!
//! NVML names a MIG device (a compute instance) by a handle that goes invalid the moment its
//! instance is destroyed, and the layout can change at any time, so nothing here keeps a handle
//! across ticks: each tick enumerates the MIG devices again (`nvmlDeviceGetMaxMigDeviceCount`,
//! then `nvmlDeviceGetMigDeviceHandleByIndex` for every index; NOT_FOUND is an empty slot).
//! Per MIG device: GPU instance id, compute instance id, UUID. Per GPU instance (once, however
//! many compute instances it has): memory from its first MIG device, its profile (GI id →
//! `nvmlDeviceGetGpuInstanceById` → `nvmlGpuInstanceGetInfo` → profile id → the profile table's
//! name, "MIG 1g.10gb" → "1g.10gb"), and GPM through `super::gpm::read_instance_gpm`.
//!
//! The profile table is read once per session (it is the board's); the instance → profile id
//! lookup is two calls per instance per tick, since an instance id can be reused by another
//! profile after a reconfiguration. NVML calls per tick on a GPU with G instances and D MIG
//! devices: 1 + 7 (max count, every index) + 3·D (GI id, CI id, UUID) + 3·G (memory, instance by
//! id, instance info), plus 2·G for GPM (sample, metrics) on Hopper: 40 for h100-mig's GPU0
//! (4 instances of one compute instance each).
//!
//! The handles found are handed on, for this tick only, to the process reader
//! ([`super::processes`]), which lists each MIG device's processes when the GPU refuses its own
//! list to an unprivileged caller: one enumeration per tick serves both.
//!
//! nvml-wrapper 0.13 wraps the MIG handle calls but not the instance id, instance info and
//! versioned profile info calls; those are made through `nvml.lib()` as in [`super::raw`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT;

use super::raw::{self, IdKind};

use super::gpm::{GpmState, InstanceKey, read_instance_gpm};
use super::ledger::CallLedger;
use crate::sample::{ComputeInstanceSample, MemoryInfo, MigInstanceSample};

/// Argument under which calls on MIG device handles are remembered as not supported, apart from
/// the same function on the GPU's own handle (a MIG handle supports far less).
pub(super) const MIG_HANDLE: u32 = 1 << 20;

/// Reads a GPU's MIG instances tick after tick; keeps the board's profile names.
#[derive(Debug, Default)]
pub struct MigReader {
    /// Profile id → name ("1g.10gb"), from the board's profile table.
    profile_names: HashMap<u32, String>,
    /// The whole table has been read once (profiles the board lacks answer an error).
    table_read: bool,
}

/// A MIG device handle found this tick and the instance it names; valid for this tick only.
pub(super) struct MigHandle<'nvml> {
    /// The MIG device handle.
    pub handle: Device<'nvml>,
    /// Its GPU instance id.
    pub gpu_instance: u32,
    /// Its compute instance id.
    pub compute_instance: u32,
}

/// One MIG device found this tick.
struct MigDevice<'nvml> {
    handle: Device<'nvml>,
    gpu_instance: u32,
    compute: ComputeInstanceSample,
}

impl MigReader {
    /// A reader that has not read the profile table yet.
    pub fn new() -> MigReader {
        MigReader::default()
    }

    /// The GPU instances of `device` now (its MIG mode is on), by GI id, with GPM when the GPU
    /// supports it, and the MIG device handles found on the way (for the per-instance process
    /// lists, so that a tick enumerates once). Windows of instances that are gone are dropped
    /// from `gpm`.
    pub(super) fn read<'nvml>(
        &mut self,
        t: &mut CallLedger,
        nvml: &'nvml Arc<Nvml>,
        device: &Device<'nvml>,
        gpm: &mut GpmState,
    ) -> (Vec<MigInstanceSample>, Vec<MigHandle<'nvml>>) {
        let mut by_instance: BTreeMap<u32, Vec<MigDevice<'nvml>>> = BTreeMap::new();
        for d in enumerate(t, device) {
            by_instance.entry(d.gpu_instance).or_default().push(d);
        }
        let mut alive = Vec::with_capacity(by_instance.len());
        let mut out = Vec::with_capacity(by_instance.len());
        let mut handles = Vec::new();
        for (gi, mut devices) in by_instance {
            devices.sort_by_key(|d| d.compute.compute_instance);
            let first = &devices[0].handle;
            let memory = t
                .call("nvmlDeviceGetMemoryInfo_v2", MIG_HANDLE, || {
                    first.memory_info()
                })
                .map(|m| MemoryInfo {
                    total_bytes: m.total as f64,
                    used_bytes: m.used as f64,
                    free_bytes: m.free as f64,
                    reserved_bytes: m.reserved as f64,
                });
            let info = t
                .call("nvmlGpuInstanceGetInfo", 0, || {
                    raw::gpu_instance_info(device, gi)
                })
                .flatten();
            let profile = info
                .map(|i| self.profile_name(t, device, i.profileId))
                .unwrap_or_default();
            let gpm_metrics = match info {
                Some(i) if gpm.supported() => {
                    let key = InstanceKey {
                        gpu_instance: gi,
                        profile_id: i.profileId,
                        placement_start: i.placement.start,
                        uuid: devices[0].compute.uuid.clone(),
                    };
                    let m = read_instance_gpm(t, nvml, device, &key, gpm);
                    alive.push(key);
                    m
                }
                _ => None,
            };
            let gpu_fraction = self.gpu_fraction(&profile);
            out.push(MigInstanceSample {
                gpu_instance: gi,
                gpu_fraction,
                profile,
                placement_start: info.map(|i| i.placement.start),
                memory,
                gpm: gpm_metrics,
                compute_instances: devices
                    .into_iter()
                    .map(|d| {
                        handles.push(MigHandle {
                            handle: d.handle,
                            gpu_instance: gi,
                            compute_instance: d.compute.compute_instance,
                        });
                        d.compute
                    })
                    .collect(),
                // Integrated by the sampler's session.
                busy: Default::default(),
            });
        }
        gpm.retain_instances(&alive);
        (out, handles)
    }

    /// The share of the GPU an instance of `profile` is: its compute slices over the largest
    /// profile's of the board's table (7 on an H100 or A100, 4 on an A30).
    fn gpu_fraction(&self, profile: &str) -> Option<f64> {
        let whole = self
            .profile_names
            .values()
            .filter_map(|p| compute_slices(p))
            .max()?;
        Some(f64::from(compute_slices(profile)?) / f64::from(whole))
    }

    /// The name of profile `profile_id`, reading the board's profile table the first time.
    fn profile_name(&mut self, t: &mut CallLedger, device: &Device, profile_id: u32) -> String {
        if !self.table_read && !self.profile_names.contains_key(&profile_id) {
            let mut complete = true;
            for profile in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
                match t.call("nvmlDeviceGetGpuInstanceProfileInfoV", profile, || {
                    profile_info(device, profile)
                }) {
                    Some(Some((id, name))) => {
                        self.profile_names.insert(id, name);
                    }
                    Some(None) => {}
                    // A failure (counted) or a library without the call: ask again next tick.
                    None => complete = false,
                }
            }
            self.table_read = complete;
        }
        self.profile_names
            .get(&profile_id)
            .cloned()
            .unwrap_or_default()
    }
}

/// The MIG devices of `device` now. A slot whose handle or ids cannot be read is left out.
fn enumerate<'nvml>(t: &mut CallLedger, device: &Device<'nvml>) -> Vec<MigDevice<'nvml>> {
    let count = t
        .call("nvmlDeviceGetMaxMigDeviceCount", 0, || {
            device.mig_device_count()
        })
        .unwrap_or(0);
    let mut out = Vec::new();
    for index in 0..count {
        let handle = t.call("nvmlDeviceGetMigDeviceHandleByIndex", 0, || {
            // NOT_FOUND: nothing at this index now (the indices need not be dense).
            match device.mig_device_by_index(index) {
                Err(NvmlError::NotFound) => Ok(None),
                other => other.map(Some),
            }
        });
        let Some(Some(handle)) = handle else {
            continue;
        };
        let Some(gpu_instance) = t.call("nvmlDeviceGetGpuInstanceId", 0, || {
            raw::mig_instance_id(&handle, IdKind::Gpu)
        }) else {
            continue;
        };
        let Some(compute_instance) = t.call("nvmlDeviceGetComputeInstanceId", 0, || {
            raw::mig_instance_id(&handle, IdKind::Compute)
        }) else {
            continue;
        };
        let uuid = t
            .call("nvmlDeviceGetUUID", MIG_HANDLE, || handle.uuid())
            .unwrap_or_default();
        out.push(MigDevice {
            handle,
            gpu_instance,
            compute: ComputeInstanceSample {
                compute_instance,
                uuid,
            },
        });
    }
    out
}

/// Which id of a MIG device handle to read.
/// Profile id and `mig_profile` label of the `NVML_GPU_INSTANCE_PROFILE_*` value `profile`;
/// `None` when the board has no such profile.
fn profile_info(device: &Device, profile: u32) -> Result<Option<(u32, String)>, NvmlError> {
    Ok(raw::gpu_instance_profile(device, profile)?.map(|(id, name)| (id, profile_label(&name))))
}

/// The compute slices of a profile by its label, the number before "g": "3g.40gb" → 3,
/// "1g.10gb+me" → 1.
pub fn compute_slices(label: &str) -> Option<u32> {
    let (slices, _) = label.split_once('g')?;
    slices.parse().ok().filter(|n| *n > 0)
}

/// The `mig_profile` label of a profile name: "MIG 1g.10gb" → "1g.10gb".
pub fn profile_label(name: &str) -> String {
    let name = name.trim();
    name.strip_prefix("MIG ").unwrap_or(name).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_slices_are_the_number_before_g() {
        assert_eq!(compute_slices("3g.40gb"), Some(3));
        assert_eq!(compute_slices("1g.10gb+me"), Some(1));
        assert_eq!(compute_slices("7g.80gb"), Some(7));
        assert_eq!(compute_slices(""), None);
        assert_eq!(compute_slices("0g.1gb"), None);
        assert_eq!(compute_slices("big"), None);
    }

    #[test]
    fn profile_names_lose_the_mig_prefix() {
        assert_eq!(profile_label("MIG 1g.10gb"), "1g.10gb");
        assert_eq!(profile_label("MIG 1g.10gb+me"), "1g.10gb+me");
        assert_eq!(profile_label("3g.40gb"), "3g.40gb");
        assert_eq!(profile_label(""), "");
    }
}

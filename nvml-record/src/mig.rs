//! MIG: a GPU's instances as laid out when the recording starts, each with its compute
//! instances (MIG devices), its memory use per sample and its GPM averages.

use std::collections::BTreeMap;

use nvml_exporter::nvml::raw::{self, IdKind};
use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use toml::{Table, Value};

use crate::gpm::gpm_load;
use crate::trace::{Trace, float, int, table};

/// A MIG GPU instance as it was when the recording started.
#[derive(Debug)]
pub(crate) struct InstanceRecording {
    pub(crate) id: u32,
    pub(crate) profile: String,
    pub(crate) start: u32,
    pub(crate) computes: Vec<ComputeRecording>,
    /// Memory used, bytes, from its MIG devices.
    pub(crate) memory: Trace,
    /// GPM averages per `load` key.
    pub(crate) gpm: BTreeMap<&'static str, Vec<f64>>,
}

/// A compute instance (a MIG device) of a GPU instance.
#[derive(Debug)]
pub(crate) struct ComputeRecording {
    pub(crate) id: u32,
    pub(crate) uuid: String,
    /// Its compute slices and those of its GPU instance (`nvmlDeviceGetAttributes`).
    pub(crate) slices: Option<(u32, u32)>,
}

/// The `load` keys a MIG instance takes: links belong to the whole board.
fn instance_load_key(key: &str) -> bool {
    !key.starts_with("pcie_") && !key.starts_with("nvlink_")
}

/// The MIG devices of `d` now: (GPU instance id, compute instance id, handle).
pub(crate) fn mig_devices<'nvml>(d: &Device<'nvml>) -> Vec<(u32, u32, Device<'nvml>)> {
    let max = d.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|i| {
            let mig = d.mig_device_by_index(i).ok()?;
            let gi = raw::mig_instance_id(&mig, IdKind::Gpu).ok()?;
            let ci = raw::mig_instance_id(&mig, IdKind::Compute).ok()?;
            Some((gi, ci, mig))
        })
        .collect()
}

/// The GPU instances of `d` (MIG mode on) with their compute instances, by GPU instance id.
pub(crate) fn read_instances(d: &Device) -> Result<Vec<InstanceRecording>, NvmlError> {
    // Profile id -> name without the "MIG " prefix ("1g.10gb"); a profile the board lacks, or a
    // library without the call, is left out.
    let profiles: BTreeMap<u32, String> = (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|profile| raw::gpu_instance_profile(d, profile).ok().flatten())
        .map(|(id, name)| (id, name.trim_start_matches("MIG ").to_owned()))
        .collect();
    let mut instances: BTreeMap<u32, InstanceRecording> = BTreeMap::new();
    for (gi, ci, mig) in mig_devices(d) {
        let instance = match instances.entry(gi) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let info = raw::gpu_instance_info(d, gi)?.ok_or(NvmlError::NotFound)?;
                let (profile_id, start) = (info.profileId, info.placement.start);
                let profile = profiles.get(&profile_id).ok_or(NvmlError::NotFound)?;
                e.insert(InstanceRecording {
                    id: gi,
                    profile: profile.clone(),
                    start,
                    computes: Vec::new(),
                    memory: Trace::default(),
                    gpm: BTreeMap::new(),
                })
            }
        };
        let compute = ComputeRecording {
            id: ci,
            uuid: mig.uuid()?,
            slices: mig
                .attributes()
                .ok()
                .map(|a| (a.compute_instance_slice_count, a.gpu_instance_slice_count)),
        };
        instance.computes.push(compute);
    }
    Ok(instances.into_values().collect())
}

impl InstanceRecording {
    /// The `[[gpu.mig.instance]]` table.
    pub(crate) fn table(&self, step: f64, samples: usize) -> Value {
        let mut t = Table::new();
        t.insert("id".into(), int(self.id.into()));
        t.insert("profile".into(), Value::String(self.profile.clone()));
        t.insert("start".into(), int(self.start.into()));
        match self.computes.as_slice() {
            // One compute instance spanning the GPU instance: the simulator's default.
            [c] if c.id == 0 && c.slices.is_none_or(|(ci, gi)| ci == gi) => {
                t.insert("uuid".into(), Value::String(c.uuid.clone()));
            }
            computes => {
                let computes = computes
                    .iter()
                    .map(|c| {
                        let mut ct = Table::new();
                        ct.insert("id".into(), int(c.id.into()));
                        ct.insert("uuid".into(), Value::String(c.uuid.clone()));
                        if let Some((slices, _)) = c.slices {
                            ct.insert("slices".into(), int(slices.into()));
                        }
                        Value::Table(ct)
                    })
                    .collect();
                t.insert("compute".into(), Value::Array(computes));
            }
        }
        let mut load = gpm_load(&self.gpm, step, samples);
        load.retain(|k, _| instance_load_key(k));
        if !load.is_empty() {
            t.insert("load".into(), Value::Table(load));
        }
        if let Some(memory) = self.memory.series() {
            t.insert(
                "replay".into(),
                table([("step", float(step)), ("memory_used_bytes", memory)]),
            );
        }
        Value::Table(t)
    }
}

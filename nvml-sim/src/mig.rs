//! Multi-Instance GPU (MIG): the GPU-instance profiles each board offers, the scenario's
//! `[gpu.mig]` table (mode and a layout of GPU and compute instances that may change over time),
//! its validation against what the real board allows, and the layout at a given time.
//!
//! A GPU instance (GI) owns a set of compute slices and memory slices; a compute instance (CI)
//! is a share of its GI's compute slices, and each CI is one "MIG device" with its own NVML
//! handle and `MIG-…` UUID. The memory belongs to the GI, so every CI of a GI sees the GI's memory.

use crate::load::Load;
use crate::pattern::Pattern;
use crate::replay::InstanceReplay;
use serde::Deserialize;
use std::collections::HashSet;

/// Compute slices (GPCs) of every MIG-capable board simulated here.
pub const COMPUTE_SLICES: u32 = 7;
/// Memory slices of every MIG-capable board simulated here.
pub const MEMORY_SLICES: u32 = 8;
/// GPU instance ids run 0..MAX_GI_IDS (the driver never hands out more on these boards).
pub const MAX_GI_IDS: u32 = 15;
/// Compute instance ids run 0..MAX_CI_IDS within a GPU instance.
pub const MAX_CI_IDS: u32 = 8;
/// `nvmlDeviceGetMaxMigDeviceCount` with MIG enabled: one MIG device per compute slice at most.
pub const MAX_MIG_DEVICES: u32 = COMPUTE_SLICES;
/// Compute instance sizes (slices) a GPU instance can be split into (`1c`, `2c`, `3c`, `4c`, `7c`).
const CI_SIZES: [u32; 5] = [1, 2, 3, 4, 7];

/// A GPU-instance profile as `nvidia-smi mig -lgip` lists it on the real board.
#[derive(Debug, PartialEq, Eq)]
pub struct Profile {
    /// Profile name without the "MIG " prefix, e.g. "1g.10gb".
    pub name: &'static str,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` constant that selects it in
    /// `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_profile: u32,
    /// The profile id (`nvmlGpuInstanceProfileInfo_t.id`, the "ID" column of `-lgip`).
    pub id: u32,
    /// Compute slices.
    pub slices: u32,
    /// Memory slices (the placement size).
    pub memory_slices: u32,
    /// Placement starts the board allows (memory slice index).
    pub starts: &'static [u32],
    /// Memory of an instance, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// NVDEC engines.
    pub decoders: u32,
    /// NVJPG engines.
    pub jpegs: u32,
    /// NVOFA engines.
    pub ofas: u32,
}

const ONE_SLICE_STARTS: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICE_STARTS: &[u32] = &[0, 2, 4];
const ONE_SLICE_DOUBLE_MEMORY_STARTS: &[u32] = &[0, 2, 4, 6];
const THREE_SLICE_STARTS: &[u32] = &[0, 4];
const AT_ZERO: &[u32] = &[0];

#[allow(clippy::too_many_arguments)]
const fn profile(
    name: &'static str,
    nvml_profile: u32,
    id: u32,
    slices: u32,
    memory_slices: u32,
    starts: &'static [u32],
    memory_mib: u64,
    sms: u32,
    engines: [u32; 4],
) -> Profile {
    Profile {
        name,
        nvml_profile,
        id,
        slices,
        memory_slices,
        starts,
        memory_mib,
        sms,
        copy_engines: engines[0],
        decoders: engines[1],
        jpegs: engines[2],
        ofas: engines[3],
    }
}

// NVML_GPU_INSTANCE_PROFILE_* values used below: 1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE 3,
// 7_SLICE 4, 1_SLICE_REV2 (one slice, twice the memory) 9. Memory sizes are the GiB of `-lgip`
// (two decimals) in MiB; engines are [copy, NVDEC, NVJPG, NVOFA].

/// H100 SXM5 80GB.
const H100_80GB: &[Profile] = &[
    profile(
        "1g.10gb",
        0,
        19,
        1,
        1,
        ONE_SLICE_STARTS,
        9984,
        16,
        [1, 1, 1, 0],
    ),
    profile(
        "1g.20gb",
        9,
        15,
        1,
        2,
        ONE_SLICE_DOUBLE_MEMORY_STARTS,
        20096,
        26,
        [1, 1, 1, 0],
    ),
    profile(
        "2g.20gb",
        1,
        14,
        2,
        2,
        TWO_SLICE_STARTS,
        20096,
        32,
        [2, 2, 2, 0],
    ),
    profile(
        "3g.40gb",
        2,
        9,
        3,
        4,
        THREE_SLICE_STARTS,
        40448,
        60,
        [3, 3, 3, 0],
    ),
    profile("4g.40gb", 3, 5, 4, 4, AT_ZERO, 40448, 64, [4, 4, 4, 0]),
    profile("7g.80gb", 4, 0, 7, 8, AT_ZERO, 81152, 132, [8, 7, 7, 1]),
];

/// A100 SXM4 80GB.
const A100_80GB: &[Profile] = &[
    profile(
        "1g.10gb",
        0,
        19,
        1,
        1,
        ONE_SLICE_STARTS,
        9728,
        14,
        [1, 0, 0, 0],
    ),
    profile(
        "1g.20gb",
        9,
        15,
        1,
        2,
        ONE_SLICE_DOUBLE_MEMORY_STARTS,
        19968,
        14,
        [1, 1, 0, 0],
    ),
    profile(
        "2g.20gb",
        1,
        14,
        2,
        2,
        TWO_SLICE_STARTS,
        19968,
        28,
        [2, 1, 0, 0],
    ),
    profile(
        "3g.40gb",
        2,
        9,
        3,
        4,
        THREE_SLICE_STARTS,
        40192,
        42,
        [3, 2, 0, 0],
    ),
    profile("4g.40gb", 3, 5, 4, 4, AT_ZERO, 40192, 56, [4, 2, 0, 0]),
    profile("7g.80gb", 4, 0, 7, 8, AT_ZERO, 81152, 98, [7, 5, 1, 1]),
];

/// A100 SXM4 40GB.
const A100_40GB: &[Profile] = &[
    profile(
        "1g.5gb",
        0,
        19,
        1,
        1,
        ONE_SLICE_STARTS,
        4864,
        14,
        [1, 0, 0, 0],
    ),
    profile(
        "1g.10gb",
        9,
        15,
        1,
        2,
        ONE_SLICE_DOUBLE_MEMORY_STARTS,
        9856,
        14,
        [1, 1, 0, 0],
    ),
    profile(
        "2g.10gb",
        1,
        14,
        2,
        2,
        TWO_SLICE_STARTS,
        9856,
        28,
        [2, 1, 0, 0],
    ),
    profile(
        "3g.20gb",
        2,
        9,
        3,
        4,
        THREE_SLICE_STARTS,
        20096,
        42,
        [3, 2, 0, 0],
    ),
    profile("4g.20gb", 3, 5, 4, 4, AT_ZERO, 20096, 56, [4, 2, 0, 0]),
    profile("7g.40gb", 4, 0, 7, 8, AT_ZERO, 40448, 98, [7, 5, 1, 1]),
];

/// The profile table of a board (`mig_board` in the model presets); empty for a board without
/// MIG (no `mig_board`) or one not simulated here.
pub fn board(name: Option<&str>) -> &'static [Profile] {
    match name {
        Some("h100-80gb") => H100_80GB,
        Some("a100-80gb") => A100_80GB,
        Some("a100-40gb") => A100_40GB,
        _ => &[],
    }
}

/// `[gpu.mig]`: the MIG mode and the instance layout over time.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigSpec {
    /// Current mode (`nvmlDeviceGetMigMode` current). Instances exist only when enabled.
    #[serde(default)]
    pub enabled: bool,
    /// Pending mode, applied at the next GPU reset; default: the current mode.
    pub pending: Option<bool>,
    /// The GPU instances (each optionally limited to a time window).
    #[serde(default, rename = "instance")]
    pub instances: Vec<GpuInstanceSpec>,
}

/// `[[gpu.mig.instance]]`: one GPU instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInstanceSpec {
    /// GPU instance id (`nvmlDeviceGetGpuInstanceId`), 0..15, unique among live instances.
    pub id: u32,
    /// Profile name, e.g. "1g.10gb".
    pub profile: String,
    /// Placement start (memory slice); must be one the profile allows.
    pub start: u32,
    /// Created at this time (default: before t = 0).
    pub from: Option<f64>,
    /// Destroyed at this time (default: never).
    pub to: Option<f64>,
    /// UUID of the default compute instance (when no `[[…compute]]` is given).
    pub uuid: Option<String>,
    /// Activity of the instance: the GPM inputs of `gpu.load` and `memory_used` (ratio of the
    /// instance's memory).
    #[serde(default)]
    load: toml::Table,
    /// Compute instances; default: one (id 0) spanning the whole GPU instance.
    #[serde(default, rename = "compute")]
    pub computes: Vec<ComputeInstanceSpec>,
    /// Recorded memory use, in place of `load.memory_used` (see `replay`).
    #[serde(default)]
    pub replay: Option<InstanceReplay>,
    /// The resolved profile (set by validation).
    #[serde(skip)]
    resolved: Option<&'static Profile>,
    /// The resolved load (set by validation).
    #[serde(skip)]
    pub activity: Load,
}

/// `[[gpu.mig.instance.compute]]`: one compute instance, i.e. one MIG device.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeInstanceSpec {
    /// Compute instance id within its GPU instance (`nvmlDeviceGetComputeInstanceId`), 0..8.
    pub id: u32,
    /// Compute slices; default: all of the GPU instance's.
    pub slices: Option<u32>,
    /// `MIG-…` UUID; default: derived from the parent UUID and the instance ids.
    pub uuid: Option<String>,
}

/// The `load` keys an instance accepts: the activity inputs that GPM reports per instance, and
/// `memory_used`. Link rates and power belong to the whole board.
const INSTANCE_LOAD_KEYS: &[&str] = &[
    "utilization",
    "memory_utilization",
    "memory_used",
    "graphics_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
    "integer_active",
    "dfma_tensor_active",
    "hmma_tensor_active",
    "imma_tensor_active",
    "decoder",
    "nvjpg",
    "nvofa",
];

impl GpuInstanceSpec {
    /// The instance's profile (validated at parse time).
    pub fn profile(&self) -> &'static Profile {
        self.resolved.unwrap_or(&H100_80GB[0])
    }

    /// Whether the instance exists at `t`.
    pub fn alive(&self, t: f64) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t < e)
    }
}

impl ComputeInstanceSpec {
    /// Compute slices of this compute instance inside `gi`.
    pub fn slices_in(&self, gi: &GpuInstanceSpec) -> u32 {
        self.slices.unwrap_or(gi.profile().slices)
    }
}

/// One MIG device (a compute instance) of a GPU at some time.
#[derive(Debug, Clone, Copy)]
pub struct MigDevice<'a> {
    /// Position of the GPU instance in the scenario's `instance` list.
    pub gi_index: usize,
    /// The GPU instance.
    pub gi: &'a GpuInstanceSpec,
    /// The compute instance.
    pub ci: &'a ComputeInstanceSpec,
}

impl MigDevice<'_> {
    /// Profile name as it appears in the device name: "1g.10gb" for a compute instance that
    /// spans its GPU instance, "1c.3g.40gb" for a smaller one (as real drivers name them).
    pub fn profile_name(&self) -> String {
        let profile = self.gi.profile();
        let slices = self.ci.slices_in(self.gi);
        if slices == profile.slices {
            profile.name.to_owned()
        } else {
            format!("{slices}c.{}", profile.name)
        }
    }

    /// `nvmlDeviceGetName` on the MIG handle, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb" for
    /// the parent GPU named `parent`.
    pub fn name(&self, parent: &str) -> String {
        format!("{parent} MIG {}", self.profile_name())
    }

    /// `nvmlDeviceGetUUID` on the MIG handle: "MIG-" and a UUID (derived from the parent GPU's
    /// `parent_uuid` when the scenario gives none).
    pub fn uuid(&self, parent_uuid: &str) -> String {
        self.ci
            .uuid
            .clone()
            .or_else(|| {
                (self.gi.computes.is_empty())
                    .then(|| self.gi.uuid.clone())
                    .flatten()
            })
            .unwrap_or_else(|| derived_uuid(parent_uuid, self.gi, self.ci.id))
    }
}

/// The default compute instance list: one CI (id 0) over the whole GPU instance.
fn default_computes() -> &'static [ComputeInstanceSpec] {
    static DEFAULT: [ComputeInstanceSpec; 1] = [ComputeInstanceSpec {
        id: 0,
        slices: None,
        uuid: None,
    }];
    &DEFAULT
}

impl GpuInstanceSpec {
    /// The compute instances (the default one when none are listed).
    pub fn compute_instances(&self) -> &[ComputeInstanceSpec] {
        if self.computes.is_empty() {
            default_computes()
        } else {
            &self.computes
        }
    }
}

/// A stable, unique-looking UUID for a MIG device the scenario gives none for: FNV-1a over the
/// parent UUID, the instance ids, placement and creation time (so a re-created instance gets a
/// new UUID, as on a real driver).
fn derived_uuid(parent: &str, gi: &GpuInstanceSpec, ci: u32) -> String {
    let key = format!(
        "{parent}/{}/{ci}/{}/{}",
        gi.id,
        gi.start,
        gi.from.unwrap_or(f64::NEG_INFINITY)
    );
    let fnv = |seed: u64| {
        key.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x84222325_cbf29ce4));
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl MigSpec {
    /// The GPU instances alive at `t` (none unless MIG is enabled), with their list positions.
    pub fn instances_at(&self, t: f64) -> impl Iterator<Item = (usize, &GpuInstanceSpec)> {
        let enabled = self.enabled;
        self.instances
            .iter()
            .enumerate()
            .filter(move |(_, gi)| enabled && gi.alive(t))
    }

    /// The MIG devices at `t`, in MIG device index order (by GPU instance id, then compute
    /// instance id).
    pub fn devices_at(&self, t: f64) -> Vec<MigDevice<'_>> {
        let mut v: Vec<MigDevice> = self
            .instances_at(t)
            .flat_map(|(gi_index, gi)| {
                gi.compute_instances()
                    .iter()
                    .map(move |ci| MigDevice { gi_index, gi, ci })
            })
            .collect();
        v.sort_by_key(|d| (d.gi.id, d.ci.id));
        v
    }

    /// The MIG device with these ids at `t`, if it exists.
    pub fn device_at(&self, gi_id: u32, ci_id: u32, t: f64) -> Option<MigDevice<'_>> {
        self.devices_at(t)
            .into_iter()
            .find(|d| d.gi.id == gi_id && d.ci.id == ci_id)
    }

    /// Resolves each instance's profile (from the board's `profiles`) and load, and checks that
    /// every layout the instances form over time is one the board allows.
    pub fn resolve(&mut self, profiles: &'static [Profile]) -> Result<(), String> {
        for (i, gi) in self.instances.iter_mut().enumerate() {
            resolve_instance(gi, profiles).map_err(|e| format!("mig instance {i}: {e}"))?;
        }
        check_layouts(&self.instances)
    }

    /// The UUIDs of every MIG device the layout ever has, on the GPU with UUID `parent_uuid`;
    /// an error if one is not a `MIG-…` UUID.
    pub fn uuids(&self, parent_uuid: &str) -> Result<Vec<String>, String> {
        let mut uuids = Vec::new();
        for gi in &self.instances {
            for ci in gi.compute_instances() {
                let device = MigDevice {
                    gi_index: 0,
                    gi,
                    ci,
                };
                let uuid = device.uuid(parent_uuid);
                if !uuid.starts_with("MIG-") {
                    return Err(format!("mig: uuid must start with \"MIG-\": {uuid:?}"));
                }
                uuids.push(uuid);
            }
        }
        Ok(uuids)
    }
}

fn resolve_instance(gi: &mut GpuInstanceSpec, profiles: &'static [Profile]) -> Result<(), String> {
    let profile = profiles
        .iter()
        .find(|p| p.name == gi.profile)
        .ok_or_else(|| {
            let known: Vec<_> = profiles.iter().map(|p| p.name).collect();
            format!(
                "profile {:?} does not exist on this board (known: {})",
                gi.profile,
                known.join(", ")
            )
        })?;
    if !profile.starts.contains(&gi.start) {
        return Err(format!(
            "{} cannot start at memory slice {} (allowed: {:?})",
            profile.name, gi.start, profile.starts
        ));
    }
    if gi.id >= MAX_GI_IDS {
        return Err(format!("id {} out of range (0..{MAX_GI_IDS})", gi.id));
    }
    if let (Some(f), Some(e)) = (gi.from, gi.to)
        && e.partial_cmp(&f) != Some(std::cmp::Ordering::Greater)
    {
        return Err("`to` must be after `from`".into());
    }
    let mut ids = HashSet::new();
    let mut used = 0;
    for ci in &gi.computes {
        if ci.id >= MAX_CI_IDS || !ids.insert(ci.id) {
            return Err(format!(
                "compute instance id {} is out of range or repeated",
                ci.id
            ));
        }
        let slices = ci.slices.unwrap_or(profile.slices);
        if !CI_SIZES.contains(&slices) || slices > profile.slices {
            return Err(format!(
                "compute instance {}: {slices} slices do not fit a {} instance",
                ci.id, profile.name
            ));
        }
        used += slices;
    }
    if used > profile.slices {
        return Err(format!(
            "compute instances use {used} slices, {} has {}",
            profile.name, profile.slices
        ));
    }
    if let Some(key) = gi
        .load
        .keys()
        .find(|k| !INSTANCE_LOAD_KEYS.contains(&k.as_str()))
    {
        return Err(format!(
            "load.{key} is not an instance input (allowed: {})",
            INSTANCE_LOAD_KEYS.join(", ")
        ));
    }
    let load: Load = gi
        .load
        .clone()
        .try_into()
        .map_err(|e: toml::de::Error| format!("load: {}", e.message()))?;
    validate_patterns(&load)?;
    if let Some(replay) = &gi.replay {
        replay.validate()?;
    }
    gi.activity = load;
    gi.resolved = Some(profile);
    Ok(())
}

fn validate_patterns(l: &Load) -> Result<(), String> {
    let patterns: [(&str, Option<&Pattern>); 6] = [
        ("utilization", Some(&l.utilization)),
        ("memory_used", Some(&l.memory_used)),
        ("sm_active", l.sm_active.as_ref()),
        ("graphics_active", l.graphics_active.as_ref()),
        ("tensor_active", Some(&l.tensor_active)),
        ("dram_active", l.dram_active.as_ref()),
    ];
    for (name, p) in patterns {
        if let Some(p) = p {
            p.validate().map_err(|e| format!("load.{name}: {e}"))?;
        }
    }
    Ok(())
}

/// Every layout the instances form over time (checked at each creation/destruction time) must
/// be one the board allows: unique ids, no shared memory slice, at most 7 compute slices.
fn check_layouts(instances: &[GpuInstanceSpec]) -> Result<(), String> {
    let mut times: Vec<f64> = vec![0.0];
    for gi in instances {
        times.extend(gi.from);
        times.extend(gi.to);
    }
    for t in times {
        let live: Vec<&GpuInstanceSpec> = instances.iter().filter(|gi| gi.alive(t)).collect();
        let mut ids = HashSet::new();
        let mut memory = [None::<u32>; MEMORY_SLICES as usize];
        let mut compute = 0;
        for gi in &live {
            if !ids.insert(gi.id) {
                return Err(format!("mig at t={t}: two GPU instances have id {}", gi.id));
            }
            let p = gi.profile();
            for slice in gi.start..gi.start + p.memory_slices {
                if let Some(other) = memory[slice as usize].replace(gi.id) {
                    return Err(format!(
                        "mig at t={t}: GPU instances {other} and {} overlap at memory slice {slice}",
                        gi.id
                    ));
                }
            }
            compute += p.slices;
        }
        if compute > COMPUTE_SLICES {
            return Err(format!(
                "mig at t={t}: instances need {compute} compute slices, the GPU has {COMPUTE_SLICES}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    fn parse(model: &str, mig: &str) -> Result<Scenario, String> {
        Scenario::parse(&format!(
            "[[gpu]]\nmodel = \"{model}\"\nuuid = \"GPU-1\"\npci_bus_id = \"01:00.0\"\n\
             serial = \"1\"\n{mig}"
        ))
    }

    fn instance(id: u32, profile: &str, start: u32, extra: &str) -> String {
        format!(
            "[[gpu.mig.instance]]\nid = {id}\nprofile = \"{profile}\"\nstart = {start}\n{extra}\n"
        )
    }

    fn h100(instances: &[String]) -> Result<Scenario, String> {
        parse(
            "H100-SXM5-80GB",
            &format!("[gpu.mig]\nenabled = true\n{}", instances.concat()),
        )
    }

    #[test]
    fn full_layouts_the_board_allows_are_accepted() {
        let sevens: Vec<_> = (0..7).map(|s| instance(7 + s, "1g.10gb", s, "")).collect();
        assert!(h100(&sevens).is_ok());
        let mixed = [instance(1, "4g.40gb", 0, ""), instance(2, "3g.40gb", 4, "")];
        assert!(h100(&mixed).is_ok());
        assert!(h100(&[instance(0, "7g.80gb", 0, "")]).is_ok());
        let a100 = parse(
            "A100-SXM4-40GB",
            &format!(
                "[gpu.mig]\nenabled = true\n{}",
                instance(1, "3g.20gb", 4, "")
            ),
        );
        assert_eq!(
            a100.unwrap().gpus[0].mig.instances[0].profile().memory_mib,
            20096
        );
    }

    #[test]
    fn placements_the_board_refuses_are_errors() {
        let err = |v: &[String]| h100(v).unwrap_err();
        assert!(err(&[instance(1, "3g.40gb", 2, "")]).contains("cannot start at memory slice 2"));
        assert!(err(&[instance(1, "1g.10gb", 7, "")]).contains("cannot start"));
        assert!(err(&[instance(1, "1g.5gb", 0, "")]).contains("does not exist on this board"));
        let overlap = [instance(3, "2g.20gb", 0, ""), instance(7, "1g.10gb", 1, "")];
        assert!(err(&overlap).contains("overlap at memory slice 1"));
        let same_id = [instance(3, "1g.10gb", 0, ""), instance(3, "1g.10gb", 1, "")];
        assert!(err(&same_id).contains("two GPU instances have id 3"));
        // 4g + 3g fill all 7 compute slices and 8 memory slices.
        let crowded = [instance(2, "3g.40gb", 4, ""), instance(1, "4g.40gb", 0, "")];
        assert!(h100(&crowded).is_ok());
        let too_many = [
            instance(3, "2g.20gb", 0, ""),
            instance(4, "2g.20gb", 2, ""),
            instance(5, "2g.20gb", 4, ""),
            instance(13, "1g.20gb", 6, ""),
        ];
        assert!(h100(&too_many).is_ok(), "2+2+2+1 = 7 slices");
        let bad_ci = [instance(
            1,
            "3g.40gb",
            0,
            "[[gpu.mig.instance.compute]]\nid = 0\nslices = 5",
        )];
        assert!(err(&bad_ci).contains("do not fit"));
        let bad_load = [instance(1, "3g.40gb", 0, "load = { pcie_tx_mb_s = 5 }")];
        assert!(err(&bad_load).contains("not an instance input"));
        assert!(
            parse("L4", "[gpu.mig]\nenabled = true\n")
                .unwrap_err()
                .contains("does not support MIG")
        );
    }

    #[test]
    fn layouts_are_checked_at_every_reconfiguration() {
        // GI 3 leaves at 60 s and GI 7 takes its slices from 60 s: fine.
        let ok = [
            instance(3, "2g.20gb", 0, "to = 60"),
            instance(7, "1g.20gb", 0, "from = 60"),
        ];
        assert!(h100(&ok).is_ok());
        // Created at 50 s while GI 3 still holds the slices: refused.
        let early = [
            instance(3, "2g.20gb", 0, "to = 60"),
            instance(7, "1g.20gb", 0, "from = 50"),
        ];
        assert!(h100(&early).unwrap_err().contains("at t=50"));
    }

    #[test]
    fn processes_must_live_in_an_existing_instance() {
        let gi = instance(3, "2g.20gb", 0, "to = 60");
        let process = |extra: &str| {
            format!("[[gpu.process]]\npid = 1\nname = \"p\"\nused_memory_mib = 1024\n{extra}\n")
        };
        assert!(h100(&[gi.clone(), process("gpu_instance = 3\nto = 60")]).is_ok());
        let err = |p: &str| h100(&[gi.clone(), process(p)]).unwrap_err();
        assert!(err("").contains("`gpu_instance` is required"));
        assert!(err("gpu_instance = 3").contains("whole life"));
        assert!(err("gpu_instance = 3\nto = 60\ncompute_instance = 1").contains("whole life"));
        let big = process("gpu_instance = 3\nto = 60").replace("1024", "30000");
        assert!(h100(&[gi, big]).unwrap_err().contains("processes hold"));
        let off = parse("H100-SXM5-80GB", &process("gpu_instance = 3"));
        assert!(off.unwrap_err().contains("needs MIG enabled"));
    }

    #[test]
    fn derived_uuids_are_mig_uuids_and_differ_per_instance() {
        let s = h100(&[
            instance(9, "1g.10gb", 2, ""),
            instance(10, "1g.10gb", 3, ""),
        ])
        .unwrap();
        let gpu = &s.gpus[0];
        let devices = gpu.mig.devices_at(0.0);
        let uuids: Vec<_> = devices.iter().map(|d| d.uuid(&gpu.uuid)).collect();
        assert_eq!(uuids[0].len(), "MIG-".len() + 36);
        assert!(uuids.iter().all(|u| u.starts_with("MIG-")));
        assert_ne!(uuids[0], uuids[1]);
        assert_eq!(
            devices[0].name(&gpu.name),
            "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        );
    }
}

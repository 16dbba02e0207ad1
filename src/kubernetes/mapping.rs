//! From the kubelet's answer to "which GPU belongs to which container".
//!
//! Two steps, kept apart so that the sampler stays NVML-only: [`assignments`] turns a `List`
//! response into [`PodAssignment`]s (done when the kubelet answers), and [`attribute`] resolves
//! them against the devices of a snapshot (done when a snapshot is encoded, so a GPU that appears
//! or is renumbered is matched by the very next exposition).
//!
//! Device IDs come from the device plugin, so their format depends on which one runs:
//! - `GPU-<uuid>` (NVIDIA device plugin): the GPU with that UUID. With time-slicing the plugin
//!   appends a replica number, `GPU-<uuid>::3`; it is dropped.
//! - `nvidia<N>` (GKE's device plugin): the GPU whose minor number is N (`/dev/nvidiaN`), which
//!   need not be the NVML index. GKE time-sharing appends `/vgpu<K>`; it is dropped.
//! - `MIG-<uuid>` (NVIDIA device plugin, MIG strategies): the MIG device with that UUID, which is
//!   one compute instance of a GPU instance; it resolves to that GPU instance ([`attribute_instances`]).
//! - `nvidia<N>/gi<M>` (GKE's device plugin on a MIG partition): GPU instance M of the GPU whose
//!   minor number is N. A further `/vgpu<K>` (time-sharing) is dropped.
//!
//! - DRA (`--kubernetes-dra`, [`super::dra`]): the GPU UUID or MIG device UUID of the claimed
//!   device's ResourceSlice, or, for a MIG device created at allocation, its parent's UUID,
//!   profile and placement: the GPU instance of that GPU with that profile at that placement.
//!
//! A MIG assignment never resolves to the whole GPU: the GPU's own series describe every instance
//! together, so they belong to no single container.

use std::collections::BTreeSet;

use crate::sample::{ContainerRef, DeviceRef, DeviceSample, PodAssignment};

use super::proto::ListPodResourcesResponse;

/// The resource name of whole GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The prefix of MIG resource names under the "mixed" strategy (`nvidia.com/mig-1g.10gb`, …).
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Which extended resources are NVIDIA devices: `nvidia.com/gpu`, every `nvidia.com/mig-*`, and
/// the names given by `--kubernetes-resource-names` (renamed or shared resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceFilter {
    extra: BTreeSet<String>,
}

impl ResourceFilter {
    /// The default resources plus `extra` names (matched exactly).
    pub fn new(extra: impl IntoIterator<Item = String>) -> ResourceFilter {
        ResourceFilter {
            extra: extra.into_iter().collect(),
        }
    }

    /// Whether devices of resource `name` are GPUs (or MIG instances) this exporter reports.
    pub fn matches(&self, name: &str) -> bool {
        name == GPU_RESOURCE || name.starts_with(MIG_RESOURCE_PREFIX) || self.extra.contains(name)
    }
}

impl DeviceRef {
    /// Classifies a device ID from the kubelet (see the module doc for the formats).
    pub fn parse(id: &str) -> DeviceRef {
        let id = id.trim();
        if id.starts_with("GPU-") {
            let uuid = id.split_once("::").map_or(id, |(uuid, _replica)| uuid);
            return DeviceRef::GpuUuid(uuid.to_owned());
        }
        if id.starts_with("MIG-") {
            let uuid = id.split_once("::").map_or(id, |(uuid, _replica)| uuid);
            return DeviceRef::MigUuid(uuid.to_owned());
        }
        let mut parts = id.split('/');
        let device = parts.next().unwrap_or_default();
        if let Some(minor) = number_after(device, "nvidia") {
            // "nvidia0/gi3" names a GPU instance; "nvidia0/vgpu1" a time-sharing replica.
            return match parts.next().and_then(|p| number_after(p, "gi")) {
                Some(gpu_instance) => DeviceRef::MinorGpuInstance {
                    minor,
                    gpu_instance,
                },
                None => DeviceRef::Minor(minor),
            };
        }
        DeviceRef::Other(id.to_owned())
    }
}

/// The decimal number after `prefix` in `s` ("nvidia12" → 12); `None` unless all of the rest are
/// digits.
fn number_after(s: &str, prefix: &str) -> Option<u32> {
    s.strip_prefix(prefix)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// The NVIDIA device assignments of a `List` response: one per (container, device), sorted, and
/// without duplicates (time-slicing replicas of one GPU given to one container collapse).
pub fn assignments(
    response: &ListPodResourcesResponse,
    filter: &ResourceFilter,
) -> Vec<PodAssignment> {
    let mut out = BTreeSet::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            let devices = container
                .devices
                .iter()
                .filter(|d| filter.matches(&d.resource_name));
            for id in devices.flat_map(|d| &d.device_ids) {
                out.insert(PodAssignment {
                    container: ContainerRef {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    },
                    device: DeviceRef::parse(id),
                    claim: String::new(),
                });
            }
        }
    }
    out.into_iter().collect()
}

/// Whether `device` is the GPU `sample` (see the module doc for the rules).
pub fn resolves_to(device: &DeviceRef, sample: &DeviceSample) -> bool {
    match device {
        DeviceRef::GpuUuid(uuid) => *uuid == sample.uuid,
        DeviceRef::Minor(minor) => sample.info.minor_number.parse::<u32>() == Ok(*minor),
        // A MIG device is one instance of the GPU, never the whole of it.
        DeviceRef::MigUuid(_)
        | DeviceRef::MinorGpuInstance { .. }
        | DeviceRef::MigPlacement { .. }
        | DeviceRef::Other(_) => false,
    }
}

/// The GPU instance id of `sample` that `device` names, if it names one of its instances.
pub fn resolves_to_instance(device: &DeviceRef, sample: &DeviceSample) -> Option<u32> {
    match device {
        DeviceRef::MigUuid(uuid) => sample
            .mig_instances
            .iter()
            .find(|i| i.compute_instances.iter().any(|c| c.uuid == *uuid))
            .map(|i| i.gpu_instance),
        DeviceRef::MinorGpuInstance {
            minor,
            gpu_instance,
        } => (sample.info.minor_number.parse::<u32>() == Ok(*minor)
            && sample
                .mig_instances
                .iter()
                .any(|i| i.gpu_instance == *gpu_instance))
        .then_some(*gpu_instance),
        DeviceRef::MigPlacement {
            parent_uuid,
            profile,
            placement_start,
        } => sample
            .mig_instances
            .iter()
            .filter(|_| *parent_uuid == sample.uuid)
            .find(|i| i.placement_start == Some(*placement_start) && i.profile == *profile)
            .map(|i| i.gpu_instance),
        DeviceRef::GpuUuid(_) | DeviceRef::Minor(_) | DeviceRef::Other(_) => None,
    }
}

/// For each of `devices` (same order), and each of its GPU instances (same order as
/// `mig_instances`), the containers the instance is assigned to, sorted and distinct. Several
/// MIG devices (compute instances) of one GPU instance given to one container are one assignment.
pub fn attribute_instances<'a>(
    assignments: &'a [PodAssignment],
    devices: &[&DeviceSample],
) -> Vec<Vec<Vec<&'a ContainerRef>>> {
    devices
        .iter()
        .map(|sample| {
            let mut per_instance = vec![Vec::new(); sample.mig_instances.len()];
            if sample.mig_instances.is_empty() {
                return per_instance;
            }
            for a in assignments {
                let Some(gi) = resolves_to_instance(&a.device, sample) else {
                    continue;
                };
                if let Some(i) = sample
                    .mig_instances
                    .iter()
                    .position(|m| m.gpu_instance == gi)
                {
                    per_instance[i].push(&a.container);
                }
            }
            for containers in &mut per_instance {
                containers.sort();
                containers.dedup();
            }
            per_instance
        })
        .collect()
}

/// The claims (DRA) through which `container` holds the GPU `sample`, or its GPU instance
/// `gpu_instance`: sorted, distinct, comma-separated; empty for a device plugin's assignment.
pub fn claims_of(
    assignments: &[PodAssignment],
    sample: &DeviceSample,
    gpu_instance: Option<u32>,
    container: &ContainerRef,
) -> String {
    let mut claims: Vec<&str> = assignments
        .iter()
        .filter(|a| a.container == *container && !a.claim.is_empty())
        .filter(|a| match gpu_instance {
            None => resolves_to(&a.device, sample),
            Some(gi) => resolves_to_instance(&a.device, sample) == Some(gi),
        })
        .map(|a| a.claim.as_str())
        .collect();
    claims.sort_unstable();
    claims.dedup();
    claims.join(",")
}

/// For each of `devices` (same order), the containers it is assigned to, sorted and distinct.
pub fn attribute<'a>(
    assignments: &'a [PodAssignment],
    devices: &[&DeviceSample],
) -> Vec<Vec<&'a ContainerRef>> {
    devices
        .iter()
        .map(|sample| {
            let mut containers: Vec<&ContainerRef> = assignments
                .iter()
                .filter(|a| resolves_to(&a.device, sample))
                .map(|a| &a.container)
                .collect();
            // A container can name one GPU twice (by UUID under one resource, by a replica ID
            // under another); it is still one assignment.
            containers.sort();
            containers.dedup();
            containers
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::proto::{ContainerDevices, ContainerResources, PodResources};
    use crate::sample::DeviceInfo;
    use std::sync::Arc;

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, resource, ids)| ContainerResources {
                    name: (*c).into(),
                    devices: vec![ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.iter().map(|s| (*s).into()).collect(),
                    }],
                    dynamic_resources: vec![],
                })
                .collect(),
        }
    }

    fn gpu(index: u32, uuid: &str, minor: &str) -> DeviceSample {
        DeviceSample {
            index,
            uuid: uuid.into(),
            info: Arc::new(DeviceInfo {
                minor_number: minor.into(),
                ..Default::default()
            }),
            up: true,
            ..Default::default()
        }
    }

    #[test]
    fn device_ids_in_every_plugin_format() {
        assert_eq!(
            DeviceRef::parse("GPU-1a2b"),
            DeviceRef::GpuUuid("GPU-1a2b".into())
        );
        assert_eq!(
            DeviceRef::parse("GPU-1a2b::3"),
            DeviceRef::GpuUuid("GPU-1a2b".into())
        );
        assert_eq!(DeviceRef::parse("nvidia0"), DeviceRef::Minor(0));
        assert_eq!(DeviceRef::parse("nvidia12"), DeviceRef::Minor(12));
        assert_eq!(DeviceRef::parse("nvidia3/vgpu1"), DeviceRef::Minor(3));
        assert_eq!(
            DeviceRef::parse("nvidia0/gi3"),
            DeviceRef::MinorGpuInstance {
                minor: 0,
                gpu_instance: 3
            }
        );
        assert_eq!(
            DeviceRef::parse("nvidia1/gi12/vgpu0"),
            DeviceRef::MinorGpuInstance {
                minor: 1,
                gpu_instance: 12
            }
        );
        assert_eq!(DeviceRef::parse("nvidia1/gix"), DeviceRef::Minor(1));
        assert_eq!(
            DeviceRef::parse("MIG-9f8e"),
            DeviceRef::MigUuid("MIG-9f8e".into())
        );
        assert_eq!(
            DeviceRef::parse("nvidia"),
            DeviceRef::Other("nvidia".into())
        );
        assert_eq!(
            DeviceRef::parse("nvidiactl"),
            DeviceRef::Other("nvidiactl".into())
        );
        assert_eq!(DeviceRef::parse("0"), DeviceRef::Other("0".into()));
    }

    #[test]
    fn only_nvidia_resources_and_the_configured_extras_count() {
        let filter = ResourceFilter::new(["example.com/shared-gpu".to_owned()]);
        assert!(filter.matches("nvidia.com/gpu"));
        assert!(filter.matches("nvidia.com/mig-1g.10gb"));
        assert!(filter.matches("example.com/shared-gpu"));
        assert!(!filter.matches("nvidia.com/gpu.shared"));
        assert!(!filter.matches("example.com/fpga"));

        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "ml",
                    "train",
                    &[("main", "nvidia.com/gpu", &["GPU-b", "GPU-a"])],
                ),
                pod("ml", "fpga", &[("main", "example.com/fpga", &["GPU-c"])]),
                pod(
                    "web",
                    "infer",
                    &[("srv", "example.com/shared-gpu", &["nvidia3"])],
                ),
                pod("idle", "nogpu", &[]),
            ],
        };
        let got = assignments(&response, &filter);
        let summary: Vec<(&str, &DeviceRef)> = got
            .iter()
            .map(|a| (a.container.pod.as_str(), &a.device))
            .collect();
        assert_eq!(
            summary,
            [
                ("train", &DeviceRef::GpuUuid("GPU-a".into())),
                ("train", &DeviceRef::GpuUuid("GPU-b".into())),
                ("infer", &DeviceRef::Minor(3)),
            ]
        );
    }

    #[test]
    fn replicas_of_one_gpu_in_one_container_are_one_assignment() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![pod(
                "ml",
                "p",
                &[("c", "nvidia.com/gpu", &["GPU-a::0", "GPU-a::1"])],
            )],
        };
        assert_eq!(assignments(&response, &ResourceFilter::default()).len(), 1);
    }

    #[test]
    fn uuids_and_minor_numbers_resolve_to_their_gpu() {
        // Minor numbers need not follow NVML indices.
        let devices = [
            gpu(0, "GPU-a", "1"),
            gpu(1, "GPU-b", "0"),
            gpu(2, "GPU-c", ""),
        ];
        let refs: Vec<&DeviceSample> = devices.iter().collect();
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ns", "by-uuid", &[("c", "nvidia.com/gpu", &["GPU-a"])]),
                pod("ns", "by-minor", &[("c", "nvidia.com/gpu", &["nvidia1"])]),
                pod("ns", "mig", &[("c", "nvidia.com/mig-1g.10gb", &["MIG-x"])]),
                pod(
                    "ns",
                    "gone",
                    &[("c", "nvidia.com/gpu", &["GPU-zzz", "nvidia7"])],
                ),
            ],
        };
        let list = assignments(&response, &ResourceFilter::default());
        let pods: Vec<Vec<&str>> = attribute(&list, &refs)
            .iter()
            .map(|cs| cs.iter().map(|c| c.pod.as_str()).collect())
            .collect();
        // GPU-a is minor 1 too, so both pods hold it: a shared GPU lists both.
        assert_eq!(pods, [vec!["by-minor", "by-uuid"], vec![], vec![]]);
    }

    fn mig_gpu(index: u32, minor: &str, instances: &[(u32, &[&str])]) -> DeviceSample {
        let mut d = gpu(index, &format!("GPU-{index}"), minor);
        d.mig_mode = Some(true);
        d.mig_instances = instances
            .iter()
            .map(|(gi, uuids)| crate::sample::MigInstanceSample {
                gpu_instance: *gi,
                profile: "1g.10gb".into(),
                compute_instances: uuids
                    .iter()
                    .enumerate()
                    .map(|(ci, u)| crate::sample::ComputeInstanceSample {
                        compute_instance: ci as u32,
                        uuid: (*u).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        d
    }

    #[test]
    fn mig_uuids_and_gke_instances_resolve_to_their_instance_not_the_gpu() {
        let devices = [
            mig_gpu(0, "4", &[(2, &["MIG-a", "MIG-b"]), (9, &["MIG-c"])]),
            mig_gpu(1, "5", &[(2, &["MIG-d"])]),
        ];
        let refs: Vec<&DeviceSample> = devices.iter().collect();
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                // Both compute instances of GI 2 in one container: one assignment.
                pod(
                    "ns",
                    "two-ci",
                    &[("c", "nvidia.com/mig-3g.40gb", &["MIG-a", "MIG-b"])],
                ),
                pod("ns", "gke", &[("c", "nvidia.com/gpu", &["nvidia5/gi2"])]),
                pod(
                    "ns",
                    "other",
                    &[("c", "nvidia.com/mig-1g.10gb", &["MIG-c"])],
                ),
                pod(
                    "ns",
                    "gone",
                    &[("c", "nvidia.com/gpu", &["MIG-zzz", "nvidia4/gi7"])],
                ),
            ],
        };
        let list = assignments(&response, &ResourceFilter::default());
        assert!(
            attribute(&list, &refs).iter().all(Vec::is_empty),
            "a MIG device is not the whole GPU"
        );
        let pods: Vec<Vec<Vec<&str>>> = attribute_instances(&list, &refs)
            .iter()
            .map(|gpu| {
                gpu.iter()
                    .map(|cs| cs.iter().map(|c| c.pod.as_str()).collect())
                    .collect()
            })
            .collect();
        assert_eq!(
            pods,
            [vec![vec!["two-ci"], vec!["other"]], vec![vec!["gke"]]]
        );
    }

    #[test]
    fn a_dra_mig_placement_is_the_instance_of_that_gpu_profile_and_placement() {
        let mut gpu = mig_gpu(0, "4", &[(2, &["MIG-a"]), (9, &["MIG-c"])]);
        gpu.uuid = "GPU-p".into();
        gpu.mig_instances[0].placement_start = Some(4);
        gpu.mig_instances[1].placement_start = Some(2);
        let at = |parent: &str, profile: &str, start: u32| DeviceRef::MigPlacement {
            parent_uuid: parent.into(),
            profile: profile.into(),
            placement_start: start,
        };
        assert_eq!(
            resolves_to_instance(&at("GPU-p", "1g.10gb", 2), &gpu),
            Some(9)
        );
        assert_eq!(
            resolves_to_instance(&at("GPU-p", "1g.10gb", 4), &gpu),
            Some(2)
        );
        assert_eq!(resolves_to_instance(&at("GPU-p", "1g.10gb", 3), &gpu), None);
        assert_eq!(resolves_to_instance(&at("GPU-p", "2g.20gb", 2), &gpu), None);
        assert_eq!(resolves_to_instance(&at("GPU-q", "1g.10gb", 2), &gpu), None);
        assert!(!resolves_to(&at("GPU-p", "1g.10gb", 2), &gpu));

        let c = ContainerRef {
            namespace: "ml".into(),
            pod: "p".into(),
            container: "c".into(),
        };
        let assignments = [
            PodAssignment {
                container: c.clone(),
                device: at("GPU-p", "1g.10gb", 2),
                claim: "small".into(),
            },
            PodAssignment {
                container: c.clone(),
                device: DeviceRef::MigUuid("MIG-c".into()),
                claim: "again".into(),
            },
        ];
        assert_eq!(claims_of(&assignments, &gpu, Some(9), &c), "again,small");
        assert_eq!(claims_of(&assignments, &gpu, Some(2), &c), "");
        assert_eq!(claims_of(&assignments, &gpu, None, &c), "");
    }
}

//! The resolve step: once per encoding, what each device is as the writers serve it.
//!
//! A [`DeviceView`] holds a device's reading with everything its series need besides the
//! reading: the `gpu` label value, the containers the kubelet assigned it to and the one whose
//! labels its series carry, its MIG GPU instances (each as a reading of its own, with its labels
//! and containers), and its processes with their containers and the per-container sums. The
//! writers ([`super::write`], [`super::dcgm`]) only walk these views; every attribution rule
//! lives here (or in the modules it calls: [`crate::kubernetes::mapping`],
//! [`crate::processes::attribution`]).
//!
//! Rules: with pod labels on, a GPU held by exactly one container carries that container's
//! `namespace`, `pod` and `container`; a GPU shared by several carries none (its power or memory
//! is no single container's), and `nvidia_gpu_pod_info` lists each. A MIG instance follows the
//! same rule with its own assignments. A process's container comes from its cgroup and the
//! kubelet's pod list, or else from the single container of its GPU (or of its MIG instance),
//! whatever the pod-labels option says.

use std::sync::Arc;

use crate::kubernetes::mapping;
use crate::processes::attribution::{GpuProcesses, Owners, summarize};
use crate::sample::{
    ContainerRef, DeviceSample, JobAssignment, MigInstanceSample, PodIdentity, Snapshot,
    WorkloadSeconds,
};

use super::MetricsOptions;
use super::catalog::IDENTITY_LABELS;
use super::text;

/// One device as its series are written.
#[derive(Debug)]
pub(crate) struct DeviceView<'a> {
    /// The reading.
    pub sample: &'a DeviceSample,
    /// The `gpu` label value.
    pub gpu: String,
    /// Its identity label pairs, `gpu="…",uuid="…"`, rendered once for all its series.
    pub identity: String,
    /// The containers the kubelet assigned the whole GPU to, sorted and distinct.
    pub containers: Vec<&'a ContainerRef>,
    /// The container whose labels every series of the GPU carries (with pod labels on and
    /// exactly one container).
    pub owner: Option<&'a ContainerRef>,
    /// Its MIG GPU instances (empty with MIG off).
    pub instances: Vec<InstanceView<'a>>,
    /// Its process series and per-container sums (empty without `--processes`).
    pub processes: GpuProcesses<'a>,
    /// The HPC jobs on the whole GPU (`--hpc-job-mapping-dir`), sorted.
    pub jobs: Vec<&'a str>,
    /// The GPU-seconds of the containers that hold the whole GPU now, by container.
    pub workloads: Vec<&'a WorkloadSeconds>,
}

/// One MIG GPU instance of a device as its series are written.
#[derive(Debug)]
pub(crate) struct InstanceView<'a> {
    /// The instance's own readings as a device reading: a family's reader then yields the
    /// instance's series for exactly the families that have a per-instance reading.
    pub sample: DeviceSample,
    /// The GPU instance id.
    pub id: u32,
    /// The `gpu_instance` label value.
    pub gpu_instance: String,
    /// The `mig_profile` label value.
    pub profile: &'a str,
    /// The containers the kubelet assigned the instance to, sorted and distinct.
    pub containers: Vec<&'a ContainerRef>,
    /// The container whose labels the instance's series carry (as for a GPU).
    pub owner: Option<&'a ContainerRef>,
    /// The HPC jobs on the instance, sorted.
    pub jobs: Vec<&'a str>,
    /// The GPU-seconds of the containers that hold the instance now, by container.
    pub workloads: Vec<&'a WorkloadSeconds>,
}

/// The views of every device of `snap`, in `gpu` index order.
pub(crate) fn resolve<'a>(snap: &'a Snapshot, opts: &MetricsOptions) -> Vec<DeviceView<'a>> {
    let mut devices: Vec<&DeviceSample> = snap.devices.iter().map(Arc::as_ref).collect();
    devices.sort_by_key(|d| d.index);
    let kubelet = snap.kubernetes.as_ref();
    let assignments = kubelet.map_or(&[][..], |k| &k.assignments[..]);
    let pods: &[PodIdentity] = kubelet.map_or(&[], |k| &k.pods);
    let jobs: &[JobAssignment] = snap.jobs.as_ref().map_or(&[], |j| &j.jobs);
    let jobs_on = |gpu: u32, gpu_instance: Option<u32>| -> Vec<&str> {
        jobs.iter()
            .filter(|j| j.gpu == gpu && j.gpu_instance == gpu_instance)
            .map(|j| j.job.as_str())
            .collect()
    };
    let workloads: &[WorkloadSeconds] = snap.workloads.as_deref().unwrap_or(&[]);
    // Only of containers that hold the device now: a republish after a pod ended drops them.
    let workloads_of = |gpu: u32, gpu_instance: Option<u32>, holders: &[&ContainerRef]| {
        workloads
            .iter()
            .filter(|w| w.gpu == gpu && w.gpu_instance == gpu_instance)
            .filter(|w| holders.contains(&&w.container))
            .collect::<Vec<_>>()
    };
    let containers = mapping::attribute(assignments, &devices);
    let instance_containers = mapping::attribute_instances(assignments, &devices);
    devices
        .into_iter()
        .zip(containers)
        .zip(instance_containers)
        .map(|((sample, containers), instance_containers)| {
            let single = only(&containers);
            let owners = Owners {
                gpu: single,
                mig_instances: &sample.mig_instances,
                instance_containers: &instance_containers,
                assigned: (opts.processes && kubelet.is_some()).then_some(&containers[..]),
            };
            let processes = summarize(&sample.processes, pods, owners, opts.max_processes_per_gpu);
            let instances = sample
                .mig_instances
                .iter()
                .zip(instance_containers.iter().cloned())
                .map(|(instance, containers)| InstanceView {
                    sample: instance_sample(sample, instance),
                    id: instance.gpu_instance,
                    gpu_instance: instance.gpu_instance.to_string(),
                    profile: &instance.profile,
                    owner: only(&containers).filter(|_| opts.pod_labels),
                    workloads: workloads_of(sample.index, Some(instance.gpu_instance), &containers),
                    containers,
                    jobs: jobs_on(sample.index, Some(instance.gpu_instance)),
                })
                .collect();
            let gpu = sample.index.to_string();
            DeviceView {
                sample,
                identity: text::pairs(
                    IDENTITY_LABELS
                        .iter()
                        .copied()
                        .zip([gpu.as_str(), &sample.uuid]),
                ),
                gpu,
                owner: single.filter(|_| opts.pod_labels),
                workloads: workloads_of(sample.index, None, &containers),
                containers,
                instances,
                processes,
                jobs: jobs_on(sample.index, None),
            }
        })
        .collect()
}

/// The only container of a list of one.
fn only<'a>(containers: &[&'a ContainerRef]) -> Option<&'a ContainerRef> {
    match containers {
        [only] => Some(*only),
        _ => None,
    }
}

/// A GPU instance of `parent` as a device reading that holds only the instance's own readings
/// (memory, GPM and the busy time integrated from it), so that no family invents a series for it from the GPU's readings.
pub(crate) fn instance_sample(parent: &DeviceSample, instance: &MigInstanceSample) -> DeviceSample {
    DeviceSample {
        index: parent.index,
        uuid: parent.uuid.clone(),
        up: true,
        memory: instance.memory,
        gpm: instance.gpm.clone(),
        busy: instance.busy,
        ..DeviceSample::default()
    }
}

/// The `namespace`, `pod` and `container` label values of a container, in that order.
pub(crate) fn container_labels(c: &ContainerRef) -> [&str; 3] {
    [&c.namespace, &c.pod, &c.container]
}

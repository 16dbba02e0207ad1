//! Which container a GPU process belongs to, and what each container uses of a GPU.
//!
//! A process's cgroup gives a pod UID and a container ID ([`super::cgroup`]); the kubelet's pod
//! list ([`KubernetesState::pods`](crate::sample::KubernetesState::pods)) names them. When the
//! pod list cannot say (empty, not asked, or the pod is not in it yet), a GPU that pod-resources
//! assigns to exactly one container lends that container to its processes — the same rule that
//! puts pod labels on per-GPU series — unless the list knows that container's pod under another
//! UID. A process whose cgroup was read and names no pod is a host
//! process and never attributed.
//!
//! MIG: pod-resources hands out GPU instances (MIG devices), so the lender is per instance: the
//! one container an instance is assigned to lends itself to the processes in that instance
//! ([`Owners`]). An instance assigned to nobody falls back to the GPU's own single owner (a
//! container given the whole GPU holds every instance on it).
//!
//! Per-pod usage is the sum over that container's processes on the GPU (on a MIG GPU, per GPU
//! instance), so two pods sharing a GPU each get their own share and never the GPU's total.

use std::collections::{BTreeMap, HashSet};

use crate::sample::{ContainerRef, MigInstanceSample, PodIdentity, ProcessSample};

/// Which single container pod-resources assigns a GPU, and each of its MIG GPU instances, to:
/// the fallback owners of their processes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Owners<'o> {
    /// The GPU's only container (a whole-GPU assignment), if exactly one.
    pub gpu: Option<&'o ContainerRef>,
    /// The GPU's MIG instances (empty without MIG) and, in the same order, the containers each
    /// is assigned to (what [`attribute_instances`](crate::kubernetes::mapping::attribute_instances)
    /// gives for the GPU).
    pub mig_instances: &'o [MigInstanceSample],
    /// The containers each of `mig_instances` is assigned to.
    pub instance_containers: &'o [Vec<&'o ContainerRef>],
    /// Every container the whole GPU is assigned to, where memory outside allocations is
    /// measured (the kubelet's assignments known and processes read); `None`: not measured.
    pub assigned: Option<&'o [&'o ContainerRef]>,
}

impl<'o> Owners<'o> {
    /// The fallback owner of a process in `gpu_instance` (`None`: MIG off): the instance's only
    /// container; for an instance assigned to nobody (or MIG off), the GPU's only container.
    pub fn of(&self, gpu_instance: Option<u32>) -> Option<&'o ContainerRef> {
        let assigned = gpu_instance
            .and_then(|gi| self.mig_instances.iter().position(|m| m.gpu_instance == gi))
            .and_then(|i| self.instance_containers.get(i))
            .filter(|containers| !containers.is_empty());
        match assigned.map(Vec::as_slice) {
            Some([only]) => Some(*only),
            // Several containers share the instance (time-sliced MIG): no guess.
            Some(_) => None,
            None => self.gpu,
        }
    }

    /// Whether `c`'s pod holds the GPU, or `gpu_instance` of it: the pod, not the container,
    /// since a container the pod list does not name yet is still its pod's.
    fn holds(
        &self,
        assigned: &[&ContainerRef],
        gpu_instance: Option<u32>,
        c: &ContainerRef,
    ) -> bool {
        let same_pod = |o: &&ContainerRef| o.namespace == c.namespace && o.pod == c.pod;
        let instance = gpu_instance
            .and_then(|gi| self.mig_instances.iter().position(|m| m.gpu_instance == gi))
            .and_then(|i| self.instance_containers.get(i));
        assigned.iter().any(same_pod) || instance.is_some_and(|cs| cs.iter().any(same_pod))
    }
}

/// The container `p` runs in, if it can be told (see the module doc for the rules).
/// `pods` is sorted by UID; `gpu_owner` is the only container pod-resources assigns the GPU (or,
/// on MIG, the process's instance) to: [`Owners::of`].
pub fn container_of(
    p: &ProcessSample,
    pods: &[PodIdentity],
    gpu_owner: Option<&ContainerRef>,
) -> Option<ContainerRef> {
    let fallback = || gpu_owner.cloned();
    let Some(cgroup) = &p.cgroup else {
        // The cgroup could not be read (no host procfs): it may well be the owner's.
        return fallback();
    };
    let Some(uid) = &cgroup.pod_uid else {
        return None;
    };
    let Ok(i) = pods.binary_search_by(|pod| pod.uid.as_str().cmp(uid)) else {
        // Not in the list: a pod newer than the list may well be the GPU's owner, but an owner
        // the list does know has another UID, so this process is someone else's (a deleted
        // pod's process still running while the GPU went to a new pod).
        let owner_listed = gpu_owner.is_some_and(|o| {
            pods.iter()
                .any(|pod| pod.namespace == o.namespace && pod.pod == o.pod)
        });
        return if owner_listed { None } else { fallback() };
    };
    let pod = &pods[i];
    // A container the list does not know yet (just restarted) still belongs to the pod.
    let container = cgroup
        .container_id
        .as_ref()
        .and_then(|id| pod.containers.iter().find(|c| c.id == *id))
        .map(|c| c.name.clone())
        .unwrap_or_default();
    Some(ContainerRef {
        namespace: pod.namespace.clone(),
        pod: pod.pod.clone(),
        container,
    })
}

/// One process as served.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedProcess<'a> {
    /// The process's reading.
    pub process: &'a ProcessSample,
    /// Its container, when it can be told.
    pub container: Option<ContainerRef>,
}

/// One container's usage of one GPU (on a MIG GPU, of one GPU instance): sums over its
/// processes there.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    /// The GPU instance its processes run in; `None` with MIG off.
    pub gpu_instance: Option<u32>,
    /// The container.
    pub container: ContainerRef,
    /// `None` when no process of the container had a memory reading.
    pub memory_used_bytes: Option<f64>,
    /// `None` when no process of the container had a utilization reading.
    pub sm_utilization: Option<f64>,
}

/// The process and pod series of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuProcesses<'a> {
    /// At most `limit` processes, the largest by memory, in pid order.
    pub processes: Vec<ServedProcess<'a>>,
    /// Every (GPU instance, container) with a process on the GPU, sorted; counts all processes,
    /// served or not.
    pub pods: Vec<PodUsage>,
    /// Device memory held by processes whose pod holds neither the GPU nor their GPU instance:
    /// host processes (a cgroup with no pod), pods that see the GPU without requesting it, and
    /// pods the pod list no longer names (an ended pod's leftovers). A process whose cgroup was
    /// not read, or whose pod is unknown for want of a pod list, is not counted. Measured only
    /// where [`Owners::assigned`] says so.
    pub outside_allocation_bytes: Option<f64>,
}

/// What one GPU serves for `processes` (one entry per pid; later duplicates are dropped).
pub fn summarize<'a>(
    processes: &'a [ProcessSample],
    pods: &[PodIdentity],
    owners: Owners<'_>,
    limit: usize,
) -> GpuProcesses<'a> {
    let mut seen = HashSet::new();
    let mut all: Vec<ServedProcess<'a>> = processes
        .iter()
        .filter(|p| seen.insert(p.pid))
        .map(|p| ServedProcess {
            process: p,
            container: container_of(p, pods, owners.of(p.gpu_instance)),
        })
        .collect();

    type Key<'k> = (Option<u32>, &'k ContainerRef);
    let mut sums: BTreeMap<Key, (Option<f64>, Option<f64>)> = BTreeMap::new();
    for s in &all {
        if let Some(c) = &s.container {
            let (memory, sm) = sums.entry((s.process.gpu_instance, c)).or_default();
            add(memory, s.process.used_memory_bytes);
            add(sm, s.process.sm_utilization);
        }
    }
    let outside_allocation_bytes = owners.assigned.map(|assigned| {
        all.iter()
            .filter(|s| match (&s.container, &s.process.cgroup) {
                (Some(c), _) => !owners.holds(assigned, s.process.gpu_instance, c),
                // Unread cgroup (no host procfs): it may well be an owner's.
                (None, None) => false,
                // No pod: a host process.
                (None, Some(cg)) if cg.pod_uid.is_none() => true,
                // A pod the list does not name (ended and gone, unless it is too new to be
                // listed; the alert's `for` outlasts that): outside when there is a list to ask.
                (None, Some(_)) => !pods.is_empty(),
            })
            .filter_map(|s| s.process.used_memory_bytes)
            // The sum of nothing is -0.0, which the exposition would write as "-0".
            .sum::<f64>()
            + 0.0
    });
    let pod_usage = sums
        .into_iter()
        .map(|((gpu_instance, c), (memory, sm))| PodUsage {
            gpu_instance,
            container: c.clone(),
            memory_used_bytes: memory,
            sm_utilization: sm,
        })
        .collect();

    // The largest by memory (a process without a reading counts as smallest), ties by pid.
    all.sort_by(|a, b| {
        let m = |s: &ServedProcess| s.process.used_memory_bytes.unwrap_or(-1.0);
        m(b).total_cmp(&m(a))
            .then(a.process.pid.cmp(&b.process.pid))
    });
    all.truncate(limit);
    all.sort_by_key(|s| s.process.pid);
    GpuProcesses {
        processes: all,
        pods: pod_usage,
        outside_allocation_bytes,
    }
}

/// Adds a reading to a sum that stays `None` until the first reading.
fn add(sum: &mut Option<f64>, value: Option<f64>) {
    if let Some(v) = value {
        *sum = Some(sum.unwrap_or(0.0) + v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{ContainerIdentity, ProcessCgroup};

    const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
    const UID_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";

    fn id(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn pods() -> Vec<PodIdentity> {
        vec![
            PodIdentity {
                uid: UID_A.into(),
                namespace: "ml".into(),
                pod: "train-0".into(),
                containers: vec![ContainerIdentity {
                    id: id('a'),
                    name: "main".into(),
                }],
            },
            PodIdentity {
                uid: UID_B.into(),
                namespace: "ml".into(),
                pod: "serve-0".into(),
                containers: vec![
                    ContainerIdentity {
                        id: id('b'),
                        name: "model".into(),
                    },
                    ContainerIdentity {
                        id: id('c'),
                        name: "sidecar".into(),
                    },
                ],
            },
        ]
    }

    fn process(
        pid: u32,
        mib: Option<u64>,
        sm: Option<f64>,
        cg: Option<(Option<&str>, Option<String>)>,
    ) -> ProcessSample {
        ProcessSample {
            pid,
            name: format!("p{pid}"),
            used_memory_bytes: mib.map(|m| (m << 20) as f64),
            sm_utilization: sm,
            cgroup: cg.map(|(uid, container)| ProcessCgroup {
                pod_uid: uid.map(str::to_owned),
                container_id: container,
            }),
            ..ProcessSample::default()
        }
    }

    fn container(ns: &str, pod: &str, c: &str) -> ContainerRef {
        ContainerRef {
            namespace: ns.into(),
            pod: pod.into(),
            container: c.into(),
        }
    }

    #[test]
    fn the_pod_list_names_pod_and_container() {
        let pods = pods();
        let p = process(1, Some(1), None, Some((Some(UID_B), Some(id('c')))));
        assert_eq!(
            container_of(&p, &pods, None),
            Some(container("ml", "serve-0", "sidecar"))
        );
        // A container ID the list does not know: the pod, with an empty container.
        let p = process(1, Some(1), None, Some((Some(UID_B), Some(id('f')))));
        assert_eq!(
            container_of(&p, &pods, None),
            Some(container("ml", "serve-0", ""))
        );
    }

    #[test]
    fn without_the_pod_a_single_owner_lends_its_labels() {
        let owner = container("ml", "train-0", "main");
        let unknown_pod = process(
            1,
            None,
            None,
            Some((Some("cccccccc-0000-4000-8000-000000000003"), None)),
        );
        assert_eq!(
            container_of(&unknown_pod, &[], Some(&owner)),
            Some(owner.clone())
        );
        // The list knows the owner under another UID: the process is not the owner's.
        assert_eq!(container_of(&unknown_pod, &pods(), Some(&owner)), None);
        // The owner is newer than the list: it lends its labels.
        let new_owner = container("ml", "train-1", "main");
        assert_eq!(
            container_of(&unknown_pod, &pods(), Some(&new_owner)),
            Some(new_owner.clone())
        );
        assert_eq!(container_of(&unknown_pod, &pods(), None), None);
        let unread = process(1, None, None, None);
        assert_eq!(
            container_of(&unread, &[], Some(&owner)),
            Some(owner.clone())
        );
        // A host process (its cgroup names no pod) is nobody's.
        let host = process(1, None, None, Some((None, None)));
        assert_eq!(container_of(&host, &[], Some(&owner)), None);
    }

    #[test]
    fn two_pods_on_one_gpu_each_get_their_own_sums() {
        let procs = vec![
            process(
                10,
                Some(1000),
                Some(0.30),
                Some((Some(UID_A), Some(id('a')))),
            ),
            process(
                11,
                Some(500),
                Some(0.10),
                Some((Some(UID_A), Some(id('a')))),
            ),
            process(
                20,
                Some(2000),
                Some(0.25),
                Some((Some(UID_B), Some(id('b')))),
            ),
            process(30, Some(64), None, Some((None, None))),
        ];
        let g = summarize(&procs, &pods(), Owners::default(), 32);
        assert_eq!(g.processes.len(), 4);
        assert_eq!(
            g.pods,
            vec![
                PodUsage {
                    gpu_instance: None,
                    container: container("ml", "serve-0", "model"),
                    memory_used_bytes: Some((2000u64 << 20) as f64),
                    sm_utilization: Some(0.25),
                },
                PodUsage {
                    gpu_instance: None,
                    container: container("ml", "train-0", "main"),
                    memory_used_bytes: Some((1500u64 << 20) as f64),
                    sm_utilization: Some(0.30 + 0.10),
                },
            ]
        );
        // The pod sums are the attributed processes' sums; the host process is in neither.
        let pod_total: f64 = g.pods.iter().filter_map(|p| p.memory_used_bytes).sum();
        let attributed: f64 = g
            .processes
            .iter()
            .filter(|s| s.container.is_some())
            .filter_map(|s| s.process.used_memory_bytes)
            .sum();
        assert_eq!(pod_total, attributed);
    }

    #[test]
    fn the_limit_keeps_the_largest_but_the_sums_count_all() {
        let procs: Vec<ProcessSample> = (1..=5)
            .map(|i| {
                process(
                    100 - i,
                    Some(u64::from(i) * 10),
                    Some(0.01),
                    Some((Some(UID_A), Some(id('a')))),
                )
            })
            .chain([process(
                50,
                None,
                Some(0.5),
                Some((Some(UID_A), Some(id('a')))),
            )])
            .collect();
        let g = summarize(&procs, &pods(), Owners::default(), 2);
        let pids: Vec<u32> = g.processes.iter().map(|s| s.process.pid).collect();
        // 95 holds 50 MiB, 96 holds 40 MiB; served in pid order.
        assert_eq!(pids, vec![95, 96]);
        assert_eq!(g.pods.len(), 1);
        assert_eq!(g.pods[0].memory_used_bytes, Some((150u64 << 20) as f64));
        assert!((g.pods[0].sm_utilization.unwrap() - 0.55).abs() < 1e-9);
    }

    /// `p` running in MIG GPU instance `gi`.
    fn in_instance(gi: u32, p: ProcessSample) -> ProcessSample {
        ProcessSample {
            gpu_instance: Some(gi),
            compute_instance: Some(0),
            ..p
        }
    }

    fn instance(gi: u32) -> MigInstanceSample {
        MigInstanceSample {
            gpu_instance: gi,
            profile: "1g.10gb".into(),
            ..MigInstanceSample::default()
        }
    }

    #[test]
    fn on_mig_each_instance_lends_its_single_owner_to_its_processes() {
        let train = container("ml", "train-1", "main");
        let (a, b) = (container("ml", "a", "c"), container("ml", "b", "c"));
        let whole = container("ml", "whole", "main");
        // GI 2 held by train-1 alone, GI 3 time-sliced by two containers, GI 9 by nobody.
        let mig = [instance(2), instance(3), instance(9)];
        let containers = [vec![&train], vec![&a, &b], vec![]];
        let owners = Owners {
            gpu: None,
            mig_instances: &mig,
            instance_containers: &containers,
            assigned: None,
        };
        let unknown = Some((Some("cccccccc-0000-4000-8000-000000000003"), None));
        let p = |gi| in_instance(gi, process(1, Some(1), None, unknown.clone()));
        assert_eq!(
            container_of(&p(2), &[], owners.of(Some(2))),
            Some(train.clone())
        );
        assert_eq!(container_of(&p(3), &[], owners.of(Some(3))), None);
        assert_eq!(container_of(&p(9), &[], owners.of(Some(9))), None);
        // An instance the snapshot does not know (it just appeared) has no owner either.
        assert_eq!(owners.of(Some(11)), None);
        // MIG off: the GPU's owner, as before.
        assert_eq!(owners.of(None), None);
        // The list knows train-1 under another UID: not its process.
        let listed = vec![PodIdentity {
            uid: UID_A.into(),
            namespace: "ml".into(),
            pod: "train-1".into(),
            containers: Vec::new(),
        }];
        assert_eq!(container_of(&p(2), &listed, owners.of(Some(2))), None);
        // A container given the whole GPU holds the instances nobody else was given.
        let owners = Owners {
            gpu: Some(&whole),
            ..owners
        };
        assert_eq!(owners.of(Some(9)), Some(&whole));
        assert_eq!(owners.of(Some(2)), Some(&train));
        assert_eq!(owners.of(Some(3)), None);
        assert_eq!(owners.of(None), Some(&whole));
    }

    #[test]
    fn memory_outside_allocations_is_what_no_holding_pod_owns() {
        let train = container("ml", "train-1", "main");
        let whole = container("ml", "whole", "main");
        let mig = [instance(2), instance(9)];
        let containers = [vec![&train], vec![]];
        let assigned = [&whole];
        let owners = Owners {
            gpu: Some(&whole),
            mig_instances: &mig,
            instance_containers: &containers,
            assigned: Some(&assigned),
        };
        // UID_A is train-0 in the pod list: a pod holding neither the GPU nor an instance.
        let stranger = Some((Some(UID_A), Some(id('a'))));
        let host = Some((None, None));
        let procs = vec![
            in_instance(2, process(10, Some(1000), None, stranger.clone())),
            process(11, Some(200), None, host),
            // An unread cgroup: unknown, not outside (the GPU's owner takes it).
            process(12, Some(30), None, None),
        ];
        let g = summarize(&procs, &pods(), owners, 32);
        assert_eq!(
            g.outside_allocation_bytes,
            Some(((1000 + 200) << 20) as f64)
        );
        // Once train-0 holds GI 2 its process there is inside; the host process stays outside.
        let train0 = container("ml", "train-0", "main");
        let containers = [vec![&train0], vec![]];
        let owners = Owners {
            instance_containers: &containers,
            ..owners
        };
        let g = summarize(&procs, &pods(), owners, 32);
        assert_eq!(g.outside_allocation_bytes, Some((200u64 << 20) as f64));
        // A pod the list does not name: a leftover when there is a list, unknown without one.
        let gone = Some((Some("dddddddd-0000-4000-8000-000000000004"), Some(id('d'))));
        let procs = vec![process(20, Some(64), None, gone)];
        let owners_gpu_only = Owners {
            gpu: None,
            ..owners
        };
        let g = summarize(&procs, &pods(), owners_gpu_only, 32);
        assert_eq!(g.outside_allocation_bytes, Some((64u64 << 20) as f64));
        let g = summarize(&procs, &[], owners_gpu_only, 32);
        assert_eq!(g.outside_allocation_bytes, Some(0.0));
        // Not measured without the kubelet's assignments.
        let g = summarize(
            &procs,
            &pods(),
            Owners {
                assigned: None,
                ..owners
            },
            32,
        );
        assert_eq!(g.outside_allocation_bytes, None);
    }

    #[test]
    fn on_mig_pod_sums_are_per_instance() {
        let train = container("ml", "train-1", "main");
        let mig = [instance(2), instance(9)];
        let containers = [vec![&train], vec![]];
        let owners = Owners {
            gpu: None,
            mig_instances: &mig,
            instance_containers: &containers,
            assigned: None,
        };
        let procs = vec![
            // train-0 (in the pod list) runs in two instances, one process each.
            in_instance(
                2,
                process(10, Some(1000), None, Some((Some(UID_A), Some(id('a'))))),
            ),
            in_instance(
                9,
                process(11, Some(200), None, Some((Some(UID_A), Some(id('a'))))),
            ),
            // Unread cgroups: GI 2's owner takes them, GI 9's processes stay nobody's.
            in_instance(2, process(12, Some(30), None, None)),
            in_instance(2, process(13, Some(5), None, None)),
            in_instance(9, process(14, Some(7), None, None)),
        ];
        let g = summarize(&procs, &pods(), owners, 32);
        let mib = |m: u64| Some((m << 20) as f64);
        let usage = |gi, container, memory_used_bytes| PodUsage {
            gpu_instance: Some(gi),
            container,
            memory_used_bytes,
            sm_utilization: None,
        };
        assert_eq!(
            g.pods,
            vec![
                usage(2, container("ml", "train-0", "main"), mib(1000)),
                usage(2, train.clone(), mib(35)),
                usage(9, container("ml", "train-0", "main"), mib(200)),
            ]
        );
        let nobodys: Vec<u32> = g
            .processes
            .iter()
            .filter(|s| s.container.is_none())
            .map(|s| s.process.pid)
            .collect();
        assert_eq!(nobodys, vec![14]);
    }

    #[test]
    fn missing_readings_stay_missing_in_the_sums() {
        let procs = vec![process(1, None, None, Some((Some(UID_A), None)))];
        let g = summarize(&procs, &pods(), Owners::default(), 32);
        assert_eq!(g.pods[0].memory_used_bytes, None);
        assert_eq!(g.pods[0].sm_utilization, None);
        // A duplicate pid is one process.
        let twice = vec![
            process(1, Some(1), None, None),
            process(1, Some(1), None, None),
        ];
        assert_eq!(
            summarize(&twice, &[], Owners::default(), 32)
                .processes
                .len(),
            1
        );
    }
}

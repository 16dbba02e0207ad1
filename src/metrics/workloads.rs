//! GPU-seconds per workload: what each device's busy time gained since the last published tick,
//! split among the containers the kubelet assigned it to (`--kubernetes`).
//!
//! The sampler integrates each device's time, idle time and SM-active time
//! ([`BusySeconds`]); this ledger only splits the gains, tick by tick, so the per-container
//! counters are exactly as exact as the device's:
//!
//! - a whole GPU counts 1, a MIG GPU instance its fraction of the GPU (compute slices over the
//!   GPU's); an instance whose fraction is unknown counts nothing;
//! - a device held by several containers is split by their own SM utilization (the per-container
//!   sums of `--processes`) when those say anything (their sum is above 0), else evenly: the
//!   shares always add up to the device;
//! - a container that no longer holds a device (its pod ended or is gone: see
//!   [`crate::kubernetes`]) loses its totals, and its series end;
//! - gains are counted from the first tick the ledger saw the device, and a device whose totals
//!   went down (a new NVML session) counts its new totals as the gain.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::processes::attribution::PodUsage;
use crate::sample::{BusySeconds, ContainerRef, Snapshot, WorkloadSeconds};

use super::MetricsOptions;
use super::resolve::resolve;

/// A device: the GPU's UUID and, for a MIG GPU instance, its id.
type Device = (String, Option<u32>);

/// The per-container totals, kept from tick to tick by the publisher.
#[derive(Debug, Default)]
pub struct WorkloadLedger {
    /// Each device's busy totals at the last tick.
    last: HashMap<Device, BusySeconds>,
    /// Each (device, container)'s totals.
    totals: BTreeMap<(Device, ContainerRef), WorkloadSeconds>,
}

/// What a device's busy totals gained.
#[derive(Debug, Clone, Copy)]
struct Gain {
    held: f64,
    idle: f64,
    sm_active: Option<f64>,
}

impl WorkloadLedger {
    /// Splits what each device of `snap` gained since the last tick among the containers holding
    /// it now, and returns every container's totals for the devices it holds.
    pub fn tick(&mut self, snap: &Snapshot, opts: &MetricsOptions) -> Arc<[WorkloadSeconds]> {
        let views = resolve(snap, opts);
        let mut last = HashMap::with_capacity(self.last.len());
        let mut held = BTreeMap::new();
        for d in &views {
            let uuid = &d.sample.uuid;
            let mut device = |gpu_instance: Option<u32>,
                              busy: &BusySeconds,
                              fraction: Option<f64>,
                              containers: &[&ContainerRef]| {
                let key = (uuid.clone(), gpu_instance);
                let gain = gain(self.last.get(&key), busy);
                last.insert(key.clone(), *busy);
                let Some(fraction) = fraction else { return };
                for (container, share) in shares(containers, &d.processes.pods, gpu_instance) {
                    let k = (key.clone(), container.clone());
                    let mut t = self.totals.remove(&k).unwrap_or_else(|| WorkloadSeconds {
                        gpu: d.sample.index,
                        gpu_instance,
                        container: container.clone(),
                        held: 0.0,
                        idle: 0.0,
                        sm_active: None,
                    });
                    let part = fraction * share;
                    t.gpu = d.sample.index;
                    t.held += gain.held * part;
                    t.idle += gain.idle * part;
                    if let Some(sm) = gain.sm_active {
                        *t.sm_active.get_or_insert(0.0) += sm * part;
                    }
                    held.insert(k, t);
                }
            };
            device(None, &d.sample.busy, Some(1.0), &d.containers);
            for (view, instance) in d.instances.iter().zip(&d.sample.mig_instances) {
                device(
                    Some(instance.gpu_instance),
                    &instance.busy,
                    instance.gpu_fraction,
                    &view.containers,
                );
            }
        }
        self.last = last;
        self.totals = held;
        self.totals.values().cloned().collect()
    }
}

/// What `now` gained over `before`: all of `now` after a reset (it went down), nothing the
/// first time a device is seen.
fn gain(before: Option<&BusySeconds>, now: &BusySeconds) -> Gain {
    let before = match before {
        Some(b) if now.sampled >= b.sampled => *b,
        Some(_) => BusySeconds::default(),
        None => *now,
    };
    Gain {
        held: now.sampled - before.sampled,
        idle: (now.idle - before.idle).max(0.0),
        sm_active: now
            .sm_active
            .map(|sm| (sm - before.sm_active.unwrap_or(0.0)).max(0.0)),
    }
}

/// Each container's share of a device: by its own SM utilization on it (`--processes`) when the
/// containers' sum is above 0, else even.
fn shares<'c>(
    containers: &[&'c ContainerRef],
    usage: &[PodUsage],
    gpu_instance: Option<u32>,
) -> Vec<(&'c ContainerRef, f64)> {
    let used = |c: &ContainerRef| -> f64 {
        usage
            .iter()
            .filter(|u| u.gpu_instance == gpu_instance && u.container == *c)
            .filter_map(|u| u.sm_utilization)
            .filter(|u| u.is_finite() && *u > 0.0)
            .fold(0.0, |sum, u| sum + u)
    };
    let used: Vec<f64> = containers.iter().map(|c| used(c)).collect();
    let total = used.iter().fold(0.0, |sum, u| sum + u);
    containers
        .iter()
        .zip(used)
        .map(|(c, u)| {
            let share = if total > 0.0 {
                u / total
            } else {
                1.0 / containers.len() as f64
            };
            (*c, share)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(pod: &str) -> ContainerRef {
        ContainerRef {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
        }
    }

    fn usage(pod: &str, gpu_instance: Option<u32>, sm: Option<f64>) -> PodUsage {
        PodUsage {
            gpu_instance,
            container: container(pod),
            memory_used_bytes: None,
            sm_utilization: sm,
        }
    }

    fn of(containers: &[&ContainerRef], usage: &[PodUsage], gi: Option<u32>) -> Vec<f64> {
        shares(containers, usage, gi)
            .into_iter()
            .map(|(_, s)| s)
            .collect()
    }

    #[test]
    fn a_shared_device_is_split_by_the_containers_own_usage() {
        let (a, b, c) = (container("a"), container("b"), container("c"));
        let held = [&a, &b, &c];
        // a uses three times what b does; c has no process.
        let u = [usage("a", None, Some(0.75)), usage("b", None, Some(0.25))];
        assert_eq!(of(&held, &u, None), [0.75, 0.25, 0.0]);
        // Usage in another instance, or none at all: even.
        assert_eq!(of(&held, &u, Some(1)), [1.0 / 3.0; 3]);
        let idle = [usage("a", None, Some(0.0)), usage("b", None, None)];
        assert_eq!(of(&held, &idle, None), [1.0 / 3.0; 3]);
        // Usage of a process outside these containers does not count.
        let other = [usage("x", None, Some(0.5))];
        assert_eq!(of(&[&a, &b], &other, None), [0.5, 0.5]);
    }
}

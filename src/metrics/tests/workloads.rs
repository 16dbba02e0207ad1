//! GPU-seconds per workload: the ledger's split of each device's busy time among the containers
//! holding it, tick by tick, and what the encoder serves of it.

use super::*;
use crate::metrics::workloads::WorkloadLedger;

/// A GPU whose sampler totals are `sampled` seconds, `idle` of them idle, `sm` SM-active.
fn gpu(index: u32, sampled: f64, idle: f64, sm: Option<f64>) -> DeviceSample {
    DeviceSample {
        busy: BusySeconds {
            sampled,
            idle,
            sm_active: sm,
            ..BusySeconds::default()
        },
        ..bare_device(index)
    }
}

/// A snapshot of `devices` with the kubelet's `assignments` (device ID, namespace, pod,
/// container).
fn tick(devices: Vec<DeviceSample>, assignments: &[(&str, &str, &str, &str)]) -> Snapshot {
    Snapshot {
        kubernetes: Some(kubelet(assignments)),
        devices: devices.into_iter().map(Arc::new).collect(),
        ..Snapshot::default()
    }
}

/// Pod, GPU instance, held, idle and SM-active GPU-seconds of one entry.
type Totals = (String, Option<u32>, f64, f64, Option<f64>);

/// The [`Totals`] of each entry.
fn totals(ws: &[WorkloadSeconds]) -> Vec<Totals> {
    ws.iter()
        .map(|w| {
            (
                w.container.pod.clone(),
                w.gpu_instance,
                w.held,
                w.idle,
                w.sm_active,
            )
        })
        .collect()
}

#[test]
fn a_container_gains_what_its_gpu_gained_while_it_held_it() {
    let opts = MetricsOptions::default();
    let mut ledger = WorkloadLedger::default();
    let held = [("GPU-0", "ml", "train", "main")];
    // The first tick the ledger sees: the GPU's past is nobody's.
    let first = ledger.tick(&tick(vec![gpu(0, 100.0, 40.0, Some(10.0))], &held), &opts);
    assert_eq!(
        totals(&first),
        [("train".into(), None, 0.0, 0.0, Some(0.0))]
    );
    let second = ledger.tick(&tick(vec![gpu(0, 101.0, 40.5, Some(10.25))], &held), &opts);
    assert_eq!(
        totals(&second),
        [("train".into(), None, 1.0, 0.5, Some(0.25))]
    );
    // Another GPU held by nobody adds to nobody.
    let third = ledger.tick(
        &tick(
            vec![gpu(0, 102.0, 40.5, Some(11.25)), gpu(1, 5.0, 5.0, None)],
            &held,
        ),
        &opts,
    );
    assert_eq!(
        totals(&third),
        [("train".into(), None, 2.0, 0.5, Some(1.25))]
    );
}

#[test]
fn a_shared_gpu_is_split_evenly_without_process_usage() {
    let opts = MetricsOptions::default();
    let mut ledger = WorkloadLedger::default();
    let shared = [("GPU-0", "ml", "a", "c"), ("GPU-0", "ml", "b", "c")];
    ledger.tick(&tick(vec![gpu(0, 0.0, 0.0, None)], &shared), &opts);
    let t = ledger.tick(&tick(vec![gpu(0, 4.0, 2.0, None)], &shared), &opts);
    assert_eq!(
        totals(&t),
        [
            ("a".into(), None, 2.0, 1.0, None),
            ("b".into(), None, 2.0, 1.0, None)
        ]
    );
}

#[test]
fn a_mig_instance_counts_as_its_fraction_of_the_gpu() {
    let opts = MetricsOptions::default();
    let mut ledger = WorkloadLedger::default();
    let instance = |sampled: f64, sm: f64| {
        let mut d = bare_device(0);
        d.mig_mode = Some(true);
        d.mig_instances = vec![MigInstanceSample {
            gpu_instance: 2,
            profile: "3g.40gb".into(),
            compute_instances: vec![ComputeInstanceSample {
                compute_instance: 0,
                uuid: "MIG-a".into(),
            }],
            busy: BusySeconds {
                sampled,
                sm_active: Some(sm),
                ..BusySeconds::default()
            },
            gpu_fraction: Some(3.0 / 7.0),
            ..MigInstanceSample::default()
        }];
        d
    };
    let held = [("MIG-a", "ml", "mig", "main")];
    ledger.tick(&tick(vec![instance(0.0, 0.0)], &held), &opts);
    let t = ledger.tick(&tick(vec![instance(7.0, 3.5)], &held), &opts);
    assert_eq!(totals(&t), [("mig".into(), Some(2), 3.0, 0.0, Some(1.5))]);
}

#[test]
fn a_container_that_lets_go_loses_its_totals_and_its_series() {
    let opts = MetricsOptions::default();
    let mut ledger = WorkloadLedger::default();
    let held = [("GPU-0", "ml", "train", "main")];
    ledger.tick(&tick(vec![gpu(0, 0.0, 0.0, None)], &held), &opts);
    let t = ledger.tick(&tick(vec![gpu(0, 5.0, 5.0, None)], &held), &opts);
    assert_eq!(totals(&t), [("train".into(), None, 5.0, 5.0, None)]);
    let snap = tick(vec![gpu(0, 5.0, 5.0, None)], &held);
    let snap = Snapshot {
        workloads: Some(t),
        ..snap
    };
    assert!(encode(&snap).contains(
        "nvidia_gpu_pod_idle_gpu_seconds_total{gpu=\"0\",uuid=\"GPU-0\",namespace=\"ml\",pod=\"train\",container=\"main\"} 5\n"
    ));
    // The pod ended: a republish with the new assignments drops its series at once, and the
    // ledger its totals at the next tick.
    let gone = Snapshot {
        kubernetes: Some(kubelet(&[])),
        ..snap
    };
    assert!(!encode(&gone).contains("nvidia_gpu_pod_"));
    assert!(
        ledger
            .tick(&tick(vec![gpu(0, 6.0, 6.0, None)], &[]), &opts)
            .is_empty()
    );
    // Held again: from 0.
    let t = ledger.tick(&tick(vec![gpu(0, 7.0, 7.0, None)], &held), &opts);
    assert_eq!(totals(&t), [("train".into(), None, 1.0, 1.0, None)]);
}

#[test]
fn after_a_new_nvml_session_the_new_totals_are_the_gain() {
    let opts = MetricsOptions::default();
    let mut ledger = WorkloadLedger::default();
    let held = [("GPU-0", "ml", "train", "main")];
    ledger.tick(&tick(vec![gpu(0, 0.0, 0.0, None)], &held), &opts);
    ledger.tick(&tick(vec![gpu(0, 100.0, 10.0, None)], &held), &opts);
    // The driver restarted: the sampler's totals begin again.
    let t = ledger.tick(&tick(vec![gpu(0, 2.0, 1.0, None)], &held), &opts);
    assert_eq!(totals(&t), [("train".into(), None, 102.0, 11.0, None)]);
}

//! Encoder tests on hand-built snapshots, by concern: what a user reading `/metrics` would
//! check. The fixtures below are shared by every file.

mod catalog;
mod dcgm_compat;
mod device;
mod gpm;
mod jobs;
mod kubernetes;
mod mig;
mod processes;
mod self_metrics;
mod workloads;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::catalog::{CATALOG, MetricKind, Source};
use super::*;
use crate::sample::*;

/// A device with every reading present, values chosen to be recognisable (also the node page's
/// tests' device with every field).
pub(crate) fn full_device(index: u32) -> DeviceSample {
    DeviceSample {
        index,
        uuid: format!("GPU-{index}"),
        info: Arc::new(DeviceInfo {
            name: "NVIDIA H100 80GB HBM3".into(),
            brand: "nvidia".into(),
            architecture: "hopper".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            serial: "1650000000001".into(),
            vbios_version: "96.00.99.00.01".into(),
            compute_capability: "9.0".into(),
            minor_number: index.to_string(),
        }),
        up: true,
        stale: false,
        lost: None,
        utilization: Some(0.75),
        memory_utilization: Some(0.5),
        encoder_utilization: Some(0.0),
        decoder_utilization: Some(0.25),
        memory: Some(MemoryInfo {
            total_bytes: 85_520_809_984.0,
            used_bytes: 1_048_576.0,
            free_bytes: 84_000_000_000.0,
            reserved_bytes: 519_045_120.0,
        }),
        bar1_memory: Some(Bar1MemoryInfo {
            total_bytes: 137_438_953_472.0,
            used_bytes: 2_097_152.0,
        }),
        power_watts: Some(312.5),
        power_limit_watts: Some(650.0),
        power_management_limit_watts: Some(700.0),
        energy_joules: Some(123_456.789),
        temperature_celsius: Some(61.0),
        memory_temperature_celsius: Some(70.0),
        temperature_thresholds: vec![
            (TemperatureThreshold::Shutdown, 92.0),
            (TemperatureThreshold::Slowdown, 87.0),
        ],
        fan_speeds: vec![(1, 0.4), (0, 0.3)],
        clocks_hertz: vec![
            (ClockDomain::Memory, 2_619_000_000.0),
            (ClockDomain::Graphics, 1_980_000_000.0),
        ],
        max_clocks_hertz: vec![(ClockDomain::Graphics, 1_980_000_000.0)],
        performance_state: Some(0),
        clock_events: vec![
            (ClockEventReason::GpuIdle, false),
            (ClockEventReason::SwPowerCap, true),
        ],
        throttle_seconds: vec![(ThrottleReason::Power, 1.5)],
        pcie: PcieSample {
            transmit_bytes_per_second: Some(1_024_000.0),
            receive_bytes_per_second: Some(2_048_000.0),
            replay_errors: Some(3),
            link_generation_current: Some(5),
            link_generation_max: Some(5),
            link_width_current: Some(16),
            link_width_max: Some(16),
        },
        ecc_volatile: Some(EccCounts {
            corrected: 7,
            uncorrected: 0,
        }),
        ecc_aggregate: Some(EccCounts {
            corrected: 9,
            uncorrected: 1,
        }),
        remapped_rows: Some(RemappedRows {
            correctable: 2,
            uncorrectable: 0,
            pending: true,
            failed: false,
        }),
        retired_pages: Some(RetiredPages {
            single_bit_ecc: 4,
            double_bit_ecc: 0,
            pending: Some(false),
        }),
        unrepairable_memory: Some(false),
        sram_threshold_exceeded: Some(false),
        recovery_action: Some(0),
        xid_counts: BTreeMap::from([(79, 1), (13, 2)]),
        last_xid_timestamp_seconds: Some(1_700_000_030.0),
        last_xid: Some(13),
        xids_watched: true,
        nvlinks: vec![
            NvLinkSample {
                link: 1,
                up: Some(false),
                transmit_bytes: None,
                receive_bytes: None,
                errors: NvLinkErrors::default(),
            },
            NvLinkSample {
                link: 0,
                up: Some(true),
                transmit_bytes: Some(1 << 40),
                receive_bytes: Some(1 << 30),
                errors: [(NvLinkErrorType::Replay, 5), (NvLinkErrorType::CrcFlit, 1)]
                    .into_iter()
                    .collect(),
            },
        ],
        mig_mode: Some(false),
        fabric: Some(FabricSample {
            state: FabricState::Completed,
            status: Some("success"),
            clique_id: 7,
            cluster_uuid: "8b2f4c1e-6a0d-4e59-9c3b-715e2a84d016".into(),
            conditions: vec![
                (FabricCondition::DegradedBandwidth, true),
                (FabricCondition::RouteUnhealthy, false),
            ],
            configuration: Some(FabricConfiguration::Correct),
            summary: Some(FabricSummary::LimitedCapacity),
        }),
        gpm_supported: Some(true),
        gpm: Some(full_gpm()),
        // Cgroups unread: the processes go to the GPU's single owner, if it has one.
        processes: vec![
            ProcessSample {
                pid: 4242,
                name: "python3".into(),
                used_memory_bytes: Some(8_589_934_592.0),
                sm_utilization: Some(0.37),
                cgroup: None,
                ..ProcessSample::default()
            },
            ProcessSample {
                pid: 17,
                name: "Xorg".into(),
                used_memory_bytes: None,
                sm_utilization: Some(0.0),
                cgroup: None,
                ..ProcessSample::default()
            },
        ],
        // MIG off: no instances.
        mig_instances: Vec::new(),
        busy: full_busy(),
        health: Some(Health {
            state: HealthState::Failed,
            reasons: vec![HealthReason {
                reason: "xid_79",
                action: HealthAction::RebootNode,
                state: HealthState::Failed,
            }],
        }),
    }
}

/// Busy-time totals with every counter present.
fn full_busy() -> BusySeconds {
    BusySeconds {
        utilization: Some(3600.5),
        sm_active: Some(1800.25),
        sm_occupancy: Some(900.125),
        tensor_active: Some(450.0),
        dram_active: Some(225.5),
        sampled: 7200.0,
        idle: 3600.0,
    }
}

/// [`full_device`] in MIG mode with two GPU instances (every per-instance reading present on
/// GI 1, two compute instances on GI 5), so that every family has a series.
fn full_mig_device(index: u32) -> DeviceSample {
    let mut d = full_device(index);
    d.mig_mode = Some(true);
    let memory = |total: f64, used: f64| MemoryInfo {
        total_bytes: total,
        used_bytes: used,
        free_bytes: total - used,
        reserved_bytes: 0.0,
    };
    let ci = |compute_instance: u32, gi: u32| ComputeInstanceSample {
        compute_instance,
        uuid: format!("MIG-{index}-{gi}-{compute_instance}"),
    };
    d.mig_instances = vec![
        MigInstanceSample {
            gpu_instance: 1,
            profile: "4g.40gb".into(),
            placement_start: None,
            memory: Some(memory(42_412_802_048.0, 1_073_741_824.0)),
            gpm: Some(full_gpm()),
            compute_instances: vec![ci(0, 1)],
            busy: BusySeconds {
                utilization: None,
                ..full_busy()
            },
            gpu_fraction: Some(4.0 / 7.0),
        },
        MigInstanceSample {
            gpu_instance: 5,
            profile: "2g.20gb".into(),
            placement_start: None,
            memory: Some(memory(21_072_183_296.0, 0.0)),
            gpm: None,
            compute_instances: vec![ci(0, 5), ci(1, 5)],
            busy: BusySeconds::default(),
            gpu_fraction: None,
        },
    ];
    d
}

/// GPM averages with every metric present; pipes and engines deliberately out of order.
fn full_gpm() -> GpmMetrics {
    GpmMetrics {
        graphics_engine_active: Some(0.99),
        sm_active: Some(0.15),
        sm_occupancy: Some(0.08),
        tensor_active: Some(0.05),
        dram_active: Some(0.2),
        pipes: vec![
            (GpmPipe::HmmaTensor, 0.05),
            (GpmPipe::Fp32, 0.1),
            (GpmPipe::Fp64, 0.0),
        ],
        pcie_transmit_bytes_per_second: Some(3_145_728.0),
        pcie_receive_bytes_per_second: Some(1_048_576.0),
        nvlink_transmit_bytes_per_second: Some(0.0),
        nvlink_receive_bytes_per_second: Some(524_288.0),
        media_engines: vec![(MediaEngine::Nvofa0, 0.0), (MediaEngine::Nvdec1, 0.5)],
    }
}

/// Families that come from GPM averages, in catalog order: those a device holding only
/// [`full_gpm`] serves beyond what a device with no readings serves.
fn gpm_families() -> Vec<&'static str> {
    let mut gpm_only = bare_device(0);
    gpm_only.gpm = Some(full_gpm());
    let with = encode(&snapshot(vec![gpm_only]));
    let without = encode(&snapshot(vec![bare_device(0)]));
    let (with, without) = (families_of_gpu(&with, 0), families_of_gpu(&without, 0));
    CATALOG
        .iter()
        .map(|d| d.name)
        .filter(|n| with.contains(n) && !without.contains(n))
        .collect()
}

/// A device with nothing readable beyond its identity.
fn bare_device(index: u32) -> DeviceSample {
    DeviceSample {
        index,
        uuid: format!("GPU-{index}"),
        up: true,
        ..Default::default()
    }
}

fn snapshot(devices: Vec<DeviceSample>) -> Snapshot {
    Snapshot {
        nvml_up: true,
        nvml_error: None,
        system: SystemInfo {
            driver_version: "550.54.15".into(),
            nvml_version: "12.550.54.15".into(),
            cuda_driver_version: "12.4".into(),
        },
        devices: devices.into_iter().map(Arc::new).collect(),
        nvml_errors: BTreeMap::from([(
            (
                "nvmlDeviceGetPowerUsage".to_owned(),
                "GPU_IS_LOST".to_owned(),
            ),
            2,
        )]),
        tick_duration_seconds: Some(0.012),
        last_tick_timestamp_seconds: Some(1_700_000_000.5),
        // By minor number: a full device is assigned, a bare one (no minor number) is not.
        kubernetes: Some(kubelet(&[("nvidia0", "ml", "train-0", "main")])),
        // On MIG GPU instance 1, which only a full device has.
        jobs: Some(jobs(&[(0, Some(1), "4242")])),
        health_state: Some(HealthStateErrors { read: 0, write: 2 }),
        // The assigned GPU's container, and one that no longer holds a GPU (not served).
        workloads: Some(Arc::from([
            WorkloadSeconds {
                gpu: 0,
                gpu_instance: None,
                container: ContainerRef {
                    namespace: "ml".into(),
                    pod: "train-0".into(),
                    container: "main".into(),
                },
                held: 120.0,
                idle: 30.5,
                sm_active: Some(45.25),
            },
            WorkloadSeconds {
                gpu: 0,
                gpu_instance: None,
                container: ContainerRef {
                    namespace: "ml".into(),
                    pod: "ended".into(),
                    container: "main".into(),
                },
                held: 60.0,
                idle: 60.0,
                sm_active: Some(0.0),
            },
        ])),
        // One GPU the PCI bus lists that NVML does not.
        missing_gpus: Some(vec![PciGpu {
            address: "0000:ca:00.0".into(),
            device_id: "0x2330".into(),
            driver: "nvidia".into(),
        }]),
        node_health: Some(crate::health::node_verdict(&[PciGpu::default()])),
    }
}

/// A job mapping that says these (GPU, GPU instance, job ID), after one malformed file.
fn jobs(jobs: &[(u32, Option<u32>, &str)]) -> JobsState {
    let mut list: Vec<JobAssignment> = jobs
        .iter()
        .map(|(gpu, gpu_instance, job)| JobAssignment {
            gpu: *gpu,
            gpu_instance: *gpu_instance,
            job: (*job).into(),
        })
        .collect();
    list.sort();
    JobsState {
        jobs: list.into(),
        errors: JobsError::ALL
            .iter()
            .map(|r| (*r, u64::from(*r == JobsError::Malformed)))
            .collect(),
    }
}

/// A kubelet state that answered with these (device ID, namespace, pod, container) assignments,
/// after one timeout.
fn kubelet(assignments: &[(&str, &str, &str, &str)]) -> KubernetesState {
    let mut list: Vec<PodAssignment> = assignments
        .iter()
        .map(|(id, ns, pod, container)| PodAssignment {
            container: ContainerRef {
                namespace: (*ns).into(),
                pod: (*pod).into(),
                container: (*container).into(),
            },
            device: DeviceRef::parse(id),
            claim: String::new(),
        })
        .collect();
    list.sort();
    let mut state = KubernetesState::new();
    state.up = true;
    state.errors.insert(KubeletError::Timeout, 1);
    state.assignments = list.into();
    state
}

/// The exposition of `snap` as published after one tick, with the default options.
fn encode(snap: &Snapshot) -> String {
    encode_with(MetricsOptions::default(), snap)
}

/// The exposition of `snap` as published after one tick (the tick counted, then encoded), with
/// the exporter's own metrics that the other parts keep registered as `lib.rs` wires them (the
/// OTLP push's too, as with `--otlp-endpoint`).
fn encode_with(opts: MetricsOptions, snap: &Snapshot) -> String {
    let registry = crate::SelfMetrics::new().registry;
    crate::otlp::PushMetrics::new(&registry);
    let encoder = Encoder::new(opts, registry);
    if let Some(seconds) = snap.tick_duration_seconds {
        encoder.observe_tick(seconds);
    }
    String::from_utf8(encoder.encode(snap)).expect("utf-8 exposition")
}

/// Sample lines (no comments).
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

/// The value of the exact series `name{labels}`, if served.
fn value(text: &str, series_id: &str) -> Option<f64> {
    series(text).into_iter().find_map(|l| {
        let (id, v) = l.rsplit_once(' ')?;
        (id == series_id).then(|| v.parse().expect("numeric value"))
    })
}

/// Family names in `# TYPE` order.
fn families(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect()
}

/// Names of the families that have a series for GPU `gpu`.
fn families_of_gpu(text: &str, gpu: u32) -> Vec<&str> {
    let tag = format!("{{gpu=\"{gpu}\",");
    let mut names: Vec<&str> = series(text)
        .into_iter()
        .filter(|l| l.contains(&tag))
        .map(|l| l.split('{').next().unwrap())
        .collect();
    names.dedup();
    names
}

/// A process of `pid` holding `mib` MiB at `sm` utilization, whose cgroup names `pod_uid` and
/// the container `container_id` (`None`: a host process).
fn process(pid: u32, mib: u64, sm: f64, ids: Option<(&str, char)>) -> ProcessSample {
    ProcessSample {
        pid,
        name: format!("proc{pid}"),
        used_memory_bytes: Some((mib << 20) as f64),
        sm_utilization: Some(sm),
        cgroup: Some(ProcessCgroup {
            pod_uid: ids.map(|(uid, _)| uid.to_owned()),
            container_id: ids.map(|(_, c)| c.to_string().repeat(64)),
        }),
        ..ProcessSample::default()
    }
}

const UID_A: &str = "aaaaaaaa-1111-4111-8111-111111111111";

const UID_B: &str = "bbbbbbbb-2222-4222-8222-222222222222";

/// GPU 0 time-sliced by two pods (the kubelet lists both on it) plus a host process, with the
/// kubelet's pod list filled; its used memory is the processes' sum, as the simulator models it.
fn shared_gpu_snapshot() -> Snapshot {
    let mut d = full_device(0);
    d.processes = vec![
        process(300, 20480, 0.3, Some((UID_A, 'a'))),
        process(301, 4096, 0.05, Some((UID_A, 'a'))),
        process(400, 12288, 0.2, Some((UID_B, 'b'))),
        process(900, 1024, 0.0, None),
    ];
    let held: u64 = (20480 + 4096 + 12288 + 1024) << 20;
    d.memory.as_mut().unwrap().used_bytes = held as f64;
    let mut snap = snapshot(vec![d]);
    let mut k = kubelet(&[
        ("nvidia0", "ml", "train-a", "main"),
        ("nvidia0", "web", "infer-b", "server"),
    ]);
    let pod = |uid: &str, ns: &str, pod: &str, c: char, name: &str| PodIdentity {
        uid: uid.into(),
        namespace: ns.into(),
        pod: pod.into(),
        containers: vec![ContainerIdentity {
            id: c.to_string().repeat(64),
            name: name.into(),
        }],
    };
    k.pods = vec![
        pod(UID_A, "ml", "train-a", 'a', "main"),
        pod(UID_B, "web", "infer-b", 'b', "server"),
    ]
    .into();
    snap.kubernetes = Some(k);
    snap
}

/// The text without the process collector's families and the time the encoder was made, whose
/// values move between two reads.
fn without_process(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !(l.starts_with("process_")
                || l.starts_with("# HELP process_")
                || l.starts_with("# TYPE process_")
                || l.starts_with(super::catalog::CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

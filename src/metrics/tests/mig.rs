//! MIG: per-instance series next to the GPU's, their labels, pod attribution and compat labels.

use super::*;

/// GPU 0 in MIG mode with GI 2 (3g.40gb, busy, two compute instances) and GI 9 (1g.10gb,
/// idle, no GPM window yet).
fn mig_device() -> DeviceSample {
    let mut d = bare_device(0);
    Arc::make_mut(&mut d.info).minor_number = "0".into();
    d.mig_mode = Some(true);
    d.memory = Some(MemoryInfo {
        total_bytes: 85_899_345_920.0,
        used_bytes: 3.0e9,
        free_bytes: 82_899_345_920.0,
        reserved_bytes: 0.0,
    });
    d.mig_instances = vec![
        MigInstanceSample {
            gpu_instance: 2,
            profile: "3g.40gb".into(),
            placement_start: None,
            memory: Some(MemoryInfo {
                total_bytes: 42_412_802_048.0,
                used_bytes: 2.0e9,
                free_bytes: 40_412_802_048.0,
                reserved_bytes: 0.0,
            }),
            gpm: Some(GpmMetrics {
                sm_active: Some(0.85),
                ..GpmMetrics::default()
            }),
            compute_instances: vec![
                ComputeInstanceSample {
                    compute_instance: 0,
                    uuid: "MIG-a".into(),
                },
                ComputeInstanceSample {
                    compute_instance: 1,
                    uuid: "MIG-b".into(),
                },
            ],
            busy: BusySeconds::default(),
            gpu_fraction: None,
        },
        MigInstanceSample {
            gpu_instance: 9,
            profile: "1g.10gb".into(),
            placement_start: None,
            memory: Some(MemoryInfo {
                total_bytes: 10_468_982_784.0,
                used_bytes: 1.0e9,
                free_bytes: 9_468_982_784.0,
                reserved_bytes: 0.0,
            }),
            gpm: None,
            compute_instances: vec![ComputeInstanceSample {
                compute_instance: 0,
                uuid: "MIG-c".into(),
            }],
            busy: BusySeconds::default(),
            gpu_fraction: None,
        },
    ];
    d
}

fn mig_snapshot(assignments: &[(&str, &str, &str, &str)]) -> Snapshot {
    let mut snap = snapshot(vec![mig_device(), bare_device(1)]);
    snap.kubernetes = Some(kubelet(assignments));
    snap
}

#[test]
fn no_device_family_reads_anything_from_an_empty_sample() {
    // Instance series come from a sample holding only the instance's readings: a family
    // that served something for an empty sample would invent a series for every instance.
    let empty = bare_device(0);
    let mut out = samples::Samples::default();
    for def in CATALOG {
        if let Source::Device(read) = def.source {
            out.clear();
            read(&SystemInfo::default(), &empty, &mut out);
            assert_eq!(out.iter().count(), 0, "{} reads an empty sample", def.name);
        }
    }
}

#[test]
fn instances_serve_memory_and_gpm_next_to_the_gpu_with_their_labels() {
    let text = encode(&mig_snapshot(&[]));
    let gpu = r#"gpu="0",uuid="GPU-0""#;
    assert_eq!(
        value(&text, &format!("nvidia_gpu_memory_total_bytes{{{gpu}}}")),
        Some(85_899_345_920.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_memory_total_bytes{{{gpu},gpu_instance="2",mig_profile="3g.40gb"}}"#
            )
        ),
        Some(42_412_802_048.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_memory_used_bytes{{{gpu},gpu_instance="9",mig_profile="1g.10gb"}}"#
            )
        ),
        Some(1.0e9)
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_sm_active_ratio{{{gpu},gpu_instance="2",mig_profile="3g.40gb"}}"#
            )
        ),
        Some(0.85)
    );
    // GI 9 has no GPM window: absent, not 0; and no family the instance cannot read.
    let gi9: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.contains(r#"gpu_instance="9""#))
        .map(|l| l.split('{').next().unwrap())
        .collect();
    assert_eq!(
        gi9,
        [
            "nvidia_gpu_memory_total_bytes",
            "nvidia_gpu_memory_used_bytes",
            "nvidia_gpu_memory_free_bytes",
            "nvidia_gpu_memory_reserved_bytes",
            "nvidia_gpu_mig_instance_info",
        ]
    );
    // One info series per compute instance.
    for (gi, profile, mig, ci) in [
        ("2", "3g.40gb", "MIG-a", "0"),
        ("2", "3g.40gb", "MIG-b", "1"),
        ("9", "1g.10gb", "MIG-c", "0"),
    ] {
        let id = format!(
            r#"nvidia_gpu_mig_instance_info{{{gpu},gpu_instance="{gi}",mig_profile="{profile}",mig_uuid="{mig}",compute_instance="{ci}"}}"#
        );
        assert_eq!(value(&text, &id), Some(1.0), "{id}");
    }
    // A family's instance series follow the GPU's, before the next GPU's.
    let lines = series(&text);
    let pos = |needle: &str| lines.iter().position(|l| l.starts_with(needle)).unwrap();
    assert!(
        pos(&format!("nvidia_gpu_memory_total_bytes{{{gpu}}}"))
            < pos(&format!(
                r#"nvidia_gpu_memory_total_bytes{{{gpu},gpu_instance="2""#
            ))
    );
    // The GPU without MIG has no instance labels anywhere.
    assert!(
        lines
            .iter()
            .filter(|l| l.contains(r#"gpu="1""#))
            .all(|l| !l.contains("gpu_instance"))
    );
}

#[test]
fn an_instance_held_by_one_container_carries_its_labels_and_pod_info() {
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &mig_snapshot(&[
            ("MIG-b", "ml", "train", "main"),
            ("nvidia0/gi9", "web", "notebook", "kernel"),
        ]),
    );
    let gpu = r#"gpu="0",uuid="GPU-0""#;
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_pod_info{{{gpu},gpu_instance="2",mig_profile="3g.40gb",namespace="ml",pod="train",container="main"}}"#
            )
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_memory_used_bytes{{{gpu},gpu_instance="9",mig_profile="1g.10gb",namespace="web",pod="notebook",container="kernel"}}"#
            )
        ),
        Some(1.0e9)
    );
    // The GPU itself belongs to no single container.
    assert_eq!(
        value(&text, &format!("nvidia_gpu_memory_used_bytes{{{gpu}}}")),
        Some(3.0e9)
    );
}

#[test]
fn dcgm_compat_puts_the_instance_labels_after_model_name() {
    let text = encode_with(
        MetricsOptions {
            dcgm_compat: DcgmCompat::Dcgm,
            hostname: "node-1".into(),
            ..MetricsOptions::default()
        },
        &mig_snapshot(&[]),
    );
    let fb: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains(r#"gpu="0""#))
        .collect();
    assert_eq!(
        fb,
        [
            r#"DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",pci_bus_id="",device="nvidia0",modelName="",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 2861"#,
            r#"DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",pci_bus_id="",device="nvidia0",modelName="",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 1907"#,
            r#"DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",pci_bus_id="",device="nvidia0",modelName="",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 953"#,
        ]
    );
    assert!(text.contains(
        r#"DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-0",pci_bus_id="",device="nvidia0",modelName="",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0.85"#
    ));
}

/// A process of `pid` in GPU instance `gi` (`None`: MIG off) holding `mib` MiB, its cgroup
/// unread; no utilization, as on MIG.
fn mig_process(pid: u32, gi: Option<u32>, mib: u64) -> ProcessSample {
    ProcessSample {
        pid,
        name: format!("p{pid}"),
        used_memory_bytes: Some((mib << 20) as f64),
        gpu_instance: gi,
        compute_instance: gi.map(|_| 0),
        ..ProcessSample::default()
    }
}

#[test]
fn processes_carry_their_instance_and_its_single_owner_and_pods_sum_per_instance() {
    // GI 2 held by train alone (by the UUID of one of its MIG devices), GI 9 time-sliced.
    let mut snap = mig_snapshot(&[
        ("MIG-b", "ml", "train", "main"),
        ("MIG-c::0", "ml", "x", "c"),
        ("MIG-c::1", "ml", "y", "c"),
    ]);
    Arc::make_mut(&mut snap.devices[0]).processes = vec![
        mig_process(10, Some(2), 1000),
        mig_process(11, Some(2), 24),
        mig_process(12, Some(9), 512),
        // An instance the snapshot does not hold (created after it was read).
        mig_process(13, Some(4), 1),
    ];
    Arc::make_mut(&mut snap.devices[1]).processes = vec![mig_process(20, None, 64)];
    let text = encode(&snap);
    let gpu0 = r#"gpu="0",uuid="GPU-0""#;
    let gi2 = r#"gpu_instance="2",mig_profile="3g.40gb""#;
    let train = r#"namespace="ml",pod="train",container="main""#;
    let memory = |labels: String| value(&text, &format!("nvidia_gpu_{labels}"));
    assert_eq!(
        memory(format!(
            r#"process_memory_used_bytes{{{gpu0},pid="10",process_name="p10",{gi2},{train}}}"#
        )),
        Some(1000.0 * 1048576.0)
    );
    assert_eq!(
        memory(format!(
            r#"process_memory_used_bytes{{{gpu0},pid="12",process_name="p12",gpu_instance="9",mig_profile="1g.10gb"}}"#
        )),
        Some(512.0 * 1048576.0)
    );
    assert_eq!(
        memory(format!(
            r#"process_memory_used_bytes{{{gpu0},pid="13",process_name="p13",gpu_instance="4",mig_profile=""}}"#
        )),
        Some(1048576.0)
    );
    // MIG off: today's labels exactly.
    assert_eq!(
        memory(
            r#"process_memory_used_bytes{gpu="1",uuid="GPU-1",pid="20",process_name="p20"}"#.into()
        ),
        Some(64.0 * 1048576.0)
    );
    // The pod sum is per instance and counts the instance's processes only.
    let pods: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pod_memory_used_bytes{"))
        .collect();
    assert_eq!(
        pods,
        [format!(
            "nvidia_gpu_pod_memory_used_bytes{{{gpu0},{gi2},{train}}} {}",
            1024.0 * 1048576.0
        )]
    );
    // No utilization on MIG: absent, not 0.
    assert!(
        !text.contains("nvidia_gpu_process_sm_utilization_ratio{"),
        "{text}"
    );
    assert!(
        !text.contains("nvidia_gpu_pod_sm_utilization_ratio{"),
        "{text}"
    );
}

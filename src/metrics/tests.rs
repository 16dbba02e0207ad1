//! Encoder tests on hand-built snapshots: what a user reading `/metrics` would check.

use std::collections::BTreeMap;
use std::io::Read;

use super::catalog::{CATALOG, MetricKind, POD_LABELS, Source};
use super::*;
use crate::sample::*;

/// A device with every reading present, values chosen to be recognisable.
fn full_device(index: u32) -> DeviceSample {
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
        power_limit_watts: Some(700.0),
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
        }),
        xid_counts: BTreeMap::from([(79, 1), (13, 2)]),
        last_xid_timestamp_seconds: Some(1_700_000_030.0),
        last_xid: Some(13),
        nvlinks: vec![
            NvLinkSample {
                link: 1,
                up: false,
                transmit_bytes: None,
                receive_bytes: None,
                errors: NvLinkErrors::default(),
            },
            NvLinkSample {
                link: 0,
                up: true,
                transmit_bytes: Some(1 << 40),
                receive_bytes: Some(1 << 30),
                errors: [(NvLinkErrorType::Replay, 5), (NvLinkErrorType::CrcFlit, 1)]
                    .into_iter()
                    .collect(),
            },
        ],
        mig_mode: Some(false),
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
            memory: Some(memory(42_412_802_048.0, 1_073_741_824.0)),
            gpm: Some(full_gpm()),
            compute_instances: vec![ci(0, 1)],
        },
        MigInstanceSample {
            gpu_instance: 5,
            profile: "2g.20gb".into(),
            memory: Some(memory(21_072_183_296.0, 0.0)),
            gpm: None,
            compute_instances: vec![ci(0, 5), ci(1, 5)],
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

/// Families that come from GPM samples (everything of the saturation group but the flag).
fn gpm_families() -> Vec<&'static str> {
    vec![
        "nvidia_gpu_graphics_engine_active_ratio",
        "nvidia_gpu_sm_active_ratio",
        "nvidia_gpu_sm_occupancy_ratio",
        "nvidia_gpu_tensor_active_ratio",
        "nvidia_gpu_dram_active_ratio",
        "nvidia_gpu_pipe_active_ratio",
        "nvidia_gpu_pcie_gpm_transmit_bytes_per_second",
        "nvidia_gpu_pcie_gpm_receive_bytes_per_second",
        "nvidia_gpu_nvlink_gpm_transmit_bytes_per_second",
        "nvidia_gpu_nvlink_gpm_receive_bytes_per_second",
        "nvidia_gpu_media_engine_active_ratio",
    ]
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
        })
        .collect();
    list.sort();
    let mut state = KubernetesState::new();
    state.up = true;
    state.errors.insert(KubeletError::Timeout, 1);
    state.assignments = list.into();
    state
}

fn encode(snap: &Snapshot) -> String {
    let e = Encoder::new(MetricsOptions::default()).encode(snap);
    String::from_utf8(e.text.to_vec()).expect("utf-8 exposition")
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

#[test]
fn a_full_device_serves_every_device_family_with_identity_labels() {
    let text = encode(&snapshot(vec![full_mig_device(0)]));
    let expected: Vec<&str> = CATALOG
        .iter()
        .filter(|d| d.source.is_per_device())
        .map(|d| d.name)
        .collect();
    assert_eq!(families_of_gpu(&text, 0), expected);
    for l in series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_"))
    {
        assert!(l.contains("{gpu=\"0\",uuid=\"GPU-0\""), "{l}");
    }
}

#[test]
fn values_are_served_in_base_units_and_flags_as_0_or_1() {
    let text = encode(&snapshot(vec![full_device(0)]));
    let id = r#"gpu="0",uuid="GPU-0""#;
    let v = |s: &str| value(&text, s);
    assert_eq!(
        v(&format!("nvidia_gpu_utilization_ratio{{{id}}}")),
        Some(0.75)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_memory_total_bytes{{{id}}}")),
        Some(85_520_809_984.0)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_energy_joules_total{{{id}}}")),
        Some(123_456.789)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_clock_hertz{{{id},clock="graphics"}}"#
        )),
        Some(1.98e9)
    );
    assert_eq!(
        v(&format!(r#"nvidia_gpu_fan_speed_ratio{{{id},fan="1"}}"#)),
        Some(0.4)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_clock_event_active{{{id},reason="sw_power_cap"}}"#
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_clock_event_active{{{id},reason="gpu_idle"}}"#
        )),
        Some(0.0)
    );
    assert_eq!(
        v(&format!(r#"nvidia_gpu_pcie_link_width{{{id},link="max"}}"#)),
        Some(16.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_ecc_errors_total{{{id},error_type="corrected"}}"#
        )),
        Some(7.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_ecc_lifetime_errors{{{id},error_type="uncorrected"}}"#
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_row_remap_pending{{{id}}}")),
        Some(1.0)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_row_remap_failed{{{id}}}")),
        Some(0.0)
    );
    assert_eq!(
        v(&format!(r#"nvidia_gpu_xid_errors_total{{{id},xid="79"}}"#)),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(r#"nvidia_gpu_nvlink_up{{{id},link="1"}}"#)),
        Some(0.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_nvlink_transmit_bytes_total{{{id},link="0"}}"#
        )),
        Some(1_099_511_627_776.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_nvlink_errors_total{{{id},link="0",error_type="replay"}}"#
        )),
        Some(5.0)
    );
    assert_eq!(v(&format!("nvidia_gpu_mig_mode{{{id}}}")), Some(0.0));
    // A link without counters has no byte series (never 0).
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_nvlink_transmit_bytes_total{{{id},link="1"}}"#
        )),
        None
    );
}

#[test]
fn info_carries_identity_and_system_versions() {
    let text = encode(&snapshot(vec![full_device(0)]));
    let info = r#"nvidia_gpu_info{gpu="0",uuid="GPU-0",name="NVIDIA H100 80GB HBM3",brand="nvidia",architecture="hopper",pci_bus_id="00000000:18:00.0",serial="1650000000001",vbios_version="96.00.99.00.01",driver_version="550.54.15",cuda_driver_version="12.4",compute_capability="9.0",minor_number="0"}"#;
    assert_eq!(value(&text, info), Some(1.0), "{text}");
}

#[test]
fn missing_readings_produce_no_series() {
    let text = encode(&snapshot(vec![bare_device(0)]));
    assert_eq!(
        families_of_gpu(&text, 0),
        ["nvidia_gpu_info", "nvidia_gpu_up"]
    );
}

#[test]
fn a_lost_device_keeps_only_info_and_up_0() {
    let mut lost = full_device(1);
    lost.up = false;
    let text = encode(&snapshot(vec![full_device(0), lost]));
    assert_eq!(
        families_of_gpu(&text, 1),
        ["nvidia_gpu_info", "nvidia_gpu_up"]
    );
    assert_eq!(
        value(&text, r#"nvidia_gpu_up{gpu="1",uuid="GPU-1"}"#),
        Some(0.0)
    );
    assert_eq!(
        value(&text, r#"nvidia_gpu_up{gpu="0",uuid="GPU-0"}"#),
        Some(1.0)
    );
    assert_eq!(value(&text, "nvml_exporter_gpus"), Some(2.0));
}

#[test]
fn a_stale_device_still_serves_its_last_values() {
    let mut stale = full_device(0);
    stale.stale = true;
    let text = encode(&snapshot(vec![stale]));
    assert_eq!(
        value(&text, r#"nvidia_gpu_power_watts{gpu="0",uuid="GPU-0"}"#),
        Some(312.5)
    );
}

#[test]
fn non_finite_readings_are_omitted() {
    let mut d = bare_device(0);
    d.power_watts = Some(f64::NAN);
    d.temperature_celsius = Some(f64::INFINITY);
    let text = encode(&snapshot(vec![d]));
    assert!(!text.contains("nvidia_gpu_power_watts{"), "{text}");
    assert!(!text.contains("nvidia_gpu_temperature_celsius{"), "{text}");
}

#[test]
fn label_values_are_escaped() {
    let mut d = bare_device(0);
    Arc::make_mut(&mut d.info).name = "Odd \"GPU\" \\ name\nline2".into();
    let text = encode(&snapshot(vec![d]));
    assert!(
        text.contains(r#"name="Odd \"GPU\" \\ name\nline2""#),
        "{text}"
    );
}

#[test]
fn types_match_the_catalog_and_counters_end_in_total() {
    let text = encode(&snapshot(vec![full_mig_device(0)]));
    for def in CATALOG {
        let line = format!("# TYPE {} {}", def.name, def.kind.as_str());
        assert!(text.contains(&line), "missing {line:?}");
        assert_eq!(
            def.kind == MetricKind::Counter,
            def.name.ends_with("_total"),
            "{}",
            def.name
        );
    }
    assert!(text.contains("# TYPE nvidia_gpu_energy_joules_total counter\n"));
    assert!(text.contains("# TYPE nvidia_gpu_power_watts gauge\n"));
    assert!(text.contains("# TYPE nvml_exporter_sample_duration_seconds histogram\n"));
}

#[test]
fn families_follow_the_catalog_then_process_metrics() {
    let text = encode(&snapshot(vec![full_mig_device(0)]));
    let served = families(&text);
    let catalog: Vec<&str> = CATALOG.iter().map(|d| d.name).collect();
    assert_eq!(&served[..catalog.len()], &catalog[..]);
    assert!(
        served[catalog.len()..]
            .iter()
            .all(|n| n.starts_with("process_")),
        "{served:?}"
    );
}

#[test]
fn series_are_ordered_by_gpu_index_then_label() {
    // Devices and label lists deliberately out of order.
    let text = encode(&snapshot(vec![full_device(1), full_device(0)]));
    let clocks: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_clock_hertz{"))
        .collect();
    assert_eq!(
        clocks,
        [
            r#"nvidia_gpu_clock_hertz{gpu="0",uuid="GPU-0",clock="graphics"} 1980000000"#,
            r#"nvidia_gpu_clock_hertz{gpu="0",uuid="GPU-0",clock="memory"} 2619000000"#,
            r#"nvidia_gpu_clock_hertz{gpu="1",uuid="GPU-1",clock="graphics"} 1980000000"#,
            r#"nvidia_gpu_clock_hertz{gpu="1",uuid="GPU-1",clock="memory"} 2619000000"#,
        ]
    );
    let xids: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_xid_errors_total{gpu=\"0\""))
        .collect();
    assert!(
        xids[0].contains("xid=\"13\"") && xids[1].contains("xid=\"79\""),
        "{xids:?}"
    );
}

#[test]
fn duplicate_label_values_from_the_sampler_give_one_series() {
    let mut d = bare_device(0);
    d.fan_speeds = vec![(0, 0.3), (0, 0.9)];
    let text = encode(&snapshot(vec![d]));
    let fans = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_fan_speed_ratio{"))
        .count();
    assert_eq!(fans, 1);
}

#[test]
fn nvlinks_in_any_order_give_one_series_per_link_in_link_order() {
    let link = |link: u32, up: bool, errors: Vec<(NvLinkErrorType, u64)>| NvLinkSample {
        link,
        up,
        transmit_bytes: Some(u64::from(link)),
        receive_bytes: None,
        errors: errors.into_iter().collect(),
    };
    let mut d = bare_device(0);
    d.nvlinks = vec![
        link(40, true, vec![]),
        link(
            3,
            true,
            vec![(NvLinkErrorType::Replay, 2), (NvLinkErrorType::CrcFlit, 1)],
        ),
        link(20, true, vec![]),
        // A duplicate of link 3: the first one read is kept.
        link(3, false, vec![]),
    ];
    let text = encode(&snapshot(vec![d]));
    let up: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_nvlink_up{"))
        .collect();
    assert_eq!(
        up,
        [
            r#"nvidia_gpu_nvlink_up{gpu="0",uuid="GPU-0",link="3"} 1"#,
            r#"nvidia_gpu_nvlink_up{gpu="0",uuid="GPU-0",link="20"} 1"#,
            r#"nvidia_gpu_nvlink_up{gpu="0",uuid="GPU-0",link="40"} 1"#,
        ]
    );
    let errors: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_nvlink_errors_total{"))
        .collect();
    assert_eq!(
        errors,
        [
            r#"nvidia_gpu_nvlink_errors_total{gpu="0",uuid="GPU-0",link="3",error_type="crc_flit"} 1"#,
            r#"nvidia_gpu_nvlink_errors_total{gpu="0",uuid="GPU-0",link="3",error_type="replay"} 2"#,
        ]
    );
}

#[test]
fn self_metrics_reflect_the_snapshot() {
    let text = encode(&snapshot(vec![full_device(0)]));
    assert_eq!(value(&text, "nvml_exporter_nvml_up"), Some(1.0));
    assert_eq!(value(&text, "nvml_exporter_gpus"), Some(1.0));
    assert_eq!(
        value(&text, "nvml_exporter_last_sample_timestamp_seconds"),
        Some(1_700_000_000.5)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_nvml_errors_total{function="nvmlDeviceGetPowerUsage",error="GPU_IS_LOST"}"#
        ),
        Some(2.0)
    );
    let build = format!(
        r#"nvml_exporter_build_info{{version="{VERSION}",revision="{REVISION}",rustc="{RUSTC}"}}"#
    );
    assert_eq!(value(&text, &build), Some(1.0));
    assert!(RUSTC.starts_with("rustc ") || RUSTC == "unknown", "{RUSTC}");
}

#[test]
fn an_empty_snapshot_says_nvml_is_down_and_has_no_timestamp() {
    let text = encode(&Snapshot::default());
    assert_eq!(value(&text, "nvml_exporter_nvml_up"), Some(0.0));
    assert_eq!(value(&text, "nvml_exporter_gpus"), Some(0.0));
    assert!(!text.contains("nvml_exporter_last_sample_timestamp_seconds"));
    assert!(!text.contains("nvidia_gpu_"));
    // No tick yet, so nothing observed.
    assert_eq!(
        value(&text, "nvml_exporter_sample_duration_seconds_count"),
        Some(0.0)
    );
}

#[test]
fn each_encode_observes_the_tick_duration_once() {
    let enc = Encoder::new(MetricsOptions::default());
    let snap = snapshot(vec![]);
    enc.encode(&snap);
    let text = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert_eq!(
        value(&text, "nvml_exporter_sample_duration_seconds_count"),
        Some(2.0)
    );
    assert_eq!(
        value(&text, "nvml_exporter_sample_duration_seconds_sum"),
        Some(0.024)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_sample_duration_seconds_bucket{le="0.01"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_sample_duration_seconds_bucket{le="0.025"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn scrapes_appear_in_the_next_encoding() {
    let enc = Encoder::new(MetricsOptions::default());
    let snap = snapshot(vec![]);
    let before = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert_eq!(
        value(&before, r#"nvml_exporter_scrapes_total{code="200"}"#),
        Some(0.0)
    );
    let counter = enc.scrape_counter();
    counter.inc(200);
    counter.inc(200);
    counter.inc(405);
    let after = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert_eq!(
        value(&after, r#"nvml_exporter_scrapes_total{code="200"}"#),
        Some(2.0)
    );
    assert_eq!(
        value(&after, r#"nvml_exporter_scrapes_total{code="405"}"#),
        Some(1.0)
    );
}

#[test]
fn gzip_decodes_to_the_text_and_is_made_once() {
    let e = Encoder::new(MetricsOptions::default()).encode(&snapshot(vec![full_device(0)]));
    assert_eq!(e.gzip_if_ready(), None, "gzip is made on demand");
    let gz = e.gzip();
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut decoded)
        .unwrap();
    assert_eq!(decoded, e.text);
    assert!(gz.len() < e.text.len());
    // A clone (what every request holds) shares the one compression.
    let clone = e.clone();
    assert_eq!(clone.gzip_if_ready().map(|b| b.as_ptr()), Some(gz.as_ptr()));
    assert_eq!(clone.gzip().as_ptr(), gz.as_ptr());
}

#[test]
fn a_recycled_exposition_lends_its_buffer_to_the_next_encoding() {
    // As the server does it: the exposition replaced by a newer one comes back.
    let enc = Encoder::new(MetricsOptions::default());
    let snap = snapshot(vec![full_device(0), full_device(1)]);
    let first = enc.encode(&snap);
    let first_text = first.text.to_vec();
    let buffer = first.text.as_ptr();
    let second = enc.encode(&snap);
    enc.recycle(first);
    let third = enc.encode(&snap);
    assert_eq!(
        third.text.as_ptr(),
        buffer,
        "the same buffer, written again"
    );
    // Same readings; only the self-metrics (tick count, duration) may differ.
    let first_text = String::from_utf8(first_text).unwrap();
    let third_text = String::from_utf8(third.text.to_vec()).unwrap();
    assert_eq!(families(&third_text), families(&first_text));

    // A response still holding the text keeps it intact: nothing is taken back.
    let held = second.text.clone();
    let held_copy = held.to_vec();
    enc.recycle(second);
    let fourth = enc.encode(&snap);
    assert_ne!(fourth.text.as_ptr(), held.as_ptr());
    assert_eq!(held.to_vec(), held_copy);
}

/// The exposition without the self-metrics that count an encoder's ticks (so that an encoder
/// that encoded before and a fresh one can be compared).
fn without_tick_counts(text: &str) -> String {
    without_process(text)
        .lines()
        .filter(|l| !l.contains(SAMPLE_DURATION_SECONDS))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn an_encoder_that_copies_last_tick_s_lines_writes_what_a_fresh_one_writes() {
    let opts = MetricsOptions {
        pod_labels: true,
        ..MetricsOptions::default()
    };
    let enc = Encoder::new(opts.clone());
    let base = snapshot(vec![full_device(0), full_device(1), bare_device(2)]);
    let mut steps = vec![("first", base.clone()), ("unchanged", base.clone())];
    let mut s = base.clone();
    Arc::make_mut(&mut s.devices[0]).power_watts = Some(123.5);
    Arc::make_mut(&mut s.devices[1]).temperature_celsius = Some(91.0);
    steps.push(("new values", s));
    let mut s = base.clone();
    Arc::make_mut(&mut s.devices[0]).nvlinks.remove(0);
    steps.push(("a link fewer: every later series one place earlier", s));
    steps.push(("the link back", base.clone()));
    let mut s = base.clone();
    Arc::make_mut(&mut s.devices[1]).uuid = "GPU-another".into();
    steps.push(("another uuid at the same index", s));
    let mut s = base.clone();
    s.kubernetes = Some(kubelet(&[("nvidia0", "ml", "train-1", "main")]));
    steps.push(("another pod holds GPU 0", s));
    s = base.clone();
    s.kubernetes = None;
    steps.push(("no pod labels", s));
    let mut s = base.clone();
    Arc::make_mut(&mut s.devices[0]).up = false;
    steps.push(("GPU 0 lost", s));
    steps.push(("GPU 0 back", base.clone()));
    steps.push((
        "GPU 0 gone: the others one place earlier",
        snapshot(vec![full_device(1), bare_device(2)]),
    ));
    steps.push(("GPU 0 back again", base.clone()));
    let mut s = base.clone();
    Arc::make_mut(&mut Arc::make_mut(&mut s.devices[0]).info).name = "Odd \"GPU\" \\ name".into();
    steps.push(("a label value that needs escaping", s));
    let mut s = base.clone();
    Arc::make_mut(&mut Arc::make_mut(&mut s.devices[0]).info).name = "Odd \"GPU\" \\ nam".into();
    steps.push(("a shorter one", s));
    steps.push(("back to the start", base.clone()));
    let mut previous = None;
    for (step, snap) in &steps {
        let steady = enc.encode(snap);
        if let Some(old) = previous.replace(steady.clone()) {
            enc.recycle(old);
        }
        let fresh = Encoder::new(opts.clone()).encode(snap);
        let [steady, fresh] = [steady, fresh].map(|e| String::from_utf8(e.text.to_vec()).unwrap());
        assert_eq!(
            without_tick_counts(&steady),
            without_tick_counts(&fresh),
            "{step}"
        );
    }
}

#[test]
fn closed_labels_only_take_their_declared_values() {
    let text = encode(&snapshot(vec![full_device(0)]));
    for def in CATALOG {
        for (label, values) in def.closed_labels {
            assert!(
                def.labels.contains(label),
                "{}: {label} is not a label",
                def.name
            );
            let allowed = values();
            let prefix = format!("{}{{", def.name);
            // The label is first (after `{`) or follows another (after `,`).
            let tags = [format!("{{{label}=\""), format!(",{label}=\"")];
            let lines: Vec<&str> = series(&text)
                .into_iter()
                .filter(|l| l.starts_with(&prefix))
                .collect();
            assert!(!lines.is_empty(), "{}: no series", def.name);
            for l in lines {
                let v = tags
                    .iter()
                    .find_map(|t| l.split(t.as_str()).nth(1))
                    .and_then(|r| r.split('"').next());
                let v = v.unwrap_or_else(|| panic!("{l}: no {label}"));
                assert!(allowed.contains(&v), "{}: {label}={v}", def.name);
            }
        }
    }
}

/// What the encoder wrote before it wrote text itself: `prometheus` protobuf families printed by
/// that crate's `TextEncoder`. The oracle for byte-identical output.
fn reference_text(enc: &Encoder, snap: &Snapshot) -> String {
    use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricType};

    let metric = |def: &catalog::MetricDef, names: Vec<&str>, values: Vec<String>, value: f64| {
        let labels = names
            .iter()
            .zip(values)
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name((*name).to_owned());
                pair.set_value(value);
                pair
            })
            .collect();
        let mut m = Metric::default();
        m.set_label(labels);
        if def.kind == MetricKind::Counter {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        m
    };
    let owned = |s: &samples::Samples| -> Vec<(Vec<String>, f64)> {
        s.iter()
            .map(|(l, v)| (l.map(str::to_owned).collect(), v))
            .collect()
    };
    let mut gathered = enc.registry.gather();
    let mut devices: Vec<&DeviceSample> = snap.devices.iter().map(Arc::as_ref).collect();
    devices.sort_by_key(|d| d.index);
    let mut out = Vec::new();
    let mut samples = samples::Samples::default();
    let assigned: Vec<Vec<&ContainerRef>> = snap
        .kubernetes
        .as_ref()
        .map(|k| crate::kubernetes::mapping::attribute(&k.assignments, &devices))
        .unwrap_or_default();
    let instance_assigned: Vec<Vec<Vec<&ContainerRef>>> = snap
        .kubernetes
        .as_ref()
        .map(|k| crate::kubernetes::mapping::attribute_instances(&k.assignments, &devices))
        .unwrap_or_else(|| {
            devices
                .iter()
                .map(|d| vec![Vec::new(); d.mig_instances.len()])
                .collect()
        });
    let pod_values =
        |c: &ContainerRef| vec![c.namespace.clone(), c.pod.clone(), c.container.clone()];
    let mig_values = |d: &DeviceSample, gi: u32| {
        let profile = d.mig_instances.iter().find(|m| m.gpu_instance == gi);
        [
            gi.to_string(),
            profile.map(|m| m.profile.clone()).unwrap_or_default(),
        ]
    };
    for def in CATALOG {
        let mut metrics = Vec::new();
        match def.source {
            Source::Device(read) | Source::DeviceIdentity(read) => {
                let always = matches!(def.source, Source::DeviceIdentity(_));
                for (i, d) in devices.iter().enumerate().filter(|(_, d)| d.up || always) {
                    samples.clear();
                    read(&snap.system, d, &mut samples);
                    let owner = match assigned.get(i).map(Vec::as_slice) {
                        Some([only]) if enc.options().pod_labels => Some(*only),
                        _ => None,
                    };
                    for (labels, value) in owned(&samples) {
                        let mut all = vec![d.index.to_string(), d.uuid.clone()];
                        all.extend(labels);
                        let mut names = def.all_labels();
                        if let Some(c) = owner {
                            all.extend(pod_values(c));
                            names.extend(POD_LABELS);
                        }
                        metrics.push(metric(def, names, all, value));
                    }
                    if always {
                        continue;
                    }
                    for (j, m) in d.mig_instances.iter().enumerate() {
                        samples.clear();
                        read(&snap.system, &instance_view(d, m), &mut samples);
                        let owner = match instance_assigned[i][j].as_slice() {
                            [only] if enc.options().pod_labels => Some(*only),
                            _ => None,
                        };
                        for (labels, value) in owned(&samples) {
                            let mut all = vec![d.index.to_string(), d.uuid.clone()];
                            all.extend(labels);
                            all.extend([m.gpu_instance.to_string(), m.profile.clone()]);
                            let mut names = def.all_labels();
                            names.extend(catalog::MIG_LABELS);
                            if let Some(c) = owner {
                                all.extend(pod_values(c));
                                names.extend(POD_LABELS);
                            }
                            metrics.push(metric(def, names, all, value));
                        }
                    }
                }
            }
            Source::PodAssignments => {
                for (d, containers) in devices.iter().zip(&assigned) {
                    for c in containers {
                        let mut all = vec![d.index.to_string(), d.uuid.clone()];
                        all.extend(pod_values(c));
                        metrics.push(metric(def, def.all_labels(), all, 1.0));
                    }
                }
                for (d, instances) in devices.iter().zip(&instance_assigned) {
                    for (m, containers) in d.mig_instances.iter().zip(instances) {
                        for c in containers {
                            let mut all = vec![d.index.to_string(), d.uuid.clone()];
                            all.extend([m.gpu_instance.to_string(), m.profile.clone()]);
                            all.extend(pod_values(c));
                            let mut names = def.all_labels();
                            names.splice(2..2, catalog::MIG_LABELS.iter().copied());
                            metrics.push(metric(def, names, all, 1.0));
                        }
                    }
                }
            }
            Source::Processes(field) => {
                for (i, d) in devices.iter().enumerate().filter(|(_, d)| d.up) {
                    let g = summarize_for(snap, &assigned, i, d, enc.options());
                    for p in &g.processes {
                        let Some(value) = field.of_process(p.process) else {
                            continue;
                        };
                        let mut all = vec![
                            d.index.to_string(),
                            d.uuid.clone(),
                            p.process.pid.to_string(),
                            p.process.name.clone(),
                        ];
                        let mut names = def.all_labels();
                        if let Some(gi) = p.process.gpu_instance {
                            all.extend(mig_values(d, gi));
                            names.extend(catalog::MIG_LABELS);
                        }
                        if let Some(c) = &p.container {
                            all.extend(pod_values(c));
                            names.extend(POD_LABELS);
                        }
                        metrics.push(metric(def, names, all, value));
                    }
                }
            }
            Source::PodProcesses(field) => {
                for (i, d) in devices.iter().enumerate().filter(|(_, d)| d.up) {
                    let g = summarize_for(snap, &assigned, i, d, enc.options());
                    for u in &g.pods {
                        if let Some(value) = field.of_pod(u) {
                            let mut all = vec![d.index.to_string(), d.uuid.clone()];
                            let mut names = def.all_labels();
                            if let Some(gi) = u.gpu_instance {
                                all.extend(mig_values(d, gi));
                                names.splice(2..2, catalog::MIG_LABELS.iter().copied());
                            }
                            all.extend(pod_values(&u.container));
                            metrics.push(metric(def, names, all, value));
                        }
                    }
                }
            }
            Source::Exporter(read) => {
                samples.clear();
                read(snap, &mut samples);
                for (labels, value) in owned(&samples) {
                    metrics.push(metric(def, def.all_labels(), labels, value));
                }
            }
            Source::Registry => {
                if let Some(pos) = gathered.iter().position(|f| f.name() == def.name) {
                    out.push(gathered.remove(pos));
                }
                continue;
            }
        }
        if !metrics.is_empty() {
            let mut f = MetricFamily::default();
            f.set_name(def.name.to_owned());
            f.set_help(def.help.to_owned());
            f.set_field_type(match def.kind {
                MetricKind::Gauge => MetricType::GAUGE,
                MetricKind::Counter => MetricType::COUNTER,
                MetricKind::Histogram => MetricType::HISTOGRAM,
            });
            f.set_metric(metrics);
            out.push(f);
        }
    }
    out.extend(gathered);
    prometheus::TextEncoder::new()
        .encode_to_string(&out)
        .unwrap()
}

/// The process and pod rows of device `i` (the shared attribution logic; the reference checks
/// only how they are written).
fn summarize_for<'a>(
    snap: &Snapshot,
    assigned: &[Vec<&ContainerRef>],
    i: usize,
    d: &'a DeviceSample,
    opts: &MetricsOptions,
) -> crate::processes::attribution::GpuProcesses<'a> {
    let gpu = match assigned.get(i).map(Vec::as_slice) {
        Some([only]) => Some(*only),
        _ => None,
    };
    let instance_containers = snap
        .kubernetes
        .as_ref()
        .map(|k| crate::kubernetes::mapping::attribute_instances(&k.assignments, &[d]))
        .and_then(|mut per_device| per_device.pop())
        .unwrap_or_default();
    let owners = crate::processes::attribution::Owners {
        gpu,
        mig_instances: &d.mig_instances,
        instance_containers: &instance_containers,
    };
    let pods = snap.kubernetes.as_ref().map_or(&[][..], |k| &k.pods[..]);
    crate::processes::attribution::summarize(&d.processes, pods, owners, opts.max_processes_per_gpu)
}

/// The text without the process collector's families, whose values move between two reads.
fn without_process(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !(l.starts_with("process_")
                || l.starts_with("# HELP process_")
                || l.starts_with("# TYPE process_"))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn output_is_byte_identical_to_the_prometheus_text_encoder() {
    let mut odd = full_device(2);
    Arc::make_mut(&mut odd.info).name = "Odd \"GPU\" \\ name\nline2 °C".into();
    odd.uuid = "GPU-\"quoted\"".into();
    odd.power_watts = Some(-0.0);
    odd.energy_joules = Some(1e21);
    odd.utilization = Some(1e-7);
    odd.memory_utilization = Some(f64::NAN);
    odd.temperature_celsius = Some(f64::NEG_INFINITY);
    odd.gpm = Some(full_gpm());
    let mut lost = full_device(3);
    lost.up = false;
    let mut mig = full_mig_device(4);
    Arc::make_mut(&mut mig.info).minor_number = "4".into();
    // Its processes run in GI 1 (held by one container below) and GI 5 (shared).
    for (p, gi) in mig.processes.iter_mut().zip([1, 5]) {
        p.gpu_instance = Some(gi);
    }
    let mut snap = snapshot(vec![lost, full_device(1), odd, full_device(0), mig]);
    snap.nvml_errors.insert(
        ("nvmlDeviceGetPowerUsage".into(), "Unknown \"err\"".into()),
        3,
    );
    // GPU 1 shared by two containers, GPU 2 (the odd one) by one with an odd name.
    let mut pods = snap.clone();
    pods.kubernetes = Some(kubelet(&[
        ("GPU-1", "a", "p", "c"),
        ("GPU-1::1", "b", "q", "c"),
        ("nvidia2", "odd\"ns", "p\\1", "c\n"),
        ("MIG-9", "mig", "m", "c"),
        // GPU 4's GI 1 held by one container, its GI 5 shared by two.
        ("MIG-4-1-0", "mig", "one", "c"),
        ("MIG-4-5-1", "mig", "shared", "a"),
        ("nvidia4/gi5", "mig", "shared", "b"),
    ]));
    for pod_labels in [false, true] {
        let enc = Encoder::new(MetricsOptions {
            pod_labels,
            ..MetricsOptions::default()
        });
        enc.scrape_counter().inc(200);
        enc.scrape_counter().inc(500);
        for snap in [
            Snapshot::default(),
            snapshot(vec![]),
            snap.clone(),
            pods.clone(),
        ] {
            let text = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
            let reference = reference_text(&enc, &snap);
            assert_eq!(without_process(&text), without_process(&reference));
            assert!(text.contains("\nprocess_"), "process families still served");
        }
    }
}

fn encode_with(opts: MetricsOptions, snap: &Snapshot) -> String {
    String::from_utf8(Encoder::new(opts).encode(snap).text.to_vec()).unwrap()
}

#[test]
fn a_gpu_held_by_one_container_carries_its_labels_on_every_series() {
    let mut snap = snapshot(vec![full_device(0), full_device(1), full_device(3)]);
    snap.kubernetes = Some(kubelet(&[
        ("GPU-0", "ml", "train-a", "main"),
        ("nvidia3", "web", "infer-b", "server"),
    ]));
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let pod_a = r#"namespace="ml",pod="train-a",container="main""#;
    let pod_b = r#"namespace="web",pod="infer-b",container="server""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="0",uuid="GPU-0",{pod_a}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="3",uuid="GPU-3",{pod_b}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        series(&text)
            .iter()
            .filter(|l| l.starts_with("nvidia_gpu_pod_info"))
            .count(),
        2
    );
    for l in series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_"))
    {
        let expected = match l.split("gpu=\"").nth(1).and_then(|r| r.split('"').next()) {
            Some("0") => Some(pod_a),
            Some("3") => Some(pod_b),
            _ => None,
        };
        match expected {
            Some(pod) => assert!(l.contains(pod), "{l}"),
            None => assert!(!l.contains("namespace="), "{l}"),
        }
    }
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_power_watts{{gpu="0",uuid="GPU-0",{pod_a}}}"#)
        ),
        Some(312.5)
    );
    // Labels only in the info family when the per-series labels are off. (Process and pod-usage
    // series name their own container whatever that option says: it is what they are about.)
    let text = encode_with(
        MetricsOptions {
            pod_labels: false,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let labelled: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.contains("namespace="))
        .filter(|l| {
            !(l.starts_with("nvidia_gpu_process_")
                || l.starts_with("nvidia_gpu_pod_memory_")
                || l.starts_with("nvidia_gpu_pod_sm_"))
        })
        .collect();
    assert_eq!(labelled.len(), 2, "{labelled:?}");
    assert!(
        labelled
            .iter()
            .all(|l| l.starts_with("nvidia_gpu_pod_info{"))
    );
}

#[test]
fn a_shared_gpu_lists_every_container_but_labels_no_series() {
    let mut snap = snapshot(vec![full_device(0)]);
    snap.kubernetes = Some(kubelet(&[
        ("GPU-0::0", "ml", "a", "main"),
        ("GPU-0::1", "ml", "b", "main"),
    ]));
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let infos: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pod_info"))
        .collect();
    assert_eq!(
        infos,
        [
            r#"nvidia_gpu_pod_info{gpu="0",uuid="GPU-0",namespace="ml",pod="a",container="main"} 1"#,
            r#"nvidia_gpu_pod_info{gpu="0",uuid="GPU-0",namespace="ml",pod="b",container="main"} 1"#,
        ]
    );
    assert!(value(&text, r#"nvidia_gpu_power_watts{gpu="0",uuid="GPU-0"}"#).is_some());
}

#[test]
fn kubelet_state_is_served_only_with_attribution_on() {
    let mut snap = snapshot(vec![full_device(0)]);
    let text = encode(&snap);
    assert_eq!(value(&text, "nvml_exporter_kubernetes_up"), Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_kubernetes_errors_total{reason="timeout"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"nvml_exporter_kubernetes_errors_total{reason="unavailable"}"#
        ),
        Some(0.0)
    );
    snap.kubernetes = None;
    let text = encode(&snap);
    assert!(!text.contains("kubernetes"), "{text}");
    assert!(!text.contains("nvidia_gpu_pod_info"));
}

#[test]
fn a_lost_gpu_keeps_its_assignment_but_no_readings() {
    let mut lost = full_device(0);
    lost.up = false;
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snapshot(vec![lost]),
    );
    let pod = r#"namespace="ml",pod="train-0",container="main""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_info{{gpu="0",uuid="GPU-0",{pod}}}"#)
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"nvidia_gpu_up{{gpu="0",uuid="GPU-0",{pod}}}"#)
        ),
        Some(0.0)
    );
}

#[test]
fn catalog_names_units_and_labels_are_well_formed() {
    let mut names: Vec<&str> = CATALOG.iter().map(|d| d.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), CATALOG.len(), "duplicate names");
    let snake = |s: &str| {
        !s.is_empty()
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    for d in CATALOG {
        assert!(snake(d.name), "{}", d.name);
        assert!(!d.help.is_empty(), "{}", d.name);
        if !d.unit.is_empty() {
            let base = d.name.strip_suffix("_total").unwrap_or(d.name);
            assert!(
                base.ends_with(&format!("_{}", d.unit)),
                "{} lacks unit {}",
                d.name,
                d.unit
            );
        }
        for l in d.labels {
            assert!(snake(l) && !l.starts_with("__"), "{}: label {l}", d.name);
            assert!(!d.all_labels()[..d.all_labels().len() - d.labels.len()].contains(l));
        }
        let per_device = d.name.starts_with("nvidia_gpu_");
        assert_eq!(per_device, d.source.is_per_device(), "{}", d.name);
        // Only the registry can hold a histogram's buckets.
        if d.kind == MetricKind::Histogram {
            assert!(matches!(d.source, Source::Registry), "{}", d.name);
        }
        for f in d.dcgm {
            assert!(f.field.starts_with("DCGM_FI_"), "{}", d.name);
            if let Some(v) = f.label_value {
                let known = d
                    .closed_labels
                    .iter()
                    .any(|(_, values)| values().contains(&v));
                assert!(
                    known,
                    "{}: DCGM mapping for unknown label value {v}",
                    d.name
                );
            }
        }
    }
}

#[test]
fn gpm_averages_are_served_per_gpu_with_pipe_and_engine_labels() {
    let text = encode(&snapshot(vec![full_device(1)]));
    let id = r#"gpu="1",uuid="GPU-1""#;
    let v = |s: String| value(&text, &s);
    assert_eq!(v(format!("nvidia_gpu_gpm_supported{{{id}}}")), Some(1.0));
    // The canonical trap: busy (utilization, engine active) but not saturated (SM activity).
    assert_eq!(
        v(format!("nvidia_gpu_utilization_ratio{{{id}}}")),
        Some(0.75)
    );
    assert_eq!(
        v(format!("nvidia_gpu_graphics_engine_active_ratio{{{id}}}")),
        Some(0.99)
    );
    assert_eq!(v(format!("nvidia_gpu_sm_active_ratio{{{id}}}")), Some(0.15));
    assert_eq!(
        v(format!("nvidia_gpu_sm_occupancy_ratio{{{id}}}")),
        Some(0.08)
    );
    assert_eq!(
        v(format!("nvidia_gpu_tensor_active_ratio{{{id}}}")),
        Some(0.05)
    );
    assert_eq!(
        v(format!("nvidia_gpu_dram_active_ratio{{{id}}}")),
        Some(0.2)
    );
    assert_eq!(
        v(format!(
            "nvidia_gpu_pcie_gpm_transmit_bytes_per_second{{{id}}}"
        )),
        Some(3_145_728.0)
    );
    assert_eq!(
        v(format!(
            "nvidia_gpu_nvlink_gpm_receive_bytes_per_second{{{id}}}"
        )),
        Some(524_288.0)
    );
    let pipes: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pipe_active_ratio{"))
        .collect();
    assert_eq!(
        pipes,
        [
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="fp64"} 0"#,
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="fp32"} 0.1"#,
            r#"nvidia_gpu_pipe_active_ratio{gpu="1",uuid="GPU-1",pipe="hmma_tensor"} 0.05"#,
        ]
    );
    let engines: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_media_engine_active_ratio{"))
        .collect();
    assert_eq!(
        engines,
        [
            r#"nvidia_gpu_media_engine_active_ratio{gpu="1",uuid="GPU-1",engine="nvdec1"} 0.5"#,
            r#"nvidia_gpu_media_engine_active_ratio{gpu="1",uuid="GPU-1",engine="nvofa0"} 0"#,
        ]
    );
}

#[test]
fn a_gpu_without_gpm_says_so_and_serves_no_gpm_series() {
    let mut a100 = full_device(0);
    Arc::make_mut(&mut a100.info).architecture = "ampere".into();
    a100.gpm_supported = Some(false);
    a100.gpm = None;
    let text = encode(&snapshot(vec![a100, full_device(1)]));
    assert_eq!(
        value(&text, r#"nvidia_gpu_gpm_supported{gpu="0",uuid="GPU-0"}"#),
        Some(0.0)
    );
    let served = families_of_gpu(&text, 0);
    for f in gpm_families() {
        assert!(!served.contains(&f), "{f} served for a GPU without GPM");
    }
    // The other GPU is unaffected.
    assert!(families_of_gpu(&text, 1).contains(&"nvidia_gpu_sm_active_ratio"));
}

#[test]
fn the_first_tick_serves_the_gpm_flag_but_no_averages() {
    let mut first = full_device(0);
    first.gpm = None;
    let text = encode(&snapshot(vec![first]));
    assert_eq!(
        value(&text, r#"nvidia_gpu_gpm_supported{gpu="0",uuid="GPU-0"}"#),
        Some(1.0)
    );
    let served = families_of_gpu(&text, 0);
    for f in gpm_families() {
        assert!(
            !served.contains(&f),
            "{f} served before a GPM window closed"
        );
    }
}

#[test]
fn gpm_metrics_the_driver_refused_are_absent_not_zero() {
    let mut d = bare_device(0);
    d.gpm_supported = Some(true);
    d.gpm = Some(GpmMetrics {
        sm_active: Some(0.9),
        sm_occupancy: Some(0.55),
        ..GpmMetrics::default()
    });
    let text = encode(&snapshot(vec![d]));
    assert_eq!(
        families_of_gpu(&text, 0),
        [
            "nvidia_gpu_info",
            "nvidia_gpu_up",
            "nvidia_gpu_gpm_supported",
            "nvidia_gpu_sm_active_ratio",
            "nvidia_gpu_sm_occupancy_ratio",
        ]
    );
}

#[test]
fn gpm_support_unknown_serves_no_flag() {
    let mut d = bare_device(0);
    d.gpm_supported = None;
    let text = encode(&snapshot(vec![d]));
    assert!(!text.contains("nvidia_gpu_gpm_supported{"), "{text}");
}

#[test]
fn a_lost_gpu_serves_neither_the_gpm_flag_nor_averages() {
    let mut lost = full_device(0);
    lost.up = false;
    let text = encode(&snapshot(vec![lost]));
    assert!(!text.contains("nvidia_gpu_gpm_supported{"), "{text}");
    assert!(!text.contains("nvidia_gpu_sm_active_ratio{"), "{text}");
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

#[test]
fn two_pods_sharing_a_gpu_each_get_their_own_usage() {
    let snap = shared_gpu_snapshot();
    let text = encode_with(
        MetricsOptions {
            pod_labels: true,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let a = r#"namespace="ml",pod="train-a",container="main""#;
    let b = r#"namespace="web",pod="infer-b",container="server""#;
    let pod_mem = |c: &str| {
        value(
            &text,
            &format!(r#"nvidia_gpu_pod_memory_used_bytes{{gpu="0",uuid="GPU-0",{c}}}"#),
        )
    };
    assert_eq!(pod_mem(a), Some(((20480u64 + 4096) << 20) as f64));
    assert_eq!(pod_mem(b), Some((12288u64 << 20) as f64));
    let pod_sm = value(
        &text,
        &format!(r#"nvidia_gpu_pod_sm_utilization_ratio{{gpu="0",uuid="GPU-0",{a}}}"#),
    )
    .unwrap();
    assert!((pod_sm - 0.35).abs() < 1e-12, "{pod_sm}");
    // Each process names its own pod; the host process none.
    assert_eq!(
        value(
            &text,
            &format!(
                r#"nvidia_gpu_process_memory_used_bytes{{gpu="0",uuid="GPU-0",pid="400",process_name="proc400",{b}}}"#
            )
        ),
        Some((12288u64 << 20) as f64)
    );
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="900",process_name="proc900"}"#
        ),
        Some((1024u64 << 20) as f64)
    );
    // The pod sums add up to the attributed processes' memory; with the host process they add up
    // to the device's used memory (exactly so in the simulator; a real GPU's used memory also
    // holds the driver's own reservations, so there the processes sum to less).
    let sum = |family: &str| -> f64 {
        series(&text)
            .into_iter()
            .filter(|l| l.starts_with(family))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    };
    let pods = sum("nvidia_gpu_pod_memory_used_bytes{");
    let procs = sum("nvidia_gpu_process_memory_used_bytes{");
    assert_eq!(pods + (1024u64 << 20) as f64, procs);
    assert_eq!(Some(procs), snap.devices[0].memory.map(|m| m.used_bytes));
    // The shared GPU's own series carry no pod labels, and no pod gets the GPU's memory.
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_memory_used_bytes{gpu="0",uuid="GPU-0"}"#
        ),
        Some(procs)
    );
}

#[test]
fn process_series_are_capped_per_gpu_but_pod_sums_count_all() {
    let snap = shared_gpu_snapshot();
    let text = encode_with(
        MetricsOptions {
            max_processes_per_gpu: 2,
            ..MetricsOptions::default()
        },
        &snap,
    );
    let pids: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_process_memory_used_bytes{"))
        .map(|l| l.split("pid=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(pids, ["300", "400"], "the two largest, in pid order");
    assert_eq!(
        value(
            &text,
            r#"nvidia_gpu_pod_memory_used_bytes{gpu="0",uuid="GPU-0",namespace="ml",pod="train-a",container="main"}"#
        ),
        Some(((20480u64 + 4096) << 20) as f64),
        "pid 301 is not served but still counts for its pod"
    );
}

#[test]
fn an_exited_process_leaves_no_series_behind() {
    let enc = Encoder::new(MetricsOptions::default());
    let mut snap = shared_gpu_snapshot();
    let text = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert!(text.contains(r#"pid="400""#));
    assert!(text.contains(r#"pod="infer-b""#));
    // pid 400 (infer-b's only process) exits.
    Arc::make_mut(&mut snap.devices[0])
        .processes
        .retain(|p| p.pid != 400);
    let text = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert!(!text.contains(r#"pid="400""#), "{text}");
    // infer-b is still assigned (pod_info) but has no usage series.
    let usage: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_pod_") && l.contains(r#"pod="infer-b""#))
        .collect();
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert!(usage[0].starts_with("nvidia_gpu_pod_info{"));
    // No processes at all: the families disappear, headers included.
    Arc::make_mut(&mut snap.devices[0]).processes.clear();
    let text = String::from_utf8(enc.encode(&snap).text.to_vec()).unwrap();
    assert!(!text.contains("nvidia_gpu_process_"));
    assert!(!text.contains("nvidia_gpu_pod_memory_used_bytes"));
}

#[test]
fn a_lost_gpu_serves_no_process_series() {
    let mut snap = shared_gpu_snapshot();
    Arc::make_mut(&mut snap.devices[0]).up = false;
    let text = encode(&snap);
    assert!(!text.contains("nvidia_gpu_process_"), "{text}");
    assert!(!text.contains("nvidia_gpu_pod_memory_used_bytes"), "{text}");
}

/// `--dcgm-compat`: the dcgm-exporter families of the same snapshot.
mod dcgm_compat {
    use super::*;
    use crate::config::DcgmCompat;

    fn encode_mode(mode: DcgmCompat, hostname: &str, snap: &Snapshot) -> String {
        encode_with(
            MetricsOptions {
                pod_labels: true,
                dcgm_compat: mode,
                hostname: hostname.into(),
                ..MetricsOptions::default()
            },
            snap,
        )
    }

    /// The value of the one series of `name` for GPU `gpu` whose labels contain `with`.
    fn one(text: &str, name: &str, gpu: u32, with: &str) -> f64 {
        let prefix = format!("{name}{{gpu=\"{gpu}\",");
        let found: Vec<f64> = series(text)
            .into_iter()
            .filter(|l| l.starts_with(&prefix) && l.contains(with))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(found.len(), 1, "{name} gpu {gpu} {with}: {found:?}\n{text}");
        found[0]
    }

    #[test]
    fn the_xid_field_is_the_last_code_seen() {
        let mut quiet = full_device(1);
        quiet.xid_counts.clear();
        quiet.last_xid = None;
        quiet.last_xid_timestamp_seconds = None;
        let t = encode_mode(
            DcgmCompat::Dcgm,
            "node-a",
            &snapshot(vec![full_device(0), quiet]),
        );
        // GPU 0 saw XID 79 once and XID 13 twice, 13 last: the gauge is the last code, not the
        // commonest or the largest. GPU 1 saw none: no series (not a 0 that may be unsupported).
        assert_eq!(one(&t, "DCGM_FI_DEV_XID_ERRORS", 0, ""), 13.0);
        assert!(!t.contains("DCGM_FI_DEV_XID_ERRORS{gpu=\"1\""), "{t}");
        assert!(t.contains("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"), "{t}");
    }

    #[test]
    fn values_are_the_native_readings_in_dcgm_units() {
        let t = encode_mode(DcgmCompat::Both, "node-a", &snapshot(vec![full_device(0)]));
        let native = |name: &str, with: &str| one(&t, name, 0, with);
        let dcgm = |name: &str| one(&t, name, 0, "");
        // Percent from ratios.
        assert_eq!(
            dcgm("DCGM_FI_DEV_GPU_UTIL"),
            native("nvidia_gpu_utilization_ratio", "") * 100.0
        );
        assert_eq!(
            dcgm("DCGM_FI_DEV_DEC_UTIL"),
            native("nvidia_gpu_decoder_utilization_ratio", "") * 100.0
        );
        // DCGM's fan speed is the first fan's.
        assert_eq!(
            dcgm("DCGM_FI_DEV_FAN_SPEED"),
            native("nvidia_gpu_fan_speed_ratio", "fan=\"0\"") * 100.0
        );
        // MiB from bytes, whole MiB as DCGM's integer division gives.
        for (field, family) in [
            ("DCGM_FI_DEV_FB_TOTAL", "nvidia_gpu_memory_total_bytes"),
            ("DCGM_FI_DEV_FB_USED", "nvidia_gpu_memory_used_bytes"),
            ("DCGM_FI_DEV_FB_FREE", "nvidia_gpu_memory_free_bytes"),
            (
                "DCGM_FI_DEV_FB_RESERVED",
                "nvidia_gpu_memory_reserved_bytes",
            ),
        ] {
            assert_eq!(
                dcgm(field),
                (native(family, "") / 1_048_576.0).floor(),
                "{field}"
            );
        }
        assert_eq!(dcgm("DCGM_FI_DEV_FB_USED"), 1.0);
        // MHz from hertz.
        assert_eq!(
            dcgm("DCGM_FI_DEV_MEM_CLOCK"),
            native("nvidia_gpu_clock_hertz", "clock=\"memory\"") / 1e6
        );
        assert_eq!(dcgm("DCGM_FI_DEV_MEM_CLOCK"), 2619.0);
        // mJ from joules, ns from seconds.
        assert_eq!(
            dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
            (native("nvidia_gpu_energy_joules_total", "") * 1e3).round()
        );
        assert_eq!(dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), 123_456_789.0);
        assert_eq!(
            dcgm("DCGM_FI_DEV_POWER_VIOLATION"),
            native("nvidia_gpu_throttle_seconds_total", "reason=\"power\"") * 1e9
        );
        // Same unit: watts, celsius, P-state, counts.
        assert_eq!(
            dcgm("DCGM_FI_DEV_POWER_USAGE"),
            native("nvidia_gpu_power_watts", "")
        );
        assert_eq!(
            dcgm("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
            native("nvidia_gpu_power_limit_watts", "")
        );
        assert_eq!(
            dcgm("DCGM_FI_DEV_GPU_TEMP"),
            native("nvidia_gpu_temperature_celsius", "")
        );
        assert_eq!(dcgm("DCGM_FI_DEV_PSTATE"), 0.0);
        assert_eq!(
            dcgm("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
            native("nvidia_gpu_ecc_lifetime_errors", "error_type=\"corrected\"")
        );
        assert_eq!(dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING"), 1.0);
        // NVLink error counts are per GPU in DCGM: the total over links.
        assert_eq!(dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"), 5.0);
        assert_eq!(dcgm("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"), 1.0);
        // Profiling fields stay ratios in 0..1.
        assert_eq!(
            dcgm("DCGM_FI_PROF_SM_ACTIVE"),
            native("nvidia_gpu_sm_active_ratio", "")
        );
        assert_eq!(
            dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
            native("nvidia_gpu_pipe_active_ratio", "pipe=\"fp64\"")
        );
        let ratios: Vec<f64> = series(&t)
            .into_iter()
            .filter(|l| l.starts_with("DCGM_FI_PROF_") && l.contains("_ACTIVE{"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert!(ratios.len() >= 6, "{ratios:?}");
        assert!(ratios.iter().all(|v| (0.0..=1.0).contains(v)), "{ratios:?}");
        // Types are dcgm-exporter's.
        assert!(t.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
        assert!(t.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
        assert!(t.contains("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"));
    }

    #[test]
    fn labels_follow_dcgm_exporter_order_and_are_escaped() {
        let mut d = full_device(0);
        Arc::make_mut(&mut d.info).name = "Odd \"GPU\" \\ name".into();
        let mut snap = snapshot(vec![d, full_device(1)]);
        snap.kubernetes = Some(kubelet(&[("GPU-0", "ml", "train-0", "main")]));
        let t = encode_mode(DcgmCompat::Dcgm, "node-a", &snap);
        assert!(
            t.contains(concat!(
                r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0","#,
                r#"device="nvidia0",modelName="Odd \"GPU\" \\ name",Hostname="node-a","#,
                r#"DCGM_FI_DRIVER_VERSION="550.54.15",container="main",namespace="ml","#,
                r#"pod="train-0"} 61"#,
                "\n"
            )),
            "{t}"
        );
        // A GPU no container holds has no pod labels at all, as in dcgm-exporter.
        assert!(
            t.contains(concat!(
                r#"DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0","#,
                r#"device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a","#,
                r#"DCGM_FI_DRIVER_VERSION="550.54.15"} 61"#,
                "\n"
            )),
            "{t}"
        );
        // No hostname known: the label is left out, not served empty.
        let t = encode_mode(DcgmCompat::Dcgm, "", &snap);
        assert!(!t.contains("Hostname="), "{t}");
        assert!(t.contains(r#"modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="#));
    }

    #[test]
    fn a_lost_gpu_and_unsupported_readings_have_no_dcgm_series() {
        let mut lost = full_device(1);
        lost.up = false;
        let snap = snapshot(vec![full_device(0), lost, bare_device(2)]);
        let t = encode_mode(DcgmCompat::Both, "n", &snap);
        let dcgm_lines = |gpu: u32| {
            series(&t)
                .into_iter()
                .filter(|l| l.starts_with("DCGM_") && l.contains(&format!("{{gpu=\"{gpu}\",")))
                .count()
        };
        assert!(dcgm_lines(0) > 30, "{t}");
        assert_eq!(dcgm_lines(1), 0, "a lost GPU's series are dropped");
        assert_eq!(dcgm_lines(2), 0, "nothing readable, nothing served");
        // Still visible natively.
        assert_eq!(
            value(&t, r#"nvidia_gpu_up{gpu="1",uuid="GPU-1"}"#),
            Some(0.0)
        );
        // A family no GPU has a reading for is left out, header included.
        let t = encode_mode(DcgmCompat::Dcgm, "n", &snapshot(vec![bare_device(0)]));
        assert!(!t.contains("DCGM_"), "{t}");
    }

    #[test]
    fn modes_choose_the_names_and_native_comes_first() {
        let snap = snapshot(vec![full_device(0)]);
        let off = encode_mode(DcgmCompat::Off, "n", &snap);
        assert!(!off.contains("DCGM_"));
        // Process metrics differ between any two encodings; the rest is the same bytes.
        assert_eq!(
            without_process(&off),
            without_process(&encode_with(
                MetricsOptions {
                    pod_labels: true,
                    ..Default::default()
                },
                &snap
            ))
        );

        let only = encode_mode(DcgmCompat::Dcgm, "n", &snap);
        let fams = families(&only);
        assert!(
            !fams.iter().any(|f| f.starts_with("nvidia_gpu_")),
            "{fams:?}"
        );
        assert!(fams.contains(&"nvml_exporter_nvml_up"), "self-metrics stay");
        assert!(fams.contains(&"DCGM_FI_DEV_GPU_UTIL"));

        let both = encode_mode(DcgmCompat::Both, "n", &snap);
        let fams = families(&both);
        let last_native = fams.iter().rposition(|f| !f.starts_with("DCGM_")).unwrap();
        let first_dcgm = fams.iter().position(|f| f.starts_with("DCGM_")).unwrap();
        assert!(last_native < first_dcgm, "{fams:?}");
        // The native part is exactly what `off` serves.
        let native = without_process(&both[..both.find("# HELP DCGM_").unwrap()]);
        let off = without_process(&off);
        let diff: Vec<_> = native
            .lines()
            .zip(off.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert!(diff.is_empty() && native.len() == off.len(), "{diff:?}");
    }
}

/// MIG: per-instance series next to the GPU's, their labels, pod attribution and compat labels.
mod mig {
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
            },
            MigInstanceSample {
                gpu_instance: 9,
                profile: "1g.10gb".into(),
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
                r#"process_memory_used_bytes{gpu="1",uuid="GPU-1",pid="20",process_name="p20"}"#
                    .into()
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
}

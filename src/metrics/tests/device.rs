//! A device's own series: every family, identity labels, base units, omissions, order.

use super::*;

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
    // Processes not read: with them, an empty process list is a reading (0 bytes outside).
    let opts = MetricsOptions {
        processes: false,
        ..MetricsOptions::default()
    };
    let text = encode_with(opts, &snapshot(vec![bare_device(0)]));
    assert_eq!(
        families_of_gpu(&text, 0),
        ["nvidia_gpu_info", "nvidia_gpu_up"]
    );
}

#[test]
fn a_lost_device_keeps_only_info_up_0_and_its_health() {
    let mut lost = full_device(1);
    lost.up = false;
    let text = encode(&snapshot(vec![full_device(0), lost]));
    // Its health verdict is what says why it is down and what to do.
    assert_eq!(
        families_of_gpu(&text, 1),
        [
            "nvidia_gpu_info",
            "nvidia_gpu_up",
            "nvidia_gpu_health_state",
            "nvidia_gpu_health_reason"
        ]
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
        up: Some(up),
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
fn nvlink_per_gpu_families_sum_over_the_links() {
    let link =
        |link: u32, up: bool, tx: Option<u64>, errors: Vec<(NvLinkErrorType, u64)>| NvLinkSample {
            link,
            up: Some(up),
            transmit_bytes: tx,
            receive_bytes: None,
            errors: errors.into_iter().collect(),
        };
    let mut d = bare_device(0);
    d.nvlinks = vec![
        link(0, true, Some(100), vec![(NvLinkErrorType::Replay, 2)]),
        link(1, false, None, vec![(NvLinkErrorType::Replay, 3)]),
        link(2, true, Some(20), vec![(NvLinkErrorType::CrcFlit, 1)]),
        // A duplicate of link 0: the first one read is kept, as per link.
        link(0, true, Some(1000), vec![]),
    ];
    let text = encode(&snapshot(vec![d]));
    let per_gpu: Vec<&str> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("nvidia_gpu_nvlink_links_"))
        .collect();
    assert_eq!(
        per_gpu,
        [
            r#"nvidia_gpu_nvlink_links_up{gpu="0",uuid="GPU-0"} 2"#,
            r#"nvidia_gpu_nvlink_links_transmit_bytes_total{gpu="0",uuid="GPU-0"} 120"#,
            r#"nvidia_gpu_nvlink_links_errors_total{gpu="0",uuid="GPU-0",error_type="crc_flit"} 1"#,
            r#"nvidia_gpu_nvlink_links_errors_total{gpu="0",uuid="GPU-0",error_type="replay"} 5"#,
        ],
        "no receive counter on any link: no receive series; error types no link has are absent"
    );
    // A GPU without NVLink has none of them.
    let text = encode(&snapshot(vec![bare_device(0)]));
    assert!(!text.contains("nvidia_gpu_nvlink_links_"), "{text}");
}

#[test]
fn thermal_slowdown_is_either_thermal_clock_event() {
    let flag = |events: Vec<(ClockEventReason, bool)>| {
        let mut d = bare_device(0);
        d.clock_events = events;
        let text = encode(&snapshot(vec![d]));
        series(&text)
            .into_iter()
            .find(|l| l.starts_with("nvidia_gpu_thermal_slowdown_active{"))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(flag(vec![]), None, "clock events not read: absent");
    assert_eq!(
        flag(vec![
            (ClockEventReason::SwPowerCap, true),
            (ClockEventReason::SwThermalSlowdown, false),
            (ClockEventReason::HwThermalSlowdown, false),
        ])
        .as_deref(),
        Some("0")
    );
    for reason in [
        ClockEventReason::SwThermalSlowdown,
        ClockEventReason::HwThermalSlowdown,
    ] {
        assert_eq!(
            flag(vec![(ClockEventReason::GpuIdle, false), (reason, true)]).as_deref(),
            Some("1"),
            "{reason:?}"
        );
    }
}

#[test]
fn only_the_families_of_the_groups_on_are_served() {
    use crate::groups::{Group, Groups};
    let snap = snapshot(vec![full_mig_device(0)]);
    for groups in [
        Groups::defaults(),
        Groups::none(),
        Groups::none().with(Group::NvlinkLinks),
        Groups::all().without(Group::Memory),
    ] {
        let text = encode_with(
            MetricsOptions {
                groups,
                ..MetricsOptions::default()
            },
            &snap,
        );
        let expected: Vec<&str> = CATALOG
            .iter()
            .filter(|d| d.source.is_per_device() && groups.contains(d.group))
            .map(|d| d.name)
            .collect();
        assert_eq!(families_of_gpu(&text, 0), expected, "{groups:?}");
        assert!(
            text.contains("nvml_exporter_gpus "),
            "core is always served"
        );
    }
}

#[test]
fn the_fabric_is_served_where_the_gpu_is_on_one_and_absent_elsewhere() {
    let every = MetricsOptions {
        groups: crate::groups::Groups::all(),
        ..MetricsOptions::default()
    };
    let mut failed = full_device(1);
    failed.uuid = "GPU-1".into();
    if let Some(f) = failed.fabric.as_mut() {
        f.status = Some("timeout");
        f.conditions.clear();
        f.configuration = None;
        f.summary = None;
    }
    let text = encode_with(
        every,
        &snapshot(vec![full_device(0), failed, bare_device(2)]),
    );
    let v = |s: &str| value(&text, s);
    let id = |g: u32| format!(r#"gpu="{g}",uuid="GPU-{g}""#);
    assert_eq!(
        v(&format!("nvidia_gpu_fabric_state{{{}}}", id(0))),
        Some(3.0)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_fabric_state{{{}}}", id(1))),
        Some(4.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_fabric_condition{{{},condition="degraded_bandwidth"}}"#,
            id(0)
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_fabric_condition{{{},condition="route_unhealthy"}}"#,
            id(0)
        )),
        Some(0.0)
    );
    assert_eq!(
        v(&format!("nvidia_gpu_fabric_health{{{}}}", id(0))),
        Some(3.0)
    );
    assert_eq!(
        v(&format!(
            r#"nvidia_gpu_fabric_info{{{},clique_id="7",cluster_uuid="8b2f4c1e-6a0d-4e59-9c3b-715e2a84d016",status="timeout",configuration=""}}"#,
            id(1)
        )),
        Some(1.0)
    );
    // Conditions and a summary the driver does not report are absent, never 0.
    for absent in ["nvidia_gpu_fabric_condition", "nvidia_gpu_fabric_health"] {
        assert!(
            !series(&text)
                .iter()
                .any(|l| l.starts_with(absent) && l.contains(&id(1))),
            "{absent}"
        );
    }
    assert!(
        !series(&text)
            .iter()
            .any(|l| l.contains("fabric") && l.contains(&id(2)))
    );
}

#[test]
fn the_node_serves_its_missing_gpus_and_nothing_when_it_cannot_tell() {
    let mut snap = snapshot(vec![full_device(0)]);
    let text = encode(&snap);
    assert_eq!(value(&text, "nvidia_node_gpus_missing"), Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"nvidia_node_missing_gpu_info{pci_bus_id="0000:ca:00.0",device_id="0x2330",driver="nvidia"}"#
        ),
        Some(1.0)
    );
    snap.missing_gpus = Some(Vec::new());
    let text = encode(&snap);
    assert_eq!(value(&text, "nvidia_node_gpus_missing"), Some(0.0));
    assert!(!text.contains("nvidia_node_missing_gpu_info{"));
    snap.missing_gpus = None;
    assert!(!encode(&snap).contains("nvidia_node_"));
    // The group off: not served, whatever the snapshot holds.
    snap.missing_gpus = Some(Vec::new());
    let off = MetricsOptions {
        groups: crate::groups::Groups::defaults().without(crate::groups::Group::Inventory),
        ..MetricsOptions::default()
    };
    assert!(!encode_with(off, &snap).contains("nvidia_node_"));
}

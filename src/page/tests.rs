//! The node view's marks, states and holders on made-up snapshots, its HTML and JSON, the
//! thresholds it shares with the alert rules, and the field table the page, the JSON and
//! `docs/node-page.md` follow.

use std::sync::Arc;

use super::fields::{FIELDS, Readings, Shown};
use super::html::render;
use super::view::{
    ALLOCATED_MEMORY_BYTES, BUSY_UTILIZATION, DeviceState, Mark, NodeView, SATURATED_SM_ACTIVE,
};
use crate::metrics::MetricsOptions;
use crate::metrics::catalog::{self, Source};
use crate::sample::{
    ContainerRef, DeviceInfo, DeviceRef, DeviceSample, GpmMetrics, Health, HealthAction,
    HealthReason, HealthState, KubernetesState, MemoryInfo, PciGpu, PodAssignment, Snapshot,
};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A GPU that is up with this utilization, SM activity (GPM) and memory used.
fn gpu(index: u32, utilization: Option<f64>, sm_active: Option<f64>, used: f64) -> DeviceSample {
    DeviceSample {
        index,
        uuid: format!("GPU-{index}"),
        info: Arc::new(DeviceInfo {
            name: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        }),
        up: true,
        utilization,
        memory: Some(MemoryInfo {
            total_bytes: 80.0 * GIB,
            used_bytes: used,
            ..Default::default()
        }),
        gpm: sm_active.map(|a| GpmMetrics {
            sm_active: Some(a),
            ..Default::default()
        }),
        power_watts: Some(300.0),
        power_limit_watts: Some(700.0),
        temperature_celsius: Some(50.0),
        ..Default::default()
    }
}

fn snapshot(devices: Vec<DeviceSample>) -> Snapshot {
    Snapshot {
        nvml_up: true,
        devices: devices.into_iter().map(Arc::new).collect(),
        last_tick_timestamp_seconds: Some(1000.0),
        ..Default::default()
    }
}

fn view(snap: &Snapshot) -> NodeView {
    NodeView::new(snap, true, &MetricsOptions::default(), "node-1", 1002.5)
}

fn marks(v: &NodeView) -> Vec<Vec<Mark>> {
    v.gpus.iter().map(|g| g.marks.clone()).collect()
}

#[test]
fn marks_are_the_alert_rules_conditions_at_their_thresholds() {
    let snap = snapshot(vec![
        gpu(0, Some(0.95), Some(0.29), 10.0 * GIB),
        gpu(1, Some(0.95), Some(0.3), 10.0 * GIB),
        gpu(2, Some(0.89), Some(0.1), 10.0 * GIB),
        // Without GPM there is no saturation to judge; idleness falls back to utilization.
        gpu(3, Some(0.01), None, 2.0 * GIB),
        gpu(4, Some(0.0), Some(0.04), ALLOCATED_MEMORY_BYTES + 1.0),
        // Not allocated: at most 1 GiB held, or none at all.
        gpu(5, Some(0.0), Some(0.0), ALLOCATED_MEMORY_BYTES),
        gpu(6, Some(0.0), Some(0.05), 2.0 * GIB),
    ]);
    let v = view(&snap);
    assert_eq!(
        marks(&v),
        [
            vec![Mark::BusyNotSaturated],
            vec![],
            vec![],
            vec![Mark::AllocatedIdle],
            vec![Mark::AllocatedIdle],
            vec![],
            vec![],
        ]
    );
    assert_eq!(v.last_tick_age_seconds, Some(2.5));
    assert_eq!(v.thresholds.idle_below, 0.05);

    let raised = MetricsOptions {
        idle_threshold: 0.1,
        ..Default::default()
    };
    let v = NodeView::new(&snap, true, &raised, "node-1", 1000.0);
    assert_eq!(v.gpus[6].marks, [Mark::AllocatedIdle]);
}

#[test]
fn a_failed_gpu_gets_no_mark() {
    let mut failed = gpu(0, Some(1.0), Some(0.1), 10.0 * GIB);
    let mut idle_failed = gpu(1, Some(0.0), Some(0.0), 10.0 * GIB);
    let verdict = Health {
        state: HealthState::Failed,
        reasons: vec![HealthReason {
            reason: "xid_79",
            action: HealthAction::RebootNode,
            state: HealthState::Failed,
        }],
    };
    failed.health = Some(verdict.clone());
    idle_failed.health = Some(verdict);
    let v = view(&snapshot(vec![failed, idle_failed]));
    assert_eq!(marks(&v), [vec![], vec![]]);
    let page = render(&v);
    assert!(page.contains("✖ failed"), "{page}");
    assert!(page.contains("xid_79 (action: reboot node)"), "{page}");
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["gpus"][0]["health"]["state"], "failed");
    assert_eq!(
        json["gpus"][0]["health"]["reasons"][0]["action"],
        "reboot_node"
    );
}

#[test]
fn where_pods_hold_gpus_only_pods_allocate() {
    // GPU 0: 20 GiB held by a process outside any pod, idle: not allocated on a node where
    // the kubelet assigns GPUs. GPU 1: assigned to a pod and idle, though it holds no memory.
    let mut snap = snapshot(vec![
        gpu(0, Some(0.0), Some(0.0), 20.0 * GIB),
        gpu(1, Some(0.0), Some(0.0), 0.0),
    ]);
    let mut kubelet = KubernetesState::new();
    kubelet.up = true;
    kubelet.assignments = Arc::from([PodAssignment {
        container: ContainerRef {
            namespace: "ml".into(),
            pod: "<train>".into(),
            container: "main".into(),
        },
        device: DeviceRef::GpuUuid("GPU-1".into()),
        claim: String::new(),
    }]);
    snap.kubernetes = Some(kubelet);
    let v = view(&snap);
    assert_eq!(marks(&v), [vec![], vec![Mark::AllocatedIdle]]);
    assert!(!v.gpus[0].allocated && v.gpus[1].allocated);
    assert_eq!(v.gpus[1].holders[0].pod, "<train>");
    let page = render(&v);
    assert!(page.contains("held by <span class=\"holder\">ml/&lt;train&gt; (main)</span>"));
    assert!(!page.contains("<train>"));
}

#[test]
fn a_down_gpu_shows_no_readings_and_a_stale_one_says_so() {
    let mut down = gpu(0, Some(0.0), Some(0.0), 20.0 * GIB);
    down.up = false;
    let mut stale = gpu(1, Some(1.0), Some(0.1), 20.0 * GIB);
    stale.stale = true;
    let v = view(&snapshot(vec![down, stale]));
    assert_eq!(v.gpus[0].state, DeviceState::Down);
    assert_eq!(v.gpus[0].readings, Readings::default());
    assert!(v.gpus[0].marks.is_empty() && !v.gpus[0].allocated);
    assert_eq!(v.gpus[1].state, DeviceState::Stale);
    assert_eq!(v.gpus[1].readings.get("utilization"), Some(1.0));
    assert_eq!(v.gpus[1].marks, [Mark::BusyNotSaturated]);
    let page = render(&v);
    assert!(page.contains("✖ down"), "{page}");
    assert!(page.contains("◷ stale"), "{page}");
    assert!(page.contains("data-state=\"down\""));
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["gpus"][0]["state"], "down");
    assert_eq!(json["gpus"][0]["utilization"], serde_json::Value::Null);
    assert_eq!(json["gpus"][1]["state"], "stale");
    assert_eq!(json["gpus"][1]["marks"][0], "busy_not_saturated");
}

#[test]
fn before_the_first_tick_the_page_says_so() {
    let v = NodeView::new(
        &Snapshot::default(),
        false,
        &MetricsOptions::default(),
        "n",
        0.0,
    );
    assert!(v.gpus.is_empty());
    let page = render(&v);
    assert!(page.contains("NVML not available: no sample yet"), "{page}");
    assert!(
        page.contains("last tick <b id=\"age\">none yet</b>"),
        "{page}"
    );
}

#[test]
fn names_from_the_driver_and_the_node_are_escaped() {
    let mut d = gpu(0, None, None, 0.0);
    d.info = Arc::new(DeviceInfo {
        name: "NVIDIA <H100> & \"co\"".into(),
        ..Default::default()
    });
    let v = NodeView::new(
        &snapshot(vec![d]),
        true,
        &MetricsOptions::default(),
        "<node>",
        1000.0,
    );
    let page = render(&v);
    assert!(
        page.contains("NVIDIA &lt;H100&gt; &amp; &quot;co&quot;"),
        "{page}"
    );
    assert!(page.contains("<h1>&lt;node&gt;</h1>"), "{page}");
}

#[test]
fn the_thresholds_are_the_alert_rules() {
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus/alerts.yaml"
    ))
    .unwrap();
    for condition in [
        format!("nvidia_gpu_sm_active_ratio < {SATURATED_SM_ACTIVE}"),
        format!("nvidia_gpu_utilization_ratio >= {BUSY_UTILIZATION}"),
        // The default of --idle-threshold, which the page uses.
        format!(
            "gpu:nvidia_gpu_sm_active_ratio:or_utilization < {}",
            MetricsOptions::default().idle_threshold
        ),
        format!("nvidia_gpu_memory_used_bytes > bool {ALLOCATED_MEMORY_BYTES}"),
    ] {
        assert!(rules.contains(&condition), "alerts.yaml lacks {condition}");
    }
}

#[test]
fn every_field_is_a_served_family_of_one_series_per_gpu() {
    for f in FIELDS {
        let def = catalog::find(f.family)
            .unwrap_or_else(|| panic!("{}: no family {} in the catalog", f.name, f.family));
        assert!(
            matches!(def.source, Source::Device(_)) && def.labels.is_empty(),
            "{}: {} is not one series per GPU",
            f.name,
            f.family
        );
        assert_eq!(
            FIELDS.iter().filter(|g| g.name == f.name).count(),
            1,
            "{} twice",
            f.name
        );
        // A bar's end is a field shown as one, and each such field ends one bar.
        let ends = |name: &str| {
            FIELDS
                .iter()
                .filter(|b| matches!(b.shown, Shown::Bar { max, .. } if max == name))
                .count()
        };
        if let Shown::Bar { max, .. } = f.shown {
            assert!(
                FIELDS
                    .iter()
                    .any(|m| m.name == max && m.shown == Shown::Max),
                "{}: its end {max} is not a field shown as one",
                f.name
            );
        }
        assert_eq!(
            ends(f.name),
            usize::from(f.shown == Shown::Max),
            "{}",
            f.name
        );
    }
}

#[test]
fn the_json_and_the_page_hold_every_field_read_through_its_family() {
    // The catalog tests' device with every reading, in a thermal slowdown.
    let mut full = crate::metrics::tests::full_device(0);
    full.clock_events
        .push((crate::sample::ClockEventReason::SwThermalSlowdown, true));
    let v = view(&snapshot(vec![full]));
    let json = serde_json::to_value(&v).unwrap();
    let page = render(&v);
    for (field, value) in v.gpus[0].readings.iter() {
        let name = field.name;
        let value =
            value.unwrap_or_else(|| panic!("{name}: none from a device with every reading"));
        if let Shown::Flag { text } = field.shown {
            assert_eq!(json["gpus"][0][name], value == 1.0, "{name}");
            assert_eq!(page.contains(&format!("▲ {text}")), value == 1.0, "{name}");
        } else {
            assert_eq!(json["gpus"][0][name], value, "{name}");
            let shown = format!("data-field=\"{name}\" data-value=\"{value}\"");
            assert!(page.contains(&shown), "{name}: {page}");
        }
    }
    assert_eq!(v.gpus[0].readings.get("thermal_slowdown"), Some(1.0));
}

#[test]
fn docs_node_page_md_is_generated_from_the_fields() {
    crate::files::assert_generated(
        "docs/node-page.md",
        &super::docs::render_markdown(),
        "UPDATE_DOCS=1 cargo test --lib page::",
    );
}

#[test]
fn a_gpu_nvml_lost_shows_on_the_node_and_in_the_json() {
    let mut snap = snapshot(vec![gpu(0, Some(0.5), Some(0.4), 10.0 * GIB)]);
    snap.missing_gpus = Some(vec![PciGpu {
        address: "0000:ca:00.0".into(),
        device_id: "0x2330".into(),
        driver: String::new(),
    }]);
    snap.node_health = Some(crate::health::node_verdict(
        snap.missing_gpus.as_deref().unwrap(),
    ));
    let v = view(&snap);
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(
        json["missing_gpus"],
        serde_json::json!([{"pci_bus_id": "0000:ca:00.0", "device_id": "0x2330", "driver": ""}])
    );
    assert_eq!(
        json["node_health"],
        serde_json::json!({"state": "failed", "reasons": [{"reason": "gpus_missing", "action": "reboot_node"}]})
    );
    let html = render(&v);
    assert!(
        html.contains(
            "data-field=\"node_health\" data-value=\"failed\">✖ node failed: <span class=\"reason\" \
             data-reason=\"gpus_missing\">gpus_missing (action: reboot_node)</span> · 1 GPU on the \
             PCI bus that NVML does not list: <span class=\"missing-gpu\" \
             data-pci-bus-id=\"0000:ca:00.0\">0000:ca:00.0 (0x2330, driver none)</span>"
        ),
        "{html}"
    );
    assert!(html.contains("<b id=\"gpus-missing\">1</b>"), "{html}");

    // None missing: no banner, the count says 0; unknown: neither, and null in the JSON.
    snap.missing_gpus = Some(Vec::new());
    snap.node_health = Some(crate::health::node_verdict(&[]));
    let html = render(&view(&snap));
    assert!(!html.contains("node-health") && html.contains("<b id=\"gpus-missing\">0</b>"));
    snap.missing_gpus = None;
    snap.node_health = None;
    let v = view(&snap);
    let json = serde_json::to_value(&v).unwrap();
    assert!(json["missing_gpus"].is_null() && json["node_health"].is_null());
    assert!(!render(&v).contains("gpus-missing"));
}

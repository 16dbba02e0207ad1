//! The exporter against the shipped scenarios, at a pinned simulator clock: every GPU of the
//! scenario with the scenario's identity, the catalog's device series served, and the values a
//! user would check for the characters of the default node (idle, capped, ECC, allocated-idle).

mod common;
#[path = "saturation/families.rs"]
mod saturation;

use common::{Exposition, run_once};
use nvml_exporter::metrics::catalog::CATALOG;
use std::collections::BTreeSet;

const MIB: f64 = 1024.0 * 1024.0;

/// `--once` on `scenario` with every collector group on: these tests check every family.
fn once(scenario: &str) -> Exposition {
    let path = common::scenario(scenario);
    let every_group = common::every_group();
    let out = run_once(
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_TIME", "60"),
        ],
        &common::with_every_group(&every_group, &[]),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{scenario}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Exposition::parse(&String::from_utf8_lossy(&out.stdout))
}

fn scenario_file(scenario: &str) -> toml::Table {
    toml::from_str(&std::fs::read_to_string(common::scenario(scenario)).unwrap()).unwrap()
}

/// The `[[gpu]]` tables of a scenario file.
fn scenario_gpus(scenario: &str) -> Vec<toml::Table> {
    scenario_file(scenario)["gpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_table().unwrap().clone())
        .collect()
}

#[test]
fn every_scenario_gpu_is_served_with_its_identity() {
    for scenario in [
        "h100x8",
        "a100x4",
        "l4x2",
        "rtx6000ada",
        "v100x2",
        "h100-mig",
        "a100-mig",
        "health",
    ] {
        let m = once(scenario);
        let gpus = scenario_gpus(scenario);
        // The simulator's default driver unless the scenario names one.
        let driver = scenario_file(scenario)
            .get("driver")
            .and_then(|d| d.get("version"))
            .and_then(|v| v.as_str())
            .unwrap_or("550.127.05")
            .to_string();
        assert_eq!(
            m.value("nvml_exporter_gpus", &[]),
            Some(gpus.len() as f64),
            "{scenario}"
        );
        assert_eq!(m.value("nvml_exporter_nvml_up", &[]), Some(1.0));
        for (i, gpu) in gpus.iter().enumerate() {
            let info = m.find("nvidia_gpu_info", &[("gpu", &i.to_string())]);
            assert_eq!(info.len(), 1, "{scenario} gpu {i}");
            let labels = &info[0].labels;
            for key in ["uuid", "pci_bus_id", "serial"] {
                if let Some(want) = gpu.get(key).and_then(|v| v.as_str()) {
                    assert_eq!(labels[key], want, "{scenario} gpu {i} {key}");
                }
            }
            // Product names as the driver reports them: "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB".
            assert!(
                ["NVIDIA ", "Tesla "]
                    .iter()
                    .any(|p| labels["name"].starts_with(p)),
                "{scenario} gpu {i}: {labels:?}"
            );
            assert_eq!(labels["driver_version"], driver, "{scenario}");
            assert!(
                labels["cuda_driver_version"].starts_with("12."),
                "{scenario}: {labels:?}"
            );
            assert_eq!(m.gpu_value("nvidia_gpu_up", i as u32, &[]), Some(1.0));
        }
    }
}

/// Every per-device family of the catalog is served by at least one shipped scenario (XID
/// series need an event and are covered by the fault tests), and nothing outside the catalog is.
#[test]
fn the_scenarios_cover_every_device_metric_of_the_catalog() {
    let mut served = BTreeSet::new();
    for scenario in [
        "h100x8",
        "a100x4",
        "l4x2",
        "rtx6000ada",
        "v100x2",
        "h100-mig",
        "a100-mig",
        "health",
        "fabric",
    ] {
        for name in once(scenario).names() {
            served.insert(name.to_string());
        }
    }
    // XID series need an event, and GPM averages two samples an interval apart, which `--once`
    // never has: both are covered by tests of the running exporter (faults.rs, saturation.rs).
    // nvidia_gpu_pod_info needs a kubelet: covered by kubernetes.rs.
    // Process and per-pod usage series need --processes, memory outside allocations also a
    // kubelet: covered by processes.rs.
    // HPC job series need a job mapping directory: covered by jobs.rs.
    // GPU-seconds per workload need a kubelet and time: covered by workloads.rs.
    let event_driven = [
        "nvidia_gpu_job_info",
        "nvidia_gpu_xid_errors_total",
        "nvidia_gpu_last_xid_timestamp_seconds",
        "nvidia_gpu_pod_info",
        "nvidia_gpu_process_memory_used_bytes",
        "nvidia_gpu_process_sm_utilization_ratio",
        "nvidia_gpu_pod_memory_used_bytes",
        "nvidia_gpu_pod_sm_utilization_ratio",
        "nvidia_gpu_memory_outside_allocation_bytes",
        "nvidia_gpu_pod_gpu_seconds_total",
        "nvidia_gpu_pod_idle_gpu_seconds_total",
        "nvidia_gpu_pod_sm_active_gpu_seconds_total",
    ];
    let gpm_values: Vec<&str> = saturation::gpm_families()
        .into_iter()
        .filter(|n| *n != "nvidia_gpu_gpm_supported")
        .collect();
    let missing: Vec<&str> = CATALOG
        .iter()
        .filter(|d| {
            d.source.is_per_device()
                && !event_driven.contains(&d.name)
                && !gpm_values.contains(&d.name)
        })
        .map(|d| d.name)
        .filter(|n| !served.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "catalog families no scenario serves: {missing:?}"
    );

    let catalog: BTreeSet<&str> = CATALOG.iter().map(|d| d.name).collect();
    let unknown: Vec<&String> = served
        .iter()
        .filter(|n| !n.starts_with("process_"))
        .filter(|n| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(n.as_str(), |s, suf| s.strip_suffix(suf).unwrap_or(s));
            !catalog.contains(n.as_str()) && !catalog.contains(family)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "served but not in the catalog: {unknown:?}"
    );
}

#[test]
fn the_default_node_reads_like_the_scenario_says() {
    let m = once("h100x8");
    let gpus = scenario_gpus("h100x8");
    for i in 0..8u32 {
        let info = &m.find("nvidia_gpu_info", &[("gpu", &i.to_string())])[0].labels;
        assert_eq!(info["name"], "NVIDIA H100 80GB HBM3");
        assert_eq!(info["architecture"], "hopper");
        assert_eq!(info["compute_capability"], "9.0");
        assert_eq!(
            m.gpu_value("nvidia_gpu_memory_total_bytes", i, &[]),
            Some(81559.0 * MIB),
            "gpu {i}"
        );
        // SXM boards are cooled by the chassis, and Hopper remaps rows instead of retiring pages.
        assert!(
            m.find("nvidia_gpu_fan_speed_ratio", &[("gpu", &i.to_string())])
                .is_empty()
        );
        assert!(
            m.find("nvidia_gpu_retired_pages", &[("gpu", &i.to_string())])
                .is_empty()
        );
        assert!(m.gpu_value("nvidia_gpu_row_remap_failed", i, &[]).is_some());
        assert_eq!(
            m.find("nvidia_gpu_nvlink_up", &[("gpu", &i.to_string())])
                .len(),
            18,
            "H100 SXM has 18 links"
        );
        let mem = |n: &str| m.gpu_value(n, i, &[]).unwrap();
        let sum = mem("nvidia_gpu_memory_used_bytes")
            + mem("nvidia_gpu_memory_free_bytes")
            + mem("nvidia_gpu_memory_reserved_bytes");
        assert!(
            (sum - mem("nvidia_gpu_memory_total_bytes")).abs() <= MIB,
            "gpu {i}: used+free+reserved = total"
        );
        let active = |r: &str| m.gpu_value("nvidia_gpu_clock_event_active", i, &[("reason", r)]);
        assert!(
            active("gpu_idle").is_some(),
            "gpu {i}: every reason is exported"
        );
        let power = mem("nvidia_gpu_power_watts");
        assert!(
            power > 0.0 && power <= mem("nvidia_gpu_power_limit_watts") + 1e-9,
            "gpu {i}: {power} W"
        );
        // Memory held by the scenario's processes is in use.
        let held: f64 = gpus[i as usize]
            .get("process")
            .and_then(|p| p.as_array())
            .map(|ps| {
                ps.iter()
                    .map(|p| p["used_memory_mib"].as_integer().unwrap() as f64 * MIB)
                    .sum()
            })
            .unwrap_or(0.0);
        assert!(
            mem("nvidia_gpu_memory_used_bytes") >= held,
            "gpu {i}: processes hold {held} bytes"
        );
    }

    // GPU 0 is idle: no kernel ran, and the driver says the clocks are down because of that.
    assert_eq!(
        m.gpu_value("nvidia_gpu_utilization_ratio", 0, &[]),
        Some(0.0)
    );
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_clock_event_active",
            0,
            &[("reason", "gpu_idle")]
        ),
        Some(1.0)
    );

    // GPU 2 trains flat out.
    assert_eq!(
        m.gpu_value("nvidia_gpu_utilization_ratio", 2, &[]),
        Some(1.0)
    );
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_clock_event_active",
            2,
            &[("reason", "gpu_idle")]
        ),
        Some(0.0)
    );

    // GPU 5 is capped at 450 W and runs hot: at the cap, power and thermal reasons active, SM
    // clock below its maximum, throttle time accumulated, over its slowdown threshold.
    assert_eq!(
        m.gpu_value("nvidia_gpu_power_limit_watts", 5, &[]),
        Some(450.0)
    );
    assert!(m.gpu_value("nvidia_gpu_power_watts", 5, &[]).unwrap() >= 440.0);
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_clock_event_active",
            5,
            &[("reason", "sw_power_cap")]
        ),
        Some(1.0)
    );
    let thermal = ["sw_thermal_slowdown", "hw_thermal_slowdown"]
        .iter()
        .any(|r| m.gpu_value("nvidia_gpu_clock_event_active", 5, &[("reason", r)]) == Some(1.0));
    assert!(thermal, "a thermal reason is active on GPU 5");
    let sm = |i| {
        m.gpu_value("nvidia_gpu_clock_hertz", i, &[("clock", "sm")])
            .unwrap()
    };
    assert!(
        sm(5)
            < m.gpu_value("nvidia_gpu_max_clock_hertz", 5, &[("clock", "sm")])
                .unwrap()
    );
    assert!(
        sm(5) < sm(2),
        "the capped GPU clocks lower than an uncapped one under load"
    );
    assert!(
        m.gpu_value(
            "nvidia_gpu_throttle_seconds_total",
            5,
            &[("reason", "power")]
        )
        .unwrap()
            > 0.0
    );
    let t5 = m
        .gpu_value("nvidia_gpu_temperature_celsius", 5, &[])
        .unwrap();
    let slowdown5 = m
        .gpu_value(
            "nvidia_gpu_temperature_threshold_celsius",
            5,
            &[("threshold", "slowdown")],
        )
        .unwrap();
    assert!(
        t5 >= slowdown5 - 1.0,
        "GPU 5 runs at its slowdown threshold: {t5} vs {slowdown5}"
    );
    assert!(
        m.gpu_value("nvidia_gpu_temperature_celsius", 0, &[])
            .unwrap()
            < t5
    );

    // GPU 6 has corrected ECC errors (volatile and lifetime), none uncorrected.
    let ecc = |n, t| m.gpu_value(n, 6, &[("error_type", t)]).unwrap();
    assert!(ecc("nvidia_gpu_ecc_errors_total", "corrected") > 0.0);
    assert_eq!(ecc("nvidia_gpu_ecc_errors_total", "uncorrected"), 0.0);
    assert!(
        ecc("nvidia_gpu_ecc_lifetime_errors", "corrected")
            >= ecc("nvidia_gpu_ecc_errors_total", "corrected")
    );
    assert_eq!(
        m.gpu_value(
            "nvidia_gpu_ecc_errors_total",
            0,
            &[("error_type", "corrected")]
        ),
        Some(0.0)
    );

    // GPU 7 is allocated but idle: memory held, no kernel running.
    assert_eq!(
        m.gpu_value("nvidia_gpu_utilization_ratio", 7, &[]),
        Some(0.0)
    );
    assert!(m.gpu_value("nvidia_gpu_memory_used_bytes", 7, &[]).unwrap() >= 20.0 * 1024.0 * MIB);

    // Energy is power integrated over the simulated minute.
    let e2 = m
        .gpu_value("nvidia_gpu_energy_joules_total", 2, &[])
        .unwrap();
    assert!(e2 > 60.0 * 100.0 && e2 < 60.0 * 700.0, "{e2} J in 60 s");
}

#[test]
fn other_models_answer_like_the_real_boards() {
    // A100: Ampere, remapped rows (one pending), no fan.
    let a100 = once("a100x4");
    assert_eq!(
        a100.find("nvidia_gpu_info", &[("architecture", "ampere")])
            .len(),
        4
    );
    assert!(
        a100.find("nvidia_gpu_row_remap_pending", &[])
            .iter()
            .any(|s| s.value == 1.0),
        "one A100 has a pending remap"
    );
    assert!(a100.find("nvidia_gpu_fan_speed_ratio", &[]).is_empty());

    // L4: PCIe card, no NVLink, video engines busy.
    let l4 = once("l4x2");
    assert!(l4.find("nvidia_gpu_nvlink_up", &[]).is_empty());
    assert!(
        l4.find("nvidia_gpu_encoder_utilization_ratio", &[])
            .iter()
            .any(|s| s.value > 0.0)
    );
    assert!(
        l4.find("nvidia_gpu_decoder_utilization_ratio", &[])
            .iter()
            .any(|s| s.value > 0.0)
    );

    // A blower-cooled workstation card reports its fan as a ratio.
    let ws = once("rtx6000ada");
    let fans = ws.find("nvidia_gpu_fan_speed_ratio", &[]);
    assert!(
        !fans.is_empty() && fans.iter().all(|s| (0.0..=1.0).contains(&s.value)),
        "{fans:?}"
    );

    // Volta retires pages instead of remapping rows.
    let v100 = once("v100x2");
    assert!(!v100.find("nvidia_gpu_retired_pages", &[]).is_empty());
    assert!(v100.find("nvidia_gpu_remapped_rows", &[]).is_empty());
}

//! `--dcgm-compat` end to end: the real exporter on the simulated H100s serves what dcgm-exporter's
//! own Grafana dashboard (12239) queries, the compat exposition of the default scenario matches
//! its golden file, and the option is read from the environment like every other.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Exporter, Exposition, assert_golden, run_once, scenario, strip_volatile};

/// Every query of dcgm-exporter's dashboard, one a line (`#` lines are comments).
const DASHBOARD: &str = include_str!("fixtures/dcgm/dashboard-12239.promql");

/// Labels the dashboard groups by that the exporter rightly does not serve: `uuid` (lowercase;
/// dcgm-exporter serves `UUID`, so the dashboard's `by (…, uuid)` groups on an absent label there
/// too) and the MIG instance labels, which dcgm-exporter only puts on GPU-instance series.
const NOT_SERVED_BY_DCGM_EXPORTER: &[&str] = &["uuid", "GPU_I_ID", "GPU_I_PROFILE"];

/// What one query needs: the metric names it selects and the labels it filters or groups by.
#[derive(Debug, Default, PartialEq)]
struct Needs {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// The metric names and label names a dashboard query uses. Handles what the dashboard's queries
/// contain: selectors with matchers, `by (…)` groupings and `label_values(selector, label)`.
fn needs(query: &str) -> Needs {
    let mut n = Needs::default();
    let mut rest = query.to_string();
    if let Some(args) = rest
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    {
        let (selector, label) = args
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        n.labels.insert(label.trim().to_string());
        rest = selector.to_string();
    }
    // Matchers inside braces.
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("closed selector");
        for matcher in rest[open + 1..close].split(',') {
            let name = matcher.split(['=', '!']).next().unwrap().trim();
            if !name.is_empty() {
                n.labels.insert(name.to_string());
            }
        }
        rest.replace_range(open..=close, " ");
    }
    // Groupings.
    while let Some(by) = rest.find("by (") {
        let open = by + 3;
        let close = open + rest[open..].find(')').expect("closed grouping");
        for label in rest[open + 1..close].split(',') {
            n.labels.insert(label.trim().to_string());
        }
        rest.replace_range(by..=close, " ");
    }
    for word in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("DCGM_") {
            n.metrics.insert(word.to_string());
        }
    }
    n
}

fn dashboard_queries() -> Vec<&'static str> {
    DASHBOARD
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn queries_are_parsed_into_metrics_and_labels() {
    let n = needs(
        r#"max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, UUID, gpu)"#,
    );
    assert_eq!(
        n.metrics,
        BTreeSet::from(["DCGM_FI_DEV_SM_CLOCK".to_string()])
    );
    assert_eq!(
        n.labels,
        ["Hostname", "UUID", "gpu"].map(String::from).into()
    );
    let n = needs(r#"label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)"#);
    assert_eq!(
        n.metrics,
        BTreeSet::from(["DCGM_FI_DEV_FB_FREE".to_string()])
    );
    assert_eq!(n.labels, ["Hostname", "gpu"].map(String::from).into());
    assert_eq!(
        dashboard_queries().len(),
        10,
        "the fixture lists all ten queries"
    );
}

/// Checks that `m` serves every metric each dashboard query selects, with every label it uses.
fn assert_dashboard_is_served(m: &Exposition, node: &str) {
    for query in dashboard_queries() {
        let n = needs(query);
        assert!(!n.metrics.is_empty(), "{query}");
        for metric in &n.metrics {
            let series = m.find(metric, &[]);
            assert!(!series.is_empty(), "{metric} not served (query: {query})");
            for label in n
                .labels
                .iter()
                .filter(|l| !NOT_SERVED_BY_DCGM_EXPORTER.contains(&l.as_str()))
            {
                assert!(
                    series.iter().all(|s| s.labels.contains_key(label)),
                    "{metric} lacks label {label} (query: {query})"
                );
            }
            // The dashboard's variables are label_values of `Hostname` and `gpu`.
            for s in &series {
                assert_eq!(s.labels.get("Hostname").map(String::as_str), Some(node));
                assert!(
                    s.labels
                        .get("gpu")
                        .is_some_and(|g| g.parse::<u32>().is_ok())
                );
            }
        }
    }
    // Every GPU of the scenario is selectable.
    let gpus: BTreeSet<&str> = m
        .find("DCGM_FI_DEV_FB_FREE", &[])
        .iter()
        .map(|s| s.labels["gpu"].as_str())
        .collect();
    assert_eq!(gpus.len(), 8, "{gpus:?}");
}

/// The exporter on the 8-GPU scenario with `args`, once the GPM-based fields are served (they
/// need two ticks).
fn exporter_with_gpm(args: &[&str]) -> (Exporter, Exposition) {
    let h100 = scenario("h100x8");
    let mut all = vec!["--interval", "200ms", "--log-level", "info"];
    all.extend_from_slice(args);
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", h100.to_str().unwrap()),
            ("NODE_NAME", "node-a"),
        ],
        &all,
    );
    let m = e.wait_metrics(Duration::from_secs(15), "GPM fields", |m| {
        !m.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[]).is_empty()
    });
    (e, m)
}

#[test]
fn dcgm_exporter_dashboard_queries_are_served_in_dcgm_mode() {
    let (_e, m) = exporter_with_gpm(&["--dcgm-compat"]);
    assert_dashboard_is_served(&m, "node-a");
    assert!(
        !m.names().iter().any(|n| n.starts_with("nvidia_gpu_")),
        "only dcgm-exporter's names for the GPUs"
    );
    assert_eq!(m.value("nvml_exporter_nvml_up", &[]), Some(1.0));
}

#[test]
fn dcgm_exporter_dashboard_queries_are_served_in_both_mode() {
    // The clocks group on, so that the native clocks are there to compare with.
    let (_e, m) = exporter_with_gpm(&["--dcgm-compat=both", "--collector.clocks"]);
    assert_dashboard_is_served(&m, "node-a");
    // Native names are served too, and come first: those of the groups on only, while the DCGM
    // fields of an opt-in group (clock-events) are served all the same.
    assert_eq!(m.find("nvidia_gpu_up", &[]).len(), 8);
    assert!(m.find("nvidia_gpu_throttle_seconds_total", &[]).is_empty());
    assert_eq!(m.find("DCGM_FI_DEV_POWER_VIOLATION", &[]).len(), 8);
    let first_dcgm = m.text.find("# HELP DCGM_").unwrap();
    assert!(m.text.rfind("\nnvidia_gpu_").unwrap() < first_dcgm);
    // Same snapshot, DCGM units: MiB of the native bytes, MHz of the native hertz.
    for gpu in 0..8 {
        let used = m
            .gpu_value("nvidia_gpu_memory_used_bytes", gpu, &[])
            .unwrap();
        let fb = m.gpu_value("DCGM_FI_DEV_FB_USED", gpu, &[]).unwrap();
        assert_eq!(fb, (used / 1_048_576.0).floor(), "gpu {gpu}");
        let sm = m.gpu_value("nvidia_gpu_clock_hertz", gpu, &[("clock", "sm")]);
        assert_eq!(
            m.gpu_value("DCGM_FI_DEV_SM_CLOCK", gpu, &[]),
            sm.map(|hz| (hz / 1e6).round()),
            "gpu {gpu}"
        );
        let sm_active = m.gpu_value("nvidia_gpu_sm_active_ratio", gpu, &[]);
        assert_eq!(m.gpu_value("DCGM_FI_PROF_SM_ACTIVE", gpu, &[]), sm_active);
    }
}

#[test]
fn default_scenario_matches_the_compat_golden_file() {
    let out = run_once(
        &[("NVML_SIM_TIME", "60"), ("NODE_NAME", "golden-node")],
        &["--dcgm-compat"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actual = strip_volatile(&String::from_utf8_lossy(&out.stdout));
    assert_golden("h100x8-dcgm.prom", &actual, "dcgm_compat");
}

#[test]
fn the_mode_comes_from_the_environment_and_a_bad_one_exits_2() {
    let out = run_once(&[("NVML_EXPORTER_DCGM_COMPAT", "both")], &[]);
    assert_eq!(out.status.code(), Some(0));
    let m = Exposition::parse(&String::from_utf8_lossy(&out.stdout));
    assert!(!m.find("nvidia_gpu_up", &[]).is_empty());
    assert!(!m.find("DCGM_FI_DEV_GPU_TEMP", &[]).is_empty());

    let out = run_once(&[("NVML_EXPORTER_DCGM_COMPAT", "everything")], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dcgm-compat"), "{stderr}");
}

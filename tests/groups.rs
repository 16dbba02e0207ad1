//! Collector groups end to end: the default groups keep the demo's H100s at 40 series per GPU or
//! fewer (saturation and an XID included), every group turns on and off by flag, file and
//! environment, a group that is off makes none of its NVML calls, and an unknown name exits 2.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use common::{Exporter, Exposition, run_once, scenario};
use nvml_exporter::groups::{Group, Groups};
use nvml_exporter::metrics::catalog::CATALOG;

/// The budget of the issue: series per GPU a fleet pays for by default.
const MAX_SERIES_PER_GPU: usize = 40;

/// Series per `gpu` label value.
fn series_per_gpu(m: &Exposition) -> BTreeMap<String, usize> {
    let mut per_gpu = BTreeMap::new();
    for s in &m.series {
        if let Some(gpu) = s.labels.get("gpu") {
            *per_gpu.entry(gpu.clone()).or_insert(0) += 1;
        }
    }
    per_gpu
}

#[test]
fn the_default_demo_serves_at_most_40_series_per_gpu() {
    // The simulated clock starts 2 s before GPU 6's XID 79, so its XID series count too.
    let e = Exporter::start(&[("NVML_SIM_START", "28")], &["--interval", "250ms"]);
    let m = e.wait_metrics(
        Duration::from_secs(20),
        "saturation on all 8 GPUs and GPU 6's XID",
        |m| {
            (0..8).all(|g| m.gpu_value("nvidia_gpu_sm_active_ratio", g, &[]).is_some())
                && m.gpu_value("nvidia_gpu_xid_errors_total", 6, &[("xid", "79")]) == Some(1.0)
        },
    );
    let per_gpu = series_per_gpu(&m);
    assert_eq!(per_gpu.len(), 8, "{per_gpu:?}");
    for (gpu, n) in &per_gpu {
        assert!(
            *n <= MAX_SERIES_PER_GPU,
            "GPU {gpu} has {n} series by default, over {MAX_SERIES_PER_GPU}:\n{}",
            m.text
        );
    }
    for g in 0..8 {
        // NVLink per GPU: 18 links up, bytes and the four error types summed over them.
        assert_eq!(
            m.gpu_value("nvidia_gpu_nvlink_links_up", g, &[]),
            Some(18.0)
        );
        assert!(
            m.gpu_value("nvidia_gpu_nvlink_links_transmit_bytes_total", g, &[])
                .is_some()
        );
        assert_eq!(
            m.find(
                "nvidia_gpu_nvlink_links_errors_total",
                &[("gpu", &g.to_string())]
            )
            .len(),
            4
        );
        assert!(
            m.find("nvidia_gpu_nvlink_up", &[]).is_empty(),
            "per link is opt-in"
        );
    }
    // GPU 5 is held down by a SW thermal slowdown (the scenario's hot GPU), the others are not.
    for g in 0..8 {
        let want = if g == 5 { 1.0 } else { 0.0 };
        assert_eq!(
            m.gpu_value("nvidia_gpu_thermal_slowdown_active", g, &[]),
            Some(want),
            "GPU {g}"
        );
    }
}

#[test]
fn an_nvswitch_node_with_fabric_reasons_stays_within_40_series_per_gpu() {
    // fabric.toml: every GPU serves its fabric state; GPUs 2 and 5 a fabric reason too.
    let scenario = scenario("fabric");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", scenario.to_str().unwrap())],
        &["--interval", "250ms", "--fabric-registration-timeout", "0s"],
    );
    let m = e.wait_metrics(
        Duration::from_secs(20),
        "saturation on all 8 GPUs and GPU 2's fabric reason",
        |m| {
            (0..8).all(|g| m.gpu_value("nvidia_gpu_sm_active_ratio", g, &[]).is_some())
                && !m
                    .find("nvidia_gpu_health_reason", &[("gpu", "2")])
                    .is_empty()
        },
    );
    let per_gpu = series_per_gpu(&m);
    assert_eq!(per_gpu.len(), 8, "{per_gpu:?}");
    for (gpu, n) in &per_gpu {
        assert!(
            *n <= MAX_SERIES_PER_GPU,
            "GPU {gpu} has {n} series by default, over {MAX_SERIES_PER_GPU}:\n{}",
            m.text
        );
    }
    assert_eq!(m.find("nvidia_gpu_fabric_state", &[]).len(), 8);
}

#[test]
fn the_per_gpu_nvlink_sums_equal_the_per_link_series() {
    let m = once(&["--collector.nvlink-links"]);
    for g in 0..8u32 {
        let gpu = g.to_string();
        let sum = |name: &str, labels: &[(&str, &str)]| -> f64 {
            let mut l = vec![("gpu", gpu.as_str())];
            l.extend_from_slice(labels);
            m.find(name, &l).iter().map(|s| s.value).sum()
        };
        assert_eq!(
            m.gpu_value("nvidia_gpu_nvlink_links_up", g, &[]),
            Some(sum("nvidia_gpu_nvlink_up", &[]))
        );
        assert_eq!(
            m.gpu_value("nvidia_gpu_nvlink_links_receive_bytes_total", g, &[]),
            Some(sum("nvidia_gpu_nvlink_receive_bytes_total", &[]))
        );
        for t in ["crc_flit", "crc_data", "replay", "recovery"] {
            assert_eq!(
                m.gpu_value(
                    "nvidia_gpu_nvlink_links_errors_total",
                    g,
                    &[("error_type", t)]
                ),
                Some(sum("nvidia_gpu_nvlink_errors_total", &[("error_type", t)])),
                "GPU {g} {t}"
            );
        }
    }
}

/// `--once` on the default scenario with `args`, parsed.
fn once(args: &[&str]) -> Exposition {
    once_env(&[], args)
}

fn once_env(env: &[(&str, &str)], args: &[&str]) -> Exposition {
    let mut all_env = vec![("NVML_SIM_TIME", "60")];
    all_env.extend_from_slice(env);
    let out = run_once(&all_env, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Exposition::parse(&String::from_utf8_lossy(&out.stdout))
}

/// The per-GPU families served.
fn gpu_families(m: &Exposition) -> BTreeSet<String> {
    m.series
        .iter()
        .filter(|s| s.labels.contains_key("gpu"))
        .map(|s| s.name.clone())
        .collect()
}

/// The catalog's per-GPU families of `groups` that the default scenario serves with `--once`
/// (every group on shows which those are).
fn expected(groups: Groups, served_by_all: &BTreeSet<String>) -> BTreeSet<String> {
    CATALOG
        .iter()
        .filter(|d| groups.contains(d.group) && served_by_all.contains(d.name))
        .map(|d| d.name.to_string())
        .collect()
}

#[test]
fn each_group_alone_and_all_but_each_serve_exactly_their_families() {
    let all_flags = common::every_group();
    let all_args = common::with_every_group(&all_flags, &[]);
    let served_by_all = gpu_families(&once(&all_args));
    assert_eq!(
        served_by_all,
        expected(Groups::all(), &served_by_all),
        "every group on"
    );
    let defaults = gpu_families(&once(&[]));
    assert_eq!(defaults, expected(Groups::defaults(), &served_by_all));
    for g in Group::switchable() {
        let on = format!("--collector.{}", g.name);
        let alone = gpu_families(&once(&["--collector.disable-defaults", &on]));
        assert_eq!(
            alone,
            expected(Groups::none().with(g.group), &served_by_all),
            "{} alone",
            g.name
        );
        let off = format!("--no-collector.{}", g.name);
        let mut args = all_args.clone();
        args.push(&off);
        let all_but = gpu_families(&once(&args));
        assert_eq!(
            all_but,
            expected(Groups::all().without(g.group), &served_by_all),
            "all but {}",
            g.name
        );
    }
}

#[test]
fn groups_are_switched_by_file_and_environment_and_flags_win() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        f,
        "collector.nvlink-links = true\ncollector.memory = false\ncollector.clocks = true"
    )
    .unwrap();
    let path = f.path().to_str().unwrap();
    let m = once(&["--config", path]);
    let families = gpu_families(&m);
    assert!(families.contains("nvidia_gpu_nvlink_up"));
    assert!(families.contains("nvidia_gpu_clock_hertz"));
    assert!(!families.contains("nvidia_gpu_memory_used_bytes"));

    // The environment beats the file, a flag beats both.
    let m = once_env(
        &[
            ("NVML_EXPORTER_COLLECTOR_MEMORY", "true"),
            ("NVML_EXPORTER_COLLECTOR_NVLINK_LINKS", "false"),
        ],
        &["--config", path, "--no-collector.clocks"],
    );
    let families = gpu_families(&m);
    assert!(families.contains("nvidia_gpu_memory_used_bytes"));
    assert!(!families.contains("nvidia_gpu_nvlink_up"));
    assert!(!families.contains("nvidia_gpu_clock_hertz"));
    let m = once_env(
        &[("NVML_EXPORTER_COLLECTOR_DISABLE_DEFAULTS", "true")],
        &["--collector.power"],
    );
    assert_eq!(
        gpu_families(&m),
        gpu_families(&once(&[
            "--collector.disable-defaults",
            "--collector.power"
        ]))
    );
    // Of two flags of one group, the later wins.
    let m = once(&["--no-collector.memory", "--collector.memory"]);
    assert!(gpu_families(&m).contains("nvidia_gpu_memory_used_bytes"));
    let m = once(&["--collector.memory", "--no-collector.memory"]);
    assert!(!gpu_families(&m).contains("nvidia_gpu_memory_used_bytes"));
}

#[test]
fn a_group_that_is_off_makes_no_nvml_calls() {
    // At t = 14 s of faults.toml every nvmlDeviceGetClockInfo call fails with UNKNOWN, and GPU 0's
    // nvmlDeviceGetPowerUsage too: a failed call is counted, a call not made is not.
    let faults = scenario("faults");
    let env = [
        ("NVML_SIM_SCENARIO", faults.to_str().unwrap()),
        ("NVML_SIM_TIME", "14"),
    ];
    let errors = |args: &[&str]| -> BTreeSet<String> {
        let out = run_once(&env, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let m = Exposition::parse(&String::from_utf8_lossy(&out.stdout));
        m.find("nvml_exporter_nvml_errors_total", &[])
            .iter()
            .map(|s| s.labels["function"].clone())
            .collect()
    };
    let default = errors(&[]);
    assert!(default.contains("nvmlDeviceGetPowerUsage"), "{default:?}");
    assert!(
        !default.contains("nvmlDeviceGetClockInfo"),
        "clocks are off by default: {default:?}"
    );
    let with_clocks = errors(&["--collector.clocks", "--no-collector.power"]);
    assert!(
        with_clocks.contains("nvmlDeviceGetClockInfo"),
        "{with_clocks:?}"
    );
    assert!(
        !with_clocks.contains("nvmlDeviceGetPowerUsage"),
        "{with_clocks:?}"
    );
}

#[test]
fn an_unknown_group_exits_2_naming_it_and_the_valid_ones() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "interval = \"1s\"\ncollector.nvlinks = true").unwrap();
    let path = f.path().to_str().unwrap().to_string();
    for (env, args) in [
        (vec![], vec!["--collector.nvlinks"]),
        (vec![], vec!["--no-collector.nvlinks=true"]),
        (vec![("NVML_EXPORTER_COLLECTOR_NVLINKS", "true")], vec![]),
        (vec![], vec!["--config", path.as_str()]),
    ] {
        let out = run_once(&env, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?} {args:?}: {stderr}");
        assert!(
            stderr.contains("unknown collector group") && stderr.contains("nvlinks"),
            "{stderr}"
        );
        for g in Group::switchable() {
            assert!(stderr.contains(g.name), "{} not listed: {stderr}", g.name);
        }
    }
    // The file's error names its line.
    let out = run_once(&[], &["--config", &path]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn help_lists_every_group_with_its_default() {
    let out = common::exporter_command(&[], &["--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for g in Group::switchable() {
        assert!(
            help.contains(&format!("--collector.{}", g.name)),
            "{}",
            g.name
        );
    }
    assert!(help.contains("--collector.disable-defaults"));
    assert!(help.contains("--no-collector.NAME"));
}

#[test]
fn every_alert_rule_reads_families_of_default_groups() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yaml");
    let rules = std::fs::read_to_string(path).unwrap();
    let mut used = BTreeSet::new();
    for (i, _) in rules.match_indices("nvidia_gpu_") {
        let name: String = rules[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        used.insert(name);
    }
    let mut checked = 0;
    for def in CATALOG.iter().filter(|d| used.contains(d.name)) {
        assert!(
            Groups::defaults().contains(def.group),
            "alerts.yaml reads {} of the {} group, which is off by default",
            def.name,
            def.group
        );
        checked += 1;
    }
    // The rules read a dozen families (the other names are recording rules' own).
    assert!(checked >= 10, "{used:?}");
}

#[test]
fn over_max_series_the_per_link_series_go_first_with_one_log_line() {
    // Every NVLink link of 8 GPUs (1,008 series) on top of the defaults (296): per link must go.
    let e = Exporter::start(
        &[],
        &[
            "--interval",
            "100ms",
            "--collector.nvlink-links",
            "--max-series",
            "400",
            "--log-level",
            "info",
        ],
    );
    let dropped = |m: &Exposition| {
        m.value(
            "nvml_exporter_series_dropped_total",
            &[("group", "nvlink-links")],
        )
    };
    let first = e.wait_metrics(Duration::from_secs(10), "a dropped group", |m| {
        dropped(m).is_some()
    });
    let m = e.wait_metrics(Duration::from_secs(10), "more ticks dropping", |m| {
        dropped(m) > dropped(&first)
    });
    let gpu_series = m
        .series
        .iter()
        .filter(|s| s.name.starts_with("nvidia_gpu_"))
        .count();
    assert!(gpu_series <= 400, "{gpu_series} GPU series served");
    assert!(m.find("nvidia_gpu_nvlink_up", &[]).is_empty());
    assert_eq!(m.find("nvidia_gpu_nvlink_links_up", &[]).len(), 8);
    assert_eq!(
        m.value("nvml_exporter_series", &[("group", "nvlink-links")]),
        Some(0.0)
    );
    assert_eq!(
        m.value("nvml_exporter_series", &[("group", "memory")]),
        Some(32.0)
    );
    assert_eq!(
        dropped(&m).unwrap() % 1008.0,
        0.0,
        "whole ticks of 1,008 series"
    );
    let logs = e.logs();
    assert_eq!(
        logs.matches("over --max-series").count(),
        1,
        "one line when it starts dropping:\n{logs}"
    );
    assert!(logs.contains("nvlink-links"), "{logs}");
}

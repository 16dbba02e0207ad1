//! The exporter's own series: NVML state, build, tick durations, scrapes, connections.

use super::*;

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
fn each_observed_tick_is_counted_in_the_duration_histogram() {
    let enc = Encoder::new(MetricsOptions::default(), prometheus::Registry::new());
    let snap = snapshot(vec![]);
    enc.observe_tick(0.012);
    enc.encode(&snap);
    enc.observe_tick(0.012);
    let text = String::from_utf8(enc.encode(&snap)).unwrap();
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
    // Encoding again (a kubelet change) counts no tick.
    let again = String::from_utf8(enc.encode(&snap)).unwrap();
    assert_eq!(
        value(&again, "nvml_exporter_sample_duration_seconds_count"),
        Some(2.0)
    );
}

#[test]
fn scrapes_appear_in_the_next_encoding() {
    let registry = prometheus::Registry::new();
    let scrapes = crate::http::ScrapeCounter::new(&registry);
    let enc = Encoder::new(MetricsOptions::default(), registry);
    let snap = snapshot(vec![]);
    let before = String::from_utf8(enc.encode(&snap)).unwrap();
    assert_eq!(
        value(&before, r#"nvml_exporter_scrapes_total{code="200"}"#),
        Some(0.0)
    );
    scrapes.count(200);
    scrapes.count(200);
    scrapes.count(405);
    let after = String::from_utf8(enc.encode(&snap)).unwrap();
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
fn connections_open_and_closed_by_reason_appear_in_the_next_encoding() {
    use crate::http::connections::{CloseReason, ConnectionMetrics};
    let registry = prometheus::Registry::new();
    let connections = ConnectionMetrics::new(&registry);
    let enc = Encoder::new(MetricsOptions::default(), registry);
    let snap = snapshot(vec![]);
    let before = String::from_utf8(enc.encode(&snap)).unwrap();
    assert_eq!(value(&before, "nvml_exporter_http_connections"), Some(0.0));
    for reason in CloseReason::ALL {
        let series = format!(
            r#"nvml_exporter_http_connections_closed_total{{reason="{}"}}"#,
            reason.label()
        );
        assert_eq!(value(&before, &series), Some(0.0), "{series}");
    }
    connections.open.inc();
    connections.open.inc();
    connections.closed(CloseReason::WriteTimeout);
    let after = String::from_utf8(enc.encode(&snap)).unwrap();
    assert_eq!(value(&after, "nvml_exporter_http_connections"), Some(2.0));
    assert_eq!(
        value(
            &after,
            r#"nvml_exporter_http_connections_closed_total{reason="write_timeout"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn max_series_leaves_out_the_most_detailed_groups_first_and_counts_them() {
    use crate::groups::Groups;
    // Two GPUs with 18 links each: per link is the bulk.
    let snap = snapshot(vec![full_device(0), full_device(1)]);
    let all = Encoder::new(MetricsOptions::default(), prometheus::Registry::new());
    let full = String::from_utf8(all.encode(&snap)).unwrap();
    let served = |text: &str, group: &str| -> f64 {
        let prefix = format!("nvml_exporter_series{{group=\"{group}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    };
    let gpu_series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("nvidia_gpu_"))
            .count()
    };
    let total = gpu_series(&full);
    assert_eq!(
        Groups::all()
            .iter()
            .map(|g| served(&full, g.name()))
            .sum::<f64>(),
        total as f64,
        "every GPU series is counted in one group"
    );
    let links = served(&full, "nvlink-links") as usize;
    let processes = served(&full, "processes") as usize;
    assert!(links > 0);
    // The groups dropped before the per-link series.
    let before: usize = ["processes", "jobs", "workloads"]
        .iter()
        .map(|g| served(&full, g) as usize)
        .sum();

    // Room for all but the per-link series and the groups dropped before them.
    let max = total - links - before;
    let enc = Encoder::new(
        MetricsOptions {
            max_series: Some(max),
            ..MetricsOptions::default()
        },
        prometheus::Registry::new(),
    );
    for round in 1..=2 {
        let text = String::from_utf8(enc.encode(&snap)).unwrap();
        assert!(gpu_series(&text) <= max);
        assert!(!text.contains("nvidia_gpu_nvlink_up{"), "per link left out");
        assert!(text.contains("nvidia_gpu_nvlink_links_up{"), "per GPU kept");
        assert!(text.contains("nvidia_gpu_info{") && text.contains("nvidia_gpu_up{"));
        assert_eq!(served(&text, "nvlink-links"), 0.0);
        assert!(
            text.contains(&format!(
                "nvml_exporter_series_dropped_total{{group=\"nvlink-links\"}} {}",
                links * round
            )),
            "{text}"
        );
        if processes > 0 {
            assert!(!text.contains("nvidia_gpu_process_"));
        }
        assert!(!text.contains("series_dropped_total{group=\"memory\"}"));
    }
    // A limit below the identity series leaves every other group out, never identity, up and
    // the pod assignment (the core group).
    let enc = Encoder::new(
        MetricsOptions {
            max_series: Some(1),
            ..MetricsOptions::default()
        },
        prometheus::Registry::new(),
    );
    let text = String::from_utf8(enc.encode(&snap)).unwrap();
    let gpu_families: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("nvidia_gpu_"))
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    assert_eq!(
        gpu_families.into_iter().collect::<Vec<_>>(),
        ["nvidia_gpu_info", "nvidia_gpu_pod_info", "nvidia_gpu_up"],
        "only the core group's"
    );
}

#[test]
fn exposition_bytes_is_the_previous_exposition_size() {
    let enc = Encoder::new(MetricsOptions::default(), prometheus::Registry::new());
    let snap = snapshot(vec![full_device(0)]);
    let first = enc.encode(&snap);
    assert!(!String::from_utf8_lossy(&first).contains("nvml_exporter_exposition_bytes"));
    let second = String::from_utf8(enc.encode(&snap)).unwrap();
    let line = format!("nvml_exporter_exposition_bytes {}", first.len());
    assert!(second.contains(&line), "{line} missing");
}

/// Series served under dcgm-exporter's names.
fn dcgm_series(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("DCGM_FI_")).count()
}

/// Sum of `nvml_exporter_series_dropped_total` over its groups.
fn dropped_total(text: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("nvml_exporter_series_dropped_total{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

#[test]
fn max_series_counts_and_leaves_out_dcgm_exporter_names_too() {
    use crate::groups::{DROP_ORDER, Group};
    use crate::metrics::dcgm::DcgmCompat;
    let snap = snapshot(vec![full_device(0), full_device(1)]);
    let with = |dcgm_compat, max_series| {
        let enc = Encoder::new(
            MetricsOptions {
                dcgm_compat,
                max_series,
                ..MetricsOptions::default()
            },
            prometheus::Registry::new(),
        );
        String::from_utf8(enc.encode(&snap)).unwrap()
    };
    let gpu_series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("nvidia_gpu_"))
            .count()
    };

    // Under dcgm-exporter's names only: room for all but one series.
    let full = with(DcgmCompat::Dcgm, None);
    let total = dcgm_series(&full);
    assert!(total > 40, "{full}");
    assert_eq!(gpu_series(&full), 0);
    let text = with(DcgmCompat::Dcgm, Some(total - 1));
    let served = dcgm_series(&text);
    assert!(served < total && served > 0, "{served} of {total}");
    assert_eq!(dropped_total(&text), (total - served) as f64, "{text}");
    // The first group of the drop order that has DCGM fields is the one left out.
    let first = DROP_ORDER
        .iter()
        .find(|g| {
            dcgm::served()
                .any(|(def, d)| def.group == **g && full.contains(&format!("\n{}{{", d.field)))
        })
        .unwrap();
    let line = format!(
        "nvml_exporter_series_dropped_total{{group=\"{}\"}}",
        first.name()
    );
    assert!(text.contains(&line), "{line} missing:\n{text}");
    for (def, d) in dcgm::served() {
        if def.group == *first {
            assert!(!text.contains(&format!("\n{}{{", d.field)), "{}", d.field);
        }
    }
    assert!(text.contains("\nDCGM_FI_DEV_GPU_UTIL{"), "vital signs kept");
    assert_ne!(*first, Group::Utilization);

    // Both names: the two count together.
    let full = with(DcgmCompat::Both, None);
    let total = dcgm_series(&full) + gpu_series(&full);
    let max = total - gpu_series(&full) / 2;
    let text = with(DcgmCompat::Both, Some(max));
    let served = dcgm_series(&text) + gpu_series(&text);
    assert!(served <= max, "{served} > {max}");
    assert_eq!(dropped_total(&text), (total - served) as f64);
}

#[test]
fn max_series_never_encodes_the_series_it_leaves_out() {
    // 100,000 jobs on one GPU: millions of bytes were they encoded.
    let mut snap = snapshot(vec![full_device(0)]);
    let mut state = jobs(&[]);
    state.jobs = (0..100_000)
        .map(|i| JobAssignment {
            gpu: 0,
            gpu_instance: None,
            job: format!("{i:08}"),
        })
        .collect();
    snap.jobs = Some(state);
    let all = Encoder::new(MetricsOptions::default(), prometheus::Registry::new()).encode(&snap);
    let job_series = String::from_utf8_lossy(&all)
        .lines()
        .filter(|l| l.starts_with("nvidia_gpu_job_info{"))
        .count();
    assert_eq!(job_series, 100_000);
    let enc = Encoder::new(
        MetricsOptions {
            max_series: Some(1_000),
            ..MetricsOptions::default()
        },
        prometheus::Registry::new(),
    );
    let out = enc.encode(&snap);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("nvidia_gpu_job_info"));
    assert!(
        text.contains("nvidia_gpu_memory_used_bytes{"),
        "the rest is served"
    );
    assert!(
        text.contains("nvml_exporter_series_dropped_total{group=\"jobs\"} 100000"),
        "{text}"
    );
    // The buffer never held them: it grew only as far as what is served.
    assert!(
        out.capacity() < all.len() / 10,
        "{} bytes of buffer for {} served, {} with the jobs",
        out.capacity(),
        out.len(),
        all.len()
    );
}

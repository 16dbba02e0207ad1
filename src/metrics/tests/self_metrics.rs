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
    let enc = Encoder::new(MetricsOptions::default());
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
    let enc = Encoder::new(MetricsOptions::default());
    let snap = snapshot(vec![]);
    let before = String::from_utf8(enc.encode(&snap)).unwrap();
    assert_eq!(
        value(&before, r#"nvml_exporter_scrapes_total{code="200"}"#),
        Some(0.0)
    );
    enc.count_scrape(200);
    enc.count_scrape(200);
    enc.count_scrape(405);
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
    use crate::http::connections::CloseReason;
    let enc = Encoder::new(MetricsOptions::default());
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
    let connections = enc.connection_metrics();
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

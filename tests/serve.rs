//! The HTTP side of the running exporter, against the default simulated node: endpoints, gzip,
//! readiness, method handling, graceful shutdown, and serving before NVML is available.

mod common;

use common::{Exporter, Exposition, http_get, http_request};
use std::io::Read;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn serves_metrics_health_readiness_and_landing_page() {
    let mut e = Exporter::start(&[], &["--interval", "200ms", "--stale-grace", "1s"]);
    e.wait_ready(WAIT);
    assert_eq!(e.get("/healthz").status, 200);

    let m = e.wait_metrics(WAIT, "8 GPUs up", |m| {
        m.find("nvidia_gpu_up", &[])
            .iter()
            .filter(|s| s.value == 1.0)
            .count()
            == 8
    });
    assert_eq!(m.value("nvml_exporter_nvml_up", &[]), Some(1.0));
    assert_eq!(m.value("nvml_exporter_gpus", &[]), Some(8.0));
    assert!(
        m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .unwrap()
            > 1.7e9
    );

    let r = e.get("/metrics");
    let ctype = r.header("content-type").unwrap_or_default().to_string();
    assert!(
        ctype.starts_with("text/plain") && ctype.contains("version=0.0.4"),
        "{ctype}"
    );

    let landing = e.get("/");
    assert_eq!(landing.status, 200);
    let html = landing.text();
    assert!(
        html.contains("/metrics") && html.contains("NVIDIA H100"),
        "{html}"
    );

    // Ticks keep coming: the timestamp moves.
    let first = m
        .value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap();
    e.wait_metrics(WAIT, "a newer tick", |m| {
        m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .unwrap_or(0.0)
            > first
    });

    let status = e
        .terminate(Duration::from_secs(10))
        .expect("exits within 10 s of SIGTERM");
    assert!(status.success(), "{status:?}\n{}", e.logs());
}

#[test]
fn metrics_are_gzipped_when_asked() {
    let e = Exporter::start(&[], &[]);
    e.wait_ready(WAIT);
    let plain = e.get("/metrics");
    assert_eq!(plain.header("content-encoding"), None);

    let gz = http_get(&e.url("/metrics"), &[("Accept-Encoding", "gzip, deflate")]);
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz.body[..])
        .read_to_string(&mut text)
        .expect("valid gzip");
    let m = Exposition::parse(&text);
    assert_eq!(m.value("nvml_exporter_gpus", &[]), Some(8.0));
    assert!(
        gz.body.len() * 3 < plain.body.len(),
        "gzip {} vs plain {} bytes",
        gz.body.len(),
        plain.body.len()
    );

    let refused = http_get(&e.url("/metrics"), &[("Accept-Encoding", "gzip;q=0")]);
    assert_eq!(refused.header("content-encoding"), None, "q=0 refuses gzip");
}

#[test]
fn unknown_paths_404_wrong_methods_405_head_works() {
    let e = Exporter::start(&[], &[]);
    assert_eq!(e.get("/nope").status, 404);
    assert_eq!(http_request("POST", &e.url("/metrics"), &[]).status, 405);
    let head = http_request("HEAD", &e.url("/metrics"), &[]);
    assert_eq!(head.status, 200);
    assert_eq!(http_request("HEAD", &e.url("/healthz"), &[]).status, 200);
}

#[test]
fn serves_and_reports_not_ready_without_nvml() {
    let mut e = Exporter::start_raw(&[], &["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    assert_eq!(e.get("/healthz").status, 200);
    let m = e.wait_metrics(WAIT, "nvml_up 0", |m| {
        m.value("nvml_exporter_nvml_up", &[]) == Some(0.0)
    });
    assert_eq!(m.find("nvidia_gpu_up", &[]).len(), 0);
    let r = e.get("/readyz");
    assert_eq!(r.status, 503);
    assert!(
        r.text().contains("/nonexistent/libnvidia-ml.so.1"),
        "readyz says why: {}",
        r.text()
    );
    assert!(e.alive(), "keeps running and retrying");
    assert!(
        e.terminate(Duration::from_secs(10))
            .expect("exits on SIGTERM")
            .success()
    );
}

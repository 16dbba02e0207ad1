//! The HTTP side of the running exporter, against the default simulated node: endpoints, gzip,
//! readiness, method handling, request bodies, graceful shutdown, SIGHUP, and serving before
//! NVML is available.

mod common;

use common::{Exporter, Exposition, eventually, http_get, http_request};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn serves_metrics_health_readiness_and_the_node_page() {
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

    let page = e.get("/");
    assert_eq!(page.status, 200);
    let html = page.text();
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
    // Before the first attempt `/readyz` says "no sample yet"; after it, why NVML is not there.
    let mut last = String::new();
    common::poll_until(WAIT, || {
        let r = e.get("/readyz");
        assert_eq!(r.status, 503);
        last = r.text();
        last.contains("/nonexistent/libnvidia-ml.so.1")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("readyz says why: {last}"));
    assert!(e.alive(), "keeps running and retrying");
    assert!(
        e.terminate(Duration::from_secs(10))
            .expect("exits on SIGTERM")
            .success()
    );
}

#[test]
fn sighup_reloads_and_the_exporter_keeps_serving() {
    let mut e = Exporter::start(&[], &["--interval", "200ms"]);
    e.wait_ready(WAIT);
    e.signal(libc::SIGHUP);
    eventually(WAIT, "the reload's log line", || {
        e.logs().contains("configuration reloaded").then_some(())
    });
    assert!(e.alive(), "SIGHUP ended the process\n{}", e.logs());
    assert!(e.logs().contains("SIGHUP received"), "{}", e.logs());
    assert_eq!(e.get("/metrics").status, 200);
    e.wait_ready(WAIT);
    let status = e
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// One HTTP/1.1 response read off `stream`: status, head and the body its Content-Length gives.
fn read_response(stream: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("a whole response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .expect("content-length");
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("the whole body");
    (status, head, body)
}

fn connect(e: &Exporter) -> TcpStream {
    let stream = TcpStream::connect(e.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream
}

#[test]
fn a_request_body_that_arrives_late_still_gets_the_whole_response() {
    let e = Exporter::start(&[], &[]);
    e.wait_ready(WAIT);
    let expected = e.get("/metrics").body.len();
    let mut s = connect(&e);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        .unwrap();
    // The exporter waits for the body before it answers.
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let early = s.read(&mut [0u8; 1]);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "answered before the body arrived: {early:?}"
    );
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(b"hello").unwrap();
    let (status, head, body) = read_response(&mut s);
    assert_eq!(status, 200, "{head}");
    // Sizes of two ticks' expositions differ by a few digits at most.
    assert!(
        body.len().abs_diff(expected) < 256,
        "{} vs {expected}",
        body.len()
    );
    // The connection is still good for the next request.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (status, _, body) = read_response(&mut s);
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
}

#[test]
fn a_request_body_too_large_is_refused_whole_and_the_connection_closed() {
    let e = Exporter::start(&[], &[]);
    let mut s = connect(&e);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        .unwrap();
    let (status, head, body) = read_response(&mut s);
    assert_eq!(status, 413, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert_eq!(body, b"request body too large\n");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .expect("a clean close, not a reset");
    assert!(rest.is_empty(), "{rest:?}");
}

//! OTLP push on the real binary against a receiver built on the official OTLP definitions
//! (`otlp/receiver.rs`), over gRPC and HTTP/protobuf: every request decodes, holds the series
//! `/metrics` serves at the same tick with equal values under the names, units, instruments and
//! attributes of the mapping table, and the resource; then the faults, each counted on
//! `/metrics`, logged once, with `/metrics` and the sampling going on and pushes resuming: the
//! receiver down at the start (the queue bounded, memory flat), refusing for a while, slower than
//! the timeout, answering a partial success, and demanding a header the exporter lacks until the
//! headers file, read again on reload, has it. TLS with a CA, mTLS, and a reload that turns the
//! push on and off.

mod common;
mod otlp {
    pub mod receiver;
}

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::certs::Ca;
use common::{Exporter, Exposition, eventually, scenario, write_atomic};
use nvml_exporter::otlp::mapping::{
    self, HEALTH_STATES, Instrument, MIG_ATTRIBUTES, POD_ATTRIBUTES, Push,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, metric, number_data_point};
use otlp::receiver::{Mode, Protocol, Receiver, ReceiverTls};

/// Long enough for a few pushes and reloads on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// One data point as the comparison sees it: metric name, attributes (values as text), value.
type Point = (String, BTreeMap<String, String>, f64);

/// An attribute's value as text.
fn text_of(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        other => panic!("{}: unexpected value {other:?}", kv.key),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text_of(kv))).collect()
}

/// Every point of `request`, with each metric's instrument and unit checked against the
/// mapping, and every sum cumulative with a start time at or before its time.
fn points(request: &ExportMetricsServiceRequest) -> Vec<Point> {
    let mut points = Vec::new();
    for rm in &request.resource_metrics {
        for sm in &rm.scope_metrics {
            assert_eq!(sm.scope.as_ref().unwrap().name, "nvml-exporter");
            for m in &sm.metrics {
                let rows: Vec<mapping::Metric> = mapping::MAPPING
                    .iter()
                    .filter_map(|r| match r.push {
                        Push::Metric(mm) if mm.name == m.name => Some(mm),
                        _ => None,
                    })
                    .collect();
                let row = rows
                    .first()
                    .unwrap_or_else(|| panic!("{} is in no row", m.name));
                assert_eq!(m.unit, row.unit, "{}", m.name);
                assert!(!m.description.is_empty(), "{}", m.name);
                let data_points = match m.data.as_ref().unwrap() {
                    metric::Data::Gauge(g) => {
                        assert_eq!(row.instrument, Instrument::Gauge, "{}", m.name);
                        &g.data_points
                    }
                    metric::Data::Sum(s) => {
                        assert_eq!(
                            s.aggregation_temporality,
                            AggregationTemporality::Cumulative as i32,
                            "{}",
                            m.name
                        );
                        assert_eq!(
                            s.is_monotonic,
                            row.instrument == Instrument::Counter,
                            "{}",
                            m.name
                        );
                        assert_ne!(row.instrument, Instrument::Gauge, "{}", m.name);
                        for p in &s.data_points {
                            assert!(
                                p.start_time_unix_nano > 0
                                    && p.start_time_unix_nano <= p.time_unix_nano,
                                "{}: start {} time {}",
                                m.name,
                                p.start_time_unix_nano,
                                p.time_unix_nano
                            );
                        }
                        &s.data_points
                    }
                    other => panic!("{}: {other:?}", m.name),
                };
                for p in data_points {
                    let Some(number_data_point::Value::AsDouble(v)) = p.value else {
                        panic!("{}: not a double", m.name);
                    };
                    points.push((m.name.clone(), attributes(&p.attributes), v));
                }
            }
        }
    }
    points
}

/// The resource attributes of `request`.
fn resource(request: &ExportMetricsServiceRequest) -> BTreeMap<String, String> {
    attributes(
        &request.resource_metrics[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes,
    )
}

/// The points the series of `m` map to by the table, hardware attributes as the documentation
/// says: what a request of the same tick must hold.
fn expected(m: &Exposition) -> Vec<Point> {
    // A MIG GPU instance is its first MIG device, in the exposition's order.
    let mut mig_uuids: BTreeMap<(String, String), String> = BTreeMap::new();
    for s in m.find("nvidia_gpu_mig_instance_info", &[]) {
        mig_uuids
            .entry((s.labels["uuid"].clone(), s.labels["gpu_instance"].clone()))
            .or_insert_with(|| s.labels["mig_uuid"].clone());
    }
    let mut expected = Vec::new();
    for s in &m.series {
        let Some(row) = mapping::row(&s.name) else {
            continue; // a histogram's _bucket, _sum and _count
        };
        let Push::Metric(mm) = row.push else {
            continue;
        };
        let mut attrs = BTreeMap::new();
        if let Some(uuid) = s.labels.get("uuid") {
            let id = match s.labels.get("gpu_instance") {
                Some(gi) => mig_uuids
                    .get(&(uuid.clone(), gi.clone()))
                    .cloned()
                    .unwrap_or_else(|| format!("{uuid}/gi{gi}")),
                None => uuid.clone(),
            };
            attrs.insert("hw.id".to_owned(), id);
        }
        for (k, v) in mm.fixed {
            attrs.insert((*k).to_owned(), (*v).to_owned());
        }
        for (label, value) in &s.labels {
            if label == "gpu" || label == "uuid" {
                continue;
            }
            let key = MIG_ATTRIBUTES
                .iter()
                .chain(&POD_ATTRIBUTES)
                .chain(mm.attributes)
                .find(|a| a.label == label)
                .map_or(label.as_str(), |a| a.key);
            attrs.insert(key.to_owned(), value.clone());
        }
        if mm.states {
            for (state_value, state) in HEALTH_STATES {
                let mut attrs = attrs.clone();
                attrs.insert("hw.state".to_owned(), (*state).to_owned());
                let on = if s.value == *state_value { 1.0 } else { 0.0 };
                expected.push((mm.name.to_owned(), attrs, on));
            }
        } else {
            expected.push((mm.name.to_owned(), attrs, s.value));
        }
    }
    expected
}

/// The points of `request` without the hardware attributes derived from `hw.id` (checked
/// here: every GPU point has them, with the model `/metrics` gives its GPU).
fn comparable(request: &ExportMetricsServiceRequest, m: &Exposition) -> Vec<Point> {
    let models: BTreeMap<&str, &str> = m
        .find("nvidia_gpu_info", &[])
        .iter()
        .map(|s| (s.labels["uuid"].as_str(), s.labels["name"].as_str()))
        .collect();
    points(request)
        .into_iter()
        .map(|(name, mut attrs, v)| {
            if let Some(id) = attrs.get("hw.id").cloned() {
                assert_eq!(attrs.remove("hw.type").as_deref(), Some("gpu"), "{name}");
                assert_eq!(
                    attrs.remove("hw.vendor").as_deref(),
                    Some("NVIDIA"),
                    "{name}"
                );
                assert!(attrs.remove("hw.name").is_some(), "{name}");
                let model = attrs.remove("hw.model").unwrap();
                let gpu = attrs.remove("hw.parent").unwrap_or(id);
                if name != "nvidia.gpu.info" {
                    assert_eq!(Some(&model.as_str()), models.get(gpu.as_str()), "{name}");
                } else {
                    attrs.insert("hw.model".into(), model);
                }
            }
            (name, attrs, v)
        })
        .collect()
}

/// The pushed value of `name` at `attrs` in `points`.
fn value_of(points: &[Point], name: &str, attrs: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = points
        .iter()
        .filter(|(n, a, _)| {
            n == name
                && attrs
                    .iter()
                    .all(|(k, v)| a.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|p| p.2)
        .collect();
    assert!(found.len() <= 1, "{name}{attrs:?}: {found:?}");
    found.first().copied()
}

/// A scrape of `e`, and a request the receiver took from the same tick (its last sample
/// timestamp the scrape's).
fn same_tick(e: &Exporter, receiver: &Receiver) -> (Exposition, ExportMetricsServiceRequest) {
    eventually(WAIT, "a push of the tick of a scrape", || {
        let m = e.metrics();
        let tick = m.value("nvml_exporter_last_sample_timestamp_seconds", &[])?;
        // The push of this tick may come after the scrape: wait for one more push.
        let seen = receiver.count();
        let pushed = common::poll_until(WAIT, || {
            (receiver.count() > seen).then(|| receiver.received())
        })
        .unwrap_or_else(|| panic!("no more pushes; logs:\n{}", e.logs()));
        pushed.into_iter().rev().find_map(|r| {
            let at = value_of(
                &points(&r.request),
                "nvml_exporter.last_sample.timestamp",
                &[],
            )?;
            (at == tick).then(|| (m.clone(), r.request))
        })
    })
}

/// Asserts that `request` holds exactly the points the series of `m` map to.
fn assert_same_series(request: &ExportMetricsServiceRequest, m: &Exposition) {
    let mut want = expected(m);
    let mut got = comparable(request, m);
    let order = |a: &Point, b: &Point| (&a.0, &a.1).cmp(&(&b.0, &b.1));
    want.sort_by(order);
    got.sort_by(order);
    let missing: Vec<&Point> = want.iter().filter(|p| !got.contains(p)).take(10).collect();
    let extra: Vec<&Point> = got.iter().filter(|p| !want.contains(p)).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && want.len() == got.len(),
        "{} points expected, {} pushed\nmissing: {missing:#?}\nextra: {extra:#?}",
        want.len(),
        got.len()
    );
}

/// The GPU-level checks a user makes: for every GPU (by its UUID) memory used and total, and
/// utilization, SM activity and the other saturation signals and energy as a cumulative sum
/// wherever `/metrics` has them (`utilization`: whether the GPU must have utilization and SM
/// activity, as a GPU out of MIG mode on the demo does).
fn assert_every_gpu_pushed(
    request: &ExportMetricsServiceRequest,
    m: &Exposition,
    utilization: bool,
) {
    let pts = points(request);
    let uuids: Vec<&str> = m
        .find("nvidia_gpu_info", &[])
        .iter()
        .map(|s| s.labels["uuid"].as_str())
        .collect();
    assert!(!uuids.is_empty());
    for uuid in uuids {
        let gpu = |name: &str| {
            m.find(name, &[("uuid", uuid)])
                .into_iter()
                .find(|s| !s.labels.contains_key("gpu_instance"))
                .map(|s| s.value)
        };
        let pushed = |name: &str, extra: &[(&str, &str)]| {
            let mut attrs = vec![("hw.id", uuid)];
            attrs.extend_from_slice(extra);
            value_of(&pts, name, &attrs)
        };
        for (otel, extra, prometheus) in [
            (
                "hw.gpu.memory.usage",
                &[][..],
                "nvidia_gpu_memory_used_bytes",
            ),
            ("hw.gpu.memory.limit", &[], "nvidia_gpu_memory_total_bytes"),
        ] {
            let value = gpu(prometheus);
            assert!(value.is_some(), "{prometheus} of {uuid}");
            assert_eq!(pushed(otel, extra), value, "{otel} of {uuid}");
        }
        for (otel, extra, prometheus) in [
            (
                "hw.gpu.utilization",
                &[("hw.gpu.task", "general")][..],
                "nvidia_gpu_utilization_ratio",
            ),
            ("nvidia.gpu.sm.activity", &[], "nvidia_gpu_sm_active_ratio"),
            (
                "nvidia.gpu.sm.occupancy",
                &[],
                "nvidia_gpu_sm_occupancy_ratio",
            ),
            (
                "nvidia.gpu.tensor.activity",
                &[],
                "nvidia_gpu_tensor_active_ratio",
            ),
            (
                "nvidia.gpu.dram.activity",
                &[],
                "nvidia_gpu_dram_active_ratio",
            ),
            (
                "nvidia.gpu.sm.active_time",
                &[],
                "nvidia_gpu_sm_active_seconds_total",
            ),
            ("hw.energy", &[], "nvidia_gpu_energy_joules_total"),
        ] {
            let value = gpu(prometheus);
            assert!(!utilization || value.is_some(), "{prometheus} of {uuid}");
            assert_eq!(pushed(otel, extra), value, "{otel} of {uuid}");
        }
    }
}

#[test]
fn grpc_pushes_the_series_of_metrics_at_the_same_tick() {
    let receiver = Receiver::start(Protocol::Grpc, None);
    let endpoint = format!("http://{}", receiver.addr);
    let e = Exporter::start(
        &[("NODE_NAME", "gpu-node-1")],
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "200ms",
            "--kubernetes-node-name",
            "gpu-node-1",
        ],
    );
    // The saturation signals need two GPM samples: from the second tick on.
    e.wait_metrics(WAIT, "GPM readings", |m| {
        !m.find("nvidia_gpu_sm_active_ratio", &[]).is_empty()
    });
    let (m, request) = same_tick(&e, &receiver);
    assert_same_series(&request, &m);
    assert_every_gpu_pushed(&request, &m, true);
    let r = resource(&request);
    assert_eq!(r["service.name"], "nvml-exporter");
    assert_eq!(r["service.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(r["host.name"], "gpu-node-1");
    assert_eq!(r["k8s.node.name"], "gpu-node-1");
    assert!(r["service.instance.id"].starts_with("gpu-node-1:"), "{r:?}");
    // Every request decodes, gzip-compressed as gRPC says.
    for got in receiver.received() {
        assert!(!points(&got.request).is_empty());
        let encoding = got.headers.iter().find(|(n, _)| n == "grpc-encoding");
        assert_eq!(encoding.map(|(_, v)| v.as_str()), Some("gzip"));
    }
    let m = e.metrics();
    assert!(
        m.value("nvml_exporter_otlp_exports_total", &[("result", "success")])
            .unwrap()
            >= 1.0
    );
    assert!(
        m.value("nvml_exporter_otlp_points_total", &[("result", "sent")])
            .unwrap()
            > 0.0
    );
    assert!(
        m.value("nvml_exporter_otlp_last_success_timestamp_seconds", &[])
            .unwrap()
            > 0.0
    );
}

#[test]
fn http_protobuf_from_otel_variables_pushes_every_group_and_mig_instances() {
    let receiver = Receiver::start(Protocol::Http, None);
    let dir = tempfile::tempdir().unwrap();
    let headers = write_atomic(dir.path(), "headers", "Authorization: Bearer s3cret\n");
    let flags = common::every_group();
    let endpoint = format!("http://{}/otlp", receiver.addr);
    let scenario = scenario("h100-mig");
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.cluster.name=lab,deployment.environment.name=test",
            ),
            ("OTEL_SERVICE_NAME", "gpu-metrics"),
        ],
        &common::with_every_group(&flags, &["--otlp-headers-file", headers.to_str().unwrap()]),
    );
    e.wait_metrics(WAIT, "GPM readings of the MIG instances", |m| {
        m.find("nvidia_gpu_sm_active_ratio", &[])
            .iter()
            .any(|s| s.labels.contains_key("gpu_instance"))
    });
    let (m, request) = same_tick(&e, &receiver);
    assert_same_series(&request, &m);
    assert_every_gpu_pushed(&request, &m, false);
    let pts = points(&request);
    assert!(
        pts.iter().any(
            |(_, a, _)| a.contains_key("hw.parent") && a.contains_key("nvidia.gpu.mig.profile")
        ),
        "MIG instances pushed as hardware of their own"
    );
    let r = resource(&request);
    assert_eq!(r["service.name"], "gpu-metrics");
    assert_eq!(r["k8s.cluster.name"], "lab");
    assert_eq!(r["deployment.environment.name"], "test");
    for got in receiver.received() {
        assert_eq!(got.path, "/otlp/v1/metrics");
        assert_eq!(got.content_encoding.as_deref(), Some("gzip"));
        assert!(
            got.headers
                .contains(&("authorization".to_owned(), "Bearer s3cret".to_owned()))
        );
    }
    assert!(
        !e.logs().contains("s3cret"),
        "the header's value is never logged"
    );
}

/// Scrapes `/metrics` every 50 ms until stopped: each answer's status, how long it took and
/// the last sample timestamp it served.
struct Scraper {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(u16, Duration, f64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scraper {
    fn start(e: &Exporter) -> Scraper {
        let url = e.url("/metrics");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (Arc::clone(&stop), Arc::clone(&seen));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = common::http_get(&url, &[]);
                let took = t.elapsed();
                let tick = Exposition::parse(&r.text())
                    .value("nvml_exporter_last_sample_timestamp_seconds", &[])
                    .unwrap_or(0.0);
                v.lock().unwrap().push((r.status, took, tick));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Scraper {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Every scrape answered 200, ticks went on (`ticks` distinct ones at least), and the worst
    /// scrape, which is printed.
    fn finish(mut self, ticks: usize) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let seen = self.seen.lock().unwrap();
        assert!(
            seen.iter().all(|(status, _, _)| *status == 200),
            "a scrape failed"
        );
        let mut distinct: Vec<u64> = seen.iter().map(|(_, _, t)| t.to_bits()).collect();
        distinct.dedup();
        assert!(
            distinct.len() >= ticks,
            "{} ticks served over {} scrapes",
            distinct.len(),
            seen.len()
        );
        let worst = seen.iter().map(|(_, took, _)| *took).max().unwrap();
        println!(
            "{} scrapes during the faults, the worst took {worst:?}",
            seen.len()
        );
        worst
    }
}

/// Occurrences of `what` in the logs of `e`.
fn logged(e: &Exporter, what: &str) -> usize {
    e.logs().matches(what).count()
}

/// A counter of `/metrics`, 0 when absent.
fn counter(e: &Exporter, name: &str, result: &str) -> f64 {
    e.metrics()
        .value(name, &[("result", result)])
        .unwrap_or(0.0)
}

/// The faults, one after the other in one exporter's life, over `protocol`.
fn faults(protocol: Protocol) {
    const FAILED: &str = "OTLP push failed";
    const RESUMED: &str = "OTLP push succeeds again";
    const EXPORTS: &str = "nvml_exporter_otlp_exports_total";
    let port = Receiver::free_port();
    let dir = tempfile::tempdir().unwrap();
    let headers = write_atomic(dir.path(), "headers", "X-Token: tok-wrong\n");
    let e = Exporter::start(
        &[],
        &[
            "--interval",
            "250ms",
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{port}"),
            "--otlp-protocol",
            protocol.name(),
            "--otlp-interval",
            "100ms",
            "--otlp-timeout",
            "400ms",
            "--otlp-headers-file",
            headers.to_str().unwrap(),
        ],
    );
    let scraper = Scraper::start(&e);

    // Down at the start: retried, logged once, the queue full at 10 and the oldest dropped.
    let m = e.wait_metrics(WAIT, "a full queue", |m| {
        m.value("nvml_exporter_otlp_queue_batches", &[]) == Some(10.0)
            && m.value("nvml_exporter_otlp_points_total", &[("result", "dropped")])
                .is_some_and(|v| v > 0.0)
    });
    assert!(m.value(EXPORTS, &[("result", "unavailable")]).unwrap() >= 2.0);
    let rss = common::memory_of(e.child.id(), "VmRSS");
    let dropped = counter(&e, "nvml_exporter_otlp_points_total", "dropped");
    e.wait_metrics(WAIT, "twenty more intervals away", |m| {
        m.value("nvml_exporter_otlp_points_total", &[("result", "dropped")])
            .is_some_and(|v| v >= dropped * 3.0)
    });
    assert_eq!(
        e.metrics().value("nvml_exporter_otlp_queue_batches", &[]),
        Some(10.0)
    );
    let grown = common::memory_of(e.child.id(), "VmRSS").saturating_sub(rss);
    assert!(
        grown < 4 << 20,
        "resident memory grew {grown} bytes while the receiver was away"
    );
    assert_eq!(logged(&e, FAILED), 1, "{}", e.logs());

    // Up: the queue drains, the recovery logged once.
    let receiver = Receiver::start_on(port, protocol, None);
    eventually(WAIT, "the queue delivered", || {
        (receiver.count() >= 10).then_some(())
    });
    eventually(WAIT, "the recovery logged", || {
        (logged(&e, RESUMED) == 1).then_some(())
    });

    // Refusing with UNAVAILABLE / 503 Retry-After for a while.
    let unavailable = counter(&e, EXPORTS, "unavailable");
    receiver.set_mode(Mode::Unavailable);
    eventually(WAIT, "refusals retried", || {
        (counter(&e, EXPORTS, "unavailable") >= unavailable + 2.0).then_some(())
    });
    let before = receiver.count();
    receiver.set_mode(Mode::Accept);
    eventually(WAIT, "pushes resuming", || {
        (receiver.count() > before).then_some(())
    });
    eventually(WAIT, "the recovery logged", || {
        (logged(&e, RESUMED) == 2).then_some(())
    });
    if protocol == Protocol::Http {
        assert!(
            e.logs().contains("trying again in 1s"),
            "the 503's Retry-After is honoured: {}",
            e.logs()
        );
    }
    assert_eq!(logged(&e, FAILED), 2, "{}", e.logs());

    // Slower than --otlp-timeout.
    receiver.set_mode(Mode::Slow(Duration::from_secs(2)));
    eventually(WAIT, "a timeout", || {
        (counter(&e, EXPORTS, "timeout") >= 1.0).then_some(())
    });
    receiver.set_mode(Mode::Accept);
    eventually(WAIT, "the recovery logged", || {
        (logged(&e, RESUMED) == 3).then_some(())
    });
    assert_eq!(logged(&e, FAILED), 3, "{}", e.logs());

    // A partial success: counted, and logged with the receiver's message.
    receiver.set_mode(Mode::Partial(3));
    eventually(WAIT, "partial successes", || {
        (counter(&e, EXPORTS, "partial_success") >= 2.0).then_some(())
    });
    assert!(counter(&e, "nvml_exporter_otlp_points_total", "rejected") >= 6.0);
    assert_eq!(logged(&e, "rejected 3 of"), 1, "{}", e.logs());
    assert!(e.logs().contains("3 points are too old"));
    receiver.set_mode(Mode::Accept);
    eventually(WAIT, "the recovery logged", || {
        (logged(&e, RESUMED) == 4).then_some(())
    });

    // A header the exporter does not send: refused for good (401 / UNAUTHENTICATED), each
    // request dropped, logged once, until the headers file has it.
    receiver.require(Some(("X-Token", "tok-5e7c")));
    eventually(WAIT, "refusals", || {
        (counter(&e, EXPORTS, "rejected") >= 3.0).then_some(())
    });
    assert_eq!(logged(&e, FAILED), 5, "{}", e.logs());
    assert!(receiver.refused() >= 3);
    write_atomic(dir.path(), "headers", "X-Token: tok-5e7c\n");
    eventually(WAIT, "the recovery after the reload", || {
        (logged(&e, RESUMED) == 5).then_some(())
    });
    assert_eq!(logged(&e, FAILED), 5, "{}", e.logs());
    assert!(!e.logs().contains("tok-"), "header values are never logged");

    // /metrics answered throughout, and the ticks went on (4 a second, for 10 s or more).
    scraper.finish(10);
}

#[test]
fn grpc_faults_are_counted_logged_once_and_pushes_resume() {
    faults(Protocol::Grpc);
}

#[test]
fn http_faults_are_counted_logged_once_and_pushes_resume() {
    faults(Protocol::Http);
}

/// The receiver's CA, and a client certificate it signed, as files in `dir`.
fn tls_files(ca: &Ca, dir: &std::path::Path) -> (String, String, String) {
    let client = ca.client();
    let path = |name: &str, text: &str| write_atomic(dir, name, text).to_str().unwrap().to_owned();
    (
        path("ca.pem", &ca.pem),
        path("client.pem", &client.cert),
        path("client.key", &client.key),
    )
}

#[test]
fn tls_with_a_ca_over_grpc() {
    let tls = ReceiverTls {
        ca: Ca::new("otlp receiver CA"),
        client_auth: false,
    };
    let receiver = Receiver::start(Protocol::Grpc, Some(&tls));
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _) = tls_files(&tls.ca, dir.path());
    let endpoint = format!("https://127.0.0.1:{}", receiver.addr.port());
    let trusting = Exporter::start(
        &[],
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "200ms",
            "--otlp-ca-file",
            &ca,
        ],
    );
    // Without the CA the system's roots do not know the receiver's certificate.
    let distrusting = Exporter::start(
        &[],
        &["--otlp-endpoint", &endpoint, "--otlp-interval", "200ms"],
    );
    eventually(WAIT, "pushes over TLS", || {
        (receiver.count() >= 2).then_some(())
    });
    distrusting.wait_metrics(WAIT, "a refused handshake", |m| {
        m.value(
            "nvml_exporter_otlp_exports_total",
            &[("result", "unavailable")],
        )
        .is_some_and(|v| v >= 1.0)
    });
    assert!(distrusting.logs().contains("OTLP push failed"));
    assert_eq!(
        counter(&distrusting, "nvml_exporter_otlp_exports_total", "success"),
        0.0
    );
    assert!(counter(&trusting, "nvml_exporter_otlp_exports_total", "success") >= 1.0);
}

#[test]
fn mtls_over_http() {
    let tls = ReceiverTls {
        ca: Ca::new("otlp receiver CA"),
        client_auth: true,
    };
    let receiver = Receiver::start(Protocol::Http, Some(&tls));
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(&tls.ca, dir.path());
    let endpoint = format!("https://localhost:{}", receiver.addr.port());
    let common = [
        "--otlp-endpoint",
        &endpoint,
        "--otlp-protocol",
        "http/protobuf",
        "--otlp-interval",
        "200ms",
        "--otlp-ca-file",
        &ca,
    ];
    let mut with_cert = common.to_vec();
    with_cert.extend([
        "--otlp-client-cert-file",
        &cert,
        "--otlp-client-key-file",
        &key,
    ]);
    let identified = Exporter::start(&[], &with_cert);
    let anonymous = Exporter::start(&[], &common);
    eventually(WAIT, "pushes over mTLS", || {
        (receiver.count() >= 2).then_some(())
    });
    anonymous.wait_metrics(WAIT, "a refused handshake", |m| {
        m.value(
            "nvml_exporter_otlp_exports_total",
            &[("result", "unavailable")],
        )
        .is_some_and(|v| v >= 1.0)
    });
    assert_eq!(
        counter(&anonymous, "nvml_exporter_otlp_exports_total", "success"),
        0.0
    );
    assert!(counter(&identified, "nvml_exporter_otlp_exports_total", "success") >= 1.0);
}

#[test]
fn a_reload_turns_the_push_on_and_changes_it() {
    let first = Receiver::start(Protocol::Http, None);
    let second = Receiver::start(Protocol::Grpc, None);
    let dir = tempfile::tempdir().unwrap();
    let config = write_atomic(dir.path(), "config.toml", "interval = \"500ms\"\n");
    let e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    e.wait_ready(WAIT);
    assert!(
        e.metrics()
            .find("nvml_exporter_otlp_exports_total", &[])
            .is_empty()
    );
    write_atomic(
        dir.path(),
        "config.toml",
        &format!(
            "interval = \"500ms\"\notlp_endpoint = \"http://{}\"\notlp_protocol = \"http/protobuf\"\notlp_interval = \"200ms\"\n",
            first.addr
        ),
    );
    eventually(WAIT, "pushes after the reload", || {
        (first.count() >= 2).then_some(())
    });
    // Each decodes, its sums starting no later than their points (the tick pushed first may be
    // older than the push).
    for r in first.received() {
        assert!(!points(&r.request).is_empty());
    }
    write_atomic(
        dir.path(),
        "config.toml",
        &format!(
            "interval = \"500ms\"\notlp_endpoint = \"http://{}\"\notlp_interval = \"200ms\"\n",
            second.addr
        ),
    );
    eventually(WAIT, "pushes to the new endpoint", || {
        (second.count() >= 2).then_some(())
    });
    let sent = counter(&e, "nvml_exporter_otlp_exports_total", "success");
    assert!(sent >= 4.0, "the counters carry on: {sent}");
    // A file that cannot be read fails the reload and keeps the push as it was.
    write_atomic(
        dir.path(),
        "config.toml",
        &format!(
            "interval = \"500ms\"\notlp_endpoint = \"http://{}\"\notlp_headers_file = \"/no/such/headers\"\n",
            second.addr
        ),
    );
    e.wait_metrics(WAIT, "the reload refused", |m| {
        m.value("nvml_exporter_config_last_reload_successful", &[]) == Some(0.0)
    });
    let pushed = second.count();
    eventually(WAIT, "pushes going on", || {
        (second.count() > pushed).then_some(())
    });
    assert!(e.logs().contains("/no/such/headers"));
}

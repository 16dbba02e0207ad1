//! One publication as one OTLP request: the series `/metrics` serves from the same snapshot,
//! written by the encoder's own writers ([`crate::metrics::write_series`]) into a [`Sink`] that
//! turns each into a data point as the mapping ([`super::mapping`]) says.
//!
//! - Points carry the time of the tick they were read at (`nvml_exporter_last_sample_timestamp_seconds`;
//!   the time of the push while no tick has completed).
//! - A point of a GPU carries the hardware's attributes: `hw.id` (its UUID), `hw.type` `gpu`,
//!   `hw.name` ("GPU 0"), `hw.vendor` `NVIDIA`, `hw.model`; a MIG GPU instance's (a series with
//!   `gpu_instance`) has `hw.id` its first MIG device's UUID (`<GPU UUID>/gi<N>` when it has
//!   none), `hw.name` "GPU 0 GI 3", `hw.parent` the GPU's UUID and the MIG attributes; then come
//!   the row's fixed attributes, its labels' attributes, the pod's (`k8s.*`), and any label the
//!   table does not know (the copied pod labels of `nvidia_gpu_pod_info`) under its own name.
//! - Cumulative sums need the time their count started ([`StartTimes`]): a series present at
//!   the first push started when the push did (the exporter's start, or the reload that turned it
//!   on); one that appears later, or a counter whose value went down (a driver or exporter
//!   restart reset it), started at the previous push.

use std::collections::HashMap;
use std::fmt::Write as _;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::metrics::catalog::{MetricDef, VERSION};
use crate::metrics::resolve::DeviceView;
use crate::metrics::write::Sink;
use crate::publish::Published;

use super::mapping::{self, HEALTH_STATES, Instrument, Kind, MIG_ATTRIBUTES, POD_ATTRIBUTES, Push};

/// The instrumentation scope of every point: the exporter itself.
pub const SCOPE: &str = "nvml-exporter";

/// `hw.vendor` of every GPU.
const VENDOR: &str = "NVIDIA";

/// When each cumulative series started counting, by its metric name and attributes.
#[derive(Debug)]
pub struct StartTimes {
    /// The time a series first seen now started: the first push's start, then the previous
    /// push's time.
    since: u64,
    series: HashMap<String, Start>,
    /// Counts the pushes, so that series no longer served are forgotten.
    generation: u64,
}

#[derive(Debug)]
struct Start {
    start: u64,
    last: f64,
    generation: u64,
}

impl StartTimes {
    /// Nothing seen yet; series present at the first push started at `since` (Unix ns).
    pub fn new(since: u64) -> StartTimes {
        StartTimes {
            since,
            series: HashMap::new(),
            generation: 0,
        }
    }

    /// The start of series `key` holding `value` now; a monotonic one whose value went down
    /// was reset and starts again.
    fn start(&mut self, key: &str, value: f64, monotonic: bool) -> u64 {
        let (since, generation) = (self.since, self.generation);
        match self.series.get_mut(key) {
            Some(s) => {
                if monotonic && value < s.last {
                    s.start = since;
                }
                s.last = value;
                s.generation = generation;
                s.start
            }
            None => {
                self.series.insert(
                    key.to_owned(),
                    Start {
                        start: since,
                        last: value,
                        generation,
                    },
                );
                since
            }
        }
    }

    /// The push at `time` is written: forget the series it did not hold, and start the ones
    /// first seen by the next at `time`.
    fn finish(&mut self, time: u64) {
        let generation = self.generation;
        self.series.retain(|_, s| s.generation == generation);
        self.generation += 1;
        self.since = time;
    }
}

/// One request and how many points it holds.
#[derive(Debug)]
pub struct Request {
    /// The request.
    pub request: ExportMetricsServiceRequest,
    /// Its data points.
    pub points: usize,
}

/// The request pushing `published`, under `resource`, at `now` (Unix ns) when no tick has
/// completed; the cumulative series' starts come from (and go back into) `starts`.
pub fn request(
    published: &Published,
    resource: &[KeyValue],
    starts: &mut StartTimes,
    now: u64,
) -> Request {
    let snap = &published.snapshot;
    let time = snap
        .last_tick_timestamp_seconds
        .map_or(now, |s| (s * 1e9) as u64);
    let mut sink = Points {
        time,
        starts,
        metrics: Vec::new(),
        index: HashMap::new(),
        current: None,
        series: 0,
        points: 0,
        key: String::new(),
    };
    crate::metrics::write_series(snap, &published.options, published.groups, &mut sink);
    let points = sink.points;
    let metrics = sink.metrics;
    starts.finish(time);
    Request {
        request: ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: resource.to_vec(),
                    ..Resource::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: SCOPE.to_owned(),
                        version: VERSION.to_owned(),
                        ..InstrumentationScope::default()
                    }),
                    metrics,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        },
        points,
    }
}

/// A text attribute.
pub fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

/// An attribute of `kind`; an integer label that does not parse stays text.
fn typed(key: &str, value: &str, kind: Kind) -> KeyValue {
    match (kind, value.parse::<i64>()) {
        (Kind::Int, Ok(n)) => KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(n)),
            }),
            ..KeyValue::default()
        },
        _ => attribute(key, value),
    }
}

/// Sets `key` in `attributes`, replacing a value it has (`nvidia_gpu_info`'s `name` is the
/// `hw.model` every GPU point has).
fn set(attributes: &mut Vec<KeyValue>, kv: KeyValue) {
    match attributes.iter_mut().find(|a| a.key == kv.key) {
        Some(a) => *a = kv,
        None => attributes.push(kv),
    }
}

/// The sink the encoder's writers write into: each series becomes data points.
struct Points<'s> {
    time: u64,
    starts: &'s mut StartTimes,
    metrics: Vec<Metric>,
    /// Where each metric name is in `metrics`.
    index: HashMap<&'static str, usize>,
    /// The mapping of the family being written, when it is pushed.
    current: Option<&'static mapping::Metric>,
    series: usize,
    points: usize,
    /// A buffer for series keys.
    key: String,
}

impl Points<'_> {
    /// The metric `m` of family `def`, added when it is first met.
    fn metric(&mut self, def: &'static MetricDef, m: &'static mapping::Metric) -> &mut Metric {
        let at = *self.index.entry(m.name).or_insert_with(|| {
            let data = match m.instrument {
                Instrument::Gauge => metric::Data::Gauge(Gauge::default()),
                Instrument::Counter | Instrument::UpDownCounter => metric::Data::Sum(Sum {
                    data_points: Vec::new(),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: m.instrument == Instrument::Counter,
                }),
            };
            self.metrics.push(Metric {
                name: m.name.to_owned(),
                description: m.description.unwrap_or(def.help).to_owned(),
                unit: m.unit.to_owned(),
                data: Some(data),
                ..Metric::default()
            });
            self.metrics.len() - 1
        });
        &mut self.metrics[at]
    }

    /// Adds one point of `m` with `attributes` and `value`.
    fn point(
        &mut self,
        def: &'static MetricDef,
        m: &'static mapping::Metric,
        attributes: Vec<KeyValue>,
        value: f64,
    ) {
        let start = match m.instrument {
            Instrument::Gauge => 0,
            Instrument::Counter | Instrument::UpDownCounter => {
                self.key.clear();
                self.key.push_str(m.name);
                for a in &attributes {
                    let _ = write!(self.key, "\u{1f}{}=", a.key);
                    match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                        Some(any_value::Value::StringValue(s)) => self.key.push_str(s),
                        Some(any_value::Value::IntValue(n)) => {
                            let _ = write!(self.key, "{n}");
                        }
                        _ => {}
                    }
                }
                let key = std::mem::take(&mut self.key);
                let start = self
                    .starts
                    .start(&key, value, m.instrument == Instrument::Counter);
                self.key = key;
                // A push started by a reload may be later than the tick it pushes.
                start.min(self.time)
            }
        };
        let point = NumberDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: self.time,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..NumberDataPoint::default()
        };
        self.points += 1;
        match &mut self.metric(def, m).data {
            Some(metric::Data::Gauge(g)) => g.data_points.push(point),
            Some(metric::Data::Sum(s)) => s.data_points.push(point),
            _ => {}
        }
    }
}

impl Sink for Points<'_> {
    fn begin(&mut self, def: &'static MetricDef) -> usize {
        self.current = match mapping::row(def.name).map(|r| &r.push) {
            Some(Push::Metric(m)) => Some(m),
            _ => None,
        };
        0
    }

    fn end(&mut self, _mark: usize, _empty: bool) {
        self.current = None;
    }

    fn series<'n, 'v>(
        &mut self,
        def: &'static MetricDef,
        device: Option<&DeviceView<'_>>,
        labels: impl IntoIterator<Item = (&'n str, &'v str)>,
        value: f64,
    ) {
        self.series += 1;
        let Some(m) = self.current else {
            return;
        };
        // The labels first: a MIG label says which hardware the point is of.
        let mut gpu_instance = None;
        let mut mig = Vec::new();
        let mut own = Vec::new();
        let mut pod = Vec::new();
        let mut other = Vec::new();
        for (label, v) in labels {
            if let Some(a) = MIG_ATTRIBUTES.iter().find(|a| a.label == label) {
                if label == "gpu_instance" {
                    gpu_instance = v.parse::<u32>().ok();
                }
                mig.push(typed(a.key, v, a.kind));
            } else if let Some(a) = POD_ATTRIBUTES.iter().find(|a| a.label == label) {
                pod.push(attribute(a.key, v));
            } else if let Some(a) = m.attributes.iter().find(|a| a.label == label) {
                own.push(typed(a.key, v, a.kind));
            } else {
                other.push(attribute(label, v));
            }
        }
        let mut attributes = Vec::with_capacity(8 + mig.len() + own.len() + pod.len());
        if let Some(d) = device {
            hardware(&mut attributes, d, gpu_instance);
        }
        attributes.extend(mig);
        for (k, v) in m.fixed {
            set(&mut attributes, attribute(k, v));
        }
        for kv in own.into_iter().chain(pod).chain(other) {
            set(&mut attributes, kv);
        }
        if m.states {
            for (state_value, state) in HEALTH_STATES {
                let mut attributes = attributes.clone();
                attributes.push(attribute("hw.state", state));
                let on = if value == *state_value { 1.0 } else { 0.0 };
                self.point(def, m, attributes, on);
            }
        } else {
            self.point(def, m, attributes, value);
        }
    }

    fn count(&self) -> usize {
        self.series
    }
}

/// The attributes of the hardware a point is of: the GPU of `d`, or its MIG GPU instance
/// `gpu_instance`.
fn hardware(attributes: &mut Vec<KeyValue>, d: &DeviceView<'_>, gpu_instance: Option<u32>) {
    let gpu = d.sample;
    match gpu_instance {
        None => {
            attributes.push(attribute("hw.id", &gpu.uuid));
            attributes.push(attribute("hw.type", "gpu"));
            attributes.push(attribute("hw.name", &format!("GPU {}", gpu.index)));
        }
        Some(gi) => {
            let uuid = gpu
                .mig_instances
                .iter()
                .find(|m| m.gpu_instance == gi)
                .and_then(|m| m.compute_instances.first())
                .map_or_else(|| format!("{}/gi{gi}", gpu.uuid), |c| c.uuid.clone());
            attributes.push(attribute("hw.id", &uuid));
            attributes.push(attribute("hw.type", "gpu"));
            attributes.push(attribute("hw.name", &format!("GPU {} GI {gi}", gpu.index)));
            attributes.push(attribute("hw.parent", &gpu.uuid));
        }
    }
    attributes.push(attribute("hw.vendor", VENDOR));
    attributes.push(attribute("hw.model", &gpu.info.name));
}

#[cfg(test)]
mod tests {
    use super::StartTimes;

    #[test]
    fn a_counter_starts_with_the_push_and_again_after_a_reset() {
        let mut starts = StartTimes::new(100);
        // Present at the first push: started when the push did.
        assert_eq!(starts.start("energy", 5.0, true), 100);
        assert_eq!(starts.start("memory", 9.0, false), 100);
        starts.finish(1_000);
        assert_eq!(starts.start("energy", 7.0, true), 100);
        // A series first seen now started after the previous push.
        assert_eq!(starts.start("xid 79", 1.0, true), 1_000);
        // An amount that goes down is no reset.
        assert_eq!(starts.start("memory", 3.0, false), 100);
        starts.finish(2_000);
        // A counter that went down was reset since the previous push.
        assert_eq!(starts.start("energy", 0.5, true), 2_000);
        assert_eq!(starts.start("xid 79", 1.0, true), 1_000);
        starts.finish(3_000);
        // Series a push did not hold are forgotten: back, they start anew.
        assert_eq!(starts.start("energy", 0.7, true), 2_000);
        starts.finish(4_000);
        assert_eq!(starts.start("memory", 3.0, false), 4_000);
    }
}

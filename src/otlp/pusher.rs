//! The push task: every interval the current publication becomes one request, queued; the queue
//! is sent oldest first, with OTLP's retries.
//!
//! - The request is built and encoded on a blocking thread from the publication `/metrics` serves
//!   (never a read of its own): sampling and scrapes never wait for the push, and a receiver that
//!   is slow or away holds nothing but this task.
//! - The queue holds at most [`QUEUE_BATCHES`] encoded requests; a new one past that drops the
//!   oldest, whose points are counted as dropped. Memory stays flat however long the receiver is
//!   away.
//! - A request that may be retried ([`Outcome::Retry`]) stays at the head of the queue and is
//!   sent again after the receiver's `Retry-After` or `RetryInfo` (at least [`FIRST_BACKOFF`],
//!   at most [`MAX_RETRY_AFTER`]), else after a backoff that doubles from [`FIRST_BACKOFF`] (or
//!   the interval, when shorter) to the interval (at least 1 s, at most [`MAX_BACKOFF`]). A
//!   refused one is dropped, its points counted as rejected.
//! - A failure is logged when it starts (and when its kind changes), and the recovery when it
//!   ends, with how many attempts failed meanwhile: one line per outage, not one per retry.
//! - New options (a reload) apply from the next request: a new client, interval and resource;
//!   the queue, the counters and the counters' start times carry on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use prost::Message;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::convert::{self, StartTimes};
use super::options::OtlpOptions;
use super::transport::{Client, Outcome};
use crate::metrics::catalog::{
    self, OTLP_EXPORT_RESULTS, OTLP_EXPORTS_TOTAL, OTLP_LAST_SUCCESS_TIMESTAMP_SECONDS,
    OTLP_POINT_RESULTS, OTLP_POINTS_TOTAL, OTLP_QUEUE_BATCHES, OTLP_REQUEST_BYTES_TOTAL,
};
use crate::publish::Published;

/// Requests kept while the receiver does not take them: ten intervals (ten minutes at the
/// default interval; 5 MB at 64 GPUs, BENCHMARKS.md).
pub const QUEUE_BATCHES: usize = 10;

/// The first wait after a failed request (the interval, when shorter).
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between two tries, whatever the interval.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The longest wait a receiver's `Retry-After` or `RetryInfo` is granted.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The push's own metrics, kept here and served on `/metrics` from the exporter's registry.
#[derive(Debug, Clone)]
pub struct PushMetrics {
    exports: IntCounterVec,
    points: IntCounterVec,
    bytes: IntCounter,
    queue: IntGauge,
    last_success: Gauge,
}

impl PushMetrics {
    /// The metrics, registered in `registry`, every result at 0.
    pub fn new(registry: &Registry) -> PushMetrics {
        let counter = |name: &str, label: &str, values: &[&str]| {
            let vec = IntCounterVec::new(Opts::new(name, catalog::help(name)), &[label])
                .expect("static counter options are valid");
            for v in values {
                vec.with_label_values(&[*v]);
            }
            crate::metrics::registered(registry, vec)
        };
        PushMetrics {
            exports: counter(OTLP_EXPORTS_TOTAL, "result", OTLP_EXPORT_RESULTS),
            points: counter(OTLP_POINTS_TOTAL, "result", OTLP_POINT_RESULTS),
            bytes: crate::metrics::registered(
                registry,
                IntCounter::new(
                    OTLP_REQUEST_BYTES_TOTAL,
                    catalog::help(OTLP_REQUEST_BYTES_TOTAL),
                )
                .expect("static counter options are valid"),
            ),
            queue: crate::metrics::registered(
                registry,
                IntGauge::new(OTLP_QUEUE_BATCHES, catalog::help(OTLP_QUEUE_BATCHES))
                    .expect("static gauge options are valid"),
            ),
            last_success: crate::metrics::registered(
                registry,
                Gauge::new(
                    OTLP_LAST_SUCCESS_TIMESTAMP_SECONDS,
                    catalog::help(OTLP_LAST_SUCCESS_TIMESTAMP_SECONDS),
                )
                .expect("static gauge options are valid"),
            ),
        }
    }

    fn export(&self, result: &str) {
        self.exports.with_label_values(&[result]).inc();
    }

    fn points(&self, result: &str, n: usize) {
        self.points.with_label_values(&[result]).inc_by(n as u64);
    }
}

/// The running push: dropping it stops the task (what is queued is lost).
#[derive(Debug)]
pub struct Handle {
    options: watch::Sender<Arc<OtlpOptions>>,
    task: tokio::task::JoinHandle<()>,
}

impl Handle {
    /// The options in force.
    pub fn options(&self) -> Arc<OtlpOptions> {
        Arc::clone(&self.options.borrow())
    }

    /// Pushes with `options` from the next request on.
    pub fn reconfigure(&self, options: OtlpOptions) {
        self.options.send_replace(Arc::new(options));
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The publication to push now, when there is one (none before the first tick).
pub type Source = Box<dyn Fn() -> Option<Arc<Published>> + Send + Sync>;

/// Starts pushing what `source` gives, as `options` say, counting in `metrics`. Called on the
/// runtime.
pub fn start(options: OtlpOptions, source: Source, metrics: PushMetrics) -> Handle {
    let options = Arc::new(options);
    tracing::info!(
        endpoint = %options.endpoint,
        protocol = options.protocol.name(),
        interval = %humantime::format_duration(options.interval),
        "pushing metrics over OTLP"
    );
    let (sender, receiver) = watch::channel(Arc::clone(&options));
    let pusher = Pusher {
        client: Client::new(&options),
        resource: resource(&options),
        backoff: first_backoff(&options),
        options: receiver,
        source,
        metrics,
        queue: VecDeque::new(),
        starts: Some(StartTimes::new(unix_nanos())),
        next_try: Instant::now(),
        failing: None,
    };
    Handle {
        options: sender,
        task: tokio::spawn(pusher.run()),
    }
}

/// One encoded request waiting to be sent.
#[derive(Debug)]
struct Batch {
    body: Bytes,
    points: usize,
}

/// A failure being lived through: logged when it started, and when it ends.
#[derive(Debug)]
struct Failing {
    /// The export result it counts under.
    result: &'static str,
    since: Instant,
    attempts: u64,
}

struct Pusher {
    options: watch::Receiver<Arc<OtlpOptions>>,
    source: Source,
    metrics: PushMetrics,
    client: Result<Client, String>,
    resource: Arc<[KeyValue]>,
    queue: VecDeque<Batch>,
    /// Taken by the blocking thread that builds a request.
    starts: Option<StartTimes>,
    backoff: Duration,
    next_try: Instant,
    failing: Option<Failing>,
}

impl Pusher {
    async fn run(mut self) {
        let mut ticker = self.ticker();
        loop {
            tokio::select! {
                changed = self.options.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.reconfigure();
                    ticker = self.ticker();
                }
                _ = ticker.tick() => self.collect().await,
                () = tokio::time::sleep_until(self.next_try), if !self.queue.is_empty() => {
                    self.attempt().await;
                }
            }
        }
    }

    /// The schedule of requests: one interval from now, then every interval; a tick missed
    /// while a request was on its way is skipped, not made up for.
    fn ticker(&self) -> tokio::time::Interval {
        let interval = self.options.borrow().interval;
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        ticker
    }

    fn reconfigure(&mut self) {
        let options = Arc::clone(&self.options.borrow_and_update());
        self.client = Client::new(&options);
        self.resource = resource(&options);
        self.backoff = first_backoff(&options);
        self.next_try = Instant::now();
        tracing::info!(
            endpoint = %options.endpoint,
            protocol = options.protocol.name(),
            interval = %humantime::format_duration(options.interval),
            "OTLP push reconfigured"
        );
    }

    /// Builds the request of the current publication and queues it.
    async fn collect(&mut self) {
        let Some(published) = (self.source)() else {
            return;
        };
        let Some(mut starts) = self.starts.take() else {
            return;
        };
        let resource = Arc::clone(&self.resource);
        let now = unix_nanos();
        let built = tokio::task::spawn_blocking(move || {
            let r = convert::request(&published, &resource, &mut starts, now);
            (Bytes::from(r.request.encode_to_vec()), r.points, starts)
        })
        .await;
        match built {
            Ok((body, points, starts)) => {
                self.starts = Some(starts);
                if self.queue.len() >= QUEUE_BATCHES
                    && let Some(dropped) = self.queue.pop_front()
                {
                    self.metrics.points("dropped", dropped.points);
                    tracing::debug!(
                        points = dropped.points,
                        "OTLP queue full: oldest request dropped"
                    );
                }
                self.queue.push_back(Batch { body, points });
            }
            Err(e) => {
                tracing::error!(error = %e, "building the OTLP request failed");
                self.starts = Some(StartTimes::new(now));
            }
        }
        self.metrics.queue.set(self.queue.len() as i64);
    }

    /// Sends the oldest request and acts on the answer.
    async fn attempt(&mut self) {
        let Some(batch) = self.queue.front() else {
            return;
        };
        let (body, points) = (batch.body.clone(), batch.points);
        if self.client.is_err() {
            self.client = Client::new(&self.options.borrow());
        }
        let outcome = match &mut self.client {
            Ok(client) => {
                self.metrics.bytes.inc_by(body.len() as u64);
                client.send(body).await
            }
            Err(e) => Outcome::Retry {
                why: format!("no client: {e}"),
                after: None,
                timeout: false,
            },
        };
        let now = Instant::now();
        match outcome {
            Outcome::Accepted { rejected, message } => {
                self.queue.pop_front();
                let rejected = usize::try_from(rejected).unwrap_or(usize::MAX).min(points);
                self.metrics.points("sent", points - rejected);
                self.metrics.points("rejected", rejected);
                self.metrics.last_success.set(unix_nanos() as f64 / 1e9);
                if rejected > 0 || !message.is_empty() {
                    self.metrics.export("partial_success");
                    self.failed(
                        "partial_success",
                        &format!(
                            "the receiver rejected {rejected} of {points} points: {}",
                            if message.is_empty() {
                                "(no message)"
                            } else {
                                &message
                            }
                        ),
                    );
                } else {
                    self.metrics.export("success");
                    self.recovered();
                }
                self.backoff = first_backoff(&self.options.borrow());
                self.next_try = now;
            }
            Outcome::Retry {
                why,
                after,
                timeout,
            } => {
                let result = if timeout { "timeout" } else { "unavailable" };
                self.metrics.export(result);
                let first = first_backoff(&self.options.borrow());
                let wait = after.map_or(self.backoff, |a| a.clamp(first, MAX_RETRY_AFTER));
                self.failed(
                    result,
                    &format!(
                        "{why}; trying again in {}",
                        humantime::format_duration(wait)
                    ),
                );
                self.next_try = now + wait;
                self.backoff = (self.backoff * 2).min(max_backoff(&self.options.borrow()));
            }
            Outcome::Rejected { why } => {
                self.queue.pop_front();
                self.metrics.export("rejected");
                self.metrics.points("rejected", points);
                self.failed(
                    "rejected",
                    &format!("{why}; its {points} points are dropped, which sending them again would not change"),
                );
                self.next_try = now;
            }
        }
        self.metrics.queue.set(self.queue.len() as i64);
    }

    /// Logs a failure when it starts or changes kind; later attempts of the same only at debug.
    fn failed(&mut self, result: &'static str, why: &str) {
        let endpoint = self.options.borrow().endpoint.clone();
        match &mut self.failing {
            Some(f) if f.result == result => {
                f.attempts += 1;
                tracing::debug!(%endpoint, result, "OTLP push still failing: {why}");
            }
            _ => {
                tracing::warn!(%endpoint, result, "OTLP push failed: {why}");
                self.failing = Some(Failing {
                    result,
                    since: Instant::now(),
                    attempts: 1,
                });
            }
        }
    }

    /// Logs the end of a failure.
    fn recovered(&mut self) {
        if let Some(f) = self.failing.take() {
            let endpoint = self.options.borrow().endpoint.clone();
            tracing::info!(
                %endpoint,
                failed_attempts = f.attempts,
                "OTLP push succeeds again after {} ({})",
                humantime::format_duration(Duration::from_secs(f.since.elapsed().as_secs())),
                f.result
            );
        }
    }
}

/// The resource of `options` as attributes.
fn resource(options: &OtlpOptions) -> Arc<[KeyValue]> {
    options
        .resource
        .iter()
        .map(|(k, v)| convert::attribute(k, v))
        .collect()
}

/// The first wait after a failure.
fn first_backoff(options: &OtlpOptions) -> Duration {
    FIRST_BACKOFF.min(options.interval)
}

/// The longest wait after failures: the interval, at least 1 s and at most [`MAX_BACKOFF`].
fn max_backoff(options: &OtlpOptions) -> Duration {
    options.interval.clamp(FIRST_BACKOFF, MAX_BACKOFF)
}

/// Now, in nanoseconds since the Unix epoch.
fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

//! OTLP push: the readings `/metrics` serves, pushed to an OpenTelemetry receiver (the
//! Collector, Grafana Alloy, a cloud agent) every `--otlp-interval`, over gRPC or HTTP/protobuf.
//!
//! Another reader of the published snapshot, on its own task (as the node condition is): each
//! push takes the publication `/metrics` was encoded from and writes its series again through
//! the encoder's own writers (`convert`), so the values are those of the scrape at the same tick
//! and no NVML call is made; the names, units, instruments and attributes come from one table
//! ([`mapping`], rendered into docs/otlp.md by [`docs`]). The `pusher` queues each request and
//! sends it with OTLP's retry rules through one `transport`. Nothing here imports the
//! configuration: [`OtlpOptions`] is built from it (with OpenTelemetry's `OTEL_*` variables) in
//! `config`, and `lib.rs` starts the push and gives the reloader the means to change it.

mod convert;
pub mod docs;
pub mod mapping;
mod options;
mod pusher;
mod transport;

pub use options::{Compression, Headers, OtlpOptions, Protocol, Tls, parse_pairs};
pub use pusher::{
    FIRST_BACKOFF, Handle, MAX_BACKOFF, MAX_RETRY_AFTER, PushMetrics, QUEUE_BATCHES, Source, start,
};

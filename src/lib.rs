//! nvml-exporter: a Prometheus exporter for NVIDIA GPUs.
//!
//! Data flows one way: [`config`] → [`sampler`] (the only user of NVML, through [`nvml`]) →
//! [`sample::Snapshot`] → [`metrics`] (encoded once per tick) → [`http`] (serves the bytes).
//! A scrape never calls NVML and never encodes.

pub mod config;
pub mod http;
pub mod metrics;
pub mod nvml;
pub mod sample;
pub mod sampler;
pub mod web;

use std::future::Future;
use std::time::Duration;

use config::Config;

/// How long open HTTP connections get to finish after the shutdown signal before they are dropped:
/// a client that never finishes a request must not hold a rolling update hostage.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The sampler's settings from the configuration.
pub fn sampler_options(config: &Config) -> sampler::SamplerOptions {
    sampler::SamplerOptions {
        nvml_lib: config.nvml.library_path(),
        interval: config.interval,
        device_timeout: config.device_timeout,
        stale_grace: config.stale_grace,
    }
}

/// Serves the exporter on `listener` until `shutdown` completes, then stops the sampler.
///
/// The HTTP server answers from the first moment, before NVML is initialised (`/readyz` says why it
/// is not ready); the sampler publishes a new encoded exposition after every tick. `web` adds TLS
/// and basic auth (see [`web`]); `WebSettings::default()` serves plain HTTP to anyone.
pub async fn run(
    config: Config,
    web: web::WebSettings,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = http::AppState::new(
        metrics::Encoder::new(metrics::MetricsOptions::default()),
        config.interval,
    );
    let publisher = state.clone();
    let sampler = sampler::Sampler::start(sampler_options(&config), move |snapshot| {
        publisher.publish(snapshot)
    })?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut app = http::router(state);
    if let Some(auth) = web.auth {
        app = app.layer(axum::middleware::from_fn_with_state(
            auth,
            web::auth::require,
        ));
    }
    web::serve::serve(listener, app, web.tls, stop_rx).await;
    tokio::task::spawn_blocking(move || sampler.shutdown()).await?;
    Ok(())
}

/// `--once`: one tick, encoded. Returns the exposition text and whether NVML answered.
pub fn sample_once(config: &Config) -> (Vec<u8>, bool) {
    let snapshot = sampler::sample_once(&sampler_options(config));
    let nvml_up = snapshot.nvml_up;
    if let Some(reason) = &snapshot.nvml_error {
        tracing::error!(reason = %reason, "NVML is not available");
    }
    let exposition = metrics::Encoder::new(metrics::MetricsOptions::default()).encode(&snapshot);
    (exposition.text.to_vec(), nvml_up)
}

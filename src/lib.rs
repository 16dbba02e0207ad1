//! nvml-exporter: a Prometheus exporter for NVIDIA GPUs.
//!
//! Data flows one way: [`config`] → [`sampler`] (the only user of NVML, through [`nvml`]) →
//! [`sample::Snapshot`] → [`metrics`] (encoded once per tick) → [`http`] (serves the bytes).
//! A scrape never calls NVML and never encodes.

pub mod config;
pub mod http;
pub mod kubernetes;
pub mod metrics;
pub mod nvml;
pub mod processes;
pub mod sample;
pub mod sampler;

use std::future::Future;
use std::time::Duration;

use config::Config;

/// How long open HTTP connections get to finish after the shutdown signal before they are dropped:
/// a client that never finishes a request must not hold a rolling update hostage.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The encoder's settings from the configuration.
pub fn metrics_options(config: &Config) -> metrics::MetricsOptions {
    metrics::MetricsOptions {
        pod_labels: config.kubernetes.enabled && config.kubernetes.labels,
        max_processes_per_gpu: config.processes.max_per_gpu,
        dcgm_compat: config.dcgm_compat,
        // Only the dcgm-exporter series carry it; asking the environment once is enough.
        hostname: if config.dcgm_compat == config::DcgmCompat::Off {
            String::new()
        } else {
            metrics::dcgm::hostname()
        },
    }
}

/// The sampler's settings from the configuration.
pub fn sampler_options(config: &Config) -> sampler::SamplerOptions {
    sampler::SamplerOptions {
        nvml_lib: config.nvml.library_path(),
        interval: config.interval,
        device_timeout: config.device_timeout,
        stale_grace: config.stale_grace,
        processes: config
            .processes
            .enabled
            .then(|| config.processes.host_proc.clone()),
    }
}

/// Serves the exporter on `listener` until `shutdown` completes, then stops the sampler.
///
/// The HTTP server answers from the first moment, before NVML is initialised (`/readyz` says why it
/// is not ready); the sampler publishes a new encoded exposition after every tick. `web` adds TLS
/// and basic auth (see [`http::web_config`]); `WebSettings::default()` serves plain HTTP to anyone.
pub async fn run(
    config: Config,
    web: http::WebSettings,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = http::AppState::new(
        metrics::Encoder::new(metrics_options(&config)),
        config.interval,
    );
    let publisher = state.clone();
    // The kubelet is asked on this runtime, never on the sampler threads; each published snapshot
    // carries the latest answer.
    // A change of assignments is served at once (re-encoding the last snapshot off the runtime's
    // workers), not at the next tick.
    let republisher = state.clone();
    let watcher = config.kubernetes.enabled.then(|| {
        kubernetes::Watcher::spawn(&config.kubernetes, move |kubelet| {
            let state = republisher.clone();
            tokio::task::spawn_blocking(move || state.republish_kubernetes(kubelet));
        })
    });
    let kubelet = watcher.as_ref().map(kubernetes::Watcher::state);
    let sampler = sampler::Sampler::start(sampler_options(&config), move |mut snapshot| {
        snapshot.kubernetes = kubelet.as_ref().map(kubernetes::StateHandle::current);
        publisher.publish(snapshot);
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
            http::auth::require,
        ));
    }
    http::server::serve(listener, app, web.tls, stop_rx).await;
    tokio::task::spawn_blocking(move || sampler.shutdown()).await?;
    drop(watcher);
    Ok(())
}

/// `--once`: one tick (and with `--kubernetes`, one `List` call), encoded. Returns the exposition
/// text and whether NVML answered.
pub fn sample_once(config: &Config) -> (Vec<u8>, bool) {
    let mut snapshot = sampler::sample_once(&sampler_options(config));
    if config.kubernetes.enabled {
        snapshot.kubernetes = Some(kubelet_once(config));
    }
    let nvml_up = snapshot.nvml_up;
    if let Some(reason) = &snapshot.nvml_error {
        tracing::error!(reason = %reason, "NVML is not available");
    }
    let exposition = metrics::Encoder::new(metrics_options(config)).encode(&snapshot);
    (exposition.text.to_vec(), nvml_up)
}

/// One `List` call on a runtime of its own (`--once` runs without one).
fn kubelet_once(config: &Config) -> sample::KubernetesState {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(kubernetes::list_once(&config.kubernetes)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start a runtime to ask the kubelet");
            sample::KubernetesState::new()
        }
    }
}

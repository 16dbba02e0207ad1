//! nvml-exporter: a Prometheus exporter for NVIDIA GPUs.
//!
//! Data flows one way: [`config`] → [`sampler`] (the only user of NVML, through [`nvml`]) →
//! [`sample::Snapshot`] → [`publish`] (encoded once per tick by [`metrics`], with the kubelet's
//! answer from [`kubernetes`]) → [`http`] (serves the bytes), and with `--otlp-endpoint` →
//! [`otlp`] (pushes the same series). A scrape never calls NVML and never encodes. [`reload`]
//! applies a changed configuration to the running parts.

mod certificates;
pub mod config;
pub mod files;
pub mod groups;
pub mod health;
pub mod http;
pub mod jobs;
pub mod kubernetes;
pub mod metrics;
pub mod nvml;
pub mod otlp;
pub mod page;
pub mod pci;
pub mod processes;
pub mod publish;
pub mod reload;
pub mod sample;
pub mod sampler;

use std::future::Future;
use std::sync::Arc;

use config::Config;

pub use http::server::SHUTDOWN_GRACE;

/// The exporter's own metrics that the running parts keep (the HTTP server's connections, the
/// routes' scrape count, the reloader's outcome), each registered in the one registry the
/// encoder writes whole.
struct SelfMetrics {
    registry: prometheus::Registry,
    connections: http::connections::ConnectionMetrics,
    scrapes: http::ScrapeCounter,
    reloads: reload::ReloadMetrics,
}

impl SelfMetrics {
    fn new() -> SelfMetrics {
        let registry = prometheus::Registry::new();
        SelfMetrics {
            connections: http::connections::ConnectionMetrics::new(&registry),
            scrapes: http::ScrapeCounter::new(&registry),
            reloads: reload::ReloadMetrics::new(&registry),
            registry,
        }
    }
}

/// Serves the exporter on `listener` until `shutdown` completes, then stops the sampler.
///
/// The HTTP server answers from the first moment, before NVML is initialised (`/readyz` says why it
/// is not ready); the sampler publishes a new encoded exposition after every tick. `web` adds TLS
/// and basic auth (see [`http::web_config`]); `WebSettings::default()` serves plain HTTP to anyone.
/// `reload` says how `config` and `web` were loaded, to load them again on SIGHUP or when their
/// files change (see [`reload`]).
pub async fn run(
    config: Config,
    web: http::WebSettings,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    reload: reload::Triggers,
) -> anyhow::Result<()> {
    for warning in startup_warnings(Some(&web)) {
        tracing::warn!("{warning}");
    }
    // The kubelet is asked on this runtime, never on the sampler threads.
    let kubernetes_options = config.kubernetes_options();
    let kubelet_state = config
        .kubernetes
        .then(|| kubernetes::StateHandle::new(&kubernetes_options));
    let own = SelfMetrics::new();
    let registry = own.registry.clone();
    let encoder = metrics::Encoder::new(config.metrics_options(), own.registry);
    let publisher = publish::Publisher::new(encoder, kubelet_state.clone());
    publisher.set_job_mapping_dir(config.job_mapping_dir());
    let start_kubernetes = kubernetes_starter(&publisher);
    let kubernetes = kubelet_state.map(|state| start_kubernetes(&kubernetes_options, state));
    let start_otlp = otlp_starter(&publisher, registry);
    let otlp = config
        .otlp_options()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .map(&start_otlp);
    let sampler = {
        let publisher = Arc::clone(&publisher);
        sampler::Sampler::start(config.sampler_options(), move |snapshot| {
            publisher.tick(snapshot)
        })?
    };
    // Installed without users too, so that a reload can turn basic auth on.
    let auth = Arc::new(http::auth::AuthSwitch::new(web.auth.clone()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    {
        let auth = Arc::clone(&auth);
        tokio::spawn(async move {
            shutdown.await;
            // Credential checks still waiting are answered at once: stopping waits only for the
            // running ones.
            auth.close();
            let _ = stop_tx.send(true);
        });
    }
    let reloader = reload::Reloader {
        args: reload.args,
        watched: reload::Reloader::stamps(&config),
        config: config.clone(),
        web: web.file.clone(),
        publisher: Arc::clone(&publisher),
        sampler: sampler.live_options(),
        kubernetes,
        start_kubernetes,
        otlp,
        start_otlp,
        auth: Arc::clone(&auth),
        tls: web.tls.clone(),
        metrics: own.reloads,
    };
    let reloading = tokio::spawn(reloader.watch(reload.hangup, stop_rx.clone()));
    // The sampler stops as soon as the signal comes, while connections drain, so that the whole
    // shutdown takes at most SHUTDOWN_GRACE (the sampler's own bound is shorter).
    let sampler_stopped = {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            // An error means the sender is gone, which is a stop too.
            let _ = stop.wait_for(|s| *s).await;
            tokio::task::spawn_blocking(move || sampler.shutdown()).await
        })
    };
    let mut app = http::router(publisher, config.interval, own.scrapes);
    app = app.layer(axum::middleware::from_fn_with_state(
        auth,
        http::auth::require,
    ));
    http::server::serve(listener, app, web.tls, own.connections, stop_rx).await;
    sampler_stopped.await??;
    // Stops the kubelet refresh task and the OTLP push with the reloader that owns them; a reload
    // still running on its blocking thread is abandoned with the others.
    reloading.abort();
    Ok(())
}

/// How the Kubernetes tasks start, here and again on a reload that changes their options: a change
/// of assignments is served at once (encoded on a blocking thread, off the runtime's workers, not
/// at the next tick), and the node condition reads the published snapshots.
fn kubernetes_starter(publisher: &Arc<publish::Publisher>) -> reload::StartKubernetes {
    let publisher = Arc::clone(publisher);
    Box::new(move |options, state| {
        let (changed, published) = (Arc::clone(&publisher), Arc::clone(&publisher));
        kubernetes::Tasks::start(
            options,
            state,
            move || {
                let publisher = Arc::clone(&changed);
                tokio::task::spawn_blocking(move || publisher.republish());
            },
            move || {
                let current = published.current();
                current.sampled.then(|| Arc::clone(&current.snapshot))
            },
        )
    })
}

/// How the OTLP push starts, here and again on a reload that turns it on: it reads the current
/// publication (none before the first tick) and counts in the exporter's registry, where its
/// metrics are registered when it first starts.
fn otlp_starter(
    publisher: &Arc<publish::Publisher>,
    registry: prometheus::Registry,
) -> reload::StartOtlp {
    let publisher = Arc::clone(publisher);
    let metrics = std::sync::OnceLock::new();
    Box::new(move |options| {
        let metrics = metrics
            .get_or_init(|| otlp::PushMetrics::new(&registry))
            .clone();
        let publisher = Arc::clone(&publisher);
        let source: otlp::Source = Box::new(move || {
            let current = publisher.current();
            current.sampled.then_some(current)
        });
        otlp::start(options, source, metrics)
    })
}

/// `--once`: one tick (and with `--kubernetes`, one `List` call), encoded. Returns the exposition
/// text and whether NVML answered.
pub fn sample_once(config: &Config) -> (Vec<u8>, bool) {
    for warning in startup_warnings(None) {
        tracing::warn!("{warning}");
    }
    let mut snapshot = sampler::sample_once(&config.sampler_options());
    if config.kubernetes {
        snapshot.kubernetes = Some(kubelet_once(&config.kubernetes_options()));
    }
    if let Some(dir) = config.job_mapping_dir() {
        snapshot.jobs = Some(jobs::JobReader::new(dir.to_owned()).read(&snapshot.devices));
    }
    if let Some(reason) = &snapshot.nvml_error {
        tracing::error!(reason = %reason, "NVML is not available");
    }
    // The same families as a running exporter's, at their first values.
    let encoder = metrics::Encoder::new(config.metrics_options(), SelfMetrics::new().registry);
    if let Some(seconds) = snapshot.tick_duration_seconds {
        encoder.observe_tick(seconds);
    }
    (encoder.encode(&snapshot), snapshot.nvml_up)
}

/// What is valid but probably not meant: each `NVML_EXPORTER_*` variable that is no option (a
/// typo would otherwise go unseen), and a web-config file that enables neither TLS nor auth.
/// Logged at start and printed by `check-config`.
pub fn startup_warnings(web: Option<&http::WebSettings>) -> Vec<String> {
    let mut warnings = config::unknown_variables(std::env::vars_os().map(|(name, _)| name));
    if let Some(path) = web.and_then(http::WebSettings::enables_nothing) {
        warnings.push(format!(
            "{}: the web-config file enables neither TLS nor basic auth: serving plain HTTP to anyone",
            path.display()
        ));
    }
    warnings
}

/// One `List` call on a runtime of its own (`--once` runs without one).
fn kubelet_once(options: &kubernetes::KubernetesOptions) -> sample::KubernetesState {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(kubernetes::list_once(options)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start a runtime to ask the kubelet");
            sample::KubernetesState::new()
        }
    }
}

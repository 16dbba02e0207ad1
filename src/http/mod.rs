//! The HTTP side: serves what the sampler last published, never touching NVML or encoding.
//!
//! [`web_config`] reads the `--web-config` file (TLS, client certificates, basic auth, in the
//! Prometheus exporter-toolkit format), [`settings`] makes what it names ready to serve,
//! [`tls`] builds and rebuilds the rustls configuration,
//! [`auth`] checks basic-auth credentials, [`server`] runs the accept loop with its bounds and
//! [`connections`] keeps every connection within its allowances.
//!
//! `/metrics` (text 0.0.4, gzip when asked), `/healthz` (process alive), `/readyz` (NVML answered
//! and a recent tick completed), `/` (the node page, [`crate::page`]), `/api/v1/gpus` (its view
//! as JSON) and `/page.js` (its script). Every route reads what the [`Publisher`] holds now: a
//! request clones an `Arc` and serves bytes from it; the node page is rendered from it by the
//! first request of each publication and shared with the others ([`Published::page`]). No
//! route takes a request body; the server reads one that comes anyway before any route answers
//! ([`server::read_body`]).

pub mod auth;
pub mod connections;
pub mod server;
pub mod settings;
pub mod tls;
pub mod web_config;

pub use settings::WebSettings;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{IntCounterVec, Opts};

use crate::files::one_line;
use crate::metrics::CONTENT_TYPE;
use crate::metrics::catalog::{self, SCRAPES_TOTAL};
use crate::page::{self, NodeView};
use crate::publish::{PageForm, Published, Publisher};
use crate::sample::{Snapshot, unix_now};

/// `/readyz` fails once the last complete tick is older than this: three missed intervals, but
/// never less than 10 s so that a short interval plus one slow tick does not flap readiness.
pub fn readiness_max_age(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(10))
}

/// `nvml_exporter_scrapes_total`: `/metrics` responses by status code, counted by the route and
/// served by the encoder from the registry it is registered in (from the next tick on: a scrape
/// never encodes).
#[derive(Debug, Clone)]
pub struct ScrapeCounter(IntCounterVec);

impl ScrapeCounter {
    /// A counter at zero, registered in `registry`; the common code, 200, shows from the start so
    /// that `rate()` has a first point before the first scrape is counted.
    pub fn new(registry: &prometheus::Registry) -> ScrapeCounter {
        let counter = IntCounterVec::new(
            Opts::new(SCRAPES_TOTAL, catalog::help(SCRAPES_TOTAL)),
            &["code"],
        )
        .expect("static counter options are valid");
        counter.with_label_values(&["200"]);
        ScrapeCounter(crate::metrics::registered(registry, counter))
    }

    /// Counts one `/metrics` response with HTTP status `code`.
    pub fn count(&self, code: u16) {
        self.0.with_label_values(&[code.to_string()]).inc();
    }
}

/// What the routes share.
#[derive(Debug, Clone)]
struct AppState {
    publisher: Arc<Publisher>,
    scrapes: ScrapeCounter,
    /// The sampling interval, for `/readyz`.
    interval: Duration,
    /// The node's name, for the node page.
    node: String,
}

/// The readiness rule for the exposition served now (`sampled` false before the first tick), on
/// a clock passed in so it is testable.
fn readiness(
    sampled: bool,
    snap: &Snapshot,
    now_unix_seconds: f64,
    interval: Duration,
) -> Result<(), String> {
    if !sampled {
        return Err("no sample yet".into());
    }
    if !snap.nvml_up {
        return Err(match &snap.nvml_error {
            Some(e) => format!("NVML not initialised: {}", one_line(e)),
            None => "NVML not initialised".into(),
        });
    }
    let Some(last) = snap.last_tick_timestamp_seconds else {
        return Err("no sample yet".into());
    };
    // A clock stepped backwards makes the age negative: that is fresh, not stale.
    let age = (now_unix_seconds - last).max(0.0);
    let limit = readiness_max_age(interval).as_secs_f64();
    if age > limit {
        return Err(format!("last sample {age:.0} s old (limit {limit:.0} s)"));
    }
    Ok(())
}

/// The exporter's routes, serving what `publisher` holds; `interval` is the sampling interval (for
/// `/readyz`); `/metrics` responses are counted in `scrapes`. Unknown paths answer 404, other
/// methods 405, and HEAD works wherever GET does (axum's `get` serves both).
pub fn router(publisher: Arc<Publisher>, interval: Duration, scrapes: ScrapeCounter) -> Router {
    let state = AppState {
        publisher,
        scrapes,
        interval,
        node: crate::metrics::dcgm::hostname(),
    };
    // The layer wraps the whole method router, so a 405 on /metrics is counted too.
    let metrics_route =
        get(metrics).layer(middleware::from_fn_with_state(state.clone(), count_scrape));
    Router::new()
        .route("/metrics", metrics_route)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/", get(index))
        .route("/api/v1/gpus", get(api_gpus))
        .route("/page.js", get(page_script))
        .with_state(state)
}

async fn count_scrape(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.scrapes.count(response.status().as_u16());
    response
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let current = state.publisher.current();
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(accepts_gzip);
    let body = if gzip { gzipped(&current).await } else { None };
    let mut response = match body {
        Some(body) => {
            let mut r = body.into_response();
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        }
        None => current.text.clone().into_response(),
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    response
}

/// The gzip form of the published exposition, made once per publish (see [`Published::gzip`]).
/// `None` only if compressing panicked, in which case the caller serves plain text.
async fn gzipped(current: &Published) -> Option<axum::body::Bytes> {
    match current.gzip().await {
        Ok(body) => Some(body),
        Err(e) => {
            tracing::error!(error = %e, "gzip of the exposition failed; serving plain text");
            None
        }
    }
}

/// Whether an `Accept-Encoding` value allows gzip: `gzip`/`x-gzip` listed with a non-zero q, or
/// `*` with a non-zero q when gzip is not listed at all (RFC 9110 §12.5.3).
fn accepts_gzip(accept_encoding: &str) -> bool {
    let mut wildcard = None;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let q = parts
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim().eq_ignore_ascii_case("q").then(|| v.trim())
            })
            .next()
            .map_or(1.0, |v| v.parse::<f32>().unwrap_or(0.0));
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            return q > 0.0;
        }
        if coding == "*" {
            wildcard = Some(q > 0.0);
        }
    }
    wildcard.unwrap_or(false)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let current = state.publisher.current();
    match readiness(current.sampled, &current.snapshot, now, state.interval) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

/// What the node page and its script may load: only this server's own script, inline style
/// and fetches to itself, so nothing on the page reaches another host.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
     connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Headers of the page and its JSON: never cached (each answer is one tick), no other host.
fn page_headers(content_type: &'static str) -> [(header::HeaderName, HeaderValue); 4] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

async fn index(State(state): State<AppState>) -> Response {
    page_response(&state, PageForm::Html, "text/html; charset=utf-8").await
}

async fn api_gpus(State(state): State<AppState>) -> Response {
    page_response(&state, PageForm::Json, "application/json").await
}

/// The node page of what is served now, in `form`: rendered once per publication (by the
/// first request for it) from the snapshot the exposition was encoded from, and shared.
async fn page_response(state: &AppState, form: PageForm, content_type: &'static str) -> Response {
    let current = state.publisher.current();
    let (snapshot, sampled) = (Arc::clone(&current.snapshot), current.sampled);
    let options = state.publisher.options();
    let node = state.node.clone();
    let render = move || {
        let view = NodeView::new(&snapshot, sampled, &options, &node, unix_now());
        match form {
            PageForm::Html => Bytes::from(page::html::render(&view)),
            // A view of plain data always serializes.
            PageForm::Json => Bytes::from(serde_json::to_vec(&view).unwrap_or_default()),
        }
    };
    match current.page(form, render).await {
        Ok(body) => (page_headers(content_type), body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering the node page failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn page_script() -> Response {
    (page_headers("text/javascript; charset=utf-8"), page::SCRIPT).into_response()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::metrics::{Encoder, MetricsOptions, VERSION};
    use crate::sample::{DeviceInfo, DeviceSample};

    const INTERVAL: Duration = Duration::from_secs(1);

    fn now() -> f64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    /// A publisher and the routes' scrape counter, in one registry as `lib.rs` wires them.
    #[derive(Clone)]
    struct Site {
        publisher: Arc<Publisher>,
        scrapes: ScrapeCounter,
    }

    impl std::ops::Deref for Site {
        type Target = Publisher;
        fn deref(&self) -> &Publisher {
            &self.publisher
        }
    }

    fn state() -> Site {
        let registry = prometheus::Registry::new();
        let scrapes = ScrapeCounter::new(&registry);
        let encoder = Encoder::new(MetricsOptions::default(), registry);
        Site {
            publisher: Publisher::new(encoder, None),
            scrapes,
        }
    }

    fn healthy_snapshot(last_tick: f64) -> Snapshot {
        Snapshot {
            nvml_up: true,
            devices: vec![Arc::new(DeviceSample {
                index: 0,
                uuid: "GPU-abc".into(),
                info: Arc::new(DeviceInfo {
                    name: "NVIDIA <H100>".into(),
                    ..Default::default()
                }),
                up: true,
                power_watts: Some(250.0),
                ..Default::default()
            })],
            tick_duration_seconds: Some(0.01),
            last_tick_timestamp_seconds: Some(last_tick),
            ..Default::default()
        }
    }

    /// Serves `state` on an ephemeral port from a runtime on its own thread; returns the base URL.
    /// The listener is bound before returning, so requests never race the server's start.
    fn serve(state: Site) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, router(state.publisher, INTERVAL, state.scrapes))
                    .await
                    .unwrap();
            });
        });
        format!("http://{addr}")
    }

    struct Reply {
        status: u16,
        headers: axum::http::HeaderMap,
        body: Vec<u8>,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).map(|v| v.to_str().unwrap())
        }
        fn text(&self) -> String {
            String::from_utf8(self.body.clone()).unwrap()
        }
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build(),
        )
    }

    fn reply(r: Result<axum::http::Response<ureq::Body>, ureq::Error>) -> Reply {
        let mut r = r.expect("request");
        Reply {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body: r.body_mut().read_to_vec().unwrap(),
        }
    }

    fn get(url: &str, accept_encoding: Option<&str>) -> Reply {
        let mut req = agent().get(url);
        if let Some(ae) = accept_encoding {
            req = req.header("Accept-Encoding", ae);
        }
        reply(req.call())
    }

    #[test]
    fn metrics_is_plain_text_without_accept_encoding() {
        let state = state();
        state.tick(healthy_snapshot(now()));
        let r = get(&format!("{}/metrics", serve(state)), None);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        assert_eq!(r.header("content-encoding"), None);
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        assert!(
            r.text()
                .contains("nvidia_gpu_power_watts{gpu=\"0\",uuid=\"GPU-abc\"} 250\n")
        );
    }

    #[test]
    fn metrics_gzip_round_trips() {
        let state = state();
        state.tick(healthy_snapshot(now()));
        let base = serve(state);
        let plain = get(&format!("{base}/metrics"), None);
        let r = get(&format!("{base}/metrics"), Some("br;q=1.0, gzip;q=0.8"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some("gzip"));
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&r.body[..])
            .read_to_end(&mut decoded)
            .unwrap();
        // Same tick, so the same bytes (scrape counts only change at the next publish).
        assert_eq!(decoded, plain.body);

        let refused = get(&format!("{base}/metrics"), Some("gzip;q=0, identity"));
        assert_eq!(refused.header("content-encoding"), None);
        assert_eq!(refused.body, plain.body);
    }

    #[test]
    fn accept_encoding_parsing() {
        assert!(accepts_gzip("gzip"));
        assert!(accepts_gzip("deflate, GZIP"));
        assert!(accepts_gzip("x-gzip;q=0.5"));
        assert!(accepts_gzip("*"));
        assert!(accepts_gzip("gzip ; q=0.001"));
        assert!(!accepts_gzip(""));
        assert!(!accepts_gzip("identity"));
        assert!(!accepts_gzip("gzip;q=0"));
        assert!(!accepts_gzip("gzip;q=0.0, *"));
        assert!(!accepts_gzip("*;q=0"));
        assert!(!accepts_gzip("br, deflate"));
    }

    #[test]
    fn before_the_first_publish_metrics_say_nvml_down_and_readyz_fails() {
        let base = serve(state());
        let r = get(&format!("{base}/metrics"), None);
        assert_eq!(r.status, 200);
        assert!(
            r.text().contains("\nnvml_exporter_nvml_up 0\n"),
            "{}",
            r.text()
        );
        let ready = get(&format!("{base}/readyz"), None);
        assert_eq!(
            (ready.status, ready.text().as_str()),
            (503, "no sample yet\n")
        );
    }

    #[test]
    fn readyz_follows_nvml_and_sample_age() {
        let state = state();
        let base = serve(state.clone());
        let readyz = || {
            let r = get(&format!("{base}/readyz"), None);
            (r.status, r.text())
        };

        state.tick(Snapshot {
            nvml_up: false,
            nvml_error: Some("driver not loaded".into()),
            ..Default::default()
        });
        assert_eq!(
            readyz(),
            (503, "NVML not initialised: driver not loaded\n".into())
        );

        state.tick(healthy_snapshot(now()));
        assert_eq!(readyz(), (200, "ok\n".into()));

        state.tick(healthy_snapshot(now() - 100.0));
        assert_eq!(
            readyz(),
            (503, "last sample 100 s old (limit 10 s)\n".into())
        );
    }

    #[test]
    fn readiness_rule() {
        let mut snap = healthy_snapshot(1000.0);
        let one_s = Duration::from_secs(1);
        let ready = |snap: &Snapshot, now: f64, interval| readiness(true, snap, now, interval);
        assert_eq!(ready(&snap, 1000.0, one_s), Ok(()));
        assert_eq!(ready(&snap, 1010.0, one_s), Ok(()));
        assert!(ready(&snap, 1010.5, one_s).is_err());
        // A long interval stretches the limit to three intervals.
        assert_eq!(ready(&snap, 1080.0, Duration::from_secs(30)), Ok(()));
        assert!(ready(&snap, 1091.0, Duration::from_secs(30)).is_err());
        // A clock that stepped back is not "stale".
        assert_eq!(ready(&snap, 900.0, one_s), Ok(()));
        assert_eq!(
            readiness(false, &snap, 1000.0, one_s),
            Err("no sample yet".into())
        );
        snap.last_tick_timestamp_seconds = None;
        assert_eq!(ready(&snap, 1000.0, one_s), Err("no sample yet".into()));
        snap.nvml_up = false;
        snap.nvml_error = Some("multi\nline".into());
        assert_eq!(
            ready(&snap, 1000.0, one_s),
            Err("NVML not initialised: multi\\nline".into())
        );
        assert_eq!(
            readiness_max_age(Duration::from_millis(100)),
            Duration::from_secs(10)
        );
        assert_eq!(
            readiness_max_age(Duration::from_secs(5)),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn healthz_is_always_ok() {
        let r = get(&format!("{}/healthz", serve(state())), None);
        assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
    }

    #[test]
    fn node_page_and_its_json_show_the_published_tick() {
        let state = state();
        let tick = now();
        state.tick(healthy_snapshot(tick));
        let base = serve(state);
        let r = get(&format!("{base}/"), None);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert_eq!(r.header("content-security-policy"), Some(PAGE_POLICY));
        let page = r.text();
        assert!(
            page.contains(&format!("nvml-exporter <b>{VERSION}</b>")),
            "{page}"
        );
        assert!(page.contains(&format!("data-tick=\"{tick}\"")), "{page}");
        assert!(page.contains("NVIDIA &lt;H100&gt;"), "{page}");
        assert!(
            page.contains("data-field=\"power_watts\" data-value=\"250\""),
            "{page}"
        );
        for link in ["/metrics", "/healthz", "/readyz", "/api/v1/gpus"] {
            assert!(page.contains(&format!("href=\"{link}\"")), "{link}");
        }

        let r = get(&format!("{base}/api/v1/gpus"), None);
        assert_eq!(r.header("content-type"), Some("application/json"));
        // Compared as text: serde_json's default parser may miss the last bit of a float.
        assert!(
            r.text()
                .contains(&format!("\"last_tick_timestamp_seconds\":{tick},")),
            "{}",
            r.text()
        );
        let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(json["gpus"][0]["name"], "NVIDIA <H100>");
        assert_eq!(json["gpus"][0]["power_watts"], 250.0);

        let script = get(&format!("{base}/page.js"), None);
        assert_eq!(
            script.header("content-type"),
            Some("text/javascript; charset=utf-8")
        );
        assert_eq!(script.text(), page::SCRIPT);
    }

    #[test]
    fn unknown_paths_404_wrong_methods_405_head_works() {
        let state = state();
        state.tick(healthy_snapshot(now()));
        let base = serve(state);
        assert_eq!(get(&format!("{base}/nope"), None).status, 404);
        let post = reply(agent().post(&format!("{base}/metrics")).send_empty());
        assert_eq!(post.status, 405);
        let post = reply(agent().post(&format!("{base}/readyz")).send_empty());
        assert_eq!(post.status, 405);
        for path in [
            "/metrics",
            "/healthz",
            "/readyz",
            "/",
            "/api/v1/gpus",
            "/page.js",
        ] {
            let head = reply(agent().head(&format!("{base}{path}")).call());
            assert_eq!(head.status, 200, "{path}");
            assert!(head.body.is_empty(), "{path}");
        }
        let head = reply(agent().head(&format!("{base}/metrics")).call());
        assert_eq!(
            head.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
    }

    #[test]
    fn scrapes_are_counted_by_code_from_the_next_publish() {
        let state = state();
        state.tick(healthy_snapshot(now()));
        let base = serve(state.clone());
        get(&format!("{base}/metrics"), None);
        get(&format!("{base}/metrics"), Some("gzip"));
        reply(agent().post(&format!("{base}/metrics")).send_empty());
        // Other endpoints are not scrapes.
        get(&format!("{base}/healthz"), None);
        state.tick(healthy_snapshot(now()));
        let text = get(&format!("{base}/metrics"), None).text();
        assert!(
            text.contains("nvml_exporter_scrapes_total{code=\"200\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("nvml_exporter_scrapes_total{code=\"405\"} 1\n"),
            "{text}"
        );
    }
}

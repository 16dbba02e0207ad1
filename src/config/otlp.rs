//! The OTLP push's options ([`OtlpOptions`]): each `--otlp-*` option, else OpenTelemetry's
//! variable for it (`OTEL_EXPORTER_OTLP_METRICS_*` before `OTEL_EXPORTER_OTLP_*`), else the
//! default; the headers and TLS files read (so that a reload reads them again); the resource
//! from what the exporter knows of itself, then `OTEL_RESOURCE_ATTRIBUTES`, then
//! `OTEL_SERVICE_NAME`. The push is on when an endpoint is given, by `--otlp-endpoint` or by
//! `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::files::read_small_file;
use crate::metrics::catalog::VERSION;
use crate::otlp::{Compression, Headers, OtlpOptions, Protocol, Tls, parse_pairs};

use super::Config;
use super::values::{fmt_duration, quote};

/// `--otlp-interval` by default: OpenTelemetry's metric export interval.
pub const DEFAULT_OTLP_INTERVAL: Duration = Duration::from_secs(60);

/// `--otlp-timeout` by default: OpenTelemetry's OTLP exporter timeout.
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest push interval accepted.
pub const MIN_OTLP_INTERVAL: Duration = Duration::from_millis(100);

/// The longest push interval accepted.
const MAX_OTLP_INTERVAL: Duration = Duration::from_secs(3600);

/// The options that mean nothing without an endpoint, by file key.
const NEED_ENDPOINT: &[&str] = &[
    "otlp_protocol",
    "otlp_interval",
    "otlp_timeout",
    "otlp_compression",
    "otlp_headers_file",
    "otlp_ca_file",
    "otlp_client_cert_file",
    "otlp_client_key_file",
];

/// A value the OTLP options cannot use, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OtlpError {
    /// The option of this file key.
    Option(&'static str, String),
    /// This environment variable of OpenTelemetry's.
    Variable(String, String),
    /// The TLS files together (a key that is not the certificate's).
    Tls(String),
}

impl fmt::Display for OtlpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OtlpError::Option(id, msg) => write!(f, "--{}: {msg}", id.replace('_', "-")),
            OtlpError::Variable(var, msg) => {
                write!(f, "invalid value for {var} (environment variable): {msg}")
            }
            OtlpError::Tls(msg) => write!(f, "the OTLP endpoint's TLS files: {msg}"),
        }
    }
}

/// Where a value was found: an option's file key, or an `OTEL_*` variable's name.
#[derive(Debug, Clone)]
enum Found {
    Option(&'static str),
    Variable(String),
}

impl Found {
    fn error(&self, msg: String) -> OtlpError {
        match self {
            Found::Option(id) => OtlpError::Option(id, msg),
            Found::Variable(var) => OtlpError::Variable(var.clone(), msg),
        }
    }
}

impl Config {
    /// The push's options, resolved from the options, `env` (OpenTelemetry's variables) and
    /// the files they name; `None` without an endpoint.
    pub(super) fn otlp_from(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpOptions>, OtlpError> {
        // A variable set to nothing is unset, as OpenTelemetry's SDKs take it.
        let var = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(|v| (Found::Variable(name.to_owned()), v))
        };
        // The metrics-specific variable, else the general one.
        let otel = |suffix: &str| {
            var(&format!("OTEL_EXPORTER_OTLP_METRICS_{suffix}"))
                .or_else(|| var(&format!("OTEL_EXPORTER_OTLP_{suffix}")))
        };

        // OTEL_EXPORTER_OTLP_ENDPOINT is a base URL, the metrics one the whole URL.
        let (endpoint, base) = match &self.otlp_endpoint {
            Some(uri) => (
                Some((Found::Option("otlp_endpoint"), uri.to_string())),
                true,
            ),
            None => match var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
                Some(found) => (Some(found), false),
                None => (var("OTEL_EXPORTER_OTLP_ENDPOINT"), true),
            },
        };
        let Some((endpoint_from, endpoint)) = endpoint else {
            if let Some(id) = NEED_ENDPOINT.iter().find(|id| self.otlp_option_set(id)) {
                return Err(OtlpError::Option(
                    id,
                    "needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT): without an endpoint \
                     nothing is pushed"
                        .into(),
                ));
            }
            return Ok(None);
        };

        let protocol = match self.otlp_protocol {
            Some(p) => p,
            None => match otel("PROTOCOL") {
                Some((from, value)) => match value.as_str() {
                    "grpc" => Protocol::Grpc,
                    "http/protobuf" => Protocol::HttpProtobuf,
                    "http/json" => {
                        return Err(
                            from.error("http/json is not supported: grpc or http/protobuf".into())
                        );
                    }
                    other => {
                        return Err(from.error(format!("{}: grpc or http/protobuf", quote(other))));
                    }
                },
                None => Protocol::Grpc,
            },
        };
        let endpoint =
            otlp_endpoint(&endpoint, protocol, base).map_err(|e| endpoint_from.error(e))?;
        let https = endpoint.scheme_str() == Some("https");

        let interval = match self.otlp_interval {
            Some(d) => d,
            None => match var("OTEL_METRIC_EXPORT_INTERVAL") {
                Some((from, ms)) => milliseconds(&from, &ms)?,
                None => DEFAULT_OTLP_INTERVAL,
            },
        };
        check_interval(interval).map_err(|e| match self.otlp_interval {
            Some(_) => OtlpError::Option("otlp_interval", e),
            None => OtlpError::Variable("OTEL_METRIC_EXPORT_INTERVAL".into(), e),
        })?;
        let timeout = match self.otlp_timeout {
            Some(d) => d,
            None => match otel("TIMEOUT") {
                Some((from, ms)) => milliseconds(&from, &ms)?,
                None => DEFAULT_OTLP_TIMEOUT,
            },
        };
        if timeout.is_zero() {
            return Err(OtlpError::Option("otlp_timeout", "must be above 0".into()));
        }
        let gzip = match self.otlp_compression {
            Some(c) => c == Compression::Gzip,
            None => match otel("COMPRESSION") {
                Some((from, value)) => match value.as_str() {
                    "gzip" => true,
                    "none" => false,
                    other => return Err(from.error(format!("{}: gzip or none", quote(other)))),
                },
                None => true,
            },
        };

        let headers = match &self.otlp_headers_file {
            Some(path) => {
                let from = Found::Option("otlp_headers_file");
                let text = read_text(path).map_err(|e| from.error(e))?;
                Headers::parse_file(&text)
                    .map_err(|e| from.error(format!("{}: {e}", path.display())))?
            }
            None => match otel("HEADERS") {
                Some((from, list)) => Headers::parse_list(&list).map_err(|e| from.error(e))?,
                None => Headers::default(),
            },
        };

        let file = |own: &Option<PathBuf>, id: &'static str, suffix: &str| {
            let found = match own {
                Some(path) => Some((Found::Option(id), path.clone())),
                None => otel(suffix).map(|(from, path)| (from, PathBuf::from(path))),
            };
            found
                .map(|(from, path)| {
                    if !https {
                        return Err(from.error(format!(
                            "a TLS file for an endpoint that is not https:// ({endpoint})"
                        )));
                    }
                    read_small_file(&path)
                        .map_err(|e| from.error(format!("{}: {e}", path.display())))
                })
                .transpose()
        };
        let ca = file(&self.otlp_ca_file, "otlp_ca_file", "CERTIFICATE")?;
        let cert = file(
            &self.otlp_client_cert_file,
            "otlp_client_cert_file",
            "CLIENT_CERTIFICATE",
        )?;
        let key = file(
            &self.otlp_client_key_file,
            "otlp_client_key_file",
            "CLIENT_KEY",
        )?;
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(OtlpError::Option(
                    "otlp_client_cert_file",
                    "needs --otlp-client-key-file, its key".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(OtlpError::Option(
                    "otlp_client_key_file",
                    "needs --otlp-client-cert-file, its certificate".into(),
                ));
            }
        };
        let tls = Tls { ca, client };
        if https {
            tls.check().map_err(OtlpError::Tls)?;
        }

        let resource = self.otlp_resource(env)?;
        Ok(Some(OtlpOptions {
            endpoint,
            protocol,
            interval,
            timeout,
            gzip,
            headers,
            tls,
            resource,
        }))
    }

    /// Whether the OTLP option of file key `id` was given.
    fn otlp_option_set(&self, id: &str) -> bool {
        match id {
            "otlp_protocol" => self.otlp_protocol.is_some(),
            "otlp_interval" => self.otlp_interval.is_some(),
            "otlp_timeout" => self.otlp_timeout.is_some(),
            "otlp_compression" => self.otlp_compression.is_some(),
            "otlp_headers_file" => self.otlp_headers_file.is_some(),
            "otlp_ca_file" => self.otlp_ca_file.is_some(),
            "otlp_client_cert_file" => self.otlp_client_cert_file.is_some(),
            "otlp_client_key_file" => self.otlp_client_key_file.is_some(),
            _ => false,
        }
    }

    /// Who pushes: `service.name` `nvml-exporter`, `service.version`, `service.instance.id`
    /// (`host.name:port` of `--listen`), `host.name` (the `NODE_NAME` variable, as
    /// dcgm-exporter's `Hostname`, else the system's), `k8s.node.name` (`--kubernetes-node-name`);
    /// then `OTEL_RESOURCE_ATTRIBUTES`, which replaces any of them, then `OTEL_SERVICE_NAME`.
    fn otlp_resource(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>, OtlpError> {
        let host = env("NODE_NAME")
            .filter(|n| !n.trim().is_empty())
            .or_else(|| {
                hostname::get()
                    .ok()
                    .map(|h| h.to_string_lossy().into_owned())
            })
            .unwrap_or_default();
        let mut resource: Vec<(String, String)> = vec![
            ("service.name".into(), "nvml-exporter".into()),
            ("service.version".into(), VERSION.into()),
            (
                "service.instance.id".into(),
                format!("{host}:{}", self.listen.port()),
            ),
            ("host.name".into(), host),
        ];
        if let Some(node) = &self.kubernetes_node_name {
            resource.push(("k8s.node.name".into(), node.clone()));
        }
        let mut set =
            |key: String, value: String| match resource.iter_mut().find(|(k, _)| *k == key) {
                Some(kv) => kv.1 = value,
                None => resource.push((key, value)),
            };
        if let Some(list) = env("OTEL_RESOURCE_ATTRIBUTES") {
            let pairs = parse_pairs(&list)
                .map_err(|e| OtlpError::Variable("OTEL_RESOURCE_ATTRIBUTES".into(), e))?;
            for (k, v) in pairs {
                set(k, v);
            }
        }
        if let Some(name) = env("OTEL_SERVICE_NAME").filter(|n| !n.trim().is_empty()) {
            set("service.name".into(), name.trim().to_owned());
        }
        Ok(resource)
    }
}

/// The URL requests go to: `text` as an http(s) URL with a host, no query or fragment; for
/// gRPC no path; for HTTP/protobuf, a `base` URL's path followed by `/v1/metrics`.
fn otlp_endpoint(text: &str, protocol: Protocol, base: bool) -> Result<http::Uri, String> {
    let shown = quote(text);
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{shown} is not a URL ({e})"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "{shown} must start with http:// or https:// (e.g. http://otel-collector:4317)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{shown} has no host"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(format!("{shown} must not have a query or a fragment"));
    }
    match protocol {
        Protocol::Grpc => {
            if !matches!(uri.path(), "" | "/") {
                return Err(format!(
                    "{shown}: a gRPC endpoint is an address without a path (the OTLP service's \
                     path is fixed)"
                ));
            }
            Ok(uri)
        }
        Protocol::HttpProtobuf if base => {
            let path = format!("{}/v1/metrics", uri.path().trim_end_matches('/'));
            let mut parts = uri.into_parts();
            parts.path_and_query = Some(path.parse().map_err(|e| format!("{shown}: {e}"))?);
            http::Uri::from_parts(parts).map_err(|e| format!("{shown}: {e}"))
        }
        Protocol::HttpProtobuf => Ok(uri),
    }
}

/// An interval within its bounds.
fn check_interval(interval: Duration) -> Result<(), String> {
    if interval < MIN_OTLP_INTERVAL || interval > MAX_OTLP_INTERVAL {
        return Err(format!(
            "{} is not from {} to {}",
            fmt_duration(interval),
            fmt_duration(MIN_OTLP_INTERVAL),
            fmt_duration(MAX_OTLP_INTERVAL)
        ));
    }
    Ok(())
}

/// OpenTelemetry's durations are integers of milliseconds.
fn milliseconds(from: &Found, text: &str) -> Result<Duration, OtlpError> {
    text.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| from.error(format!("{}: milliseconds, e.g. 10000", quote(text))))
}

/// A file of text, bounded.
fn read_text(path: &Path) -> Result<String, String> {
    let bytes = read_small_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::testing::{err, file, load_args};

    fn resolve(args: &[&str], vars: &[(&str, &str)]) -> Result<Option<OtlpOptions>, OtlpError> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        load_args(args)
            .unwrap()
            .otlp_from(&|name| env.get(name).cloned())
    }

    #[test]
    fn off_without_an_endpoint_and_the_defaults_with_one() {
        assert_eq!(resolve(&[], &[]).unwrap(), None);
        let o = resolve(
            &["--otlp-endpoint", "http://collector:4317"],
            &[("NODE_NAME", "node-7")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.endpoint, "http://collector:4317/");
        assert_eq!(o.protocol, Protocol::Grpc);
        assert_eq!(o.interval, Duration::from_secs(60));
        assert_eq!(o.timeout, Duration::from_secs(10));
        assert!(o.gzip);
        assert_eq!(o.headers, Headers::default());
        let resource: HashMap<_, _> = o.resource.into_iter().collect();
        assert_eq!(resource["service.name"], "nvml-exporter");
        assert_eq!(resource["service.version"], VERSION);
        assert_eq!(resource["host.name"], "node-7");
        assert_eq!(resource["service.instance.id"], "node-7:9400");
    }

    #[test]
    fn the_options_beat_otel_variables_which_beat_the_defaults() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/prefix/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.cluster.name=prod,host.name=gpu-7",
            ),
            ("OTEL_SERVICE_NAME", "gpus"),
        ];
        let o = resolve(&[], &vars).unwrap().unwrap();
        assert_eq!(o.endpoint, "http://env:4318/prefix/v1/metrics");
        assert_eq!(o.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            o.timeout,
            Duration::from_millis(2500),
            "the metrics variable first"
        );
        assert_eq!(o.interval, Duration::from_secs(15));
        assert!(!o.gzip);
        assert_eq!(o.headers.0[0].1, "Bearer t");
        let resource: HashMap<_, _> = o.resource.into_iter().collect();
        assert_eq!(resource["service.name"], "gpus");
        assert_eq!(resource["host.name"], "gpu-7");
        assert_eq!(resource["k8s.cluster.name"], "prod");

        let headers = file("Authorization: Bearer from-file\n");
        let o = resolve(
            &[
                "--otlp-endpoint",
                "https://own:4317",
                "--otlp-protocol",
                "grpc",
                "--otlp-timeout",
                "3s",
                "--otlp-interval",
                "5s",
                "--otlp-compression",
                "gzip",
                "--otlp-headers-file",
                headers.path().to_str().unwrap(),
            ],
            &vars,
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.endpoint, "https://own:4317/");
        assert_eq!(o.protocol, Protocol::Grpc);
        assert_eq!(o.timeout, Duration::from_secs(3));
        assert_eq!(o.interval, Duration::from_secs(5));
        assert!(o.gzip);
        assert_eq!(o.headers.0.len(), 1);
        assert_eq!(o.headers.0[0].1, "Bearer from-file");

        // The metrics endpoint is the whole URL.
        let o = resolve(
            &[],
            &[
                (
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                    "http://m:4318/custom",
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.endpoint, "http://m:4318/custom");
    }

    /// The options of a default configuration changed by `change`, with `vars`: values the
    /// load would refuse.
    fn refused(change: impl FnOnce(&mut Config), vars: &[(&str, &str)]) -> OtlpError {
        let mut c = Config::default();
        change(&mut c);
        let env: HashMap<&str, &str> = vars.iter().copied().collect();
        c.otlp_from(&|name| env.get(name).map(|v| (*v).to_owned()))
            .unwrap_err()
    }

    #[test]
    fn refused_values_name_the_option_or_the_variable() {
        let endpoint = |url: &str| {
            let url: http::Uri = url.parse().unwrap();
            move |c: &mut Config| c.otlp_endpoint = Some(url)
        };
        let e = refused(|_| {}, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")]);
        assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
        let e = refused(
            endpoint("http://c:4317"),
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
        );
        assert!(
            e.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL")
                && e.to_string().contains("http/json"),
            "{e}"
        );
        let e = refused(
            endpoint("http://c:4317"),
            &[("OTEL_METRIC_EXPORT_INTERVAL", "soon")],
        );
        assert!(e.to_string().contains("OTEL_METRIC_EXPORT_INTERVAL"), "{e}");
        let e = refused(endpoint("http://c:4317/v1/metrics"), &[]);
        assert!(matches!(e, OtlpError::Option("otlp_endpoint", _)), "{e}");
        let e = refused(
            |c| {
                endpoint("http://c:4317")(c);
                c.otlp_timeout = Some(Duration::ZERO);
            },
            &[],
        );
        assert!(matches!(e, OtlpError::Option("otlp_timeout", _)), "{e}");
        let e = refused(|c| c.otlp_interval = Some(Duration::from_secs(5)), &[]);
        assert!(e.to_string().contains("needs --otlp-endpoint"), "{e}");
        let ca = file("-----BEGIN CERTIFICATE-----\n");
        let with_ca = |url: &str| {
            let set = endpoint(url);
            let ca = ca.path().to_owned();
            move |c: &mut Config| {
                set(c);
                c.otlp_ca_file = Some(ca);
            }
        };
        let e = refused(with_ca("http://c:4317"), &[]);
        assert!(e.to_string().contains("not https://"), "{e}");
        let e = refused(with_ca("https://c:4317"), &[]);
        assert!(matches!(e, OtlpError::Tls(_)), "{e}");
        let e = refused(
            |c| {
                endpoint("https://c:4317")(c);
                c.otlp_client_cert_file = Some("/x.pem".into());
            },
            &[],
        );
        assert!(e.to_string().contains("/x.pem"), "{e}");
        let e = refused(
            |c| {
                endpoint("http://c:4317")(c);
                c.otlp_headers_file = Some("/no/such/file".into());
            },
            &[],
        );
        assert!(
            matches!(e, OtlpError::Option("otlp_headers_file", _)),
            "{e}"
        );

        // Through the whole load, with where the value came from.
        let e = err(&["--otlp-endpoint", "http://c:4317", "--otlp-interval", "1ms"]);
        assert!(e.contains("--otlp-interval (command line)"), "{e}");
        let e = err(&["--otlp-endpoint", "ftp://c"]);
        assert!(
            e.contains("--otlp-endpoint") && e.contains("http://"),
            "{e}"
        );
        let e = err(&["--otlp-timeout", "5s"]);
        assert!(
            e.contains("--otlp-timeout (command line)") && e.contains("needs"),
            "{e}"
        );
        let f = file("otlp_endpoint = \"http://c:4317\"\notlp_protocol = \"http/json\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("otlp_protocol") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn the_file_takes_the_protocol_and_durations_as_text() {
        let f = file(
            "otlp_endpoint = \"http://c:4318\"\notlp_protocol = \"http/protobuf\"\notlp_interval = \"30s\"\notlp_compression = \"none\"\n",
        );
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        let o = c.otlp_from(&|_| None).unwrap().unwrap();
        assert_eq!(o.endpoint, "http://c:4318/v1/metrics");
        assert_eq!(o.interval, Duration::from_secs(30));
        assert!(!o.gzip);
    }
}

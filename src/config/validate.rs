//! Refused values: what parses but cannot be used (bounds, options that need one another, URLs
//! that are not HTTPS), each named with the origin of its value, as [`super::load`] reports it.

use super::loading::{Origin, Origins};
use super::otlp::OtlpError;
use super::values::{fmt_duration, quote};
use super::{Config, ConfigError, MAX_INTERVAL, MIN_INTERVAL};
use crate::groups::Group;

impl Config {
    /// Refuses values that parse but cannot be used, naming the option and where its value came
    /// from; trims the resource names and drops empty ones.
    pub(super) fn validate(&mut self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        self.validate_pod_metadata(origins)?;
        self.validate_timing(origins)?;
        if !(0.0..=1.0).contains(&self.idle_threshold) {
            return Err(invalid(
                "idle_threshold",
                format!("{} is not a ratio from 0 to 1", self.idle_threshold),
            ));
        }
        // Only a value someone wrote conflicts with --demo; the default library does not.
        if self.demo && origins.of("nvml_lib") != Origin::Default {
            return Err(ConfigError::Invalid(format!(
                "--nvml-lib ({}) and --demo ({}) cannot be used together: --demo loads the simulated library",
                origins.of("nvml_lib"),
                origins.of("demo")
            )));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(invalid(
                "log_level",
                format!("{}: {e}", quote(&self.log_level)),
            ));
        }
        self.validate_kubernetes(origins)?;
        if self.max_series == Some(0) {
            return Err(invalid("max_series", "must be at least 1".into()));
        }
        if self.max_processes_per_gpu == 0 {
            return Err(invalid(
                "max_processes_per_gpu",
                "must be at least 1".into(),
            ));
        }
        let paths = [
            ("web_config", self.web_config.as_deref()),
            ("nvml_lib", Some(self.nvml_lib.as_path())),
            ("pod_resources_socket", Some(&self.pod_resources_socket)),
            ("kubelet_token_file", Some(&self.kubelet_token_file)),
            ("kubelet_ca_file", Some(&self.kubelet_ca_file)),
            ("kubernetes_api_ca_file", Some(&self.kubernetes_api_ca_file)),
            ("host_proc", Some(&self.host_proc)),
            ("health_state_file", self.health_state_file.as_deref()),
            ("host_sys", Some(&self.host_sys)),
        ];
        for (id, path) in paths {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(invalid(id, "the path is empty".into()));
            }
        }
        if let Some(path) = self.health_state_file.as_deref().filter(|p| p.is_dir()) {
            return Err(invalid(
                "health_state_file",
                format!("{} is a directory, not a file", path.display()),
            ));
        }
        // Resolved with OpenTelemetry's variables and the files read, as the exporter will.
        self.otlp_options().map_err(|e| match e {
            OtlpError::Option(id, msg) => invalid(id, msg),
            other => ConfigError::Invalid(other.to_string()),
        })?;
        Ok(())
    }

    /// The pod labels and annotations to copy: only with `--kubernetes`, no empty key, no two
    /// served under one name.
    fn validate_pod_metadata(&self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        let copied = [
            ("kubernetes_pod_labels", &self.kubernetes_pod_labels),
            (
                "kubernetes_pod_annotations",
                &self.kubernetes_pod_annotations,
            ),
        ];
        if let Some((id, _)) = copied.iter().find(|(_, keys)| !keys.is_empty())
            && !self.kubernetes
        {
            // Silently serving nothing would look like pods without those labels.
            return Err(invalid(
                id,
                "needs --kubernetes: the keys are copied onto nvidia_gpu_pod_info, which only \
                 --kubernetes serves"
                    .into(),
            ));
        }
        let mut names = std::collections::BTreeMap::new();
        for (key, annotation, name) in self.copied_pod_metadata() {
            let id = if annotation {
                "kubernetes_pod_annotations"
            } else {
                "kubernetes_pod_labels"
            };
            if key.trim().is_empty() {
                return Err(invalid(id, "an empty key".into()));
            }
            if let Some(other) = names.insert(name.clone(), key.clone()) {
                return Err(invalid(
                    id,
                    format!("{other:?} and {key:?} would both be served as {name}"),
                ));
            }
        }
        Ok(())
    }

    /// The interval within its bounds, and the per-device deadline and staleness grace against it.
    fn validate_timing(&self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        let interval = self.interval;
        if interval < MIN_INTERVAL {
            return Err(invalid(
                "interval",
                format!(
                    "{} is below the minimum of {}",
                    fmt_duration(interval),
                    fmt_duration(MIN_INTERVAL)
                ),
            ));
        }
        if interval > MAX_INTERVAL {
            return Err(invalid(
                "interval",
                format!(
                    "{} is above the maximum of {}",
                    fmt_duration(interval),
                    fmt_duration(MAX_INTERVAL)
                ),
            ));
        }
        let device_timeout = self.device_timeout();
        if device_timeout.is_zero() || device_timeout > interval {
            return Err(invalid(
                "device_timeout",
                format!(
                    "{} must be above 0 and at most the interval ({})",
                    fmt_duration(device_timeout),
                    fmt_duration(interval)
                ),
            ));
        }
        let stale_grace = self.stale_grace();
        if stale_grace < interval {
            return Err(invalid(
                "stale_grace",
                format!(
                    "{} must be at least the interval ({})",
                    fmt_duration(stale_grace),
                    fmt_duration(interval)
                ),
            ));
        }
        Ok(())
    }

    /// The Kubernetes options: refresh and timeout, URLs, the DRA driver and node name (trimmed),
    /// and the resource names (trimmed, empty ones dropped).
    fn validate_kubernetes(&mut self, origins: &Origins<'_>) -> Result<(), ConfigError> {
        let invalid = |id: &str, msg: String| origins.invalid(id, msg);
        if let Some(refresh) = self.kubernetes_refresh.filter(|r| *r < MIN_INTERVAL) {
            return Err(invalid(
                "kubernetes_refresh",
                format!(
                    "{} is below the minimum of {}",
                    fmt_duration(refresh),
                    fmt_duration(MIN_INTERVAL)
                ),
            ));
        }
        if self.kubernetes_timeout.is_zero() {
            return Err(invalid("kubernetes_timeout", "must be above 0".into()));
        }
        check_kubelet_url(&self.kubelet_url).map_err(|e| invalid("kubelet_url", e))?;
        if let Some(url) = &self.kubernetes_api_url {
            check_kubelet_url(url).map_err(|e| invalid("kubernetes_api_url", e))?;
        }
        self.kubernetes_dra_driver = self.kubernetes_dra_driver.trim().to_owned();
        if self.kubernetes_dra_driver.is_empty() {
            return Err(invalid("kubernetes_dra_driver", "must not be empty".into()));
        }
        check_dns_subdomain(&self.kubernetes_dra_driver)
            .map_err(|e| invalid("kubernetes_dra_driver", e))?;
        self.kubernetes_node_name = self
            .kubernetes_node_name
            .take()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty());
        // It goes into API paths and a field selector: only a name the API server could have.
        if let Some(name) = &self.kubernetes_node_name {
            check_dns_subdomain(name).map_err(|e| invalid("kubernetes_node_name", e))?;
        }
        if self.kubernetes_node_condition && !self.kubernetes {
            // Silently writing nothing would look like a node whose GPUs were never checked.
            return Err(invalid(
                "kubernetes_node_condition",
                "needs --kubernetes".into(),
            ));
        }
        if self.kubernetes_node_condition && !self.groups().contains(Group::Health) {
            return Err(invalid(
                "kubernetes_node_condition",
                "needs the health collector group, which gives the verdicts it writes".into(),
            ));
        }
        for (on, flag) in [
            (self.kubernetes_dra, "--kubernetes-dra"),
            (
                self.kubernetes_node_condition,
                "--kubernetes-node-condition",
            ),
        ] {
            if self.kubernetes && on && self.kubernetes_node_name.is_none() {
                return Err(invalid(
                    "kubernetes_node_name",
                    format!(
                        "is needed by {flag} (set NVML_EXPORTER_KUBERNETES_NODE_NAME from the \
                         downward API's spec.nodeName)"
                    ),
                ));
            }
        }
        self.kubernetes_resource_names = std::mem::take(&mut self.kubernetes_resource_names)
            .into_iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if let Some(bad) = self
            .kubernetes_resource_names
            .iter()
            .find(|n| n.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(
                "kubernetes_resource_names",
                format!("'{bad}' is not a resource name (e.g. example.com/gpu)"),
            ));
        }
        Ok(())
    }
}

/// An `https://host[:port][/prefix]` URL. Only HTTPS: the request carries a bearer token, and the
/// kubelet's plain-HTTP read-only port is off by default and deprecated.
fn check_kubelet_url(uri: &http::Uri) -> Result<(), String> {
    let shown = quote(&uri.to_string());
    if uri.scheme_str() != Some("https") {
        return Err(format!(
            "{shown} must start with https:// (e.g. https://10.0.0.1:10250)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{shown} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{shown} must not have a query"));
    }
    Ok(())
}

/// Whether `name` is a DNS-1123 subdomain, as Kubernetes requires of a node's name and a DRA
/// driver's: at most 253 characters, dot-separated labels of lowercase letters, digits and `-`,
/// each starting and ending with a letter or digit.
fn check_dns_subdomain(name: &str) -> Result<(), String> {
    const MAX: usize = 253;
    if name.len() > MAX {
        return Err(format!(
            "'{}…' is longer than the {MAX} characters of a Kubernetes name",
            name.chars().take(32).collect::<String>()
        ));
    }
    let label_ok = |label: &str| {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        label.starts_with(alnum)
            && label.ends_with(alnum)
            && label.chars().all(|c| alnum(c) || c == '-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a Kubernetes name (a DNS-1123 subdomain: lowercase letters, digits, \
             '-' and '.', starting and ending with a letter or digit)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, file, load_args};
    use crate::config::*;

    #[test]
    fn max_series_defaults_to_none_and_refuses_0() {
        assert_eq!(load_args(&[]).unwrap().max_series, None);
        assert_eq!(
            load_args(&["--max-series", "500"]).unwrap().max_series,
            Some(500)
        );
        let e = err(&["--max-series", "0"]);
        assert!(
            e.contains("--max-series") && e.contains("at least 1"),
            "{e}"
        );
    }

    #[test]
    fn demo_and_nvml_lib_conflict() {
        let e = err(&["--demo", "--nvml-lib", "/x.so"]);
        assert!(e.contains("--demo") && e.contains("--nvml-lib"), "{e}");
        let f = file("demo = true\n");
        let e = err(&[
            "--config",
            f.path().to_str().unwrap(),
            "--nvml-lib",
            "/x.so",
        ]);
        assert!(e.contains("--nvml-lib") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn device_timeout_must_fit_in_the_interval() {
        let e = err(&["--interval", "1s", "--device-timeout", "2s"]);
        assert!(e.contains("--device-timeout"), "{e}");
        let c = load_args(&[
            "--interval",
            "2s",
            "--device-timeout",
            "500ms",
            "--stale-grace",
            "2s",
        ])
        .unwrap();
        assert_eq!(c.device_timeout(), Duration::from_millis(500));
    }

    #[test]
    fn idle_threshold_defaults_overrides_and_refusals() {
        assert_eq!(load_args(&[]).unwrap().idle_threshold, 0.05);
        assert_eq!(
            load_args(&["--idle-threshold", "0.2"])
                .unwrap()
                .idle_threshold,
            0.2
        );
        let f = file("idle_threshold = 0\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.idle_threshold, 0.0);
        for bad in ["1.5", "-0.1", "NaN"] {
            let e = err(&[&format!("--idle-threshold={bad}")]);
            assert!(
                e.contains("--idle-threshold") && e.contains("not a ratio from 0 to 1"),
                "{bad}: {e}"
            );
        }
        assert!(err(&["--idle-threshold", "lots"]).contains("--idle-threshold"));
    }

    #[test]
    fn the_health_state_file_is_off_by_default_reaches_the_sampler_and_is_no_directory() {
        let c = load_args(&[]).unwrap();
        assert_eq!(c.health_state_file, None);
        assert_eq!(c.sampler_options().health_state_file, None);
        let c = load_args(&["--health-state-file", "/var/lib/x/health.json"]).unwrap();
        assert_eq!(
            c.sampler_options().health_state_file,
            Some(PathBuf::from("/var/lib/x/health.json"))
        );
        let f = file("health_state_file = \"/state/h.json\"\n");
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.health_state_file, Some(PathBuf::from("/state/h.json")));
        let dir = tempfile::tempdir().unwrap();
        let e = err(&["--health-state-file", dir.path().to_str().unwrap()]);
        assert!(
            e.contains("--health-state-file") && e.contains("is a directory"),
            "{e}"
        );
        assert!(err(&["--health-state-file", ""]).contains("--health-state-file"));
        assert!(crate::config::RESTART_OPTIONS.contains(&"health_state_file"));
    }

    #[test]
    fn kubernetes_defaults_and_overrides() {
        let c = load_args(&["--interval", "2s", "--stale-grace", "5s"]).unwrap();
        assert!(!c.kubernetes && c.kubernetes_labels);
        assert_eq!(
            c.pod_resources_socket,
            PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET)
        );
        assert_eq!(
            c.kubernetes_refresh(),
            Duration::from_secs(2),
            "refresh follows the interval"
        );
        assert_eq!(c.kubernetes_timeout, Duration::from_secs(1));
        assert!(c.kubernetes_resource_names.is_empty());

        let c = load_args(&[
            "--kubernetes",
            "--kubernetes-labels=false",
            "--pod-resources-socket",
            "/run/k.sock",
            "--kubernetes-resource-names",
            "a.com/gpu, b.com/gpu",
            "--kubernetes-refresh",
            "5s",
            "--kubernetes-timeout",
            "200ms",
        ])
        .unwrap();
        assert!(c.kubernetes && !c.kubernetes_labels);
        assert_eq!(c.pod_resources_socket, PathBuf::from("/run/k.sock"));
        assert_eq!(c.kubernetes_resource_names, ["a.com/gpu", "b.com/gpu"]);
        assert_eq!(c.kubernetes_refresh(), Duration::from_secs(5));
        assert_eq!(c.kubernetes_timeout, Duration::from_millis(200));

        let f = file(
            "kubernetes = true\nkubernetes_resource_names = [\"x.io/gpu\"]\nkubernetes_refresh = \"3s\"\n",
        );
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert!(c.kubernetes);
        assert_eq!(c.kubernetes_resource_names, ["x.io/gpu"]);
        assert_eq!(c.kubernetes_refresh(), Duration::from_secs(3));

        let e = err(&["--kubernetes-timeout", "0s"]);
        assert!(e.contains("--kubernetes-timeout"), "{e}");
        let e = err(&["--kubernetes-refresh", "1ms"]);
        assert!(e.contains("--kubernetes-refresh"), "{e}");
        let e = err(&["--pod-resources-socket", ""]);
        assert!(e.contains("--pod-resources-socket"), "{e}");
        let f = file("kubernetes_refresh = \"1ms\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--kubernetes-refresh") && e.contains("line 1"),
            "{e}"
        );
    }

    #[test]
    fn kubelet_options_defaults_and_overrides() {
        let k = load_args(&[]).unwrap();
        assert!(
            !k.fetch_pods(),
            "the pod list is only fetched for --processes"
        );
        assert!(load_args(&["--processes"]).unwrap().fetch_pods());
        assert!(!k.kubelet_pods);
        let p = load_args(&["--kubelet-pods"]).unwrap();
        assert!(p.kubelet_pods && p.fetch_pods());
        assert!(!load_args(&["--kubelet-pods=false"]).unwrap().fetch_pods());
        assert_eq!(k.kubelet_url, DEFAULT_KUBELET_URL);
        assert_eq!(
            k.kubelet_token_file,
            PathBuf::from(DEFAULT_KUBELET_TOKEN_FILE)
        );
        assert_eq!(k.kubelet_ca_file, PathBuf::from(DEFAULT_KUBELET_CA_FILE));
        assert!(!k.kubelet_insecure_tls);

        let k = load_args(&[
            "--kubelet-url",
            "https://10.1.2.3:10250",
            "--kubelet-token-file",
            "/t",
            "--kubelet-ca-file",
            "/ca.pem",
            "--kubelet-insecure-tls",
        ])
        .unwrap();
        assert_eq!(k.kubelet_url, "https://10.1.2.3:10250");
        assert_eq!(k.kubelet_token_file, PathBuf::from("/t"));
        assert_eq!(k.kubelet_ca_file, PathBuf::from("/ca.pem"));
        assert!(k.kubelet_insecure_tls);

        let f = file("kubelet_url = \"https://node:10250/x\"\nkubelet_insecure_tls = true\n");
        let k = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(k.kubelet_url, "https://node:10250/x");
        assert!(k.kubelet_insecure_tls);

        for bad in [
            "http://10.0.0.1:10255",
            "10.0.0.1:10250",
            "https://",
            "https://h/?a=b",
        ] {
            let e = err(&["--kubelet-url", bad]);
            assert!(e.contains("--kubelet-url"), "{bad}: {e}");
        }
        let f = file("kubelet_url = \"http://x\"\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(e.contains("--kubelet-url") && e.contains("line 1"), "{e}");
        assert!(err(&["--kubelet-token-file", ""]).contains("--kubelet-token-file"));
        assert!(err(&["--kubelet-ca-file", ""]).contains("--kubelet-ca-file"));
    }

    #[test]
    fn the_node_condition_needs_kubernetes_a_node_name_and_the_health_group() {
        let on = [
            "--kubernetes-node-condition",
            "--kubernetes-node-name",
            "n1",
        ];
        let e = err(&on);
        assert!(
            e.contains("--kubernetes-node-condition") && e.contains("needs --kubernetes"),
            "{e}"
        );
        let e = err(&["--kubernetes", "--kubernetes-node-condition"]);
        assert!(
            e.contains("--kubernetes-node-name") && e.contains("--kubernetes-node-condition"),
            "{e}"
        );
        let e = err(&[&["--kubernetes", "--no-collector.health"][..], &on].concat());
        assert!(
            e.contains("--kubernetes-node-condition") && e.contains("health"),
            "{e}"
        );
        let k = load_args(&[&["--kubernetes"][..], &on].concat())
            .unwrap()
            .kubernetes_options();
        let api = k.node_condition.expect("the node condition is written");
        assert_eq!(api.node_name, "n1");
        assert_eq!(k.dra, None);
    }

    #[test]
    fn dra_options_need_a_node_name_and_an_https_api_server() {
        let c = load_args(&[]).unwrap();
        assert!(!c.kubernetes_dra);
        assert_eq!(c.kubernetes_dra_driver, DEFAULT_DRA_DRIVER);
        assert_eq!(c.kubernetes_node_name, None);
        assert_eq!(
            c.kubernetes_api_ca_file,
            PathBuf::from(DEFAULT_KUBELET_CA_FILE)
        );

        let c = load_args(&[
            "--kubernetes",
            "--kubernetes-dra",
            "--kubernetes-node-name",
            " node-1 ",
            "--kubernetes-api-url",
            "https://10.0.0.1:6443",
        ])
        .unwrap();
        assert!(c.kubernetes_dra);
        assert_eq!(c.kubernetes_node_name.as_deref(), Some("node-1"));
        assert_eq!(c.kubernetes_api_url().to_string(), "https://10.0.0.1:6443/");

        let e = err(&["--kubernetes", "--kubernetes-dra"]);
        assert!(e.contains("--kubernetes-node-name"), "{e}");
        let e = err(&["--kubernetes-api-url", "http://10.0.0.1:6443"]);
        assert!(e.contains("--kubernetes-api-url"), "{e}");
        let e = err(&["--kubernetes-dra-driver", " "]);
        assert!(e.contains("--kubernetes-dra-driver"), "{e}");
        let e = err(&["--kubernetes-dra-driver", "gpu.nvidia.com,spec.x=y"]);
        assert!(e.contains("--kubernetes-dra-driver"), "{e}");
        let f = file(
            "kubernetes = true\nkubernetes_dra = true\nkubernetes_node_name = \"n\"\nkubernetes_api_url = \"https://api:443\"\n",
        );
        let c = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.kubernetes_api_url().to_string(), "https://api:443/");
    }

    #[test]
    fn copied_pod_labels_or_annotations_without_kubernetes_are_refused() {
        let e = err(&["--kubernetes-pod-labels", "team"]);
        assert_eq!(
            e,
            "error: invalid value for --kubernetes-pod-labels (command line): needs --kubernetes: the \
             keys are copied onto nvidia_gpu_pod_info, which only --kubernetes serves"
        );
        let e = err(&["--kubernetes-pod-annotations", "example.com/owner"]);
        assert!(
            e.contains("--kubernetes-pod-annotations") && e.contains("needs --kubernetes"),
            "{e}"
        );
        let f = file("kubernetes_pod_labels = [\"team\"]\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--kubernetes-pod-labels (")
                && e.contains(" line 1)")
                && e.contains("needs --kubernetes"),
            "{e}"
        );
    }

    #[test]
    fn inventory_and_fabric_defaults_and_overrides() {
        let p = load_args(&[]).unwrap();
        assert_eq!(p.host_sys, PathBuf::from("/sys"));
        assert_eq!(
            p.fabric_registration_timeout,
            crate::health::FABRIC_REGISTRATION_TIMEOUT
        );
        let o = p.sampler_options();
        assert_eq!(
            (o.host_sys, o.fabric_registration_timeout),
            (PathBuf::from("/sys"), Duration::from_secs(300))
        );

        let p = load_args(&[
            "--host-sys",
            "/host/sys",
            "--fabric-registration-timeout",
            "90s",
        ])
        .unwrap();
        assert_eq!(p.host_sys, PathBuf::from("/host/sys"));
        assert_eq!(p.fabric_registration_timeout, Duration::from_secs(90));

        let f = file("host_sys = \"/h/sys\"\nfabric_registration_timeout = \"10m\"\n");
        let p = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(p.host_sys, PathBuf::from("/h/sys"));
        assert_eq!(p.fabric_registration_timeout, Duration::from_secs(600));

        let e = err(&["--host-sys", ""]);
        assert!(e.contains("--host-sys"), "{e}");
        let e = err(&["--fabric-registration-timeout", "soon"]);
        assert!(e.contains("--fabric-registration-timeout"), "{e}");
    }

    #[test]
    fn processes_defaults_and_overrides() {
        let p = load_args(&[]).unwrap();
        assert_eq!(p, Config::default());
        assert!(!p.processes);
        assert_eq!(p.max_processes_per_gpu, 32);
        assert_eq!(p.host_proc, PathBuf::from("/proc"));

        let p = load_args(&[
            "--processes",
            "--max-processes-per-gpu",
            "4",
            "--host-proc",
            "/host/proc",
        ])
        .unwrap();
        assert!(p.processes);
        assert_eq!(p.max_processes_per_gpu, 4);
        assert_eq!(p.host_proc, PathBuf::from("/host/proc"));

        let f = file("processes = true\nmax_processes_per_gpu = 8\nhost_proc = \"/h/proc\"\n");
        let p = load_args(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert!(p.processes);
        assert_eq!(p.max_processes_per_gpu, 8);
        assert_eq!(p.host_proc, PathBuf::from("/h/proc"));

        let e = err(&["--max-processes-per-gpu", "0"]);
        assert!(e.contains("--max-processes-per-gpu"), "{e}");
        let e = err(&["--max-processes-per-gpu", "many"]);
        assert!(e.contains("--max-processes-per-gpu"), "{e}");
        let e = err(&["--host-proc", ""]);
        assert!(e.contains("--host-proc"), "{e}");
        let f = file("\nmax_processes_per_gpu = 0\n");
        let e = err(&["--config", f.path().to_str().unwrap()]);
        assert!(
            e.contains("--max-processes-per-gpu") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn node_names_are_kubernetes_names_or_refused() {
        for good in ["node-1", "ip-10-0-0-1.ec2.internal", "a", &"a".repeat(253)] {
            let c = load_args(&["--kubernetes-node-name", good]).unwrap();
            assert_eq!(c.kubernetes_node_name.as_deref(), Some(good));
        }
        for bad in [
            "..",
            ".",
            "../../../apis/evil.example/v1/namespaces/kube-system/secrets/x",
            "a?dryRun=All&x=",
            "a#frag",
            "a/b",
            "Node-1",
            "-a",
            "a-",
            "a..b",
            "a,spec.driver=x",
            "nöde",
            &"a".repeat(254),
        ] {
            let e = err(&[&format!("--kubernetes-node-name={bad}")]);
            assert!(
                e.contains("invalid value for --kubernetes-node-name"),
                "{bad}: {e}"
            );
        }
    }
}

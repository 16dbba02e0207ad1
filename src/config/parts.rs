//! Each part's options from the configuration: what the kubelet refresh, the encoder and the
//! sampler are built from (and rebuilt from on a reload). The parts take only their own options
//! struct and never import this module.

use crate::groups::Groups;
use crate::kubernetes::{ApiServer, DraOptions, KubernetesOptions, PodsOptions};
use crate::metrics::MetricsOptions;
use crate::metrics::dcgm::{self, DcgmCompat};
use crate::otlp::OtlpOptions;
use crate::sampler::SamplerOptions;

use super::Config;
use super::otlp::OtlpError;

impl Config {
    /// What the kubelet refresh reads (`--kubernetes-*`, `--kubelet-*`), defaults resolved: the
    /// pod list only where it is fetched, DRA only with `--kubernetes-dra`.
    pub fn kubernetes_options(&self) -> KubernetesOptions {
        KubernetesOptions {
            pod_resources_socket: self.pod_resources_socket.clone(),
            resource_names: self.kubernetes_resource_names.clone(),
            refresh: self.kubernetes_refresh(),
            timeout: self.kubernetes_timeout,
            token_file: self.kubelet_token_file.clone(),
            pods: self.fetch_pods().then(|| PodsOptions {
                url: self.kubelet_url.clone(),
                ca_file: (!self.kubelet_insecure_tls).then(|| self.kubelet_ca_file.clone()),
                copied: self.copied_pod_metadata(),
            }),
            dra: self.kubernetes_dra.then(|| DraOptions {
                driver: self.kubernetes_dra_driver.clone(),
                api: self.api_server(),
            }),
            node_condition: self.kubernetes_node_condition.then(|| self.api_server()),
        }
    }

    /// This node in the API server, as DRA and the node condition reach it.
    fn api_server(&self) -> ApiServer {
        ApiServer {
            node_name: self.kubernetes_node_name.clone().unwrap_or_default(),
            url: self.kubernetes_api_url(),
            ca_file: self.kubernetes_api_ca_file.clone(),
        }
    }

    /// What the OTLP push is configured with (`--otlp-*`, else OpenTelemetry's `OTEL_*`
    /// variables, else the defaults), its headers and TLS files read now; `None` when there is
    /// no endpoint, and the push is off.
    pub fn otlp_options(&self) -> Result<Option<OtlpOptions>, OtlpError> {
        self.otlp_from(&|name| std::env::var(name).ok())
    }

    /// The encoder's settings from the configuration.
    pub fn metrics_options(&self) -> MetricsOptions {
        MetricsOptions {
            pod_labels: self.pod_labels(),
            max_processes_per_gpu: self.max_processes_per_gpu,
            processes: self.processes,
            dcgm_compat: self.dcgm_compat,
            dcgm_release: self.dcgm_compat_version,
            // Only the dcgm-exporter series carry it; asking the environment once is enough.
            hostname: if self.dcgm_compat == DcgmCompat::Off {
                String::new()
            } else {
                dcgm::hostname()
            },
            groups: self.groups(),
            max_series: self.max_series,
            idle_threshold: self.idle_threshold,
        }
    }

    /// The sampler's settings from the configuration.
    pub fn sampler_options(&self) -> SamplerOptions {
        SamplerOptions {
            nvml_lib: self.nvml().library_path(),
            interval: self.interval,
            device_timeout: self.device_timeout(),
            stale_grace: self.stale_grace(),
            processes: self.processes.then(|| self.host_proc.clone()),
            // With --dcgm-compat every group dcgm-exporter's fields come from is sampled, unless
            // switched off by name, so that its fields are served whatever the native defaults.
            groups: self.collectors.groups(match self.dcgm_compat {
                DcgmCompat::Off => Groups::none(),
                _ => dcgm::groups(),
            }),
            idle_threshold: self.idle_threshold,
            health_state_file: self.health_state_file.clone(),
            host_sys: self.host_sys.clone(),
            fabric_registration_timeout: self.fabric_registration_timeout,
        }
    }
}

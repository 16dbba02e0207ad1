//! GPU assignments made through DRA resource claims (`--kubernetes-dra`).
//!
//! The kubelet's `List` answer gives each container's claims (`dynamic_resources`): the claim's
//! name and, per allocated device, its driver, pool and device name. [`claimed_devices`] keeps
//! those of `--kubernetes-dra-driver`; [`Dra::resolve`] names each device exactly through the
//! driver's ResourceSlices ([`super::slices`]) and returns them as [`PodAssignment`]s carrying
//! the claim's name, which then follow the device-plugin path unchanged.
//!
//! The slices are kept between refreshes and listed again only when a claimed device is not in
//! them (once per such name, so a name the driver never publishes costs one list, not one per
//! refresh), or after [`slices::RESYNC`]. No DRA claim on the node, no API-server call.
//!
//! What cannot be named leaves its GPU unattributed and nothing else: a claimed device with an
//! empty claim, pool or device name is counted under `dra_malformed`, one the slices do not name
//! exactly under `dra_unknown_device`, each once when it appears, with one log line; a failed
//! list under `dra_slices` (`dra_too_large` for an answer over
//! [`slices::MAX_BODY_BYTES`]; logged when the API server stops answering or fails differently),
//! and retried after [`RETRY`]. Device-plugin assignments never wait on any of it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::sample::{ContainerRef, KubeletError, PodAssignment};

use super::proto::ListPodResourcesResponse;
use super::slices::{self, SliceDevices, SlicesClient};
use super::{DraOptions, KubernetesOptions};

/// The error reasons of DRA attribution, counted only with `--kubernetes-dra`.
pub const REASONS: &[KubeletError] = &[
    KubeletError::DraSlices,
    KubeletError::DraTooLarge,
    KubeletError::DraUnknownDevice,
    KubeletError::DraMalformed,
];

/// How long after a failed list the slices are asked for again.
pub const RETRY: Duration = Duration::from_secs(10);

/// One device of a claim of a container, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimedDevice {
    /// The container the claim is given to.
    pub container: ContainerRef,
    /// The claim's name.
    pub claim: String,
    /// The driver's pool (the node's name, for NVIDIA's driver).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
}

/// The devices of `driver` in the claims of every container of a `List` answer, sorted and
/// distinct.
pub fn claimed_devices(response: &ListPodResourcesResponse, driver: &str) -> Vec<ClaimedDevice> {
    let mut out = BTreeSet::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for claim in &container.dynamic_resources {
                for device in claim
                    .claim_resources
                    .iter()
                    .filter(|r| r.driver_name == driver)
                {
                    out.insert(ClaimedDevice {
                        container: ContainerRef {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: container.name.clone(),
                        },
                        claim: claim.claim_name.clone(),
                        pool: device.pool_name.clone(),
                        device: device.device_name.clone(),
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The ResourceSlice cache and what has been reported of the claimed devices.
#[derive(Debug)]
pub struct Dra {
    driver: String,
    client: SlicesClient,
    /// The devices of the last successful list.
    devices: SliceDevices,
    /// When the last successful list was made; `None` before it.
    listed_at: Option<Instant>,
    /// No list before this, after a failed one.
    retry_at: Option<Instant>,
    /// The (pool, device) names not in the last successful list that were claimed since: each
    /// makes one list, not one per refresh.
    missing: BTreeSet<(String, String)>,
    /// How the last list ended, for logging changes only; `None` before the first.
    last_error: Option<Option<String>>,
    /// The claimed devices counted as unresolved, until they are no longer claimed.
    reported: BTreeSet<ClaimedDevice>,
}

impl Dra {
    /// The resolver of `dra`'s driver and node, with the token file and timeout of `options`.
    /// Calls nothing yet.
    pub fn new(dra: &DraOptions, options: &KubernetesOptions) -> Dra {
        Dra {
            driver: dra.driver.clone(),
            client: SlicesClient::new(dra, options),
            devices: SliceDevices::new(),
            listed_at: None,
            retry_at: None,
            missing: BTreeSet::new(),
            last_error: None,
            reported: BTreeSet::new(),
        }
    }

    /// The driver whose claims are read.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The assignments of `claimed` that the slices name, and the error reasons to count.
    pub async fn resolve(
        &mut self,
        claimed: Vec<ClaimedDevice>,
    ) -> (Vec<PodAssignment>, Vec<KubeletError>) {
        let mut errors = Vec::new();
        if claimed.is_empty() {
            self.reported.clear();
            return (Vec::new(), errors);
        }
        if self.should_list(&claimed, Instant::now()) {
            match self.client.fetch().await {
                Ok(devices) => {
                    if self.last_error != Some(None) {
                        tracing::info!(
                            url = %self.client.url(),
                            devices = devices.len(),
                            "ResourceSlices read"
                        );
                    }
                    self.last_error = Some(None);
                    self.devices = devices;
                    self.listed_at = Some(Instant::now());
                    self.retry_at = None;
                    self.missing = claimed
                        .iter()
                        .map(|c| (c.pool.clone(), c.device.clone()))
                        .filter(|key| !self.devices.contains_key(key))
                        .collect();
                }
                Err(e) => {
                    if self.last_error.as_ref().and_then(Option::as_deref)
                        != Some(e.message.as_str())
                    {
                        tracing::warn!(
                            error = %e,
                            "ResourceSlices not read: GPUs allocated through DRA claims stay \
                             unattributed until they are (device-plugin GPUs are not affected); \
                             retrying every {}",
                            humantime::format_duration(RETRY)
                        );
                    }
                    self.retry_at = Some(Instant::now() + RETRY);
                    errors.push(e.reason);
                    self.last_error = Some(Some(e.message));
                }
            }
        }
        let mut assignments = Vec::new();
        let mut bad = BTreeMap::new();
        for c in claimed {
            if c.claim.is_empty() || c.pool.is_empty() || c.device.is_empty() {
                bad.insert(
                    c,
                    (
                        KubeletError::DraMalformed,
                        "the kubelet names it without a claim, pool or device name".to_owned(),
                    ),
                );
                continue;
            }
            match self.devices.get(&(c.pool.clone(), c.device.clone())) {
                Some(Ok(device)) => assignments.push(PodAssignment {
                    container: c.container,
                    device: device.clone(),
                    claim: c.claim,
                }),
                Some(Err(why)) => {
                    let why = format!("its ResourceSlice does not name one GPU: {why}");
                    bad.insert(c, (KubeletError::DraUnknownDevice, why));
                }
                // Not known because the slices were never read: the failed list is counted.
                None if self.listed_at.is_none() => {}
                None => {
                    let why = "no ResourceSlice of this node names it".to_owned();
                    bad.insert(c, (KubeletError::DraUnknownDevice, why));
                }
            }
        }
        for (c, (reason, why)) in &bad {
            if self.reported.contains(c) {
                continue;
            }
            tracing::warn!(
                namespace = %c.container.namespace,
                pod = %c.container.pod,
                container = %c.container.container,
                claim = %c.claim,
                pool = %c.pool,
                device = %c.device,
                reason = reason.label(),
                "a device claimed through DRA is left unattributed: {why}"
            );
            errors.push(*reason);
        }
        self.reported = bad.into_keys().collect();
        assignments.sort();
        assignments.dedup();
        (assignments, errors)
    }

    /// Whether the slices are listed now: never listed, listed too long ago, or a claimed name
    /// that the last list lacked and that has not made a list since; never while a failed list
    /// waits for [`RETRY`].
    fn should_list(&mut self, claimed: &[ClaimedDevice], now: Instant) -> bool {
        if self.retry_at.is_some_and(|at| now < at) {
            return false;
        }
        let Some(listed_at) = self.listed_at else {
            return true;
        };
        if now.duration_since(listed_at) >= slices::RESYNC {
            return true;
        }
        claimed.iter().any(|c| {
            let key = (c.pool.clone(), c.device.clone());
            !c.device.is_empty() && !self.devices.contains_key(&key) && !self.missing.contains(&key)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::proto::{
        CdiDevice, ClaimResource, ContainerResources, DynamicResource, PodResources,
    };

    #[test]
    fn only_the_configured_drivers_devices_are_claimed_devices() {
        let resource = |driver: &str, device: &str| ClaimResource {
            cdi_devices: vec![CdiDevice {
                name: format!("k8s.{driver}/device={device}"),
            }],
            driver_name: driver.into(),
            pool_name: "node-1".into(),
            device_name: device.into(),
        };
        let response = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "train".into(),
                namespace: "ml".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices: vec![],
                    dynamic_resources: vec![DynamicResource {
                        claim_name: "gpus".into(),
                        claim_namespace: "ml".into(),
                        claim_resources: vec![
                            resource("gpu.nvidia.com", "gpu-1"),
                            resource("nic.example.com", "nic-0"),
                            resource("gpu.nvidia.com", "gpu-0"),
                        ],
                    }],
                }],
            }],
        };
        let got: Vec<(String, String)> = claimed_devices(&response, "gpu.nvidia.com")
            .into_iter()
            .map(|c| (c.claim, c.device))
            .collect();
        assert_eq!(
            got,
            [
                ("gpus".to_owned(), "gpu-0".to_owned()),
                ("gpus".to_owned(), "gpu-1".to_owned())
            ]
        );
    }

    fn claimed(device: &str) -> ClaimedDevice {
        ClaimedDevice {
            container: ContainerRef {
                namespace: "ml".into(),
                pod: "p".into(),
                container: "c".into(),
            },
            claim: "gpus".into(),
            pool: "node-1".into(),
            device: device.into(),
        }
    }

    #[test]
    fn a_missing_name_makes_one_list_and_a_stale_cache_another() {
        let options = DraOptions {
            driver: "gpu.nvidia.com".into(),
            api: crate::kubernetes::ApiServer {
                node_name: "node-1".into(),
                url: "https://10.0.0.1:6443".parse().unwrap(),
                ..Default::default()
            },
        };
        let mut dra = Dra::new(&options, &KubernetesOptions::default());
        let now = Instant::now();
        assert!(dra.should_list(&[claimed("gpu-0")], now), "never listed");
        dra.listed_at = Some(now);
        dra.devices.insert(
            ("node-1".into(), "gpu-0".into()),
            Ok(crate::sample::DeviceRef::GpuUuid("GPU-a".into())),
        );
        assert!(!dra.should_list(&[claimed("gpu-0")], now));
        assert!(dra.should_list(&[claimed("gpu-7")], now), "a new name");
        dra.missing.insert(("node-1".into(), "gpu-7".into()));
        assert!(
            !dra.should_list(&[claimed("gpu-7")], now),
            "a name already listed for"
        );
        assert!(dra.should_list(&[claimed("gpu-0")], now + slices::RESYNC));
        dra.retry_at = Some(now + RETRY);
        assert!(
            !dra.should_list(&[claimed("gpu-8")], now),
            "after a failure"
        );
    }
}

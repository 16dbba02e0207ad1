//! The ResourceSlices of NVIDIA's DRA driver on this node, read from the API server: which GPU or
//! MIG device each claimed device name is (`--kubernetes-dra`).
//!
//! The kubelet's pod-resources answer names a DRA device by driver, pool and device name
//! (`gpu.nvidia.com`, the node's name, `gpu-0`), never by UUID. The driver publishes, per node,
//! `resource.k8s.io/v1` ResourceSlices listing each device with attributes: `uuid` for a GPU
//! (type `gpu`) and for a MIG device that exists (type `mig`, `uuid` "MIG-…"); a MIG device the
//! driver creates when it is allocated (dynamic MIG, partitionable devices) has no UUID before it
//! exists, and is named instead by `parentUUID`, `profile` and the memory slices it consumes
//! (`consumesCounters`, `memory-slice-N`): the GPU instance at that placement of that GPU. So
//! each claimed device resolves to exactly one [`DeviceRef`], or to none.
//!
//! [`SlicesClient`] lists the slices of this node and driver (`fieldSelector=spec.nodeName=…,
//! spec.driver=…`) with the service account's token, verifying the API server against its CA:
//! what `list` on `resourceslices` allows (deploy/kubernetes/dra). The caller keeps the
//! answer and lists again only when a claimed device name is not in it, or after [`RESYNC`].

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;

use crate::sample::{DeviceRef, KubeletError};

use super::rest::{Grant, Peer, Reasons, RestClient, RestError};
use super::{DraOptions, KubernetesOptions};

/// How long a successful list is kept before it is made again even though every claimed device
/// is in it (a device name can come back with another UUID after the driver re-publishes).
pub const RESYNC: Duration = Duration::from_secs(300);

/// The largest answer read: a node's slices are a few KiB per device.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How the client counts a failed list: one reason, and its own for an answer over the cap.
const COUNTED: Reasons = Reasons {
    unavailable: KubeletError::DraSlices,
    timeout: KubeletError::DraSlices,
    tls: KubeletError::DraSlices,
    auth: KubeletError::DraSlices,
    conflict: KubeletError::DraSlices,
    http: KubeletError::DraSlices,
    too_large: KubeletError::DraTooLarge,
};

/// What to grant when the API server refuses the token.
const GRANT: Grant = Grant {
    rules: "list on resourceslices (resource.k8s.io)",
    manifest: "deploy/kubernetes/dra",
};

/// What the slices say of each device, by (pool, device name): the device, or why it cannot be
/// named exactly.
pub type SliceDevices = BTreeMap<(String, String), Result<DeviceRef, String>>;

/// A client of the API server's ResourceSlice list for one node and driver.
#[derive(Debug)]
pub struct SlicesClient {
    rest: RestClient,
    /// The list URL with its field selector.
    url: Url,
    driver: String,
}

impl SlicesClient {
    /// A client for `--kubernetes-api-url`, `--kubernetes-node-name` and
    /// `--kubernetes-dra-driver`; touches nothing until the first call.
    /// The token file and timeout are `options`'.
    pub fn new(dra: &DraOptions, options: &KubernetesOptions) -> SlicesClient {
        let rest = RestClient::new(
            Peer::ApiServer,
            &dra.api.url,
            Some(dra.api.ca_file.clone()),
            options.token_file.clone(),
            options.timeout,
            COUNTED,
            GRANT,
        );
        let selector = format!(
            "spec.nodeName={},spec.driver={}",
            dra.api.node_name, dra.driver
        );
        let url = rest
            .url(
                &["apis", "resource.k8s.io", "v1", "resourceslices"],
                &[("fieldSelector", &selector)],
            )
            .expect("constant segments");
        SlicesClient {
            rest,
            url,
            driver: dra.driver.clone(),
        }
    }

    /// The URL called.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Lists the slices, giving up after `--kubernetes-timeout`; the error says what failed and
    /// what to change.
    pub async fn fetch(&mut self) -> Result<SliceDevices, RestError> {
        let body = self.rest.get(&self.url, MAX_BODY_BYTES).await?;
        parse_slice_list(&body, &self.driver).map_err(|e| RestError {
            reason: KubeletError::DraSlices,
            message: format!(
                "GET {}: the answer is not a ResourceSlice list: {e}",
                self.url
            ),
        })
    }
}

// Only the fields used; serde skips the rest.

#[derive(Deserialize)]
struct SliceList {
    kind: Option<String>,
    items: Option<Vec<Slice>>,
}

#[derive(Deserialize)]
struct Slice {
    spec: SliceSpec,
}

#[derive(Deserialize)]
struct SliceSpec {
    driver: String,
    pool: Pool,
    devices: Option<Vec<Device>>,
}

#[derive(Deserialize)]
struct Pool {
    name: String,
    #[serde(default)]
    generation: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    attributes: Option<BTreeMap<String, Attribute>>,
    consumes_counters: Option<Vec<CounterConsumption>>,
}

#[derive(Deserialize)]
struct Attribute {
    string: Option<String>,
}

#[derive(Deserialize)]
struct CounterConsumption {
    counters: Option<BTreeMap<String, serde::de::IgnoredAny>>,
}

/// The devices of `driver` in a `ResourceSliceList`, by (pool, device name). Of a pool published
/// in several generations (the driver re-publishing), only the newest generation counts.
pub fn parse_slice_list(json: &[u8], driver: &str) -> Result<SliceDevices, serde_json::Error> {
    let list: SliceList = serde_json::from_slice(json)?;
    if let Some(kind) = list.kind.as_deref().filter(|k| *k != "ResourceSliceList") {
        return Err(serde::de::Error::custom(format!(
            "kind is {kind:?}, not \"ResourceSliceList\""
        )));
    }
    let slices: Vec<SliceSpec> = list
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.spec)
        .filter(|s| s.driver == driver)
        .collect();
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for s in &slices {
        let g = newest.entry(&s.pool.name).or_insert(s.pool.generation);
        *g = (*g).max(s.pool.generation);
    }
    let mut out = SliceDevices::new();
    for s in &slices {
        if newest.get(s.pool.name.as_str()) != Some(&s.pool.generation) {
            continue;
        }
        for d in s.devices.iter().flatten() {
            out.insert((s.pool.name.clone(), d.name.clone()), device_ref(d, driver));
        }
    }
    Ok(out)
}

/// The device a slice entry names (see the module doc).
fn device_ref(d: &Device, driver: &str) -> Result<DeviceRef, String> {
    // Attribute names are in the driver's domain: `uuid` and `gpu.nvidia.com/uuid` are one.
    let attribute = |name: &str| {
        let qualified = format!("{driver}/{name}");
        d.attributes
            .iter()
            .flatten()
            .find(|(k, _)| **k == name || **k == qualified)
            .and_then(|(_, v)| v.string.as_deref())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if let Some(uuid) = attribute("uuid") {
        return match DeviceRef::parse(uuid) {
            r @ (DeviceRef::GpuUuid(_) | DeviceRef::MigUuid(_)) => Ok(r),
            _ => Err(format!("its uuid attribute {uuid:?} is no GPU or MIG UUID")),
        };
    }
    let parent = attribute("parentUUID")
        .ok_or("it has neither a uuid nor a parentUUID attribute".to_owned())?;
    let profile = attribute("profile")
        .ok_or("a MIG device without a uuid must have a profile attribute".to_owned())?;
    let placement_start = d
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| c.counters.iter().flatten())
        .filter_map(|(name, _)| name.strip_prefix("memory-slice-")?.parse::<u32>().ok())
        .min()
        .ok_or(
            "a MIG device without a uuid must consume memory-slice-N counters (its placement)"
                .to_owned(),
        )?;
    Ok(DeviceRef::MigPlacement {
        parent_uuid: parent.to_owned(),
        profile: profile.to_owned(),
        placement_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(pool: &str, generation: i64, devices: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "metadata": { "name": format!("{pool}-gpu.nvidia.com-{generation}") },
            "spec": { "driver": "gpu.nvidia.com", "nodeName": pool,
                "pool": { "name": pool, "generation": generation, "resourceSliceCount": 1 },
                "devices": devices }
        })
    }

    #[test]
    fn gpus_static_and_dynamic_mig_devices_and_what_cannot_be_named() {
        let list = serde_json::json!({
            "kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
            "items": [
                slice("node-1", 1, serde_json::json!([
                    { "name": "gpu-0", "attributes": {
                        "type": { "string": "gpu" }, "uuid": { "string": "GPU-a" },
                        "driverVersion": { "version": "580.0.0" } } },
                    { "name": "gpu-1-mig-9-2-1", "attributes": {
                        "type": { "string": "mig" },
                        "gpu.nvidia.com/uuid": { "string": "MIG-b" },
                        "parentUUID": { "string": "GPU-c" } } },
                    { "name": "gpu-1-mig-1g10gb-19-3", "attributes": {
                        "type": { "string": "mig" }, "parentUUID": { "string": "GPU-c" },
                        "profile": { "string": "1g.10gb" } },
                      "consumesCounters": [{ "counterSet": "gpu-1-counter-set", "counters": {
                          "multiprocessors": { "value": "16" },
                          "memory-slice-4": { "value": "1" },
                          "memory-slice-3": { "value": "1" } } }] },
                    { "name": "gpu-2", "attributes": { "type": { "string": "gpu" } } },
                    { "name": "gpu-3", "attributes": { "uuid": { "string": "3" } } },
                ])),
                // An older generation of the pool: superseded.
                slice("node-1", 0, serde_json::json!([{ "name": "gpu-9",
                    "attributes": { "uuid": { "string": "GPU-old" } } }])),
                { "spec": { "driver": "other.example.com", "pool": { "name": "node-1" },
                    "devices": [{ "name": "fpga-0" }] } },
            ]
        });
        let devices = parse_slice_list(list.to_string().as_bytes(), "gpu.nvidia.com").unwrap();
        let get = |name: &str| {
            devices
                .get(&("node-1".to_owned(), name.to_owned()))
                .cloned()
        };
        assert_eq!(get("gpu-0"), Some(Ok(DeviceRef::GpuUuid("GPU-a".into()))));
        assert_eq!(
            get("gpu-1-mig-9-2-1"),
            Some(Ok(DeviceRef::MigUuid("MIG-b".into())))
        );
        assert_eq!(
            get("gpu-1-mig-1g10gb-19-3"),
            Some(Ok(DeviceRef::MigPlacement {
                parent_uuid: "GPU-c".into(),
                profile: "1g.10gb".into(),
                placement_start: 3,
            }))
        );
        assert!(get("gpu-2").unwrap().is_err());
        assert!(get("gpu-3").unwrap().is_err());
        assert_eq!(get("gpu-9"), None, "an older generation is superseded");
        assert_eq!(get("fpga-0"), None, "another driver's devices are not read");
    }

    #[test]
    fn not_a_slice_list_is_an_error() {
        assert!(parse_slice_list(b"<html>", "gpu.nvidia.com").is_err());
        let e = parse_slice_list(br#"{"kind":"Status"}"#, "gpu.nvidia.com").unwrap_err();
        assert!(e.to_string().contains("Status"), "{e}");
        assert!(
            parse_slice_list(
                br#"{"kind":"ResourceSliceList","items":null}"#,
                "gpu.nvidia.com"
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn the_list_url_selects_this_node_and_driver() {
        let dra = DraOptions {
            driver: "gpu.nvidia.com".into(),
            api: crate::kubernetes::ApiServer {
                node_name: "node-1".into(),
                url: "https://10.0.0.1:6443".parse().unwrap(),
                ca_file: std::path::PathBuf::new(),
            },
        };
        let client = SlicesClient::new(&dra, &KubernetesOptions::default());
        assert_eq!(
            client.url().to_string(),
            "https://10.0.0.1:6443/apis/resource.k8s.io/v1/resourceslices\
             ?fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dgpu.nvidia.com"
        );
    }
}

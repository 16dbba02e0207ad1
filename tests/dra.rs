//! DRA attribution end to end (`--kubernetes-dra`): the real exporter on the simulated GPUs, a
//! fake kubelet whose `List` answer carries resource claims of NVIDIA's DRA driver, and a fake
//! API server (HTTPS, a test CA) serving the driver's ResourceSlices for the node.

mod common;
mod kubelet;

use std::path::Path;
use std::time::Duration;

use common::{Exporter, Exposition, scenario};
use kubelet::https::{FakeKubeletApi, Reply};
use kubelet::{FakeKubelet, dra_pod, pod};

const NODE: &str = "node-1";
const DRIVER: &str = "gpu.nvidia.com";
const SLICES_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices";
const H100_GPU0: &str = "GPU-8e1c4a7f-3b2d-4c6e-9a0f-5d7b9e1c3a21";

/// A ResourceSliceList of one slice of NVIDIA's driver for [`NODE`] holding `devices`.
fn slices(devices: serde_json::Value) -> Reply {
    let list = serde_json::json!({
        "kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {},
        "items": [{
            "metadata": { "name": format!("{NODE}-{DRIVER}-x7k2p") },
            "spec": { "driver": DRIVER, "nodeName": NODE,
                "pool": { "name": NODE, "generation": 1, "resourceSliceCount": 1 },
                "devices": devices }
        }]
    });
    Reply::Body(list.to_string().into_bytes())
}

/// A whole GPU as the driver publishes it.
fn gpu_device(name: &str, uuid: &str) -> serde_json::Value {
    serde_json::json!({ "name": name, "attributes": {
        "type": { "string": "gpu" }, "uuid": { "string": uuid },
        "productName": { "string": "NVIDIA H100 80GB HBM3" } } })
}

/// The exporter on `scenario_name` (`env` added) reading claims from the kubelet at `socket` and
/// slices from `api_url`, trusting `ca_pem`, sending token "t" (files written to `dir`).
fn exporter(
    dir: &Path,
    socket: &Path,
    (api_url, ca_pem): (&str, &str),
    scenario_name: &str,
    env: &[(&str, &str)],
) -> Exporter {
    let (ca, token) = kubelet::client_files(dir, ca_pem);
    let path = scenario(scenario_name);
    let mut env = env.to_vec();
    env.push(("NVML_SIM_SCENARIO", path.to_str().unwrap()));
    Exporter::start(
        &env,
        &[
            "--interval",
            "300ms",
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
            "--kubernetes-dra",
            "--kubernetes-node-name",
            NODE,
            "--kubernetes-api-url",
            api_url,
            "--kubernetes-api-ca-file",
            ca.to_str().unwrap(),
            "--kubelet-token-file",
            token.to_str().unwrap(),
            "--log-level",
            "info",
        ],
    )
}

fn ticks(m: &Exposition) -> f64 {
    m.value("nvml_exporter_sample_duration_seconds_count", &[])
        .unwrap_or(0.0)
}

fn errors(m: &Exposition, reason: &str) -> Option<f64> {
    m.value(
        "nvml_exporter_kubernetes_errors_total",
        &[("reason", reason)],
    )
}

/// (gpu, gpu_instance, pod, claim) of every `nvidia_gpu_pod_info` series, sorted.
fn pod_infos(m: &Exposition) -> Vec<[String; 4]> {
    let mut out: Vec<[String; 4]> = m
        .find("nvidia_gpu_pod_info", &[])
        .iter()
        .map(|s| {
            let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            [l("gpu"), l("gpu_instance"), l("pod"), l("claim")]
        })
        .collect();
    out.sort();
    out
}

fn row(gpu: &str, gi: &str, pod: &str, claim: &str) -> [String; 4] {
    [gpu.into(), gi.into(), pod.into(), claim.into()]
}

#[test]
fn dra_gpus_are_attributed_by_their_slice_uuid_and_an_unknown_device_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let api = FakeKubeletApi::start_at(SLICES_PATH, "t", slices(serde_json::json!([])));
    let e = exporter(
        dir.path(),
        &socket,
        (&api.url(), api.ca_pem()),
        "h100x8",
        &[],
    );
    let m = e.wait_metrics(Duration::from_secs(10), "kubelet up", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0) && ticks(m) > 0.0
    });
    assert_eq!(errors(&m, "dra_unknown_device"), Some(0.0));
    assert!(
        api.requests().is_empty(),
        "no claim on the node, no API-server call"
    );
    let uuid = |gpu: &str| m.find("nvidia_gpu_info", &[("gpu", gpu)])[0].labels["uuid"].clone();
    let (uuid0, uuid2, uuid5) = (uuid("0"), uuid("2"), uuid("5"));
    // gpu-N names follow the minor number, not the NVML index: the slice alone says which.
    api.set_reply(slices(serde_json::json!([
        gpu_device("gpu-0", &uuid5),
        gpu_device("gpu-1", &uuid2),
    ])));

    kubelet.set_pods(vec![
        dra_pod(
            "ml",
            "train",
            "main",
            "train-gpus",
            (DRIVER, NODE),
            &["gpu-1"],
        ),
        dra_pod("ml", "odd", "main", "odd-gpu", (DRIVER, NODE), &["gpu-77"]),
        // Another driver's claim is not a GPU assignment, whatever its device is called.
        dra_pod(
            "net",
            "nic",
            "main",
            "nic",
            ("nic.example.com", NODE),
            &["gpu-0"],
        ),
        pod("web", "plugin", "srv", "nvidia.com/gpu", &[&uuid0]),
    ]);
    let m = e.wait_metrics(Duration::from_secs(10), "the DRA GPU attributed", |m| {
        pod_infos(m).len() == 2
    });
    assert_eq!(
        pod_infos(&m),
        [
            row("0", "", "plugin", ""),
            row("2", "", "train", "train-gpus")
        ]
    );
    assert_eq!(
        m.find(
            "nvidia_gpu_memory_used_bytes",
            &[
                ("gpu", "2"),
                ("namespace", "ml"),
                ("pod", "train"),
                ("container", "main")
            ]
        )
        .len(),
        1,
        "the DRA GPU's series carry its pod"
    );
    assert_eq!(
        m.find("nvidia_gpu_info", &[]).len(),
        8,
        "GPUs not allocated stay visible"
    );

    // The unknown name made one more list, and then no list per refresh; it is counted once.
    let from = ticks(&m);
    let m = e.wait_metrics(Duration::from_secs(10), "five more ticks", |m| {
        ticks(m) >= from + 5.0
    });
    assert_eq!(errors(&m, "dra_unknown_device"), Some(1.0));
    assert_eq!(errors(&m, "dra_slices"), Some(0.0));
    let requests = api.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0],
        format!(
            "{SLICES_PATH}?fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{}",
            DRIVER
        )
    );
    assert_eq!(api.authorizations()[0], "Bearer t");
    let logs = e.logs();
    assert_eq!(
        logs.matches("a device claimed through DRA is left unattributed")
            .count(),
        1,
        "{logs}"
    );
    assert!(logs.contains("gpu-77"), "{logs}");

    // The claim released: the GPU is no one's at the next refresh.
    kubelet.set_pods(vec![pod(
        "web",
        "plugin",
        "srv",
        "nvidia.com/gpu",
        &[&uuid0],
    )]);
    e.wait_metrics(Duration::from_secs(10), "the claim released", |m| {
        pod_infos(m) == [row("0", "", "plugin", "")]
    });
}

#[test]
fn a_mig_device_created_at_allocation_is_attributed_once_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    // h100-mig's GPU0 gets GI 7 (1g.20gb, memory slices 0-1) at t = 60 s, where GI 3 (2g.20gb)
    // was: the claim names it before it exists, as the driver's dynamic MIG does.
    let dynamic = "gpu-0-mig-1g20gb-15-0";
    let _kubelet = FakeKubelet::start(
        &socket,
        vec![
            dra_pod(
                "ml",
                "small",
                "main",
                "mig-small",
                (DRIVER, NODE),
                &[dynamic],
            ),
            dra_pod(
                "ml",
                "static",
                "main",
                "mig-static",
                (DRIVER, NODE),
                &["gpu-0-mig-19-2-1"],
            ),
        ],
    );
    let api = FakeKubeletApi::start_at(
        SLICES_PATH,
        "t",
        slices(serde_json::json!([
            gpu_device("gpu-0", H100_GPU0),
            { "name": "gpu-0-mig-19-2-1", "attributes": {
                "type": { "string": "mig" }, "parentUUID": { "string": H100_GPU0 },
                "uuid": { "string": "MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b03" } } },
            { "name": dynamic, "attributes": {
                "type": { "string": "mig" }, "parentUUID": { "string": H100_GPU0 },
                "profile": { "string": "1g.20gb" } },
              "consumesCounters": [{ "counterSet": "gpu-0-counter-set", "counters": {
                  "multiprocessors": { "value": "16" },
                  "memory-slice-0": { "value": "1" }, "memory-slice-1": { "value": "1" } } }] },
        ])),
    );
    let e = exporter(
        dir.path(),
        &socket,
        (&api.url(), api.ca_pem()),
        "h100-mig",
        &[("NVML_SIM_START", "53")],
    );
    let m = e.wait_metrics(Duration::from_secs(10), "the static MIG device", |m| {
        !pod_infos(m).is_empty()
    });
    assert_eq!(pod_infos(&m), [row("0", "9", "static", "mig-static")]);
    let m = e.wait_metrics(Duration::from_secs(20), "the created instance", |m| {
        pod_infos(m).len() == 2
    });
    assert_eq!(
        pod_infos(&m),
        [
            row("0", "7", "small", "mig-small"),
            row("0", "9", "static", "mig-static")
        ]
    );
    assert_eq!(
        m.find(
            "nvidia_gpu_pod_info",
            &[("gpu_instance", "7"), ("mig_profile", "1g.20gb")]
        )
        .len(),
        1
    );
    assert_eq!(
        errors(&m, "dra_unknown_device"),
        Some(0.0),
        "a device the slices name is not unknown while it is being created"
    );
}

#[test]
fn with_the_api_server_down_dra_claims_are_counted_and_device_plugin_gpus_attributed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", closed.local_addr().unwrap());
    drop(closed);
    let ca = common::certs::Ca::new("unused API server CA");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let e = exporter(dir.path(), &socket, (&url, &ca.pem), "h100x8", &[]);
    let m = e.wait_metrics(Duration::from_secs(10), "kubelet up", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0) && ticks(m) > 0.0
    });
    let uuid0 = m.find("nvidia_gpu_info", &[("gpu", "0")])[0].labels["uuid"].clone();
    kubelet.set_pods(vec![
        dra_pod(
            "ml",
            "train",
            "main",
            "train-gpus",
            (DRIVER, NODE),
            &["gpu-1"],
        ),
        pod("web", "plugin", "srv", "nvidia.com/gpu", &[&uuid0]),
    ]);
    let m = e.wait_metrics(Duration::from_secs(10), "the failed list counted", |m| {
        errors(m, "dra_slices").is_some_and(|n| n >= 1.0) && !pod_infos(m).is_empty()
    });
    assert_eq!(pod_infos(&m), [row("0", "", "plugin", "")]);
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), Some(1.0));
    assert_eq!(
        errors(&m, "dra_unknown_device"),
        Some(0.0),
        "a device not looked up is not unknown"
    );
    let logs = e.logs();
    assert_eq!(logs.matches("ResourceSlices not read").count(), 1, "{logs}");
}

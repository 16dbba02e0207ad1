//! A stand-alone fake kubelet: serves the pod-resources `List` call on a unix socket with a fixed
//! pod list, so the exporter's `--kubernetes` mode can be run without a cluster (the dashboards'
//! live check, demos). It is the integration tests' fake (tests/kubelet/mod.rs), not a copy.
//!
//! ```text
//! cargo run --example fake-kubelet -- SOCKET [--pods-api DIR] [NAMESPACE/POD/CONTAINER=ID[,ID...][;KEY=VALUE...]]...
//! ```
//!
//! Each pod argument is one pod with one container holding the listed devices of
//! `nvidia.com/gpu`. A device ID is what a device plugin reports: a GPU UUID (`GPU-…`) or a
//! device name `nvidiaN` (the GPU with minor number N). Two arguments naming the same device
//! share that GPU. Runs until killed; the socket is removed on a clean exit only, so put it in a
//! directory that is cleaned up.
//!
//! With `--pods-api DIR` it also serves the kubelet's HTTPS `/pods` (the tests' fake, with a CA
//! of its own) listing every pod as running with the labels after its `;`, and writes what the
//! exporter's `--kubelet-url`, `--kubelet-ca-file` and `--kubelet-token-file` take into
//! `DIR/url`, `DIR/ca.pem` and `DIR/token` before the socket appears: so that
//! `--kubernetes-pod-labels` has labels to copy.

#[path = "../tests/kubelet/mod.rs"]
mod kubelet;

/// The tests' CA helper, which the kubelet module's HTTPS fake signs its certificate with; at the
/// same path as in the test crates.
#[allow(dead_code)]
#[path = "../tests/common"]
mod common {
    pub mod certs;
}

use std::collections::BTreeMap;

use std::path::PathBuf;
use std::process::ExitCode;

use nvml_exporter::kubernetes::proto::PodResources;

/// The extended resource every pod argument's devices are listed under.
const RESOURCE: &str = "nvidia.com/gpu";

const USAGE: &str = "usage: fake-kubelet SOCKET [--pods-api DIR] \
                     [NAMESPACE/POD/CONTAINER=ID[,ID...][;KEY=VALUE...]]...";

/// The token the `/pods` API accepts.
const TOKEN: &str = "fake-kubelet-token";

/// A pod argument: its pod-resources entry and its labels.
type Pod = (PodResources, BTreeMap<String, String>);

/// Parses `NAMESPACE/POD/CONTAINER=ID[,ID...][;KEY=VALUE...]`.
fn parse_pod(arg: &str) -> Result<Pod, String> {
    let bad =
        || format!("bad pod {arg:?}: expected NAMESPACE/POD/CONTAINER=ID[,ID...][;KEY=VALUE...]");
    let mut parts = arg.split(';');
    let pod = parts.next().unwrap_or_default();
    let labels = parts
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(bad()),
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    let (who, ids) = pod.split_once('=').ok_or_else(bad)?;
    let mut parts = who.split('/');
    let (Some(namespace), Some(name), Some(container), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let ids: Vec<&str> = ids.split(',').collect();
    if [namespace, name, container].iter().any(|s| s.is_empty()) || ids.iter().any(|s| s.is_empty())
    {
        return Err(bad());
    }
    Ok((
        kubelet::pod(namespace, name, container, RESOURCE, &ids),
        labels,
    ))
}

/// The kubelet's `/pods` answer: a v1 PodList naming each pod as running, with its labels.
fn pod_list(pods: &[Pod]) -> Vec<u8> {
    let items: Vec<_> = pods
        .iter()
        .map(|(p, labels)| {
            serde_json::json!({
                "metadata": { "name": p.name, "namespace": p.namespace, "labels": labels },
                "status": { "phase": "Running" },
            })
        })
        .collect();
    serde_json::to_vec(
        &serde_json::json!({ "kind": "PodList", "apiVersion": "v1", "items": items }),
    )
    .expect("a pod list serializes")
}

/// Serves `/pods` and writes where and how to reach it into `dir`.
fn serve_pods(dir: &str, pods: &[Pod]) -> std::io::Result<kubelet::https::FakeKubeletApi> {
    let api =
        kubelet::https::FakeKubeletApi::start(TOKEN, kubelet::https::Reply::Body(pod_list(pods)));
    let dir = PathBuf::from(dir);
    std::fs::write(dir.join("ca.pem"), api.ca_pem())?;
    std::fs::write(dir.join("token"), TOKEN)?;
    std::fs::write(dir.join("url"), api.url())?;
    Ok(api)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(socket) = args.next().filter(|s| !s.starts_with('-')) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let mut args = args.peekable();
    let pods_api = if args.peek().is_some_and(|a| a == "--pods-api") {
        args.next();
        match args.next() {
            Some(dir) => Some(dir),
            None => {
                eprintln!("--pods-api needs a directory\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    let pods = match args.map(|a| parse_pod(&a)).collect::<Result<Vec<_>, _>>() {
        Ok(pods) => pods,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The API is up and its files written before the socket appears, which is what the scripts
    // wait for.
    let _api = match pods_api.map(|dir| serve_pods(&dir, &pods)).transpose() {
        Ok(api) => api,
        Err(e) => {
            eprintln!("fake kubelet: writing the /pods API's files: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = PathBuf::from(socket);
    let count = pods.len();
    let _kubelet = kubelet::FakeKubelet::start(&socket, pods.into_iter().map(|(p, _)| p).collect());
    eprintln!("fake kubelet: serving {count} pods on {}", socket.display());
    // The server runs on the fake's own runtime; this thread only keeps the process alive.
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_pod, pod_list};

    #[test]
    fn parses_a_pod_with_several_devices() {
        let (pod, labels) = parse_pod("ml/trainer-0/train=nvidia2,GPU-1234").unwrap();
        assert!(labels.is_empty());
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str()),
            ("ml", "trainer-0")
        );
        let container = &pod.containers[0];
        assert_eq!(container.name, "train");
        assert_eq!(container.devices[0].resource_name, "nvidia.com/gpu");
        assert_eq!(container.devices[0].device_ids, ["nvidia2", "GPU-1234"]);
    }

    #[test]
    fn parses_a_pod_with_labels_and_lists_it_running() {
        let pod = parse_pod("ml/notebook/jupyter=nvidia7;team=research;tier=").unwrap();
        assert_eq!(pod.0.containers[0].devices[0].device_ids, ["nvidia7"]);
        let list: serde_json::Value = serde_json::from_slice(&pod_list(&[pod])).unwrap();
        assert_eq!(
            list["items"][0],
            serde_json::json!({
                "metadata": { "name": "notebook", "namespace": "ml",
                              "labels": { "team": "research", "tier": "" } },
                "status": { "phase": "Running" },
            })
        );
    }

    #[test]
    fn rejects_malformed_pods() {
        for bad in [
            "ml/trainer-0=nvidia2",
            "ml/a/b/c=nvidia2",
            "ml/a/b",
            "ml/a/b=",
            "ml//b=x",
            "ml/a/b=x,",
            "ml/a/b=x;team",
            "ml/a/b=x;=v",
        ] {
            assert!(parse_pod(bad).is_err(), "{bad}");
        }
    }
}

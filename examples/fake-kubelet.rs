//! A stand-alone fake kubelet: serves the pod-resources `List` call on a unix socket with a fixed
//! pod list, so the exporter's `--kubernetes` mode can be run without a cluster (the dashboards'
//! live check, demos). It is the integration tests' fake (tests/kubelet/mod.rs), not a copy.
//!
//! ```text
//! cargo run --example fake-kubelet -- SOCKET [NAMESPACE/POD/CONTAINER=ID[,ID...]]...
//! ```
//!
//! Each pod argument is one pod with one container holding the listed devices of
//! `nvidia.com/gpu`. A device ID is what a device plugin reports: a GPU UUID (`GPU-…`) or a
//! device name `nvidiaN` (the GPU with minor number N). Two arguments naming the same device
//! share that GPU. Runs until killed; the socket is removed on a clean exit only, so put it in a
//! directory that is cleaned up.

#[path = "../tests/kubelet/mod.rs"]
mod kubelet;

/// The tests' CA helper, which the kubelet module's HTTPS fake signs its certificate with; at the
/// same path as in the test crates.
#[allow(dead_code)]
#[path = "../tests/common"]
mod common {
    pub mod certs;
}

use std::path::PathBuf;
use std::process::ExitCode;

use nvml_exporter::kubernetes::proto::PodResources;

/// The extended resource every pod argument's devices are listed under.
const RESOURCE: &str = "nvidia.com/gpu";

const USAGE: &str = "usage: fake-kubelet SOCKET [NAMESPACE/POD/CONTAINER=ID[,ID...]]...";

/// Parses `NAMESPACE/POD/CONTAINER=ID[,ID...]`.
fn parse_pod(arg: &str) -> Result<PodResources, String> {
    let bad = || format!("bad pod {arg:?}: expected NAMESPACE/POD/CONTAINER=ID[,ID...]");
    let (who, ids) = arg.split_once('=').ok_or_else(bad)?;
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
    Ok(kubelet::pod(namespace, name, container, RESOURCE, &ids))
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(socket) = args.next().filter(|s| !s.starts_with('-')) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let pods = match args.map(|a| parse_pod(&a)).collect::<Result<Vec<_>, _>>() {
        Ok(pods) => pods,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let socket = PathBuf::from(socket);
    let count = pods.len();
    let _kubelet = kubelet::FakeKubelet::start(&socket, pods);
    eprintln!("fake kubelet: serving {count} pods on {}", socket.display());
    // The server runs on the fake's own runtime; this thread only keeps the process alive.
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::parse_pod;

    #[test]
    fn parses_a_pod_with_several_devices() {
        let pod = parse_pod("ml/trainer-0/train=nvidia2,GPU-1234").unwrap();
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
    fn rejects_malformed_pods() {
        for bad in [
            "ml/trainer-0=nvidia2",
            "ml/a/b/c=nvidia2",
            "ml/a/b",
            "ml/a/b=",
            "ml//b=x",
            "ml/a/b=x,",
        ] {
            assert!(parse_pod(bad).is_err(), "{bad}");
        }
    }
}

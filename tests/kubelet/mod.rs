//! A fake kubelet for the integration tests: the pod-resources `List` call served over a unix
//! socket by a real tonic server, with the messages the exporter itself declares. The test changes
//! the pod list (and how long an answer takes) while the exporter runs against it.

#![allow(dead_code)] // each test binary uses a different subset

pub mod apiserver;
pub mod https;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_exporter::kubernetes::proto::{
    CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource, LIST_PATH,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use tonic::body::Body;
use tonic::{Request, Response, Status};

/// What the fake answers with.
#[derive(Debug, Default)]
struct Answer {
    pods: Vec<PodResources>,
    /// How long `List` takes before answering.
    delay: Duration,
}

/// A running fake kubelet. Stops (and removes its socket) on drop.
pub struct FakeKubelet {
    socket: PathBuf,
    answer: Arc<Mutex<Answer>>,
    calls: Arc<AtomicUsize>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeKubelet {
    /// Serves `List` on a new socket at `socket`, answering with `pods`.
    pub fn start(socket: &Path, pods: Vec<PodResources>) -> FakeKubelet {
        let answer = Arc::new(Mutex::new(Answer {
            pods,
            delay: Duration::ZERO,
        }));
        let calls = Arc::new(AtomicUsize::new(0));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("fake kubelet runtime");
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(socket) })
            .expect("bind the fake kubelet socket");
        let (a, c) = (answer.clone(), calls.clone());
        runtime.spawn(async move {
            let service = tower::service_fn(move |req: http::Request<Body>| {
                let (answer, calls) = (a.clone(), c.clone());
                async move { Ok::<_, Infallible>(route(req, answer, calls).await) }
            });
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            tonic::transport::Server::builder()
                .serve_with_incoming(service, incoming)
                .await
                .expect("fake kubelet serves");
        });
        FakeKubelet {
            socket: socket.to_path_buf(),
            answer,
            calls,
            runtime: Some(runtime),
        }
    }

    /// Answers later calls with `pods`.
    pub fn set_pods(&self, pods: Vec<PodResources>) {
        self.answer.lock().unwrap().pods = pods;
    }

    /// Makes later calls wait `delay` before answering.
    pub fn set_delay(&self, delay: Duration) {
        self.answer.lock().unwrap().delay = delay;
    }

    /// `List` calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Stops serving at once (open connections are dropped) and removes the socket, as a kubelet
    /// that exits does.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn route(
    req: http::Request<Body>,
    answer: Arc<Mutex<Answer>>,
    calls: Arc<AtomicUsize>,
) -> http::Response<Body> {
    if req.uri().path() != LIST_PATH {
        return Status::unimplemented(req.uri().path().to_owned()).into_http();
    }
    let list = tower::service_fn(move |_: Request<ListPodResourcesRequest>| {
        let (answer, calls) = (answer.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let delay = answer.lock().unwrap().delay;
            tokio::time::sleep(delay).await;
            let pods = answer.lock().unwrap().pods.clone();
            Ok::<_, Status>(Response::new(ListPodResourcesResponse {
                pod_resources: pods,
            }))
        }
    });
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
        .unary(list, req)
        .await
}

/// The files a client of one of the fake HTTPS servers is given: `ca_pem` written to
/// `dir/ca.crt`, and the token the fakes accept ("t") to `dir/token`. Returns both paths.
pub fn client_files(dir: &Path, ca_pem: &str) -> (PathBuf, PathBuf) {
    let (ca, token) = (dir.join("ca.crt"), dir.join("token"));
    std::fs::write(&ca, ca_pem).unwrap();
    std::fs::write(&token, "t\n").unwrap();
    (ca, token)
}

/// A pod with one container holding `device_ids` of `resource`.
pub fn pod(
    namespace: &str,
    name: &str,
    container: &str,
    resource: &str,
    ids: &[&str],
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| (*s).into()).collect(),
            }],
            dynamic_resources: vec![],
        }],
    }
}

/// A pod with one container holding, through resource claim `claim`, the devices `devices` of
/// DRA driver `driver` in pool `pool`, each with the CDI device NVIDIA's driver makes for it.
pub fn dra_pod(
    namespace: &str,
    name: &str,
    container: &str,
    claim: &str,
    (driver, pool): (&str, &str),
    devices: &[&str],
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![],
            dynamic_resources: vec![DynamicResource {
                claim_name: claim.into(),
                claim_namespace: namespace.into(),
                claim_resources: devices
                    .iter()
                    .map(|d| ClaimResource {
                        cdi_devices: vec![CdiDevice {
                            name: format!("k8s.{driver}/claim={claim}-{d}"),
                        }],
                        driver_name: driver.into(),
                        pool_name: pool.into(),
                        device_name: (*d).into(),
                    })
                    .collect(),
            }],
        }],
    }
}

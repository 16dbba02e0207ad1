//! The kubelet's pod list (`/pods`) against a fake kubelet HTTPS API: the token is sent and
//! re-read after rotation, the serving certificate is verified (or not, with
//! `--kubelet-insecure-tls`), refusals, timeouts and bad answers are counted under the right
//! reason with a message that says what to fix; and through the watcher, `KubernetesState::pods`
//! is filled, refreshed and kept while `/pods` fails, without touching `kubernetes_up`.

mod common;
mod kubelet;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::certs::Ca;
use kubelet::FakeKubelet;
use kubelet::https::{FakeKubeletApi, Reply};
use nvml_exporter::config::Config;
use nvml_exporter::kubernetes::pods::{MAX_BODY_BYTES, PodsClient};
use nvml_exporter::kubernetes::rest::RestError;
use nvml_exporter::kubernetes::{StateHandle, Watcher};
use nvml_exporter::sample::{ContainerIdentity, KubeletError, KubernetesState, PodIdentity};

/// A kubelet `/pods` answer: five pods, of which three still run containers.
const POD_LIST: &str = include_str!("kubelet/pods.json");

/// What [`POD_LIST`] becomes.
fn expected_pods() -> Vec<PodIdentity> {
    let c = |id: &str, name: &str| ContainerIdentity {
        id: id.into(),
        name: name.into(),
    };
    vec![
        PodIdentity {
            uid: "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9".into(),
            namespace: "ml".into(),
            pod: "legacy-infer".into(),
            containers: vec![c(
                "6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c",
                "server",
            )],
        },
        PodIdentity {
            uid: "9b1c3f7e-2d4a-4c61-8e0f-5a7b6c9d1e20".into(),
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            containers: vec![
                c(
                    "1f0e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
                    "fetch-weights",
                ),
                c(
                    "3a9f0c2e8b1d4f6a7c5e9b0d2f4a6c8e1b3d5f7a9c0e2b4d6f8a1c3e5b7d9f0a",
                    "train",
                ),
                c(
                    "e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3",
                    "metrics-sidecar",
                ),
            ],
        },
        PodIdentity {
            uid: "c2d4e6f8-1a3b-4c5d-9e7f-0a1b2c3d4e5f".into(),
            namespace: "research".into(),
            pod: "notebook-7c9d8".into(),
            containers: vec![c(
                "8f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a2918",
                "jupyter",
            )],
        },
    ]
}

/// Files the client reads, in a temp dir.
struct Files {
    dir: tempfile::TempDir,
    token: PathBuf,
    ca: PathBuf,
}

impl Files {
    fn new(token: &str, ca_pem: &str) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let (token_path, ca) = (dir.path().join("token"), dir.path().join("ca.crt"));
        std::fs::write(&ca, ca_pem).unwrap();
        let files = Files {
            dir,
            token: token_path,
            ca,
        };
        files.rotate_token(token);
        files
    }

    /// Replaces the token by rename, as the kubelet's projected volume does.
    fn rotate_token(&self, token: &str) {
        let tmp = self.dir.path().join(".token.tmp");
        std::fs::write(&tmp, format!("{token}\n")).unwrap();
        std::fs::rename(&tmp, &self.token).unwrap();
    }
}

fn config(url: &str, files: &Files) -> Config {
    Config {
        processes: true,
        kubelet_url: url.parse().unwrap(),
        kubelet_token_file: files.token.clone(),
        kubelet_ca_file: files.ca.clone(),
        kubernetes_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// The `/pods` client that `config` makes.
fn pods_client(config: &Config) -> PodsClient {
    let options = config.kubernetes_options();
    let pods = options.pods.as_ref().expect("the pod list is fetched");
    PodsClient::new(pods, &options)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn fetch(
    rt: &tokio::runtime::Runtime,
    client: &mut PodsClient,
) -> Result<Vec<PodIdentity>, RestError> {
    rt.block_on(client.fetch()).map(|answer| answer.running)
}

fn expect_err(result: Result<Vec<PodIdentity>, RestError>, reason: KubeletError) -> String {
    match result {
        Ok(pods) => panic!("expected {reason:?}, got {} pods", pods.len()),
        Err(e) => {
            assert_eq!(e.reason, reason, "{e}");
            e.message
        }
    }
}

#[test]
fn the_pod_list_is_fetched_with_the_token_and_the_token_is_re_read_after_rotation() {
    let api = FakeKubeletApi::start("token-1", Reply::Body(POD_LIST.into()));
    let files = Files::new("token-1", api.ca_pem());
    let rt = runtime();
    let mut client = pods_client(&config(&api.url(), &files));

    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());

    // The projected token is replaced: the next call sends the new one, on the same client.
    files.rotate_token("token-2");
    api.set_token("token-2");
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
    assert_eq!(api.authorizations(), ["Bearer token-1", "Bearer token-2"]);

    // A token the kubelet does not accept (it was rotated server side first).
    api.set_token("token-3");
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsAuth);
    assert!(message.contains("401"), "{message}");
    assert!(
        message.contains(&files.token.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains("nodes/proxy"),
        "names the RBAC fix: {message}"
    );

    // A missing token file fails before anything is sent.
    std::fs::remove_file(&files.token).unwrap();
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsAuth);
    assert!(message.contains("--kubelet-token-file"), "{message}");
    assert_eq!(api.authorizations().len(), 3);
}

#[test]
fn a_forbidden_answer_names_the_rbac_fix_and_other_statuses_are_http_errors() {
    let forbidden = "Forbidden (user=system:serviceaccount:gpu-monitoring:nvml-exporter, verb=get, \
                     resource=nodes, subresource=proxy)";
    let api = FakeKubeletApi::start("t", Reply::Status(403, forbidden.into()));
    let files = Files::new("t", api.ca_pem());
    let rt = runtime();
    let mut client = pods_client(&config(&api.url(), &files));

    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsAuth);
    assert!(message.contains("403"), "{message}");
    assert!(
        message.contains(forbidden),
        "the kubelet's reason is kept: {message}"
    );
    assert!(
        message.contains("`get` on `nodes/proxy`")
            && message.contains("deploy/kubernetes/processes"),
        "{message}"
    );

    api.set_reply(Reply::Status(500, "internal error".into()));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsHttp);
    assert!(
        message.contains("500") && message.contains("internal error"),
        "{message}"
    );

    // The connection survived the refusals: still answering once the kubelet does.
    api.set_reply(Reply::Body(POD_LIST.into()));
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
}

#[test]
fn the_serving_certificate_is_verified_against_the_ca_file_unless_insecure() {
    let api = FakeKubeletApi::start("t", Reply::Body(POD_LIST.into()));
    let other_ca = Ca::new("some other CA");
    let files = Files::new("t", &other_ca.pem);
    let rt = runtime();

    let mut client = pods_client(&config(&api.url(), &files));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsTls);
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(
        message.contains(&format!("--kubelet-ca-file {}", files.ca.display()))
            && message.contains("--kubelet-insecure-tls"),
        "says what to change: {message}"
    );
    assert!(
        api.authorizations().is_empty(),
        "no token sent to an unverified server"
    );

    // A CA file that is not there, or holds no certificate.
    std::fs::write(&files.ca, "not a certificate").unwrap();
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsTls);
    assert!(
        message.contains("--kubelet-ca-file") && message.contains("no PEM certificate"),
        "{message}"
    );

    let insecure = Config {
        kubelet_insecure_tls: true,
        ..config(&api.url(), &files)
    };
    let mut client = pods_client(&insecure);
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());

    // The right CA, written after the failures: a new connection reads it again.
    std::fs::write(&files.ca, api.ca_pem()).unwrap();
    let mut client = pods_client(&config(&api.url(), &files));
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
}

#[test]
fn a_slow_kubelet_times_out_and_the_next_call_starts_afresh() {
    let api = FakeKubeletApi::start("t", Reply::Body(POD_LIST.into()));
    let files = Files::new("t", api.ca_pem());
    let rt = runtime();
    let mut client = pods_client(&Config {
        kubernetes_timeout: Duration::from_millis(300),
        ..config(&api.url(), &files)
    });
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());

    api.set_delay(Duration::from_secs(30));
    let start = Instant::now();
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsTimeout);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(
        message.contains("300ms") && message.contains("--kubernetes-timeout"),
        "{message}"
    );

    api.set_delay(Duration::ZERO);
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
}

#[test]
fn a_kubelet_that_closes_connections_after_each_answer_costs_no_errors() {
    let api = FakeKubeletApi::start("t", Reply::Body(POD_LIST.into()));
    api.set_close_after_answer(true);
    let files = Files::new("t", api.ca_pem());
    let rt = runtime();
    let mut client = pods_client(&config(&api.url(), &files));
    for _ in 0..20 {
        assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
    }
    assert_eq!(api.authorizations().len(), 20, "one request per call");
}

#[test]
fn garbage_is_a_parse_error_and_an_oversized_answer_too_large() {
    let api = FakeKubeletApi::start("t", Reply::Body(b"<html>oops</html>".to_vec()));
    let files = Files::new("t", api.ca_pem());
    let rt = runtime();
    let mut client = pods_client(&config(&api.url(), &files));

    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsParse);
    assert!(message.contains("not a pod list"), "{message}");

    api.set_reply(Reply::Body(
        br#"{"kind":"Status","apiVersion":"v1","status":"Failure"}"#.to_vec(),
    ));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsParse);
    assert!(message.contains("\"Status\""), "{message}");

    // Declared too large: refused from the header, before reading.
    api.set_reply(Reply::DeclaredLength(MAX_BODY_BYTES as u64 + 1));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsTooLarge);
    assert!(message.contains("larger than 32 MiB"), "{message}");

    // Streamed without a length: cut off at the cap, not buffered whole.
    let mut huge = POD_LIST.as_bytes().to_vec();
    huge.resize(MAX_BODY_BYTES + 1, b' ');
    api.set_reply(Reply::Body(huge));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsTooLarge);
    assert!(message.contains("larger than 32 MiB"), "{message}");

    // Exactly at the cap is still read.
    let mut fits = POD_LIST.as_bytes().to_vec();
    fits.resize(MAX_BODY_BYTES, b' ');
    api.set_reply(Reply::Body(fits));
    assert_eq!(fetch(&rt, &mut client).unwrap(), expected_pods());
}

#[test]
fn a_token_file_that_is_a_fifo_or_a_device_is_refused_without_waiting_or_reading_it() {
    let api = FakeKubeletApi::start("t", Reply::Body(POD_LIST.into()));
    let files = Files::new("t", api.ca_pem());
    let fifo = files.dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let rt = runtime();
    for (path, what) in [
        (fifo, "a FIFO, not a regular file"),
        (
            PathBuf::from("/dev/zero"),
            "a character device, not a regular file",
        ),
    ] {
        let mut config = config(&api.url(), &files);
        config.kubelet_token_file = path.clone();
        let mut client = pods_client(&config);
        // A FIFO without a writer would wait forever, /dev/zero never ends: the 5 s timeout
        // (PodsTimeout) would say so.
        let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsAuth);
        assert_eq!(
            message,
            format!(
                "GET {}: --kubelet-token-file {}: {what}",
                client.url(),
                path.display()
            )
        );
    }
    // Nothing was sent without a token.
    assert!(api.requests().is_empty());
}

#[test]
fn no_kubelet_listening_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let files = Files::new("t", &Ca::new("ca").pem);
    let rt = runtime();
    let mut client = pods_client(&config(&format!("https://127.0.0.1:{port}"), &files));
    let message = expect_err(fetch(&rt, &mut client), KubeletError::PodsUnavailable);
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
}

// ---------------------------------------------------------------------------------------------
// Through the watcher

/// Waits up to 10 s for the watcher's state to satisfy `cond`.
fn wait_state(
    handle: &StateHandle,
    what: &str,
    cond: impl Fn(&KubernetesState) -> bool,
) -> KubernetesState {
    let mut last = None;
    common::poll_until(Duration::from_secs(10), || {
        let state = handle.current();
        if cond(&state) {
            return Some(state);
        }
        last = Some(state);
        None
    })
    .unwrap_or_else(|| panic!("timed out waiting for {what}: {last:?}"))
}

fn errors(state: &KubernetesState, reason: KubeletError) -> u64 {
    state.errors.get(&reason).copied().unwrap_or(0)
}

#[test]
fn the_watcher_fills_refreshes_and_keeps_the_pod_list_apart_from_kubernetes_up() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _pod_resources = FakeKubelet::start(&socket, vec![]);
    let api = FakeKubeletApi::start("t", Reply::Body(POD_LIST.into()));
    let files = Files::new("t", api.ca_pem());
    let config = Config {
        kubernetes: true,
        pod_resources_socket: socket.clone(),
        kubernetes_refresh: Some(Duration::from_millis(50)),
        kubernetes_timeout: Duration::from_secs(2),
        ..config(&api.url(), &files)
    };
    let rt = runtime();
    let (changes, changed) = std::sync::mpsc::channel();
    let watcher = StateHandle::new(&config.kubernetes_options());
    let handle = watcher.clone();
    let _task = rt.block_on(async {
        Watcher::spawn(&config.kubernetes_options(), handle.clone(), move || {
            let _ = changes.send(handle.current().pods.len());
        })
    });

    let state = wait_state(&watcher, "the pod list", |s| s.up && !s.pods.is_empty());
    assert_eq!(*state.pods, *expected_pods());
    assert!(
        KubeletError::ALL
            .iter()
            .filter(|r| !nvml_exporter::kubernetes::dra::REASONS.contains(r))
            .filter(|r| !nvml_exporter::kubernetes::node_condition::REASONS.contains(r))
            .all(|r| state.errors.contains_key(r)),
        "every reason but DRA's and the node condition's (off) served from 0: {:?}",
        state.errors
    );
    assert_eq!(
        changed.recv_timeout(Duration::from_secs(5)).unwrap(),
        3,
        "a new pod list is published at once"
    );

    // A pod leaves: the next refresh drops it.
    let mut list: serde_json::Value = serde_json::from_str(POD_LIST).unwrap();
    list["items"].as_array_mut().unwrap().remove(0);
    api.set_reply(Reply::Body(list.to_string().into_bytes()));
    let state = wait_state(&watcher, "trainer-0 gone", |s| s.pods.len() == 2);
    assert!(state.pods.iter().all(|p| p.pod != "trainer-0"));
    let kept = state.pods.clone();

    // /pods fails: the last list is kept, failures counted, pod-resources still up.
    api.set_reply(Reply::Status(503, "kubelet busy".into()));
    let state = wait_state(&watcher, "pods_http errors", |s| {
        errors(s, KubeletError::PodsHttp) >= 2
    });
    assert_eq!(*state.pods, *kept, "kept while /pods fails");
    assert!(state.up, "kubernetes_up is about the pod-resources API");
    assert_eq!(errors(&state, KubeletError::Unavailable), 0);

    // And back.
    api.set_reply(Reply::Body(POD_LIST.into()));
    wait_state(&watcher, "the full list again", |s| s.pods.len() == 3);
}

#[test]
fn pods_reasons_are_only_served_when_the_pod_list_is_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        kubernetes: true,
        pod_resources_socket: dir.path().join("absent.sock"),
        kubernetes_refresh: Some(Duration::from_millis(50)),
        ..Config::default()
    };
    let rt = runtime();
    let watcher = StateHandle::new(&config.kubernetes_options());
    let _task =
        rt.block_on(async { Watcher::spawn(&config.kubernetes_options(), watcher.clone(), || {}) });
    let state = wait_state(&watcher, "a failed List", |s| {
        errors(s, KubeletError::Unavailable) > 0
    });
    let reasons: Vec<&str> = state.errors.keys().map(|r| r.label()).collect();
    assert_eq!(reasons, ["unavailable", "timeout", "rpc"]);
    assert!(state.pods.is_empty());
}

#[test]
fn check_config_rejects_a_bad_kubelet_url_from_the_environment() {
    let out = common::exporter_command(
        &[("NVML_EXPORTER_KUBELET_URL", "http://10.0.0.1:10255")],
        &["check-config"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--kubelet-url") && stderr.contains("NVML_EXPORTER_KUBELET_URL"),
        "names the option and where it came from: {stderr}"
    );

    let out = common::exporter_command(
        &[
            ("NVML_EXPORTER_KUBELET_URL", "https://10.0.0.1:10250"),
            ("NVML_EXPORTER_KUBELET_INSECURE_TLS", "true"),
        ],
        &["check-config"],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

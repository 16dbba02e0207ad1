//! The health verdicts on the node (`--kubernetes-node-condition`), end to end: the real exporter
//! on `nvml-sim/scenarios/health.toml` (one signal per GPU; its clock starts at t = 18 s, just
//! before the XIDs at t = 20 s and GPU 3's reset at t = 26–28 s), a fake kubelet, and a fake API
//! server that checks each request as the real one would (tests/kubelet/apiserver.rs).

mod common;
mod kubelet;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Exporter, Exposition, eventually, scenario};
use kubelet::FakeKubelet;
use kubelet::apiserver::FakeApiServer;
use nvml_exporter::kubernetes::node_condition::CONDITION_TYPE;
use serde_json::{Value, json};

const NODE: &str = "gpu-node-1";
const WAIT: Duration = Duration::from_secs(30);

/// The exporter writing the condition of [`NODE`] to `api` (token "t", files in `dir`).
fn exporter(dir: &Path, api: &FakeApiServer, extra: &[&str]) -> (Exporter, FakeKubelet) {
    exporter_of(dir, api, &["--kubernetes-node-name", NODE], extra)
}

/// [`exporter`] with `node` for the node-name arguments.
fn exporter_of(
    dir: &Path,
    api: &FakeApiServer,
    node: &[&str],
    extra: &[&str],
) -> (Exporter, FakeKubelet) {
    exporter_on(&scenario("health"), dir, api, node, extra)
}

/// [`exporter_of`] on the scenario at `scenario`.
fn exporter_on(
    scenario: &Path,
    dir: &Path,
    api: &FakeApiServer,
    node: &[&str],
    extra: &[&str],
) -> (Exporter, FakeKubelet) {
    let socket = dir.join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let (ca, token) = kubelet::client_files(dir, api.ca_pem());
    let url = api.url();
    let mut args = vec![
        "--interval",
        "250ms",
        "--kubernetes",
        "--pod-resources-socket",
        socket.to_str().unwrap(),
        "--kubernetes-node-condition",
        "--kubernetes-api-url",
        &url,
        "--kubernetes-api-ca-file",
        ca.to_str().unwrap(),
        "--kubelet-token-file",
        token.to_str().unwrap(),
        "--log-level",
        "info",
    ];
    args.extend_from_slice(node);
    args.extend_from_slice(extra);
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_START", "18"),
        ],
        &args,
    );
    (e, kubelet)
}

fn errors(m: &Exposition, reason: &str) -> Option<f64> {
    m.value(
        "nvml_exporter_kubernetes_errors_total",
        &[("reason", reason)],
    )
}

/// (GPU named in the note, event reason, type, action) of each Event, in order.
fn events(api: &FakeApiServer) -> Vec<(String, String, String, String)> {
    api.events()
        .iter()
        .map(|e| {
            let note = e["note"].as_str().unwrap();
            let gpu = note.split(' ').nth(1).unwrap().to_owned();
            let s = |k: &str| e[k].as_str().unwrap().to_owned();
            (gpu, s("reason"), s("type"), s("action"))
        })
        .collect()
}

fn row(gpu: &str, reason: &str, kind: &str, action: &str) -> (String, String, String, String) {
    (gpu.into(), reason.into(), kind.into(), action.into())
}

#[test]
fn the_condition_and_events_follow_each_gpu_s_verdict_and_keep_the_kubelet_s_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start(NODE, "t");
    let (e, _kubelet) = exporter(dir.path(), &api, &[]);

    // After the XIDs at t = 20: GPU 2 (XID 79) and GPU 3 (XID 48) failed, next to the GPUs
    // failed or degraded from the start. GPU 1's XIDs (31, 43, 63, 92) change nothing: not named.
    let condition = eventually(WAIT, "the condition naming the XIDs' GPUs", || {
        api.condition(CONDITION_TYPE)
            .filter(|c| c["message"].as_str().unwrap().contains("GPU 3 "))
    });
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "GpuFailed");
    let message = condition["message"].as_str().unwrap();
    for part in [
        "GPU 2 (GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c22) failed: xid_79 (reboot_node)",
        "GPU 3 (GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c23) failed: xid_48 (reset_gpu)",
        "GPU 4 (GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c24) failed: nvlink_down (reset_gpu)",
        "GPU 5 (GPU-5e0a7c31-2b4d-4f68-9a1c-3d5e7f9b1c25) failed: row_remap_failure (drain_and_service)",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    // GPU 6's narrow PCIe link is only reported.
    for healthy in ["GPU 0 ", "GPU 1 ", "GPU 6 "] {
        assert!(!message.contains(healthy), "{healthy} in {message:?}");
    }
    // The kubelet's condition is kept beside ours.
    let ready = api.condition("Ready").expect("Ready kept");
    assert_eq!(ready["reason"], "KubeletReady");

    // Exactly what the API server was sent: a strategic merge patch of the node's status with
    // one condition, and Events about the node in `default`.
    let requests = api.requests();
    let patch = requests.iter().find(|r| r.method == "PATCH").unwrap();
    assert_eq!(patch.path, format!("/api/v1/nodes/{NODE}/status"));
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    let conditions = patch.body["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1, "{}", patch.body);
    let mut first = conditions[0].clone();
    for time in ["lastHeartbeatTime", "lastTransitionTime"] {
        assert!(first[time].as_str().unwrap().ends_with('Z'), "{first}");
        first[time] = Value::Null;
    }
    assert_eq!(first["type"], CONDITION_TYPE);
    assert_eq!(
        (&first["status"], &first["reason"]),
        (&json!("False"), &json!("GpuFailed"))
    );
    let post = requests.iter().find(|r| r.method == "POST").unwrap();
    assert_eq!(
        post.path,
        "/apis/events.k8s.io/v1/namespaces/default/events"
    );
    assert_eq!(post.content_type, "application/json");
    assert_eq!(
        post.body["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE})
    );
    assert_eq!(post.body["reportingController"], "nvml-exporter");

    // GPU 3 is reset at t = 26–28 and answers healthy after it: a Normal Event, and the
    // condition no longer names it.
    eventually(WAIT, "GPU 3's recovery Event", || {
        events(&api)
            .contains(&row("3", "GpuHealthy", "Normal", "none"))
            .then_some(())
    });
    let condition = eventually(WAIT, "the condition without GPU 3", || {
        api.condition(CONDITION_TYPE)
            .filter(|c| !c["message"].as_str().unwrap().contains("GPU 3 "))
    });
    assert!(condition["message"].as_str().unwrap().contains("GPU 2 "));

    // An Event for each GPU not healthy at the start, then one per change of state.
    let seen = events(&api);
    for want in [
        row("4", "GpuFailed", "Warning", "reset_gpu"),
        row("5", "GpuFailed", "Warning", "drain_and_service"),
        row("2", "GpuFailed", "Warning", "reboot_node"),
        row("3", "GpuFailed", "Warning", "reset_gpu"),
        row("8", "GpuFailed", "Warning", "reset_gpu"),
        row("9", "GpuDegraded", "Warning", "investigate"),
    ] {
        assert!(seen.contains(&want), "{want:?} not in {seen:?}");
    }
    assert!(
        !seen
            .iter()
            .any(|(gpu, ..)| gpu == "0" || gpu == "1" || gpu == "6"),
        "{seen:?}"
    );
    let three: Vec<_> = seen.iter().filter(|(gpu, ..)| gpu == "3").collect();
    // Lost while it resets is failed too: no Event of its own.
    assert_eq!(three.len(), 2, "failed, then healthy again: {three:?}");
    let m = e.metrics();
    for reason in nvml_exporter::kubernetes::node_condition::REASONS {
        assert_eq!(errors(&m, reason.label()), Some(0.0), "{reason:?}");
    }
}

#[test]
fn a_gpu_the_driver_lost_and_a_failed_fabric_turn_the_condition_false() {
    // fabric.toml: GPU 2 never registers with the NVLink fabric, GPU 5's bandwidth is degraded;
    // the PCI bus (a fake sysfs) lists a ninth GPU that NVML does not enumerate.
    let dir = tempfile::tempdir().unwrap();
    let mut devices: Vec<_> = common::sysfs::H100X8
        .iter()
        .map(|a| common::sysfs::h100(a))
        .collect();
    devices.push(common::sysfs::h100("0000:ca:00.0"));
    let sys = common::sysfs::sysfs(&devices);
    let api = FakeApiServer::start(NODE, "t");
    let (_e, _kubelet) = exporter_on(
        &scenario("fabric"),
        dir.path(),
        &api,
        &["--kubernetes-node-name", NODE],
        &[
            "--host-sys",
            sys.path().to_str().unwrap(),
            "--fabric-registration-timeout",
            "0s",
        ],
    );
    let condition = eventually(
        WAIT,
        "the condition naming the lost GPU and the fabric",
        || {
            api.condition(CONDITION_TYPE)
                .filter(|c| c["message"].as_str().unwrap().contains("GPU 5 "))
        },
    );
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("False"), &json!("GpuFailed"))
    );
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "node failed: gpus_missing (reboot_node): 0000:ca:00.0 on the PCI bus, not in NVML; "
        ),
        "{message:?}"
    );
    for part in [
        "GPU 2 (GPU-7c1d9e52-3a6b-4f80-8d2e-6b4a0f1c9e32) failed: fabric_not_registered (reset_gpu)",
        "GPU 5 (GPU-7c1d9e52-3a6b-4f80-8d2e-6b4a0f1c9e35) failed: fabric_degraded_bandwidth (reset_gpu)",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(!message.contains("GPU 0 "), "{message:?}");
}

#[test]
fn an_api_server_that_refuses_fails_or_hangs_is_retried_and_never_delays_a_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start(NODE, "t");
    api.set_failure(Some((403, "nodes \"gpu-node-1\" is forbidden")));
    let (e, _kubelet) = exporter(dir.path(), &api, &["--kubernetes-timeout", "300ms"]);

    let mut slowest = Duration::ZERO;
    let mut scrape = || {
        let t = Instant::now();
        let m = e.metrics();
        slowest = slowest.max(t.elapsed());
        m
    };
    for (reason, make) in [
        ("node_condition_forbidden", None),
        ("node_condition_conflict", Some(409)),
        ("node_condition_http", Some(500)),
    ] {
        if let Some(code) = make {
            api.set_failure(Some((code, "try again")));
        }
        eventually(WAIT, reason, || {
            errors(&scrape(), reason)
                .is_some_and(|n| n >= 1.0)
                .then_some(())
        });
    }
    // The delay first: a request between the two changes must not be answered at once (one
    // accepted call would end the outage, and the next failure would be logged again).
    api.set_delay(Duration::from_secs(5));
    api.set_failure(None);
    let m = eventually(WAIT, "a timeout", || {
        let m = scrape();
        errors(&m, "node_condition_timeout")
            .is_some_and(|n| n >= 1.0)
            .then_some(m)
    });
    // Ticks went on while every call failed or hung.
    assert!(
        m.value("nvml_exporter_sample_duration_seconds_count", &[])
            .unwrap()
            > 8.0
    );
    assert!(
        api.condition(CONDITION_TYPE).is_none(),
        "nothing was accepted"
    );

    api.set_delay(Duration::ZERO);
    let condition = eventually(WAIT, "the condition once the API server accepts", || {
        api.condition(CONDITION_TYPE)
    });
    assert_eq!(condition["status"], "False");
    eventually(WAIT, "the Events that waited", || {
        (!api.events().is_empty()).then_some(())
    });
    // The scrapes never waited for the API server (the debug binary's bound, generous).
    assert!(slowest < Duration::from_millis(1000), "{slowest:?}");
    // Logged when it stopped accepting, and when it accepted again (once every Event that waited
    // is sent); not on every retry.
    let logs = eventually(WAIT, "the log of the API server accepting again", || {
        let logs = e.logs();
        logs.contains("accepts the GPU health condition again")
            .then_some(logs)
    });
    let warned = logs
        .matches("could not write the GPU health condition")
        .count();
    assert_eq!(warned, 1, "{logs}");
}

#[test]
fn a_huge_error_answer_is_read_only_as_far_as_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start(NODE, "t");
    // 512 MiB with every 500, of which the exporter reads a few KiB; the long timeout is the
    // one that let a whole answer in.
    api.set_huge_failure(Some((500, 512 * 1024 * 1024)));
    let (e, _kubelet) = exporter(dir.path(), &api, &["--kubernetes-timeout", "10s"]);
    let m = e.wait_metrics(WAIT, "three failed calls", |m| {
        errors(m, "node_condition_http").is_some_and(|n| n >= 3.0)
    });
    assert_eq!(errors(&m, "node_condition_timeout"), Some(0.0));
    // The DaemonSet's limit is 128 Mi.
    let peak = common::memory_of(e.child.id(), "VmHWM");
    assert!(
        peak < 64 * 1024 * 1024,
        "peak resident memory {} MiB",
        peak / (1024 * 1024)
    );
    let logs = e.logs();
    assert!(
        logs.contains("answered 500 Internal Server Error (xxxx"),
        "{logs}"
    );
    // And it still gets through once the API server recovers.
    api.set_huge_failure(None);
    eventually(WAIT, "the condition", || api.condition(CONDITION_TYPE));
}

/// Node names that would address another path than the node's status, as the API server's
/// paths and field selectors read them.
const ODD_NODE_NAMES: [&str; 5] = [
    "../../../apis/evil.example/v1/namespaces/kube-system/secrets/x",
    "..",
    "a?dryRun=All&x=",
    "a#frag",
    "a,spec.driver=x",
];

#[test]
fn a_node_name_that_is_no_kubernetes_name_is_refused_at_start_and_on_reload() {
    for name in ODD_NODE_NAMES {
        let out = common::exporter_command(
            &[("NVML_EXPORTER_KUBERNETES_NODE_NAME", name)],
            &[
                "--kubernetes",
                "--kubernetes-node-condition",
                "check-config",
            ],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains("invalid value for --kubernetes-node-name"),
            "{name}: {stderr}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start(NODE, "t");
    let config = common::write_atomic(
        dir.path(),
        "config.toml",
        &format!("kubernetes_node_name = \"{NODE}\"\n"),
    );
    let (e, _kubelet) = exporter_of(
        dir.path(),
        &api,
        &["--config", config.to_str().unwrap()],
        &[],
    );
    eventually(WAIT, "the condition", || api.condition(CONDITION_TYPE));
    // Each refused the same way at start; one is enough to show a reload refuses too.
    for name in &ODD_NODE_NAMES[..1] {
        common::write_atomic(
            dir.path(),
            "config.toml",
            &format!("kubernetes_node_name = {}\n", json!(name)),
        );
        e.wait_metrics(WAIT, "the failed reload", |m| {
            m.value("nvml_exporter_config_last_reload_successful", &[]) == Some(0.0)
        });
        common::write_atomic(
            dir.path(),
            "config.toml",
            &format!("kubernetes_node_name = \"{NODE}\"\n"),
        );
        e.wait_metrics(WAIT, "the good reload", |m| {
            m.value("nvml_exporter_config_last_reload_successful", &[]) == Some(1.0)
        });
    }
    let logs = e.logs();
    assert!(
        logs.contains("invalid value for --kubernetes-node-name"),
        "{logs}"
    );
    // Only the node's status and the Events collection were ever addressed.
    for request in api.requests() {
        assert!(
            request.path == format!("/api/v1/nodes/{NODE}/status")
                || request.path == "/apis/events.k8s.io/v1/namespaces/default/events",
            "{request:?}"
        );
    }
}

#[test]
fn flapping_gpus_send_a_few_events_and_condition_writes_not_one_per_flip() {
    // Eight GPUs whose NVLink link 0 goes down for half of every second: a verdict that flips
    // every half second on each.
    let dir = tempfile::tempdir().unwrap();
    let gpu = |i: usize| {
        format!(
            "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-00000000-0000-4000-8000-00000000000{i}\"\n\
             pci_bus_id = \"00000000:1{i}:00.0\"\nserial = \"{i}\"\n\
             nvlink = {{ down = [0], down_window = {{ from = 0, to = 0.5, repeat = 1 }} }}\n"
        )
    };
    let text: String = (0..8).map(gpu).collect();
    let flapping = dir.path().join("flapping.toml");
    std::fs::write(&flapping, text).unwrap();
    let api = FakeApiServer::start(NODE, "t");
    let (e, _kubelet) = exporter_on(
        &flapping,
        dir.path(),
        &api,
        &["--kubernetes-node-name", NODE],
        &[],
    );
    e.wait_metrics(WAIT, "8 GPUs", |m| {
        m.value("nvml_exporter_gpus", &[]) == Some(8.0)
    });
    let started = Instant::now();
    eventually(WAIT, "the first Events", || {
        (!api.events().is_empty()).then_some(())
    });
    // Twelve seconds: some 24 flips of each GPU.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(started.elapsed()));
    let m = e.metrics();
    let flips = m.find("nvidia_gpu_health_state", &[("gpu", "0")]).len();
    assert!(flips > 0, "the verdict is served");
    let events = events(&api);
    for i in 0..8 {
        let of_gpu = events
            .iter()
            .filter(|(gpu, ..)| *gpu == i.to_string())
            .count();
        // The burst of three; the next is 30 s after the first.
        assert!(of_gpu <= 3, "GPU {i}: {of_gpu} Events in 12 s");
    }
    let patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .count();
    // The first write, the burst of three, and one per 10 s.
    assert!(patches <= 5, "{patches} condition writes in 12 s");
    assert!(patches >= 2, "the condition follows the GPUs: {patches}");
}

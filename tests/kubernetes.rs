//! Pod attribution end to end: the real exporter binary on the simulated H100s, asking a fake
//! kubelet (a tonic server on a unix socket in a temp dir) whose pod list the test changes, and
//! whose Kubernetes options a reloaded configuration file turns on and off.

mod common;
mod kubelet;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Exporter, Exposition, eventually, scenario, write_atomic};
use kubelet::https::{FakeKubeletApi, Reply};
use kubelet::{FakeKubelet, pod};

const INTERVAL: &str = "300ms";

/// The exporter on the 8-GPU scenario with attribution from the socket at `socket`.
fn exporter(socket: &Path, extra: &[&str]) -> Exporter {
    let h100 = scenario("h100x8");
    let mut args = vec![
        "--interval",
        INTERVAL,
        "--kubernetes",
        "--pod-resources-socket",
        socket.to_str().unwrap(),
        "--log-level",
        "info",
    ];
    args.extend_from_slice(extra);
    Exporter::start(&[("NVML_SIM_SCENARIO", h100.to_str().unwrap())], &args)
}

/// The exporter as [`exporter`], also reading the kubelet's pod list from `api` (token "t"; its CA
/// and token written to `dir`) with `extra` flags, once the kubelet answered and a tick was served.
fn exporter_reading_pods(
    dir: &Path,
    socket: &Path,
    api: &FakeKubeletApi,
    extra: &[&str],
) -> (Exporter, Exposition) {
    let (ca, token) = kubelet::client_files(dir, api.ca_pem());
    let url = api.url();
    let mut args = extra.to_vec();
    args.extend([
        "--kubelet-url",
        &url,
        "--kubelet-ca-file",
        ca.to_str().unwrap(),
        "--kubelet-token-file",
        token.to_str().unwrap(),
    ]);
    let e = exporter(socket, &args);
    let m = e.wait_metrics(Duration::from_secs(10), "kubelet up", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0) && ticks(m) > 0.0
    });
    (e, m)
}

/// Ticks so far: the count of the tick-duration histogram.
fn ticks(m: &Exposition) -> f64 {
    m.value("nvml_exporter_sample_duration_seconds_count", &[])
        .unwrap_or(0.0)
}

/// (namespace, pod, container) of every `nvidia_gpu_pod_info` series by GPU.
fn pod_infos(m: &Exposition) -> Vec<(String, String, String, String)> {
    let mut out: Vec<_> = m
        .find("nvidia_gpu_pod_info", &[])
        .iter()
        .map(|s| {
            let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            (l("gpu"), l("namespace"), l("pod"), l("container"))
        })
        .collect();
    out.sort();
    out
}

fn info_label(m: &Exposition, gpu: &str, label: &str) -> String {
    m.find("nvidia_gpu_info", &[("gpu", gpu)])[0].labels[label].clone()
}

fn owned(v: &[(&str, &str, &str, &str)]) -> Vec<(String, String, String, String)> {
    v.iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
        .collect()
}

/// Waits for `cond` and returns how many ticks it took from `from` (a tick count).
fn ticks_until(e: &Exporter, from: f64, what: &str, cond: impl Fn(&Exposition) -> bool) -> f64 {
    let m = e.wait_metrics(Duration::from_secs(10), what, cond);
    ticks(&m) - from
}

#[test]
fn pods_are_attributed_by_uuid_and_device_name_and_dropped_when_they_leave() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let e = exporter(&socket, &[]);
    let m = e.wait_metrics(Duration::from_secs(10), "kubelet up", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0) && ticks(m) > 0.0
    });
    assert!(pod_infos(&m).is_empty());
    let uuid0 = info_label(&m, "0", "uuid");
    // GKE names devices by minor number, which the sim gives each GPU like the driver does.
    let minor3 = info_label(&m, "3", "minor_number");
    let uuid1 = info_label(&m, "1", "uuid");
    let nvidia3 = format!("nvidia{minor3}");

    kubelet.set_pods(vec![
        pod("ml", "pod-a", "train", "nvidia.com/gpu", &[&uuid0]),
        pod("web", "pod-b", "infer", "nvidia.com/gpu", &[&nvidia3]),
        // Not a GPU resource: ignored even though the ID is a GPU's UUID.
        pod("other", "pod-c", "x", "example.com/fpga", &[&uuid1]),
    ]);
    let changed_at = ticks(&e.metrics());
    let expected = owned(&[
        ("0", "ml", "pod-a", "train"),
        ("3", "web", "pod-b", "infer"),
    ]);
    let took = ticks_until(&e, changed_at, "pods A and B", |m| pod_infos(m) == expected);
    // The kubelet is asked once per refresh period (= the interval) and a change is served as
    // soon as it is seen: within one tick.
    assert!(took <= 1.0, "attributed after {took} ticks");

    let m = e.metrics();
    for s in m
        .series
        .iter()
        .filter(|s| s.name.starts_with("nvidia_gpu_"))
    {
        let pod = s.labels.get("pod").map(String::as_str);
        match s.labels["gpu"].as_str() {
            "0" => {
                assert_eq!(pod, Some("pod-a"), "{s:?}");
                assert_eq!(s.labels["namespace"], "ml");
                assert_eq!(s.labels["container"], "train");
            }
            "3" => {
                assert_eq!(pod, Some("pod-b"), "{s:?}");
                assert_eq!(s.labels["namespace"], "web");
            }
            _ => assert!(
                !s.labels.contains_key("namespace") && pod.is_none(),
                "{s:?}"
            ),
        }
    }
    assert!(
        m.gpu_value("nvidia_gpu_power_watts", 0, &[("pod", "pod-a")])
            .is_some()
    );
    assert_eq!(m.find("nvidia_gpu_pod_info", &[("uuid", &uuid0)]).len(), 1);

    kubelet.set_pods(vec![pod(
        "web",
        "pod-b",
        "infer",
        "nvidia.com/gpu",
        &[&nvidia3],
    )]);
    let changed_at = ticks(&e.metrics());
    let took = ticks_until(&e, changed_at, "pod A gone", |m| {
        pod_infos(m) == owned(&[("3", "web", "pod-b", "infer")])
    });
    assert!(took <= 1.0, "dropped after {took} ticks");
    let m = e.metrics();
    assert!(m.find_any_labels(&[("pod", "pod-a")]).is_empty());
    assert!(m.gpu_value("nvidia_gpu_power_watts", 0, &[]).is_some());

    kubelet.set_pods(vec![]);
    e.wait_metrics(Duration::from_secs(10), "no pods", |m| {
        m.find_any_labels(&[("pod", "pod-b")]).is_empty()
    });
    assert!(kubelet.calls() >= 3);
}

/// The fake kubelet's `/pods` fixture (trainer-0 and batch-eval-28871 in `ml`, among others) with
/// batch-eval-28871 in `phase`, and without the pods named in `without`.
fn pod_list(phase: &str, without: &[&str]) -> Reply {
    let mut list: serde_json::Value =
        serde_json::from_str(include_str!("kubelet/pods.json")).unwrap();
    let items = list["items"].as_array_mut().unwrap();
    items.retain(|p| !without.contains(&p["metadata"]["name"].as_str().unwrap()));
    for p in items.iter_mut() {
        if p["metadata"]["name"] == "batch-eval-28871" {
            p["status"]["phase"] = phase.into();
        }
    }
    Reply::Body(list.to_string().into_bytes())
}

#[test]
fn an_ended_pod_lets_go_of_its_gpus_within_one_refresh_while_the_kubelet_still_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let api = FakeKubeletApi::start("t", pod_list("Running", &[]));
    let (e, m) = exporter_reading_pods(dir.path(), &socket, &api, &["--kubelet-pods"]);
    let uuid = |gpu: &str| info_label(&m, gpu, "uuid");
    // The kubelet lists these devices from now on, whatever becomes of the pods.
    kubelet.set_pods(vec![
        pod("ml", "trainer-0", "main", "nvidia.com/gpu", &[&uuid("0")]),
        pod(
            "ml",
            "batch-eval-28871",
            "eval",
            "nvidia.com/gpu",
            &[&uuid("1")],
        ),
    ]);
    e.wait_metrics(Duration::from_secs(10), "both pods attributed", |m| {
        pod_infos(m)
            == owned(&[
                ("0", "ml", "trainer-0", "main"),
                ("1", "ml", "batch-eval-28871", "eval"),
            ])
    });

    // The batch pod completes: the refresh that sees it so releases GPU 1. The refresh under way
    // when the phase changes may have fetched /pods before: allow it and the next.
    api.set_reply(pod_list("Succeeded", &[]));
    let from = kubelet.calls();
    let m = e.wait_metrics(Duration::from_secs(10), "batch pod released", |m| {
        pod_infos(m) == owned(&[("0", "ml", "trainer-0", "main")])
    });
    let refreshes = kubelet.calls() - from;
    assert!(refreshes <= 2, "released after {refreshes} refreshes");
    assert!(
        m.find_any_labels(&[("pod", "batch-eval-28871")]).is_empty(),
        "no series of GPU 1 names the ended pod"
    );
    assert!(
        m.gpu_value("nvidia_gpu_power_watts", 0, &[("pod", "trainer-0")])
            .is_some(),
        "the running pod keeps its GPU and labels"
    );
    assert!(m.gpu_value("nvidia_gpu_power_watts", 1, &[]).is_some());

    // /pods fails: what it said stays said, the running pod keeps its GPU.
    api.set_reply(Reply::Status(503, "busy".into()));
    let m = e.wait_metrics(Duration::from_secs(10), "pods_http errors", |m| {
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "pods_http")],
        )
        .is_some_and(|n| n >= 2.0)
    });
    assert_eq!(pod_infos(&m), owned(&[("0", "ml", "trainer-0", "main")]));

    // trainer-0 leaves the kubelet's pod list altogether (deleted), its devices still listed.
    api.set_reply(pod_list("Succeeded", &["trainer-0"]));
    e.wait_metrics(Duration::from_secs(10), "trainer-0 released", |m| {
        pod_infos(m).is_empty()
    });
    assert!(e.logs().contains("pod has ended"), "{}", e.logs());

    // A new pod takes GPU 2: attributed as soon as both lists have it.
    let mut list = pod_list("Succeeded", &["trainer-0"]);
    if let Reply::Body(body) = &mut list {
        let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let mut p = v["items"][0].clone();
        p["metadata"]["name"] = "fresh".into();
        p["metadata"]["namespace"] = "ml".into();
        v["items"].as_array_mut().unwrap().push(p);
        *body = v.to_string().into_bytes();
    }
    api.set_reply(list);
    kubelet.set_pods(vec![
        pod("ml", "trainer-0", "main", "nvidia.com/gpu", &[&uuid("0")]),
        pod(
            "ml",
            "batch-eval-28871",
            "eval",
            "nvidia.com/gpu",
            &[&uuid("1")],
        ),
        pod("ml", "fresh", "main", "nvidia.com/gpu", &[&uuid("2")]),
    ]);
    e.wait_metrics(Duration::from_secs(10), "the new pod attributed", |m| {
        pod_infos(m) == owned(&[("2", "ml", "fresh", "main")])
    });
}

#[test]
fn a_missing_socket_is_retried_and_the_exporter_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let e = exporter(&socket, &[]);

    // No kubelet yet: every GPU is served, the kubelet side says why nothing is attributed.
    let m = e.wait_metrics(Duration::from_secs(10), "unavailable errors", |m| {
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "unavailable")],
        )
        .is_some_and(|n| n >= 2.0)
    });
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), Some(0.0));
    assert_eq!(m.find("nvidia_gpu_up", &[]).len(), 8);
    assert!(m.find("nvidia_gpu_up", &[]).iter().all(|s| s.value == 1.0));
    assert!(pod_infos(&m).is_empty());
    assert_eq!(
        e.get("/readyz").status,
        200,
        "a missing kubelet does not make it unready"
    );

    let uuid2 = info_label(&m, "2", "uuid");
    let mut kubelet = FakeKubelet::start(
        &socket,
        vec![pod("ml", "pod-a", "main", "nvidia.com/gpu", &[&uuid2])],
    );
    e.wait_metrics(Duration::from_secs(10), "recovery", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0)
            && pod_infos(m) == owned(&[("2", "ml", "pod-a", "main")])
    });

    // The kubelet goes away (a restart): served on, last answer kept, errors counted.
    let before = e
        .metrics()
        .value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "unavailable")],
        )
        .unwrap();
    kubelet.stop();
    let m = e.wait_metrics(Duration::from_secs(10), "kubelet down", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(0.0)
    });
    let stamp = m
        .value("nvml_exporter_last_sample_timestamp_seconds", &[])
        .unwrap();
    let m = e.wait_metrics(Duration::from_secs(10), "ticks go on", |m| {
        m.value("nvml_exporter_last_sample_timestamp_seconds", &[])
            .is_some_and(|t| t > stamp)
            && m.value(
                "nvml_exporter_kubernetes_errors_total",
                &[("reason", "unavailable")],
            )
            .is_some_and(|n| n > before)
    });
    assert_eq!(pod_infos(&m), owned(&[("2", "ml", "pod-a", "main")]));

    // Back, with the pod gone meanwhile.
    let _kubelet = FakeKubelet::start(&socket, vec![]);
    e.wait_metrics(Duration::from_secs(10), "recovered, pod dropped", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0) && pod_infos(m).is_empty()
    });
    assert!(e.logs().contains("kubelet pod-resources API not answering"));
}

#[test]
fn a_slow_kubelet_times_out_without_delaying_ticks_or_scrapes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    kubelet.set_delay(Duration::from_secs(3));
    let e = exporter(&socket, &["--kubernetes-timeout", "200ms"]);

    let first = e.wait_metrics(Duration::from_secs(10), "a timeout", |m| {
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "timeout")],
        )
        .is_some_and(|n| n >= 1.0)
    });
    let started = Instant::now();
    let mut slowest_scrape = Duration::ZERO;
    let m = eventually(
        Duration::from_secs(15),
        "four timeouts (a call past the deadline counts as a timeout)",
        || {
            let t = Instant::now();
            let m = e.metrics();
            slowest_scrape = slowest_scrape.max(t.elapsed());
            let timeouts = m
                .value(
                    "nvml_exporter_kubernetes_errors_total",
                    &[("reason", "timeout")],
                )
                .unwrap();
            (timeouts >= 4.0).then_some(m)
        },
    );
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), Some(0.0));
    // A kubelet that gives up at the deadline it was sent is a timeout too, not an RPC error.
    assert_eq!(
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "rpc")]
        ),
        Some(0.0)
    );
    // Ticks kept their pace (300ms) while every call to the kubelet hung: at least half of the
    // expected count, and none of them waited on the kubelet.
    let ticked = ticks(&m) - ticks(&first);
    assert!(
        ticked >= elapsed / 0.3 / 2.0,
        "{ticked} ticks in {elapsed:.1}s"
    );
    let mean_tick = m
        .value("nvml_exporter_sample_duration_seconds_sum", &[])
        .unwrap()
        / ticks(&m);
    assert!(mean_tick < 0.2, "mean tick {mean_tick}s");
    assert!(
        slowest_scrape < Duration::from_millis(1000),
        "{slowest_scrape:?}"
    );

    kubelet.set_delay(Duration::ZERO);
    e.wait_metrics(Duration::from_secs(10), "recovery", |m| {
        m.value("nvml_exporter_kubernetes_up", &[]) == Some(1.0)
    });
}

#[test]
fn once_asks_the_kubelet_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let h100 = scenario("h100x8");
    let kubelet = FakeKubelet::start(
        &socket,
        vec![pod("ml", "pod-a", "main", "nvidia.com/gpu", &["nvidia1"])],
    );
    let out = common::run_once(
        &[("NVML_SIM_SCENARIO", h100.to_str().unwrap())],
        &[
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Exposition::parse(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(pod_infos(&m), owned(&[("1", "ml", "pod-a", "main")]));
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), Some(1.0));
    assert_eq!(kubelet.calls(), 1);
}

#[test]
fn attribution_and_pod_labels_follow_a_reloaded_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    let config = write_atomic(dir.path(), "config.toml", "kubernetes = false\n");
    let h100 = scenario("h100x8");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", h100.to_str().unwrap())],
        &[
            "--interval",
            INTERVAL,
            "--config",
            config.to_str().unwrap(),
            "--pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    let m = e.wait_metrics(Duration::from_secs(10), "a tick", |m| ticks(m) > 0.0);
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), None);
    let uuid0 = info_label(&m, "0", "uuid");
    kubelet.set_pods(vec![pod(
        "ml",
        "pod-a",
        "train",
        "nvidia.com/gpu",
        &[&uuid0],
    )]);
    let gpu0_pod = |m: &Exposition| {
        m.find("nvidia_gpu_up", &[("gpu", "0")])[0]
            .labels
            .get("pod")
            .cloned()
    };

    // Turned on: the kubelet is asked, and GPU 0's series carry its pod.
    write_atomic(dir.path(), "config.toml", "kubernetes = true\n");
    let wait = Duration::from_secs(20);
    e.wait_metrics(wait, "pod-a on GPU 0", |m| {
        pod_infos(m) == owned(&[("0", "ml", "pod-a", "train")])
            && gpu0_pod(m).as_deref() == Some("pod-a")
    });

    // Labels off: the assignment stays in nvidia_gpu_pod_info, the GPU's series lose the labels.
    write_atomic(
        dir.path(),
        "config.toml",
        "kubernetes = true\nkubernetes_labels = false\n",
    );
    let m = e.wait_metrics(wait, "GPU 0's series without pod labels", |m| {
        gpu0_pod(m).is_none() && !pod_infos(m).is_empty()
    });
    assert_eq!(m.value("nvml_exporter_kubernetes_up", &[]), Some(1.0));

    // Off again: nothing of the kubelet is served.
    write_atomic(dir.path(), "config.toml", "kubernetes = false\n");
    e.wait_metrics(wait, "no kubelet series", |m| {
        pod_infos(m).is_empty() && m.value("nvml_exporter_kubernetes_up", &[]).is_none()
    });
}

#[test]
fn pod_info_names_the_controller_and_the_copied_labels_from_the_pod_list() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    // legacy-infer becomes a Deployment's pod queued by Kueue, with a team annotation.
    let mut list: serde_json::Value =
        serde_json::from_str(include_str!("kubelet/pods.json")).unwrap();
    for p in list["items"].as_array_mut().unwrap() {
        if p["metadata"]["name"] == "legacy-infer" {
            p["metadata"]["labels"] = serde_json::json!({
                "pod-template-hash": "5d8f7c9b6",
                "kueue.x-k8s.io/queue-name": "team-a",
            });
            p["metadata"]["ownerReferences"] = serde_json::json!([{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "legacy-infer-5d8f7c9b6",
                "uid": "r", "controller": true,
            }]);
            p["metadata"]["annotations"]["example.com/team"] = "vision".into();
        }
    }
    let api = FakeKubeletApi::start("t", Reply::Body(list.to_string().into_bytes()));
    // The copied keys alone make the exporter fetch the pod list.
    let (e, m) = exporter_reading_pods(
        dir.path(),
        &socket,
        &api,
        &[
            "--kubernetes-pod-labels",
            "kueue.x-k8s.io/queue-name",
            "--kubernetes-pod-annotations",
            "example.com/team",
        ],
    );
    let uuid = |gpu: &str| info_label(&m, gpu, "uuid");
    kubelet.set_pods(vec![
        pod("ml", "trainer-0", "main", "nvidia.com/gpu", &[&uuid("0")]),
        pod(
            "ml",
            "legacy-infer",
            "server",
            "nvidia.com/gpu",
            &[&uuid("1")],
        ),
        pod(
            "research",
            "notebook-7c9d8",
            "jupyter",
            "nvidia.com/gpu",
            &[&uuid("2")],
        ),
    ]);
    let m = e.wait_metrics(Duration::from_secs(10), "three pods", |m| {
        pod_infos(m).len() == 3
    });
    let info = |gpu: &str| {
        let s = m.find("nvidia_gpu_pod_info", &[("gpu", gpu)]);
        assert_eq!(s.len(), 1, "{}", m.text);
        s[0].labels.clone()
    };
    let get = |l: &std::collections::BTreeMap<String, String>, k: &str| {
        l.get(k).cloned().unwrap_or_default()
    };
    let trainer = info("0");
    assert_eq!(get(&trainer, "controller_kind"), "StatefulSet");
    assert_eq!(get(&trainer, "controller_name"), "trainer");
    assert_eq!(get(&trainer, "label_kueue_x_k8s_io_queue_name"), "");
    let infer = info("1");
    assert_eq!(get(&infer, "controller_kind"), "Deployment");
    assert_eq!(get(&infer, "controller_name"), "legacy-infer");
    assert_eq!(get(&infer, "label_kueue_x_k8s_io_queue_name"), "team-a");
    assert_eq!(get(&infer, "annotation_example_com_team"), "vision");
    let notebook = info("2");
    assert!(!notebook.contains_key("controller_kind"), "{notebook:?}");
    // Only nvidia_gpu_pod_info carries them: the GPU's other series keep the pod labels alone.
    let power = m.find("nvidia_gpu_power_watts", &[("gpu", "1")]);
    assert_eq!(
        power[0].labels.get("pod").map(String::as_str),
        Some("legacy-infer")
    );
    assert!(!power[0].labels.contains_key("controller_kind"));
}

#[test]
fn a_full_node_of_pods_with_large_annotations_is_read_within_the_daemonset_s_memory() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, vec![]);
    // The kubelet's default pod limit, each pod with one legal 250 KB annotation not copied.
    let blob = "x".repeat(250_000);
    let items: Vec<serde_json::Value> = (0..110)
        .map(|i| {
            serde_json::json!({
                "metadata": {
                    "name": format!("pod-{i}"), "namespace": "ml",
                    "uid": format!("00000000-0000-4000-8000-{i:012}"),
                    "labels": { "team": format!("team-{i}") },
                    "annotations": { "example.com/notes": blob },
                },
                "status": { "phase": "Running", "containerStatuses": [{
                    "name": "main", "containerID": format!("containerd://{i:064x}"),
                    "state": { "running": { "startedAt": "2026-11-20T09:12:50Z" } },
                }] },
            })
        })
        .collect();
    let list = serde_json::json!({ "kind": "PodList", "apiVersion": "v1", "items": items });
    let list = list.to_string().into_bytes();
    assert!(list.len() > 27_000_000, "{} bytes", list.len());
    let api = FakeKubeletApi::start("t", Reply::Body(list));
    let (e, m) = exporter_reading_pods(
        dir.path(),
        &socket,
        &api,
        &["--kubernetes-pod-labels", "team"],
    );
    let uuid = info_label(&m, "0", "uuid");
    kubelet.set_pods(vec![pod("ml", "pod-7", "main", "nvidia.com/gpu", &[&uuid])]);
    // The pod list was read: pod-7 carries its label from it.
    e.wait_metrics(Duration::from_secs(10), "pod-7's label", |m| {
        m.value(
            "nvidia_gpu_pod_info",
            &[("gpu", "0"), ("pod", "pod-7"), ("label_team", "team-7")],
        ) == Some(1.0)
    });
    // Two more whole answers read (the client asks again only after the last one).
    let asked = api.requests().len();
    eventually(Duration::from_secs(20), "two more answers", || {
        (api.requests().len() >= asked + 3).then_some(())
    });
    // The DaemonSet's limit is 128 Mi; the answer alone is 27 MB.
    let peak = common::memory_of(e.child.id(), "VmHWM");
    assert!(
        peak < 64 * 1024 * 1024,
        "peak resident memory {} MiB",
        peak / (1024 * 1024)
    );
    let m = e.metrics();
    assert_eq!(
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "pods_parse")]
        )
        .unwrap_or(0.0),
        0.0,
        "{}",
        m.text
    );
}

#[test]
fn a_token_file_that_is_a_fifo_is_an_error_while_metrics_and_sigterm_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = FakeKubelet::start(&socket, vec![]);
    let api = FakeKubeletApi::start("t", Reply::Body(include_str!("kubelet/pods.json").into()));
    let (ca, fifo) = (dir.path().join("ca.crt"), dir.path().join("token"));
    std::fs::write(&ca, api.ca_pem()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let url = api.url();
    let mut e = exporter(
        &socket,
        &[
            "--kubelet-pods",
            "--kubelet-url",
            &url,
            "--kubelet-ca-file",
            ca.to_str().unwrap(),
            "--kubelet-token-file",
            fifo.to_str().unwrap(),
        ],
    );
    // Refreshes keep failing on the token, counted, while /metrics is served.
    let pods_auth = |m: &Exposition| {
        m.value(
            "nvml_exporter_kubernetes_errors_total",
            &[("reason", "pods_auth")],
        )
        .unwrap_or(0.0)
    };
    e.wait_metrics(
        Duration::from_secs(10),
        "two token errors and a tick",
        |m| pods_auth(m) >= 2.0 && ticks(m) > 0.0,
    );
    let logs = e.logs();
    assert!(
        logs.contains(&format!(
            "--kubelet-token-file {}: a FIFO, not a regular file",
            fifo.display()
        )),
        "{logs}"
    );
    assert!(api.requests().is_empty(), "no request without a token");
    let status = e
        .terminate(Duration::from_secs(10))
        .expect("the exporter stops on SIGTERM");
    assert!(status.success(), "{status:?}");
}

//! Per-process metrics end to end: the real exporter binary with `--processes` on the simulated
//! shared GPUs (`shared.toml`), looking the processes up in a fake procfs whose pids are the
//! scenario's and whose cgroups name pods the way containerd, CRI-O and the cgroupfs driver do.
//! With a fake kubelet (pod-resources and the HTTPS `/pods` list) two pods time-slicing one GPU
//! each get their own usage, and the numbers add up to the device's. On a MIG GPU
//! (`h100-mig.toml`) each process carries its GPU instance and the instance's owner, and an
//! unprivileged exporter (`NVML_SIM_PRIVILEGED=0`) serves the same process series as root.

mod common;
mod kubelet;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::{Exporter, Exposition, run_once, scenario};
use kubelet::https::{FakeKubeletApi, Reply};
use kubelet::{FakeKubelet, pod};
use nvml_exporter::kubernetes::proto::PodResources;

const GPU0: &str = "GPU-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c01";
const GPU1: &str = "GPU-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c02";
const MIB: f64 = 1048576.0;

const UID_A: &str = "1f0e5d4c-3b2a-4190-8f7e-6d5c4b3a2910";
const UID_B: &str = "2a1b0c9d-8e7f-4a6b-9c5d-4e3f2a1b0c92";
const UID_C: &str = "3b2c1d0e-9f8a-4b7c-8d6e-5f4a3b2c1d03";

/// (pid, comm, cgroup file) of every process the scenario puts on a GPU.
fn processes() -> Vec<(u32, &'static str, String)> {
    let id = |c: char| c.to_string().repeat(64);
    let systemd = |uid: &str| uid.replace('-', "_");
    vec![
        (
            610001,
            "pt_main_thread",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
                systemd(UID_A),
                id('a')
            ),
        ),
        (
            610002,
            "python3",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
                systemd(UID_A),
                id('a')
            ),
        ),
        (
            610101,
            "tritonserver",
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{}.scope\n",
                systemd(UID_B),
                id('b')
            ),
        ),
        (
            610900,
            "python3",
            "0::/user.slice/user-1000.slice/session-4.scope\n".into(),
        ),
        (
            620001,
            "trainer",
            format!(
                "12:memory:/kubepods/pod{UID_C}/{c}\n4:cpu,cpuacct:/kubepods/pod{UID_C}/{c}\n0::/\n",
                c = id('c')
            ),
        ),
        (
            620002,
            "loader",
            format!("12:memory:/kubepods/pod{UID_C}/{}\n0::/\n", id('c')),
        ),
    ]
}

/// A procfs tree with `stat`, `comm` and `cgroup` of every scenario process.
fn fake_proc(root: &Path) {
    write_proc(root, processes());
}

/// A procfs tree with `stat`, `comm` and `cgroup` of each (pid, comm, cgroup file); the comm is
/// any bytes, as a process may name itself.
fn write_proc<N: AsRef<[u8]>>(root: &Path, processes: Vec<(u32, N, String)>) {
    for (pid, comm, cgroup) in processes {
        let comm = comm.as_ref();
        let dir = root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        let fields = format!(
            " S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 10 2 0 0 20 0 4 0 {start} 1000000 200 18446744073709551615 0 0 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n",
            start = 1000 + pid
        );
        let stat = [format!("{pid} (").as_bytes(), comm, b")", fields.as_bytes()].concat();
        fs::write(dir.join("stat"), stat).unwrap();
        fs::write(dir.join("comm"), [comm, b"\n"].concat()).unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }
}

fn shared_env(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![(
        "NVML_SIM_SCENARIO",
        scenario("shared").to_str().unwrap().to_owned(),
    )];
    env.extend_from_slice(extra);
    env
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn once(env: &[(&'static str, String)], args: &[&str]) -> Exposition {
    let out = run_once(&env_refs(env), args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Exposition::parse(&String::from_utf8(out.stdout).unwrap())
}

/// The process series of `pid` (memory), if served.
fn memory(m: &Exposition, pid: u32) -> Option<f64> {
    m.value(
        "nvidia_gpu_process_memory_used_bytes",
        &[("pid", &pid.to_string())],
    )
}

/// The simulator's per-process utilization: the device's, split by memory share, in whole percent.
fn sim_share(utilization: f64, mib: f64, held_mib: f64) -> f64 {
    (utilization * 100.0 * mib / held_mib).round() / 100.0
}

#[test]
fn processes_are_served_with_procfs_names_and_sum_to_the_device_memory() {
    let dir = tempfile::tempdir().unwrap();
    fake_proc(dir.path());
    let env = shared_env(&[("NVML_SIM_TIME", "30".into())]);
    let root = dir.path().to_str().unwrap();
    let m = once(&env, &["--processes", "--host-proc", root]);

    let gpu0 = [
        (610001, 20480.0),
        (610002, 4096.0),
        (610101, 12288.0),
        (610900, 1024.0),
    ];
    let held0: f64 = gpu0.iter().map(|(_, mib)| mib).sum();
    for (pid, mib) in gpu0 {
        let s = m.find(
            "nvidia_gpu_process_memory_used_bytes",
            &[("pid", &pid.to_string())],
        );
        assert_eq!(s.len(), 1, "pid {pid}");
        assert_eq!(s[0].labels["gpu"], "0");
        assert_eq!(s[0].labels["uuid"], GPU0);
        assert_eq!(s[0].value, mib * MIB, "pid {pid}");
        // Without --kubernetes no process has pod labels.
        assert!(!s[0].labels.contains_key("namespace"), "{s:?}");
        let sm = m.value(
            "nvidia_gpu_process_sm_utilization_ratio",
            &[("pid", &pid.to_string())],
        );
        assert_eq!(sm, Some(sim_share(0.6, mib, held0)), "pid {pid}");
    }
    // The name is procfs' comm, not NVML's ("python" in the scenario).
    let s = &m.find("nvidia_gpu_process_memory_used_bytes", &[("pid", "610001")])[0];
    assert_eq!(s.labels["process_name"], "pt_main_thread");
    // The simulator models used memory as the processes' sum (memory_used = 0 in the scenario).
    assert_eq!(
        m.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[]),
        Some(held0 * MIB)
    );
    assert_eq!(memory(&m, 620001), Some(30720.0 * MIB));
    assert_eq!(m.find("nvidia_gpu_process_memory_used_bytes", &[]).len(), 6);
    // No kubelet, no pods.
    assert!(m.find("nvidia_gpu_pod_memory_used_bytes", &[]).is_empty());

    // Without --processes nothing of it is served.
    let m = once(&env, &["--host-proc", root]);
    assert!(
        m.names()
            .iter()
            .all(|n| !n.starts_with("nvidia_gpu_process_")),
        "{:?}",
        m.names()
    );
}

#[test]
fn the_series_limit_keeps_the_largest_processes_per_gpu() {
    let dir = tempfile::tempdir().unwrap();
    fake_proc(dir.path());
    let env = shared_env(&[("NVML_SIM_TIME", "30".into())]);
    let m = once(
        &env,
        &[
            "--processes",
            "--host-proc",
            dir.path().to_str().unwrap(),
            "--max-processes-per-gpu",
            "2",
        ],
    );
    let mut pids: Vec<String> = m
        .find("nvidia_gpu_process_memory_used_bytes", &[])
        .iter()
        .map(|s| s.labels["pid"].clone())
        .collect();
    pids.sort();
    assert_eq!(pids, ["610001", "610101", "620001", "620002"]);
}

#[test]
fn a_frozen_clock_counts_each_utilization_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    fake_proc(dir.path());
    // The simulator's samples carry the simulated time: frozen, no sample is ever newer than the
    // first tick's, so from the second tick every process reads 0 (and memory stays).
    let env = shared_env(&[("NVML_SIM_TIME", "30".into())]);
    let e = Exporter::start(
        &env_refs(&env),
        &[
            "--interval",
            "200ms",
            "--processes",
            "--host-proc",
            dir.path().to_str().unwrap(),
        ],
    );
    let m = e.wait_metrics(Duration::from_secs(10), "three ticks", |m| {
        m.value("nvml_exporter_sample_duration_seconds_count", &[])
            .unwrap_or(0.0)
            >= 3.0
    });
    let sm = m.find("nvidia_gpu_process_sm_utilization_ratio", &[]);
    assert_eq!(sm.len(), 6);
    assert!(sm.iter().all(|s| s.value == 0.0), "{sm:?}");
    assert_eq!(memory(&m, 610101), Some(12288.0 * MIB));
}

#[test]
fn a_gpu_held_by_one_container_lends_it_to_its_processes_until_they_exit() {
    let dir = tempfile::tempdir().unwrap();
    fake_proc(dir.path());
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = sock_dir.path().join("kubelet.sock");
    // GPU0 is time-sliced between two pods, GPU1 belongs to one container.
    let _kubelet = FakeKubelet::start(&socket, shared_pod_resources().to_vec());
    // The loader exits at t = 60 s: about ten seconds into the run.
    let env = shared_env(&[("NVML_SIM_START", "50".into())]);
    let e = Exporter::start(
        &env_refs(&env),
        &[
            "--interval",
            "300ms",
            "--processes",
            "--host-proc",
            dir.path().to_str().unwrap(),
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    let solo = [
        ("namespace", "ml"),
        ("pod", "solo-c"),
        ("container", "trainer"),
    ];
    let pod_memory = |m: &Exposition| {
        m.value(
            "nvidia_gpu_pod_memory_used_bytes",
            &[&[("gpu", "1")][..], &solo[..]].concat(),
        )
    };
    let m = e.wait_metrics(
        Duration::from_secs(10),
        "GPU1's processes attributed",
        |m| pod_memory(m).is_some(),
    );
    // Both processes of GPU1 carry the container's labels, and the pod's memory is their sum.
    for pid in ["620001", "620002"] {
        let s = m.find(
            "nvidia_gpu_process_memory_used_bytes",
            &[&[("pid", pid)][..], &solo[..]].concat(),
        );
        assert_eq!(s.len(), 1, "pid {pid}: {}", m.text);
    }
    assert_eq!(pod_memory(&m), Some((30720.0 + 2048.0) * MIB));
    let pod_sm = m
        .value(
            "nvidia_gpu_pod_sm_utilization_ratio",
            &[&[("gpu", "1")][..], &solo[..]].concat(),
        )
        .unwrap();
    let process_sm: f64 = m
        .find("nvidia_gpu_process_sm_utilization_ratio", &[("gpu", "1")])
        .iter()
        .map(|s| s.value)
        .sum();
    assert!(
        (pod_sm - process_sm).abs() < 1e-9,
        "{pod_sm} vs {process_sm}"
    );
    // GPU1's processes are its container's: nothing outside. On GPU0 the host process (a user
    // session) is outside; the pods' processes, without a pod list to name them, are not.
    let outside = |gpu| {
        m.value(
            "nvidia_gpu_memory_outside_allocation_bytes",
            &[("gpu", gpu)],
        )
    };
    assert_eq!(outside("1"), Some(0.0), "{}", m.text);
    assert!(memory(&m, 610900).is_some_and(|b| b > 0.0), "{}", m.text);
    assert_eq!(outside("0"), memory(&m, 610900));
    // The shared GPU has two owners and no pod list to tell its processes apart: no labels,
    // and no pod gets the GPU's usage copied.
    for s in m.find("nvidia_gpu_process_memory_used_bytes", &[("gpu", "0")]) {
        assert!(!s.labels.contains_key("pod"), "{s:?}");
    }
    assert!(
        m.find("nvidia_gpu_pod_memory_used_bytes", &[("gpu", "0")])
            .is_empty()
    );

    // The loader exits: its series go, and the pod's sum drops to the trainer alone.
    let m = e.wait_metrics(Duration::from_secs(20), "the loader gone", |m| {
        memory(m, 620002).is_none()
    });
    assert_eq!(memory(&m, 620001), Some(30720.0 * MIB));
    assert!(
        m.find(
            "nvidia_gpu_process_sm_utilization_ratio",
            &[("pid", "620002")]
        )
        .is_empty()
    );
    assert_eq!(pod_memory(&m), Some(30720.0 * MIB));
}

/// A `/pods` answer (v1 `PodList`) naming `pods`: (namespace, name, UID, container, runtime ID).
fn pod_list(pods: &[(&str, &str, &str, &str, String)]) -> Reply {
    let items: Vec<serde_json::Value> = pods
        .iter()
        .map(|(namespace, name, uid, container, id)| {
            serde_json::json!({
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "spec": {"containers": [{"name": container}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{
                        "name": container,
                        "containerID": id,
                        "ready": true,
                        "state": {"running": {"startedAt": "2026-11-20T09:12:50Z"}}
                    }]
                }
            })
        })
        .collect();
    let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": items});
    Reply::Body(serde_json::to_vec(&list).unwrap())
}

/// `shared.toml` with infer-b's process (pid 610101) exiting at `to` seconds.
fn shared_with_infer_exiting(dir: &Path, to: u32) -> String {
    let text = fs::read_to_string(scenario("shared")).unwrap();
    let held = "pid = 610101\nname = \"tritonserver\"\nused_memory_mib = 12288\n";
    assert!(text.contains(held), "shared.toml changed: {text}");
    let path = dir.join("shared-infer-exits.toml");
    fs::write(&path, text.replace(held, &format!("{held}to = {to}\n"))).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The pod labels of a series: (namespace, pod, container), `None` when it has none.
fn owner(s: &common::Series) -> Option<(&str, &str, &str)> {
    let l = |k: &str| s.labels.get(k).map(String::as_str);
    Some((l("namespace")?, l("pod")?, l("container").unwrap_or("")))
}

/// The pods of the shared GPUs, as pod-resources lists them: GPU0 time-sliced (replica IDs
/// `<uuid>::<n>`) between train-a and infer-b, GPU1 held by solo-c alone.
fn shared_pod_resources() -> [PodResources; 3] {
    [
        pod(
            "ml",
            "train-a",
            "main",
            "nvidia.com/gpu",
            &[&format!("{GPU0}::0")],
        ),
        pod(
            "ml",
            "infer-b",
            "server",
            "nvidia.com/gpu",
            &[&format!("{GPU0}::1")],
        ),
        pod("ml", "solo-c", "trainer", "nvidia.com/gpu", &[GPU1]),
    ]
}

/// The same pods as `/pods` names them, with the UIDs and container IDs the fake cgroups name:
/// (namespace, name, UID, container, runtime ID).
fn shared_pod_list() -> [(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    String,
); 3] {
    let id = |c: char| c.to_string().repeat(64);
    [
        (
            "ml",
            "train-a",
            UID_A,
            "main",
            format!("containerd://{}", id('a')),
        ),
        (
            "ml",
            "infer-b",
            UID_B,
            "server",
            format!("cri-o://{}", id('b')),
        ),
        (
            "ml",
            "solo-c",
            UID_C,
            "trainer",
            format!("containerd://{}", id('c')),
        ),
    ]
}

/// The exporter with `--processes` reading `proc_root` and `--kubernetes` asking a fake kubelet
/// (pod-resources and `/pods`) that serves the shared GPUs' pods, every 300 ms.
fn start_with_shared_pods(
    dir: &Path,
    proc_root: &Path,
    env: &[(&'static str, String)],
) -> (Exporter, FakeKubelet, FakeKubeletApi) {
    let socket = dir.join("kubelet.sock");
    let pod_resources = FakeKubelet::start(&socket, shared_pod_resources().to_vec());
    let api = FakeKubeletApi::start("kubelet-token", pod_list(&shared_pod_list()));
    let (ca, token) = (dir.join("ca.crt"), dir.join("token"));
    fs::write(&ca, api.ca_pem()).unwrap();
    fs::write(&token, "kubelet-token\n").unwrap();
    let e = Exporter::start(
        &env_refs(env),
        &[
            "--interval",
            "300ms",
            "--processes",
            "--host-proc",
            proc_root.to_str().unwrap(),
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
            "--kubelet-url",
            &api.url(),
            "--kubelet-ca-file",
            ca.to_str().unwrap(),
            "--kubelet-token-file",
            token.to_str().unwrap(),
        ],
    );
    (e, pod_resources, api)
}

#[test]
fn pods_sharing_a_gpu_each_get_their_own_usage_and_it_adds_up_to_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fake_proc(&proc_root);
    let [train_a, _, solo_c] = shared_pod_resources();
    let [list_a, _, list_c] = shared_pod_list();
    // infer-b's only process exits 15 s into the run: enough to see both pods first.
    let env = [(
        "NVML_SIM_SCENARIO",
        shared_with_infer_exiting(dir.path(), 15),
    )];
    let (e, pod_resources, api) = start_with_shared_pods(dir.path(), &proc_root, &env);
    let pod_value = |m: &Exposition, family: &str, gpu: &str, pod: &str| {
        m.value(family, &[("gpu", gpu), ("namespace", "ml"), ("pod", pod)])
    };
    let pod_memory =
        |m: &Exposition, pod: &str| pod_value(m, "nvidia_gpu_pod_memory_used_bytes", "0", pod);
    let pod_sm =
        |m: &Exposition, pod: &str| pod_value(m, "nvidia_gpu_pod_sm_utilization_ratio", "0", pod);
    let m = e.wait_metrics(Duration::from_secs(12), "both pods of GPU0", |m| {
        pod_sm(m, "train-a").is_some() && pod_sm(m, "infer-b").is_some()
    });

    // Every process series names its own container; the host process names none.
    let expected = [
        (610001, Some(("ml", "train-a", "main"))),
        (610002, Some(("ml", "train-a", "main"))),
        (610101, Some(("ml", "infer-b", "server"))),
        (610900, None),
        (620001, Some(("ml", "solo-c", "trainer"))),
        (620002, Some(("ml", "solo-c", "trainer"))),
    ];
    for (pid, who) in expected {
        for family in [
            "nvidia_gpu_process_memory_used_bytes",
            "nvidia_gpu_process_sm_utilization_ratio",
        ] {
            let s = m.find(family, &[("pid", &pid.to_string())]);
            assert_eq!(s.len(), 1, "{family} pid {pid}: {}", m.text);
            assert_eq!(owner(s[0]), who, "{family} pid {pid}");
        }
    }

    // Each pod's usage is its own processes', not the GPU's.
    let mib = |x: f64| x * MIB;
    let held0 = 20480.0 + 4096.0 + 12288.0 + 1024.0;
    assert_eq!(pod_memory(&m, "train-a"), Some(mib(20480.0 + 4096.0)));
    assert_eq!(pod_memory(&m, "infer-b"), Some(mib(12288.0)));
    let gpu_sm = m.gpu_value("nvidia_gpu_utilization_ratio", 0, &[]).unwrap();
    assert_eq!(gpu_sm, 0.6);
    let train_sm = sim_share(0.6, 20480.0, held0) + sim_share(0.6, 4096.0, held0);
    let infer_sm = sim_share(0.6, 12288.0, held0);
    assert!(
        (pod_sm(&m, "train-a").unwrap() - train_sm).abs() < 1e-9,
        "{}",
        m.text
    );
    assert!(
        (pod_sm(&m, "infer-b").unwrap() - infer_sm).abs() < 1e-9,
        "{}",
        m.text
    );
    assert!(train_sm < gpu_sm && infer_sm < gpu_sm && train_sm != infer_sm);
    // Both containers hold GPU0: its own series carry no pod.
    for s in m.find("nvidia_gpu_memory_used_bytes", &[("gpu", "0")]) {
        assert_eq!(owner(s), None, "{s:?}");
    }

    // The pod sums plus the processes without a pod add up to the device's used memory (the
    // simulator models it as the processes' sum), on both GPUs.
    for gpu in ["0", "1"] {
        let pods: f64 = m
            .find("nvidia_gpu_pod_memory_used_bytes", &[("gpu", gpu)])
            .iter()
            .map(|s| s.value)
            .sum();
        let unattributed: f64 = m
            .find("nvidia_gpu_process_memory_used_bytes", &[("gpu", gpu)])
            .iter()
            .filter(|s| owner(s).is_none())
            .map(|s| s.value)
            .sum();
        let device = m.value("nvidia_gpu_memory_used_bytes", &[("gpu", gpu)]);
        assert_eq!(Some(pods + unattributed), device, "GPU {gpu}");
    }
    assert_eq!(
        m.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[]),
        Some(mib(held0))
    );

    // infer-b's process exits: its usage series go at once; while the kubelet still assigns it a
    // GPU, only that assignment (`nvidia_gpu_pod_info`) and its GPU-seconds are left.
    let infer_series = |m: &Exposition| -> Vec<String> {
        m.find_any_labels(&[("pod", "infer-b")])
            .iter()
            .map(|s| s.name.clone())
            .collect()
    };
    let m = e.wait_metrics(Duration::from_secs(30), "infer-b's process gone", |m| {
        memory(m, 610101).is_none()
    });
    assert_eq!(
        infer_series(&m),
        [
            "nvidia_gpu_pod_info",
            "nvidia_gpu_pod_gpu_seconds_total",
            "nvidia_gpu_pod_idle_gpu_seconds_total",
            "nvidia_gpu_pod_sm_active_gpu_seconds_total"
        ],
        "{}",
        m.text
    );
    // Then the kubelet forgets the pod: GPU0 now belongs to train-a alone, whose series keep
    // their values, and the host process is still nobody's.
    fs::remove_dir_all(proc_root.join("610101")).unwrap();
    pod_resources.set_pods(vec![train_a, solo_c]);
    api.set_reply(pod_list(&[list_a, list_c]));
    let m = e.wait_metrics(Duration::from_secs(10), "GPU0 held by train-a", |m| {
        m.find(
            "nvidia_gpu_memory_used_bytes",
            &[("gpu", "0"), ("pod", "train-a")],
        )
        .len()
            == 1
    });
    assert_eq!(infer_series(&m), Vec::<String>::new(), "{}", m.text);
    let held0 = 20480.0 + 4096.0 + 1024.0;
    assert_eq!(pod_memory(&m, "train-a"), Some(mib(20480.0 + 4096.0)));
    let train_sm = sim_share(0.6, 20480.0, held0) + sim_share(0.6, 4096.0, held0);
    assert!(
        (pod_sm(&m, "train-a").unwrap() - train_sm).abs() < 1e-9,
        "{}",
        m.text
    );
    let host = m.find("nvidia_gpu_process_memory_used_bytes", &[("pid", "610900")]);
    assert_eq!(owner(host[0]), None, "{host:?}");
    assert_eq!(
        m.gpu_value("nvidia_gpu_memory_used_bytes", 0, &[]),
        Some(mib(held0))
    );
}

#[test]
fn a_process_named_with_bytes_that_are_not_utf8_keeps_its_pod_and_its_share_of_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    // infer-b's process renames itself with bytes that are not UTF-8 (`prctl(PR_SET_NAME)`).
    let named: Vec<(u32, Vec<u8>, String)> = processes()
        .into_iter()
        .map(|(pid, comm, cgroup)| {
            let comm = match pid {
                610101 => b"triton\xff)\xfe".to_vec(),
                _ => comm.as_bytes().to_vec(),
            };
            (pid, comm, cgroup)
        })
        .collect();
    write_proc(&proc_root, named);
    let env = shared_env(&[]);
    let (e, _pod_resources, _api) = start_with_shared_pods(dir.path(), &proc_root, &env);

    let pod_value = |m: &Exposition, family: &str, pod: &str| {
        m.value(family, &[("gpu", "0"), ("namespace", "ml"), ("pod", pod)])
    };
    let seconds = |m: &Exposition, pod: &str| {
        pod_value(m, "nvidia_gpu_pod_gpu_seconds_total", pod).unwrap_or(0.0)
    };
    let m = e.wait_metrics(Duration::from_secs(12), "both pods of GPU0", |m| {
        pod_value(m, "nvidia_gpu_pod_sm_utilization_ratio", "train-a").is_some()
            && pod_value(m, "nvidia_gpu_pod_sm_utilization_ratio", "infer-b").is_some()
    });
    // The process is served under its name made readable, in its own container.
    let s = m.find("nvidia_gpu_process_memory_used_bytes", &[("pid", "610101")]);
    assert_eq!(s.len(), 1, "{}", m.text);
    assert_eq!(s[0].labels["process_name"], "triton\u{fffd})\u{fffd}");
    assert_eq!(owner(s[0]), Some(("ml", "infer-b", "server")));
    // Its pod keeps its memory and SM series.
    let held0 = 20480.0 + 4096.0 + 12288.0 + 1024.0;
    assert_eq!(
        pod_value(&m, "nvidia_gpu_pod_memory_used_bytes", "infer-b"),
        Some(12288.0 * MIB)
    );
    let infer_sm = sim_share(0.6, 12288.0, held0);
    let train_sm = sim_share(0.6, 20480.0, held0) + sim_share(0.6, 4096.0, held0);
    let sm = pod_value(&m, "nvidia_gpu_pod_sm_utilization_ratio", "infer-b").unwrap();
    assert!((sm - infer_sm).abs() < 1e-9, "{}", m.text);

    // From here on, the GPU-seconds of GPU0 are split between the two pods by their SM
    // utilization: infer-b is charged its share, not nothing while train-a gets all.
    let (infer0, train0) = (seconds(&m, "infer-b"), seconds(&m, "train-a"));
    let m = e.wait_metrics(Duration::from_secs(10), "two seconds of GPU0", |m| {
        seconds(m, "infer-b") + seconds(m, "train-a") >= infer0 + train0 + 2.0
    });
    let infer = seconds(&m, "infer-b") - infer0;
    let train = seconds(&m, "train-a") - train0;
    assert!(infer > 0.0 && train > 0.0, "{}", m.text);
    assert!(
        infer < train,
        "infer-b uses {infer_sm} of the SMs, train-a {train_sm}: {infer} vs {train} GPU-seconds"
    );
}

const MIG_GPU0: &str = "GPU-8e1c4a7f-3b2d-4c6e-9a0f-5d7b9e1c3a21";
const MIG_GPU1: &str = "GPU-4f6a8c0e-2d4b-4e6a-8c0e-2a4c6e8a0c22";

/// The MIG device UUID of `h100-mig.toml`'s GPU0 ending in `n` (1: GI 2, 2: GI 3, 3: GI 9).
fn h100_mig_uuid(n: u32) -> String {
    format!("MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b{n:02}")
}

#[test]
fn on_a_mig_gpu_processes_carry_their_instance_and_the_instance_owner() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    // The pids of h100-mig.toml, each in a pod the (absent) pod list cannot name.
    let containerd = |uid: &str, c: char| {
        format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope\n",
            uid.replace('-', "_"),
            c.to_string().repeat(64)
        )
    };
    write_proc(
        &proc_root,
        vec![
            (610001, "pt_main_thread", containerd(UID_A, 'a')),
            (610002, "tritonserver", containerd(UID_B, 'b')),
            (610003, "jupyter-kernel", containerd(UID_C, 'c')),
            (610101, "python3", containerd(UID_C, 'd')),
        ],
    );
    // GI 2 held by train alone (by its MIG UUID), GI 3 time-sliced by two pods, GI 9 by nobody,
    // GPU1 (MIG off) whole by one container.
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = FakeKubelet::start(
        &socket,
        vec![
            pod(
                "ml",
                "train",
                "main",
                "nvidia.com/mig-3g.40gb",
                &[&h100_mig_uuid(1)],
            ),
            pod(
                "ml",
                "infer-a",
                "server",
                "nvidia.com/mig-2g.20gb",
                &[&format!("{}::0", h100_mig_uuid(2))],
            ),
            pod(
                "ml",
                "infer-b",
                "server",
                "nvidia.com/mig-2g.20gb",
                &[&format!("{}::1", h100_mig_uuid(2))],
            ),
            pod("ml", "whole", "main", "nvidia.com/gpu", &[MIG_GPU1]),
        ],
    );
    let env = [
        (
            "NVML_SIM_SCENARIO",
            scenario("h100-mig").to_str().unwrap().to_owned(),
        ),
        ("NVML_SIM_TIME", "10".to_owned()),
    ];
    let e = Exporter::start(
        &env_refs(&env),
        &[
            "--interval",
            "300ms",
            "--processes",
            "--host-proc",
            proc_root.to_str().unwrap(),
            "--kubernetes",
            "--pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    let m = e.wait_metrics(Duration::from_secs(20), "GI 2's pod sum", |m| {
        m.value("nvidia_gpu_pod_memory_used_bytes", &[("gpu_instance", "2")])
            .is_some()
    });

    // Each process series names its instance; only GI 2's has an owner to lend.
    let label = |s: &common::Series, k: &str| s.labels.get(k).cloned();
    let expected = [
        (
            610001,
            "2",
            "3g.40gb",
            Some(("ml", "train", "main")),
            30720.0,
        ),
        (610002, "3", "2g.20gb", None, 12288.0),
        (610003, "9", "1g.10gb", None, 2048.0),
    ];
    for (pid, gi, profile, who, mib) in expected {
        let s = m.find(
            "nvidia_gpu_process_memory_used_bytes",
            &[("pid", &pid.to_string())],
        );
        assert_eq!(s.len(), 1, "pid {pid}: {}", m.text);
        assert_eq!(s[0].labels["uuid"], MIG_GPU0);
        assert_eq!(
            label(s[0], "gpu_instance").as_deref(),
            Some(gi),
            "pid {pid}"
        );
        assert_eq!(
            label(s[0], "mig_profile").as_deref(),
            Some(profile),
            "pid {pid}"
        );
        assert_eq!(owner(s[0]), who, "pid {pid}");
        assert_eq!(s[0].value, mib * MIB, "pid {pid}");
    }
    // The whole GPU (MIG off) keeps the labels of a GPU's process: no instance, its owner.
    let s = m.find("nvidia_gpu_process_memory_used_bytes", &[("pid", "610101")]);
    assert_eq!(s.len(), 1, "{}", m.text);
    assert_eq!(s[0].labels["uuid"], MIG_GPU1);
    assert_eq!(label(s[0], "gpu_instance"), None);
    assert_eq!(label(s[0], "mig_profile"), None);
    assert_eq!(owner(s[0]), Some(("ml", "whole", "main")));

    // Per-pod sums are per (GPU, instance, container): GI 2's is its processes' memory, and no
    // pod gets the shared GI 3's or the unassigned GI 9's.
    let pods = m.find("nvidia_gpu_pod_memory_used_bytes", &[("gpu", "0")]);
    assert_eq!(pods.len(), 1, "{}", m.text);
    assert_eq!(label(pods[0], "gpu_instance").as_deref(), Some("2"));
    assert_eq!(label(pods[0], "mig_profile").as_deref(), Some("3g.40gb"));
    assert_eq!(owner(pods[0]), Some(("ml", "train", "main")));
    let gi2_processes: f64 = m
        .find(
            "nvidia_gpu_process_memory_used_bytes",
            &[("gpu", "0"), ("gpu_instance", "2")],
        )
        .iter()
        .map(|s| s.value)
        .sum();
    assert_eq!(pods[0].value, gi2_processes);
    let whole = m.find("nvidia_gpu_pod_memory_used_bytes", &[("gpu", "1")]);
    assert_eq!(whole.len(), 1, "{}", m.text);
    assert_eq!(label(whole[0], "gpu_instance"), None);
    assert_eq!(whole[0].value, 40960.0 * MIB);

    // The driver does not support process utilization on a MIG GPU: absent there, not 0; the
    // GPU with MIG off still has it.
    assert!(
        m.find("nvidia_gpu_process_sm_utilization_ratio", &[("gpu", "0")])
            .is_empty(),
        "{}",
        m.text
    );
    assert!(
        m.find("nvidia_gpu_pod_sm_utilization_ratio", &[("gpu", "0")])
            .is_empty()
    );
    assert_eq!(
        m.find("nvidia_gpu_process_sm_utilization_ratio", &[("gpu", "1")])
            .len(),
        1
    );

    // The simulator models an instance's used memory as max(its load's share of the instance,
    // its processes' sum): never below the processes in it, and exactly their sum for GI 9
    // (no memory load).
    let instance_used = |gi: &str| {
        m.value(
            "nvidia_gpu_memory_used_bytes",
            &[("gpu", "0"), ("gpu_instance", gi)],
        )
        .unwrap()
    };
    for gi in ["2", "3", "9"] {
        let held: f64 = m
            .find(
                "nvidia_gpu_process_memory_used_bytes",
                &[("gpu", "0"), ("gpu_instance", gi)],
            )
            .iter()
            .map(|s| s.value)
            .sum();
        assert!(instance_used(gi) >= held, "GI {gi}: {}", m.text);
    }
    assert_eq!(instance_used("9"), 2048.0 * MIB);
    // GI 2: 80 % of 3g.40gb's 40448 MiB, above its process's 30720 MiB.
    assert_eq!(instance_used("2"), (0.8 * 40448.0 * MIB).floor());
}

/// The process series of an exposition, as (name, labels, value) lines, sorted.
fn process_series(m: &Exposition) -> Vec<String> {
    let mut out: Vec<String> = m
        .series
        .iter()
        .filter(|s| s.name.starts_with("nvidia_gpu_process_"))
        .map(|s| format!("{}{:?} {}", s.name, s.labels, s.value))
        .collect();
    out.sort();
    out
}

#[test]
fn on_a_mig_gpu_an_unprivileged_exporter_reads_each_instance_s_processes() {
    // Before h100-mig's reconfiguration, and after it (GI 3 replaced by GI 7, whose process
    // 610004 started at 65 s): the MIG devices of each tick are the ones asked.
    let before = [
        (610001, "2", "3g.40gb", 30720.0),
        (610002, "3", "2g.20gb", 12288.0),
        (610003, "9", "1g.10gb", 2048.0),
    ];
    let after = [
        (610001, "2", "3g.40gb", 30720.0),
        (610004, "7", "1g.20gb", 8192.0),
        (610003, "9", "1g.10gb", 2048.0),
    ];
    unprivileged_mig_processes_match_root("10", &before);
    unprivileged_mig_processes_match_root("70", &after);
}

/// Runs h100-mig at pinned time `t` with a privileged and an unprivileged simulated caller and
/// checks that the unprivileged exporter serves `expected` (pid, GPU instance, profile, MiB) on
/// GPU0 and exactly the privileged one's process series, with no NVML error for the refusal.
fn unprivileged_mig_processes_match_root(t: &str, expected: &[(u32, &str, &str, f64)]) {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let host = "0::/user.slice/user-1000.slice/session-4.scope\n".to_owned();
    write_proc(
        &proc_root,
        vec![
            (610001, "pt_main_thread", host.clone()),
            (610002, "tritonserver", host.clone()),
            (610003, "jupyter-kernel", host.clone()),
            (610004, "python3", host.clone()),
            (610101, "python3", host),
        ],
    );
    let start = |privileged: &str| {
        let env = [
            (
                "NVML_SIM_SCENARIO",
                scenario("h100-mig").to_str().unwrap().to_owned(),
            ),
            ("NVML_SIM_TIME", t.to_owned()),
            ("NVML_SIM_PRIVILEGED", privileged.to_owned()),
        ];
        Exporter::start(
            &env_refs(&env),
            &[
                "--interval",
                "200ms",
                "--processes",
                "--host-proc",
                proc_root.to_str().unwrap(),
            ],
        )
    };
    let (root, user) = (start("1"), start("0"));
    // Several ticks: the first finds the parent's lists refused, the later ones go straight to
    // the MIG devices' lists.
    let after_ticks = |e: &Exporter, who: &str| {
        e.wait_metrics(Duration::from_secs(20), &format!("3 ticks ({who})"), |m| {
            m.value("nvml_exporter_sample_duration_seconds_count", &[])
                .is_some_and(|n| n >= 3.0)
        })
    };
    let (root_m, user_m) = (after_ticks(&root, "root"), after_ticks(&user, "user"));

    // Each instance's process, with its instance and profile, read from its MIG device.
    let on_gpu0 = user_m.find(
        "nvidia_gpu_process_memory_used_bytes",
        &[("uuid", MIG_GPU0)],
    );
    assert_eq!(on_gpu0.len(), expected.len(), "t={t}: {}", user_m.text);
    for &(pid, gi, profile, mib) in expected {
        let s = user_m.find(
            "nvidia_gpu_process_memory_used_bytes",
            &[("pid", &pid.to_string()), ("gpu_instance", gi)],
        );
        assert_eq!(s.len(), 1, "t={t} pid {pid}: {}", user_m.text);
        assert_eq!(s[0].labels["uuid"], MIG_GPU0);
        assert_eq!(s[0].labels["mig_profile"], profile, "t={t} pid {pid}");
        assert_eq!(s[0].value, mib * MIB, "t={t} pid {pid}");
    }
    // Exactly what a privileged exporter serves from the parent's lists, the MIG-off GPU's
    // process (with its utilization) included.
    assert_eq!(process_series(&user_m), process_series(&root_m), "t={t}");
    assert_eq!(
        user_m
            .find(
                "nvidia_gpu_process_sm_utilization_ratio",
                &[("uuid", MIG_GPU1)]
            )
            .len(),
        1,
        "{}",
        user_m.text
    );

    // The refusal is the driver's answer to an unprivileged caller, handled: never an error.
    let process_errors = |m: &Exposition| {
        m.find("nvml_exporter_nvml_errors_total", &[])
            .into_iter()
            .filter(|s| s.labels["function"].contains("RunningProcesses"))
            .map(|s| format!("{:?}", s.labels))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        process_errors(&user_m),
        Vec::<String>::new(),
        "{}",
        user_m.text
    );
    assert_eq!(process_errors(&root_m), Vec::<String>::new());
    assert!(
        user_m
            .find(
                "nvml_exporter_nvml_errors_total",
                &[("error", "no_permission")]
            )
            .is_empty(),
        "{}",
        user_m.text
    );
}

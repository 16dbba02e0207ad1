//! `/proc/<pid>/cgroup` → the pod UID and container ID of a process.
//!
//! The kubelet puts every container in a cgroup below its pod's, and names both after their IDs;
//! only the spelling differs:
//!
//! | driver / runtime | path (cgroup v2; v1 has the same path after `N:controllers:`) |
//! |---|---|
//! | systemd, containerd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` |
//! | systemd, CRI-O | `…/kubepods-besteffort-pod<uid>.slice/crio-<id>.scope` |
//! | systemd, Docker (cri-dockerd) | `…/kubepods-pod<uid>.slice/docker-<id>.scope` |
//! | cgroupfs, any runtime | `/kubepods/burstable/pod<uid-with-dashes>/<id>` |
//!
//! kind and other nested setups prefix `kubelet.slice/kubelet-` to the same names. A process
//! outside Kubernetes has no `pod<uid>` segment: it gets no pod (a plain Docker container still
//! gets its container ID). CRI-O's `crio-conmon-<id>.scope` is the monitor, not the container.

pub use crate::sample::ProcessCgroup;

/// Parses the text of `/proc/<pid>/cgroup` (cgroup v1, v2 or hybrid). A line that names a pod
/// wins over one that only names a container; malformed lines are skipped.
pub fn parse(text: &str) -> ProcessCgroup {
    let mut best = ProcessCgroup::default();
    for line in text.lines() {
        // `hierarchy-ID:controller-list:path`; the path itself may contain ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let ids = parse_path(path);
        if ids.pod_uid.is_some() {
            return ids;
        }
        if best.container_id.is_none() {
            best = ids;
        }
    }
    best
}

/// The IDs in one cgroup path: the first pod segment, and the first container segment.
fn parse_path(path: &str) -> ProcessCgroup {
    let mut ids = ProcessCgroup::default();
    for segment in path.split('/') {
        if ids.pod_uid.is_none()
            && let Some(uid) = pod_uid_of(segment)
        {
            ids.pod_uid = Some(uid);
            continue;
        }
        if ids.container_id.is_none() {
            ids.container_id = container_id_of(segment);
        }
    }
    ids
}

/// `pod<uid>`, `kubepods-<qos>-pod<uid>.slice`, `kubelet-kubepods-pod<uid>.slice` → the UID.
fn pod_uid_of(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".slice").unwrap_or(segment);
    let (before, uid) = name.rsplit_once("pod")?;
    if !(before.is_empty() || before.ends_with('-')) {
        return None;
    }
    // A UUID: 8-4-4-4-12 hex digits; systemd escapes '-' in unit names, so it writes '_'.
    let valid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-' || c == '_',
            _ => c.is_ascii_hexdigit(),
        });
    valid.then(|| uid.replace('_', "-").to_ascii_lowercase())
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` or a bare `<id>` → the ID.
fn container_id_of(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    if name.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "cri-dockerd-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c6e0b9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a291807";
    const UID: &str = "6f5e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn ids(pod: Option<&str>, container: Option<&str>) -> ProcessCgroup {
        ProcessCgroup {
            pod_uid: pod.map(str::to_owned),
            container_id: container.map(str::to_owned),
        }
    }

    #[test]
    fn real_shaped_lines_give_pod_and_container() {
        let u = UID.replace('-', "_");
        let table: Vec<(String, ProcessCgroup)> = vec![
            // cgroup v2, systemd driver, containerd, burstable.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // Guaranteed QoS has no QoS slice.
            (
                format!("0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope\n"),
                ids(Some(UID), Some(ID)),
            ),
            // CRI-O, best effort.
            (
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{ID}.scope\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // Docker through cri-dockerd.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/docker-{ID}.scope\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // cgroupfs driver, cgroup v1: every controller line carries the same path.
            (
                format!(
                    "12:memory:/kubepods/burstable/pod{UID}/{ID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // cgroupfs, guaranteed.
            (
                format!("0::/kubepods/pod{UID}/{ID}\n"),
                ids(Some(UID), Some(ID)),
            ),
            // kind: the node's kubelet runs in a slice of its own.
            (
                format!(
                    "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // A process in a sub-cgroup of its container (systemd inside the container).
            (
                format!(
                    "0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope/init.scope\n"
                ),
                ids(Some(UID), Some(ID)),
            ),
            // Hybrid: the v2 line says nothing, a v1 line names the pod.
            (
                format!("1:name=systemd:/kubepods/pod{UID}/{ID}\n0::/\n"),
                ids(Some(UID), Some(ID)),
            ),
            // Uppercase hex is normalised.
            (
                format!(
                    "0::/kubepods/pod{}/{}\n",
                    UID.to_uppercase(),
                    ID.to_uppercase()
                ),
                ids(Some(UID), Some(ID)),
            ),
        ];
        for (text, want) in table {
            assert_eq!(parse(&text), want, "{text}");
        }
    }

    #[test]
    fn processes_outside_kubernetes_have_no_pod() {
        let table: Vec<(String, ProcessCgroup)> = vec![
            (
                "0::/user.slice/user-1000.slice/session-3.scope\n".into(),
                ids(None, None),
            ),
            (
                "0::/system.slice/nvidia-persistenced.service\n".into(),
                ids(None, None),
            ),
            ("0::/\n".into(), ids(None, None)),
            // A plain Docker container: a container, but no pod.
            (
                format!("0::/system.slice/docker-{ID}.scope\n"),
                ids(None, Some(ID)),
            ),
            (format!("4:memory:/docker/{ID}\n"), ids(None, Some(ID))),
            // The kubepods slices themselves are not pods.
            (
                "0::/kubepods.slice/kubepods-burstable.slice\n".into(),
                ids(None, None),
            ),
            (String::new(), ids(None, None)),
            ("garbage without colons\n".into(), ids(None, None)),
        ];
        for (text, want) in table {
            assert_eq!(parse(&text), want, "{text}");
        }
    }

    #[test]
    fn near_misses_are_not_ids() {
        let u = UID.replace('-', "_");
        // CRI-O's monitor process lives next to the container: pod yes, container no.
        assert_eq!(
            parse(&format!(
                "0::/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{ID}.scope\n"
            )),
            ids(Some(UID), None)
        );
        // A short ID, a UID with a wrong separator, a word ending in "pod".
        assert_eq!(parse("0::/kubepods/podabc/1234\n"), ids(None, None));
        assert_eq!(
            parse(&format!("0::/kubepods/pod{}\n", UID.replace('-', "."))),
            ids(None, None)
        );
        assert_eq!(parse(&format!("0::/ipod{UID}/{ID}\n")), ids(None, Some(ID)));
        assert_eq!(
            parse(&format!("0::/x/docker-{}.scope\n", &ID[..63])),
            ids(None, None)
        );
    }
}

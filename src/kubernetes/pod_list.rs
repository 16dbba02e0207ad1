//! The kubelet's `/pods` answer, a v1 `PodList`, read into what attribution needs: of each pod
//! its UID, namespace, name, owner and the runtime ID → name of each container, as
//! [`PodIdentity`]s, and of its labels and annotations only the copied ones
//! (`--kubernetes-pod-labels/-annotations`), each value at most [`MAX_COPIED_VALUE_BYTES`]. The
//! others are skipped unread: a pod may carry 256 KiB of annotations no one asked for, and a node
//! 110 pods. [`super::pods::PodsClient`] fetches the answer.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::sample::{ContainerIdentity, PodIdentity, PodMeta};

/// The longest value of a copied label or annotation, in bytes; a longer one is cut at a
/// character boundary and ends in `…`. A label value is at most 63 bytes in Kubernetes, but an
/// annotation can hold 256 KiB, which would land in every scrape and trip Prometheus'
/// `label_value_length_limit`.
pub const MAX_COPIED_VALUE_BYTES: usize = 1024;

// Only the fields used; serde skips the rest of each (large) pod object.

#[derive(Deserialize)]
struct V1PodList<'a> {
    kind: Option<String>,
    #[serde(borrow)]
    items: Option<Vec<Pod<'a>>>,
}

#[derive(Deserialize)]
struct Pod<'a> {
    #[serde(borrow)]
    metadata: Metadata<'a>,
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    uid: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
    /// Left as the answer's text, from which [`Kept`] reads only the keys wanted.
    #[serde(borrow)]
    labels: Option<&'a RawValue>,
    #[serde(borrow)]
    annotations: Option<&'a RawValue>,
    owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Deserialize)]
struct OwnerReference {
    kind: String,
    name: String,
    controller: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    phase: Option<String>,
    container_statuses: Option<Vec<ContainerStatus>>,
    init_container_statuses: Option<Vec<ContainerStatus>>,
    ephemeral_container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: Option<String>,
    state: Option<ContainerState>,
}

#[derive(Deserialize)]
struct ContainerState {
    running: Option<serde::de::IgnoredAny>,
}

/// What one `/pods` answer says, as kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletPods {
    /// The pods that still have a running container (in any phase: a pod being deleted still
    /// runs its processes), sorted by UID: how a process's cgroup is named.
    pub running: Vec<PodIdentity>,
    /// (namespace, name) of every pod that has not ended: its phase is neither `Succeeded` nor
    /// `Failed`. A pod the pod-resources API lists but this set lacks has let go of its devices.
    pub live: BTreeSet<(String, String)>,
    /// The controller and copied labels of the pods not ended that have any, by (namespace,
    /// name).
    pub meta: BTreeMap<(String, String), PodMeta>,
}

/// The pods of a v1 `PodList`: those with a running container, each listing every container
/// status with a runtime ID (init and ephemeral containers too), sorted by ID, the ID without its
/// scheme; and the names of those that have not ended.
pub fn parse_pod_list(json: &[u8]) -> Result<KubeletPods, serde_json::Error> {
    parse_pod_list_copying(json, &[])
}

/// [`parse_pod_list`], and the controller of each pod and those of its labels and annotations
/// that `copied` names ((key, whether an annotation, Prometheus label name)).
pub fn parse_pod_list_copying(
    json: &[u8],
    copied: &[(String, bool, String)],
) -> Result<KubeletPods, serde_json::Error> {
    let list: V1PodList = serde_json::from_slice(json)?;
    if let Some(kind) = list.kind.as_deref().filter(|k| *k != "PodList") {
        return Err(serde::de::Error::custom(format!(
            "kind is {kind:?}, not \"PodList\""
        )));
    }
    let mut answer = KubeletPods::default();
    for pod in list.items.unwrap_or_default() {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if !matches!(phase, Some("Succeeded" | "Failed")) {
            let m = &pod.metadata;
            let key = (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            );
            let meta = meta(m, copied)?;
            if meta != PodMeta::default() {
                answer.meta.insert(key.clone(), meta);
            }
            answer.live.insert(key);
        }
        answer.running.extend(identity(pod));
    }
    answer.running.sort();
    answer.running.dedup();
    Ok(answer)
}

/// The label that names a Deployment's ReplicaSet: `<deployment>-<pod-template-hash>`.
const TEMPLATE_HASH: &str = "pod-template-hash";

/// The controller of a pod and its copied labels and annotations.
fn meta(m: &Metadata, copied: &[(String, bool, String)]) -> Result<PodMeta, serde_json::Error> {
    let wanted = |annotation: bool| copied.iter().filter(move |c| c.1 == annotation);
    let label_keys: Vec<&str> = wanted(false)
        .map(|c| c.0.as_str())
        .chain([TEMPLATE_HASH])
        .collect();
    let annotation_keys: Vec<&str> = wanted(true).map(|c| c.0.as_str()).collect();
    let labels = Kept::read(m.labels, &label_keys)?;
    let annotations = Kept::read(m.annotations, &annotation_keys)?;
    let controller = m
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| {
            let deployment = labels
                .get(TEMPLATE_HASH)
                .filter(|_| o.kind == "ReplicaSet")
                .and_then(|h| o.name.strip_suffix(h.as_str())?.strip_suffix('-'))
                .filter(|d| !d.is_empty());
            match deployment {
                Some(d) => ("Deployment".to_owned(), d.to_owned()),
                None => (o.kind.clone(), o.name.clone()),
            }
        });
    let labels = copied
        .iter()
        .filter_map(|(key, annotation, name)| {
            let from = if *annotation { &annotations } else { &labels };
            Some((name.clone(), cut(from.get(key)?)))
        })
        .collect();
    Ok(PodMeta { controller, labels })
}

/// `value`, or, when longer than [`MAX_COPIED_VALUE_BYTES`], its start cut at a character
/// boundary and marked with `…` so that a reader sees it was cut (the whole within the bound).
fn cut(value: &str) -> String {
    if value.len() <= MAX_COPIED_VALUE_BYTES {
        return value.to_owned();
    }
    let mut end = MAX_COPIED_VALUE_BYTES - '…'.len_utf8();
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &value[..end])
}

/// Reads a JSON object of strings (a pod's labels or annotations) keeping only `keys`: the other
/// values are skipped without being decoded into memory.
struct Kept<'k> {
    keys: &'k [&'k str],
}

impl Kept<'_> {
    /// The wanted entries of `object` (`None`: the pod has none).
    fn read(
        object: Option<&RawValue>,
        keys: &[&str],
    ) -> Result<BTreeMap<String, String>, serde_json::Error> {
        match object {
            Some(raw) if !keys.is_empty() => {
                Kept { keys }.deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
            }
            _ => Ok(BTreeMap::new()),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Kept<'_> {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Kept<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.keys.contains(&key.as_str()) {
                kept.insert(key, map.next_value::<String>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(kept)
    }
}

fn identity(pod: Pod) -> Option<PodIdentity> {
    let status = pod.status?;
    let statuses: Vec<ContainerStatus> = [
        status.init_container_statuses,
        status.container_statuses,
        status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .collect();
    let running = statuses
        .iter()
        .any(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()));
    let uid = pod.metadata.uid.filter(|u| !u.is_empty())?;
    if !running {
        return None;
    }
    let mut containers: Vec<ContainerIdentity> = statuses
        .into_iter()
        .filter_map(|s| {
            let id = s.container_id?;
            let id = strip_scheme(&id);
            (!id.is_empty()).then(|| ContainerIdentity {
                id: id.to_owned(),
                name: s.name,
            })
        })
        .collect();
    containers.sort();
    containers.dedup();
    Some(PodIdentity {
        uid,
        namespace: pod.metadata.namespace.unwrap_or_default(),
        pod: pod.metadata.name.unwrap_or_default(),
        containers,
    })
}

/// "containerd://abc" → "abc"; an ID without a scheme is kept as it is.
fn strip_scheme(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_lose_their_scheme() {
        assert_eq!(strip_scheme("containerd://0a1b"), "0a1b");
        assert_eq!(strip_scheme("cri-o://0a1b"), "0a1b");
        assert_eq!(strip_scheme("docker://0a1b"), "0a1b");
        assert_eq!(strip_scheme("0a1b"), "0a1b");
    }

    fn status(name: &str, id: Option<&str>, state: &str) -> serde_json::Value {
        let mut s = serde_json::json!({ "name": name, "state": { state: {} } });
        if let Some(id) = id {
            s["containerID"] = id.into();
        }
        s
    }

    #[test]
    fn running_pods_with_containers_that_have_an_id_and_the_names_of_pods_not_ended() {
        let list = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {},
            "items": [
                { "metadata": { "name": "b", "namespace": "ns", "uid": "uid-b" },
                  "status": { "phase": "Running",
                    "initContainerStatuses": [status("init", Some("containerd://i1"), "terminated")],
                    "containerStatuses": [
                        status("main", Some("containerd://c2"), "running"),
                        status("side", None, "waiting"),
                    ] } },
                { "metadata": { "name": "done", "namespace": "ns", "uid": "uid-done" },
                  "status": { "phase": "Succeeded",
                    "containerStatuses": [status("main", Some("cri-o://d1"), "terminated")] } },
                { "metadata": { "name": "a", "namespace": "ns", "uid": "uid-a" },
                  "status": { "phase": "Failed",
                    "containerStatuses": [status("main", Some("docker://a1"), "running")] } },
                { "metadata": { "name": "pending", "namespace": "ns", "uid": "uid-p" },
                  "status": { "phase": "Pending" } },
            ]
        });
        let answer = parse_pod_list(list.to_string().as_bytes()).unwrap();
        let live: Vec<_> = answer.live.iter().map(|(_, name)| name.as_str()).collect();
        assert_eq!(
            live,
            ["b", "pending"],
            "Succeeded and Failed pods have ended"
        );
        let pods = answer.running;
        let c = |id: &str, name: &str| ContainerIdentity {
            id: id.into(),
            name: name.into(),
        };
        assert_eq!(
            pods,
            [
                PodIdentity {
                    uid: "uid-a".into(),
                    namespace: "ns".into(),
                    pod: "a".into(),
                    containers: vec![c("a1", "main")],
                },
                PodIdentity {
                    uid: "uid-b".into(),
                    namespace: "ns".into(),
                    pod: "b".into(),
                    containers: vec![c("c2", "main"), c("i1", "init")],
                },
            ]
        );
    }

    #[test]
    fn controllers_and_copied_labels_of_the_pods_not_ended() {
        let pod =
            |name: &str, phase: &str, owners: serde_json::Value, labels: serde_json::Value| {
                serde_json::json!({
                    "metadata": { "name": name, "namespace": "ns", "uid": name,
                        "labels": labels, "ownerReferences": owners,
                        "annotations": { "example.com/team": format!("team-{name}") } },
                    "status": { "phase": phase },
                })
            };
        let owner = |kind: &str, name: &str, controller: bool| {
            serde_json::json!({ "apiVersion": "apps/v1", "kind": kind, "name": name,
                "uid": "u", "controller": controller })
        };
        let list = serde_json::json!({ "kind": "PodList", "items": [
            pod("web-5d8f7c9b6-x2x9q", "Running",
                serde_json::json!([owner("ReplicaSet", "web-5d8f7c9b6", true)]),
                serde_json::json!({ "pod-template-hash": "5d8f7c9b6",
                    "kueue.x-k8s.io/queue-name": "team-a" })),
            // A ReplicaSet of its own: no hash label, named as it is.
            pod("rs-abc", "Running",
                serde_json::json!([owner("ReplicaSet", "rs", true)]), serde_json::json!({})),
            // The controller among several owners.
            pod("train-0", "Pending",
                serde_json::json!([owner("ConfigMap", "c", false),
                    owner("StatefulSet", "train", true)]), serde_json::json!(null)),
            pod("bare", "Running", serde_json::json!(null), serde_json::json!(null)),
            pod("done", "Succeeded",
                serde_json::json!([owner("Job", "done", true)]), serde_json::json!({})),
        ]});
        let copied = [
            (
                "kueue.x-k8s.io/queue-name".to_owned(),
                false,
                "label_q".to_owned(),
            ),
            (
                "example.com/team".to_owned(),
                true,
                "annotation_team".to_owned(),
            ),
        ];
        let answer = parse_pod_list_copying(list.to_string().as_bytes(), &copied).unwrap();
        let meta = |name: &str| {
            answer
                .meta
                .get(&("ns".to_owned(), name.to_owned()))
                .cloned()
        };
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            meta("web-5d8f7c9b6-x2x9q").unwrap(),
            PodMeta {
                controller: Some(pair("Deployment", "web")),
                labels: vec![
                    pair("label_q", "team-a"),
                    pair("annotation_team", "team-web-5d8f7c9b6-x2x9q")
                ],
            }
        );
        assert_eq!(
            meta("rs-abc").unwrap().controller,
            Some(pair("ReplicaSet", "rs"))
        );
        assert_eq!(
            meta("train-0").unwrap().controller,
            Some(pair("StatefulSet", "train"))
        );
        assert_eq!(meta("bare").unwrap().controller, None);
        assert_eq!(meta("done"), None, "an ended pod has let go");
        let plain = parse_pod_list(list.to_string().as_bytes()).unwrap();
        assert_eq!(
            plain.meta.len(),
            3,
            "without copied keys, only pods with a controller"
        );
    }

    #[test]
    fn copied_values_are_cut_at_a_character_boundary_and_marked() {
        let at_limit = "a".repeat(MAX_COPIED_VALUE_BYTES);
        assert_eq!(cut(&at_limit), at_limit);
        let over = "a".repeat(MAX_COPIED_VALUE_BYTES + 1);
        let c = cut(&over);
        assert_eq!(c.len(), MAX_COPIED_VALUE_BYTES);
        assert_eq!(c, format!("{}…", &over[..MAX_COPIED_VALUE_BYTES - 3]));
        // Two-byte characters: 1,021 bytes would split one, so the cut is one byte earlier.
        let wide = "é".repeat(MAX_COPIED_VALUE_BYTES);
        let c = cut(&wide);
        assert_eq!(c, format!("{}…", "é".repeat(510)));
        assert!(c.len() <= MAX_COPIED_VALUE_BYTES);
    }

    #[test]
    fn only_the_copied_keys_are_read_and_their_values_are_capped() {
        let huge = "x".repeat(300 * 1024);
        let list = serde_json::json!({ "kind": "PodList", "items": [
            { "metadata": { "name": "p", "namespace": "ns", "uid": "u",
                "labels": { "team": "vision", "other": "o", "pod-template-hash": "h" },
                "annotations": {
                    "example.com/note": huge,
                    "example.com/big-json": { "nested": [1, 2, { "deep": huge }] },
                    "example.com/owner": huge,
                } },
              "status": { "phase": "Running" } },
            { "metadata": { "name": "q", "namespace": "ns", "uid": "v",
                "labels": null, "annotations": {} },
              "status": { "phase": "Running" } },
        ]});
        let copied = [
            ("team".to_owned(), false, "label_team".to_owned()),
            (
                "example.com/owner".to_owned(),
                true,
                "annotation_example_com_owner".to_owned(),
            ),
        ];
        let answer = parse_pod_list_copying(list.to_string().as_bytes(), &copied).unwrap();
        let p = &answer.meta[&("ns".to_owned(), "p".to_owned())];
        assert_eq!(
            p.labels,
            [
                ("label_team".to_owned(), "vision".to_owned()),
                (
                    "annotation_example_com_owner".to_owned(),
                    format!("{}…", &huge[..MAX_COPIED_VALUE_BYTES - 3])
                ),
            ]
        );
        assert!(!answer.meta.contains_key(&("ns".to_owned(), "q".to_owned())));
        assert_eq!(answer.live.len(), 2);
        // A copied key whose value is not a string makes the answer unreadable, as before.
        let bad = serde_json::json!({ "kind": "PodList", "items": [
            { "metadata": { "name": "p", "uid": "u", "labels": { "team": 1 } } } ]});
        assert!(parse_pod_list_copying(bad.to_string().as_bytes(), &copied).is_err());
    }

    #[test]
    fn not_a_pod_list_is_an_error() {
        assert!(parse_pod_list(b"<html>").is_err());
        let e = parse_pod_list(br#"{"kind":"Status","status":"Failure"}"#).unwrap_err();
        assert!(e.to_string().contains("Status"), "{e}");
        assert_eq!(
            parse_pod_list(br#"{"kind":"PodList","items":null}"#).unwrap(),
            KubeletPods::default()
        );
    }
}

#!/usr/bin/env python3
"""Checks the rendered Kubernetes manifests the way a reviewer would; used by check-manifests.sh.

    scripts/check-manifests.py RENDERED.yaml WORKDIR

RENDERED.yaml is `kubectl kustomize deploy/kubernetes`. Writes into WORKDIR:
  builtin.yaml  the objects of built-in kinds, for `kubernetes-validate --strict`;
  rules.yaml    the PrometheusRule's spec as a plain rules file, for `promtool check rules`.

Checks here (what the schema validator cannot know):
  - the Prometheus operator's kinds (ServiceMonitor, PrometheusRule) structurally: apiVersion,
    required fields, the field names and enums of the CRD for the fields that matter;
  - that the objects fit together: selectors match labels, ports are named alike, the
    ServiceAccount exists, everything lives in one namespace;
  - what the issue asks of the DaemonSet: GPU nodes only, tolerations, the NVIDIA environment,
    probes, priority, rolling updates, the security context, the read-only pod-resources mount;
  - that the PrometheusRule carries exactly the rules of deploy/prometheus/alerts.yaml;
  - that the --config file is a TOML key of a rendered ConfigMap, mounted whole (not subPath).
Exits 1 with one line per problem.
"""

import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy/prometheus/alerts.yaml"
NAMESPACE = "nvml-exporter"
# Where the kubelet puts its pod-resources socket; the exporter's --pod-resources-socket default.
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
OPERATOR_API = "monitoring.coreos.com/v1"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}

# Field names from the prometheus-operator CRDs (monitoring.coreos.com/v1), for the parts of the
# objects this repository writes: a misspelt field is silently ignored by the API server when the
# CRD preserves unknown fields, and dropped with a warning otherwise; either way it does nothing.
SERVICE_MONITOR_SPEC = {
    "attachMetadata", "bodySizeLimit", "endpoints", "fallbackScrapeProtocol", "jobLabel",
    "keepDroppedTargets", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
    "namespaceSelector", "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor",
    "podTargetLabels", "sampleLimit", "scrapeClass", "scrapeClassicHistograms",
    "scrapeProtocols", "selector", "selectorMechanism", "serviceDiscoveryRole", "targetLabels",
    "targetLimit", "convertClassicHistogramsToNHCB",
}
ENDPOINT = {
    "authorization", "basicAuth", "bearerTokenFile", "bearerTokenSecret", "enableHttp2",
    "filterRunning", "followRedirects", "honorLabels", "honorTimestamps", "interval",
    "metricRelabelings", "noProxy", "oauth2", "params", "path", "port", "proxyConnectHeader",
    "proxyFromEnvironment", "proxyUrl", "relabelings", "scheme", "scrapeTimeout", "targetPort",
    "tlsConfig", "trackTimestampsStaleness",
}
RELABELING = {"action", "modulus", "regex", "replacement", "separator", "sourceLabels", "targetLabel"}
RELABEL_ACTIONS = {
    "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
    "uppercase", "keepequal", "dropequal",
}
RULE_GROUP = {"interval", "labels", "limit", "name", "partial_response_strategy", "query_offset", "rules"}
RULE = {"alert", "annotations", "expr", "for", "keep_firing_for", "labels", "record"}
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")

problems: list[str] = []


def check(ok: bool, message: str) -> bool:
    if not ok:
        problems.append(message)
    return ok


def unknown_keys(obj: dict, allowed: set, where: str) -> None:
    for key in sorted(set(obj) - allowed):
        problems.append(f"{where}: unknown field {key!r}")


def labels_match(selector: dict, labels: dict) -> bool:
    """matchLabels only: every selector the manifests use is one."""
    match = selector.get("matchLabels") or {}
    return bool(match) and not selector.get("matchExpressions") and all(
        labels.get(k) == v for k, v in match.items()
    )


def check_service_monitor(sm: dict, services: list[dict]) -> None:
    where = f"ServiceMonitor {sm['metadata']['name']}"
    spec = sm.get("spec") or {}
    unknown_keys(spec, SERVICE_MONITOR_SPEC, f"{where}.spec")
    check(isinstance(spec.get("selector"), dict), f"{where}: spec.selector is required")
    endpoints = spec.get("endpoints")
    if not check(isinstance(endpoints, list) and endpoints, f"{where}: spec.endpoints must be a non-empty list"):
        return
    selected = [s for s in services if labels_match(spec.get("selector") or {}, s["metadata"].get("labels") or {})]
    if not check(selected, f"{where}: spec.selector matches no Service"):
        return
    for i, ep in enumerate(endpoints):
        ew = f"{where}.spec.endpoints[{i}]"
        unknown_keys(ep, ENDPOINT, ew)
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                check(bool(DURATION.match(str(ep[key]))), f"{ew}.{key}: {ep[key]!r} is not a duration")
        port_names = {p.get("name") for s in selected for p in s["spec"].get("ports", [])}
        check(ep.get("port") in port_names, f"{ew}.port {ep.get('port')!r} is not a port name of the selected Service ({sorted(port_names)})")
        for j, r in enumerate(ep.get("relabelings", []) + ep.get("metricRelabelings", [])):
            rw = f"{ew} relabeling {j}"
            unknown_keys(r, RELABELING, rw)
            action = r.get("action", "replace").lower()
            check(action in RELABEL_ACTIONS, f"{rw}: unknown action {r.get('action')!r}")
            if action in ("replace", "hashmod", "lowercase", "uppercase"):
                check(bool(r.get("targetLabel")), f"{rw}: action {action} needs targetLabel")
            if "regex" in r:
                try:
                    re.compile(r["regex"])
                except re.error as e:
                    problems.append(f"{rw}: regex {r['regex']!r}: {e}")


def check_prometheus_rule(pr: dict, workdir: pathlib.Path) -> None:
    where = f"PrometheusRule {pr['metadata']['name']}"
    spec = pr.get("spec") or {}
    unknown_keys(spec, {"groups"}, f"{where}.spec")
    groups = spec.get("groups")
    if not check(isinstance(groups, list) and groups, f"{where}: spec.groups must be a non-empty list"):
        return
    names = [g.get("name") for g in groups]
    check(len(names) == len(set(names)), f"{where}: group names repeat: {names}")
    for g in groups:
        gw = f"{where} group {g.get('name')!r}"
        unknown_keys(g, RULE_GROUP, gw)
        check(bool(g.get("name")), f"{gw}: name is required")
        for i, rule in enumerate(g.get("rules") or []):
            rw = f"{gw} rule {i}"
            unknown_keys(rule, RULE, rw)
            check(("alert" in rule) != ("record" in rule), f"{rw}: exactly one of alert and record")
            check(bool(str(rule.get("expr", "")).strip()), f"{rw}: expr is required")
    expected = yaml.safe_load(ALERTS.read_text())
    check(spec == expected, f"{where}: its rules differ from {ALERTS.relative_to(ROOT)} (run scripts/gen-prometheusrule.py)")
    (workdir / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def check_daemonset(ds: dict, service_accounts: set, services: list[dict], config_maps: dict) -> None:
    where = f"DaemonSet {ds['metadata']['name']}"
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels") or {}
    check(labels_match(spec["selector"], pod_labels), f"{where}: spec.selector does not match the pod template's labels")
    strategy = spec.get("updateStrategy") or {}
    check(strategy.get("type") == "RollingUpdate" and "maxUnavailable" in (strategy.get("rollingUpdate") or {}),
          f"{where}: updateStrategy must be RollingUpdate with maxUnavailable")
    check(pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true",
          f"{where}: nodeSelector nvidia.com/gpu.present: \"true\" is missing")
    check(any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" for t in pod.get("tolerations", [])),
          f"{where}: no toleration for the nvidia.com/gpu taint")
    check(pod.get("priorityClassName") == "system-node-critical", f"{where}: priorityClassName is not system-node-critical")
    check(pod.get("serviceAccountName") in service_accounts, f"{where}: serviceAccountName {pod.get('serviceAccountName')!r} is not a rendered ServiceAccount")
    check(pod.get("automountServiceAccountToken") is False, f"{where}: automountServiceAccountToken must be false (no API access is needed)")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not pod.get(key), f"{where}: {key} must not be set")
    pod_sc = pod.get("securityContext") or {}

    containers = pod.get("containers") or []
    check(len(containers) == 1, f"{where}: expected one container")
    c = containers[0]
    cw = f"{where} container {c.get('name')}"
    args = c.get("args") or []
    check("--kubernetes" in args, f"{cw}: args must include --kubernetes")
    env = env_of(c)
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          f"{cw}: NODE_NAME must come from the downward API (spec.nodeName)")
    check(env.get("NVIDIA_VISIBLE_DEVICES", {}).get("value") == "all", f"{cw}: NVIDIA_VISIBLE_DEVICES must be all")
    check(env.get("NVIDIA_DRIVER_CAPABILITIES", {}).get("value") == "utility", f"{cw}: NVIDIA_DRIVER_CAPABILITIES must be utility")
    ports = {p.get("name"): p for p in c.get("ports", [])}
    check(ports.get("metrics", {}).get("containerPort") == 9400, f"{cw}: port metrics/9400 is missing")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        check(get.get("path") == path and get.get("port") == "metrics", f"{cw}: {probe} must GET {path} on port metrics")
    res = c.get("resources") or {}
    for kind in ("requests", "limits"):
        check("memory" in (res.get(kind) or {}), f"{cw}: resources.{kind}.memory is missing")
    check("cpu" in (res.get("requests") or {}), f"{cw}: resources.requests.cpu is missing")

    sc = c.get("securityContext") or {}
    caps = sc.get("capabilities") or {}
    check(caps.get("drop") == ["ALL"], f"{cw}: capabilities.drop must be [ALL]")
    check(not caps.get("add"), f"{cw}: no capability may be added")
    check(sc.get("readOnlyRootFilesystem") is True, f"{cw}: readOnlyRootFilesystem must be true")
    check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation must be false")
    check(not sc.get("privileged"), f"{cw}: must not be privileged")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    check(seccomp == "RuntimeDefault", f"{cw}: seccompProfile must be RuntimeDefault")

    # Every host path read-only but the directory of the health state file (the exporter's own,
    # at the same path on the node), and the pod-resources socket inside one of them.
    host_volumes = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    state_dirs = {str(pathlib.PurePosixPath(a.split("=", 1)[1]).parent)
                  for a in args if a.startswith("--health-state-file=")}
    for name in host_volumes:
        mount = mounts.get(name, {})
        state = host_volumes[name] in state_dirs and mount.get("mountPath") == host_volumes[name]
        check(state or mount.get("readOnly") is True,
              f"{cw}: hostPath volume {name} must be mounted readOnly (only the directory of --health-state-file may be written)")
    socket = POD_RESOURCES_SOCKET
    for i, a in enumerate(args):
        if a.startswith("--pod-resources-socket="):
            socket = a.split("=", 1)[1]
        elif a == "--pod-resources-socket" and i + 1 < len(args):
            socket = args[i + 1]
    socket = env.get("NVML_EXPORTER_POD_RESOURCES_SOCKET", {}).get("value", socket)
    socket_dir = str(pathlib.PurePosixPath(socket).parent)
    check(any(m["mountPath"] == socket_dir and m["name"] in host_volumes and host_volumes[m["name"]] == socket_dir
              for m in mounts.values()),
          f"{cw}: the host's {socket_dir} is not mounted at {socket_dir} (where --pod-resources-socket looks)")

    # The PCI bus the inventory group reads (--host-sys): the host's /sys, mounted read-only
    # where NVML_EXPORTER_HOST_SYS points.
    host_sys = env.get("NVML_EXPORTER_HOST_SYS", {}).get("value")
    check(host_sys is not None
          and any(m["mountPath"] == host_sys and host_volumes.get(m["name"]) == "/sys" for m in mounts.values()),
          f"{cw}: the host's /sys is not mounted where NVML_EXPORTER_HOST_SYS ({host_sys}) points")

    # The --config file comes from a rendered ConfigMap mounted whole (a subPath mount is never
    # updated, and the exporter applies the ConfigMap's edits only through updates).
    config = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if config is not None:
        config_dir = str(pathlib.PurePosixPath(config).parent)
        config_volumes = {v["name"]: v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
        mount = next((m for m in mounts.values() if m["mountPath"] == config_dir), None)
        check(mount is not None and mount["name"] in config_volumes and not mount.get("subPath"),
              f"{cw}: --config {config}: no ConfigMap volume mounted whole at {config_dir}")
        if mount is not None and mount["name"] in config_volumes:
            cm = config_maps.get(config_volumes[mount["name"]])
            key = pathlib.PurePosixPath(config).name
            check(cm is not None and key in (cm.get("data") or {}),
                  f"{cw}: --config {config}: ConfigMap {config_volumes[mount['name']]!r} with key {key} is not rendered")
            if cm is not None and key in (cm.get("data") or {}):
                try:
                    tomllib.loads(cm["data"][key])
                except tomllib.TOMLDecodeError as e:
                    check(False, f"ConfigMap {cm['metadata']['name']}: {key} is not TOML: {e}")

    for s in services:
        sw = f"Service {s['metadata']['name']}"
        check(s["spec"].get("selector") and all(pod_labels.get(k) == v for k, v in s["spec"]["selector"].items()),
              f"{sw}: spec.selector does not select the DaemonSet's pods")
        for p in s["spec"].get("ports", []):
            target = p.get("targetPort", p.get("port"))
            check(target in ports or target in {q.get("containerPort") for q in ports.values()},
                  f"{sw}: port {p.get('name')} targets {target!r}, which the container does not expose")


def main() -> int:
    rendered, workdir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    objects = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    builtin, by_kind = [], {}
    for obj in objects:
        kind, api = obj.get("kind"), obj.get("apiVersion")
        check(bool(kind and api and obj.get("metadata", {}).get("name")), f"an object without kind, apiVersion or name: {obj}")
        by_kind.setdefault(kind, []).append(obj)
        if kind in OPERATOR_KINDS:
            check(api == OPERATOR_API, f"{kind}: apiVersion {api!r}, expected {OPERATOR_API}")
        else:
            builtin.append(obj)
        if kind == "Namespace":
            check(obj["metadata"]["name"] == NAMESPACE, f"Namespace {obj['metadata']['name']}: expected {NAMESPACE}")
        else:
            check(obj["metadata"].get("namespace") == NAMESPACE, f"{kind} {obj['metadata'].get('name')}: not in namespace {NAMESPACE}")
    for kind in ("Namespace", "ServiceAccount", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule"):
        check(len(by_kind.get(kind, [])) == 1, f"expected one {kind}, rendered {len(by_kind.get(kind, []))}")
    if problems:
        print("\n".join(problems))
        return 1

    services = by_kind["Service"]
    config_maps = {cm["metadata"]["name"]: cm for cm in by_kind.get("ConfigMap", [])}
    check_daemonset(by_kind["DaemonSet"][0], {sa["metadata"]["name"] for sa in by_kind["ServiceAccount"]}, services,
                    config_maps)
    check_service_monitor(by_kind["ServiceMonitor"][0], services)
    check_prometheus_rule(by_kind["PrometheusRule"][0], workdir)
    (workdir / "builtin.yaml").write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{len(objects)} objects: {', '.join(sorted(by_kind))}; structure and cross-references OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

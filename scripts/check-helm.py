#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/nvml-exporter with Helm's own code; used by check-helm.sh.

    scripts/check-helm.py CHECK BINARY

helm-python-sdk binds Helm v4's Go SDK (render, lint, values-schema validation), so what is
rendered here is what `helm install` would apply. BINARY is the exporter (target/debug). CHECK:

  render        every values file ci/*-values.yaml: rendered, `helm lint --strict` clean (the
                icon suggestion aside), every built-in object valid for the newest Kubernetes
                kubernetes-validate knows (strict), the Prometheus operator's objects checked as
                scripts/check-manifests.py checks deploy/kubernetes's, the objects fit together
                (selectors, names, bindings, env references), and the exporter's check-config
                accepts the rendered config file with the container's arguments and environment;
  parity        the chart and the kustomize manifests agree object for object, labels,
                annotations and selectors aside: the default render and deploy/kubernetes/core,
                each overlay and its values file, deploy/kubernetes and the operator's objects
                turned on (the Namespace is kustomize's alone: Helm leaves it to --namespace);
  config-change changing an option in `config` or a collector changes only the ConfigMap, and an
                option the exporter applies only at start (its --help lists them) restarts the pods; the
                chart's list of those options is restartKeys, which gen-helm.py writes from --help;
  bad-values    each file of ci/bad/ is refused by the chart's schema, with the message its
                `# expect:` line names (the key).
Exits 1 with one line per problem.
"""

import copy
import glob
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy/helm/nvml-exporter"
RELEASE = NAMESPACE = "nvml-exporter"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Where the downward API's fields come from, for running check-config with the pod's environment.
FIELDS = {"spec.nodeName": "gpu-node-1", "status.hostIP": "10.0.0.1"}

# scripts/check-manifests.py's checks of the Prometheus operator's kinds and of the DaemonSet,
# reused rather than written twice.
_spec = importlib.util.spec_from_file_location("check_manifests", ROOT / "scripts/check-manifests.py")
manifests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manifests)

problems: list[str] = manifests.problems


def check(ok: bool, message: str) -> bool:
    return manifests.check(ok, message)


def load(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def render(chart: helm.Chart, values: dict) -> list[dict]:
    """The objects `helm install nvml-exporter -n nvml-exporter` would apply."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for name, text in sorted(out.items()) if not name.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def by_key(objects: list[dict]) -> dict:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def kustomize(directory: str) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / directory)], check=True,
                         capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


# ---------------------------------------------------------------------------------------------
# render


def fits_together(where: str, objects: list[dict]) -> None:
    """Selectors, references by name, bindings and env references of one render."""
    objs = by_key(objects)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    if not check(len(daemonsets) == 1, f"{where}: expected one DaemonSet"):
        return
    ds = daemonsets[0]
    pod = ds["spec"]["template"]["spec"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    check(manifests.labels_match(ds["spec"]["selector"], pod_labels), f"{where}: the DaemonSet's selector does not match its pods")
    services = [o for o in objects if o["kind"] == "Service"]
    for s in services:
        check(all(pod_labels.get(k) == v for k, v in s["spec"]["selector"].items()), f"{where}: Service {s['metadata']['name']} selects no pod")
    for sm in (o for o in objects if o["kind"] == "ServiceMonitor"):
        manifests.check_service_monitor(sm, services)
    for pr in (o for o in objects if o["kind"] == "PrometheusRule"):
        with tempfile.TemporaryDirectory() as work:
            manifests.check_prometheus_rule(pr, pathlib.Path(work))
    account = pod["serviceAccountName"]
    check(("ServiceAccount", account) in objs, f"{where}: ServiceAccount {account} is not rendered")
    for v in pod.get("volumes", []):
        if "configMap" in v:
            check(("ConfigMap", v["configMap"]["name"]) in objs, f"{where}: volume {v['name']}: ConfigMap {v['configMap']['name']} is not rendered")
    for b in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        check(("ClusterRole", b["roleRef"]["name"]) in objs, f"{where}: {b['metadata']['name']} binds a ClusterRole that is not rendered")
        check(b["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
              f"{where}: {b['metadata']['name']} does not bind the pods' ServiceAccount")
    c = pod["containers"][0]
    defined: set[str] = set()
    for e in c.get("env", []):
        for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
            check(ref in defined, f"{where}: env {e['name']} refers to $({ref}), which is not defined before it")
        check(e["name"] not in defined, f"{where}: env {e['name']} is set twice")
        defined.add(e["name"])
    # Whatever makes the exporter fetch the kubelet's /pods comes with the token, the kubelet's
    # address and the binding that lets it.
    config = tomllib.loads(objs[("ConfigMap", f"{ds['metadata']['name']}-config")]["data"]["config.toml"])
    env_on = {e["name"] for e in c.get("env", []) if e.get("value") == "true"}
    if ({"NVML_EXPORTER_PROCESSES", "NVML_EXPORTER_KUBELET_PODS"} & env_on
            or any(config.get(k) for k in ("processes", "kubelet_pods", "kubernetes_pod_labels", "kubernetes_pod_annotations"))):
        check(("ClusterRoleBinding", f"{ds['metadata']['name']}-kubelet-pods") in objs
              and pod.get("automountServiceAccountToken") is True and "NVML_EXPORTER_KUBELET_URL" in defined,
              f"{where}: the exporter fetches the kubelet's /pods without the token, URL and kubelet-pods binding")
    names = [v["name"] for v in pod.get("volumes", [])]
    check(len(names) == len(set(names)), f"{where}: volume names repeat: {names}")
    for m in c.get("volumeMounts", []):
        check(m["name"] in names, f"{where}: mount {m['name']} has no volume")


def self_signed(directory: pathlib.Path) -> None:
    """tls.crt, tls.key and ca.crt of a kubernetes.io/tls Secret, as cert-manager writes them."""
    directory.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=nvml-exporter", "-addext", "subjectAltName=DNS:nvml-exporter",
                    "-keyout", directory / "tls.key", "-out", directory / "tls.crt"], check=True, capture_output=True)
    (directory / "ca.crt").write_bytes((directory / "tls.crt").read_bytes())


def exporter_accepts(where: str, objects: list[dict], binary: str) -> None:
    """`nvml-exporter check-config` with the container's arguments and environment, the rendered
    config file and the web-config the chart makes, its Secret's certificate made here (a
    web-config from an existingSecret is the user's, and left out)."""
    objs = by_key(objects)
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    c = ds["spec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_EXPORTER_")}
    for e in c.get("env", []):
        value = e.get("value") or FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    with tempfile.TemporaryDirectory() as work:
        args = []
        for a in c["args"]:
            if a.startswith("--config="):
                cm = objs[("ConfigMap", f"{ds['metadata']['name']}-config")]
                path = pathlib.Path(work, "config.toml")
                path.write_text(cm["data"]["config.toml"])
                a = f"--config={path}"
            elif a.startswith("--hpc-job-mapping-dir="):
                a = f"--hpc-job-mapping-dir={work}"
            elif a.startswith("--web-config="):
                secret = objs.get(("Secret", f"{ds['metadata']['name']}-web-config"))
                if secret is None:
                    continue
                (text,) = secret["stringData"].values()
                path = pathlib.Path(work, "web-config.yml")
                path.write_text(text.replace("/etc/nvml-exporter-tls/", f"{work}/tls/"))
                self_signed(pathlib.Path(work, "tls"))
                a = f"--web-config={path}"
            args.append(a)
        run = subprocess.run([binary, *args, "check-config"], env=env, capture_output=True, text=True)
        check(run.returncode == 0, f"{where}: nvml-exporter {' '.join(args)} check-config: {(run.stdout + run.stderr).strip()}")


def check_render(binary: str) -> None:
    chart = helm.Chart.load(CHART)
    version = kubernetes_validate.utils.latest_version()
    files = sorted(glob.glob(str(CHART / "ci/*-values.yaml")))
    check(len(files) >= 8, f"ci/: expected the eight values files, found {len(files)}")
    for f in files:
        where = pathlib.Path(f).name
        values = load(pathlib.Path(f))
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        for m in report["messages"]:
            check(m["error"] == "icon is recommended", f"{where}: helm lint --strict: {m['path']}: {m['error'].strip()}")
        try:
            objects = render(chart, values)
        except helm.HelmError as e:
            problems.append(f"{where}: render: {e}")
            continue
        for o in objects:
            if o["kind"] in OPERATOR_KINDS:
                continue
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{where}: {o['kind']} {o['metadata']['name']}: Kubernetes {version}: {e.message} at {list(e.path)}")
        fits_together(where, objects)
        exporter_accepts(where, objects, binary)
        print(f"{where}: {len(objects)} objects ({', '.join(sorted({o['kind'] for o in objects}))})")
    # What deploy/kubernetes's own check asks of its DaemonSet, asked of the chart's defaults.
    objects = render(chart, {})
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    manifests.check_daemonset(kinds["DaemonSet"][0], {sa["metadata"]["name"] for sa in kinds["ServiceAccount"]},
                              kinds["Service"], {cm["metadata"]["name"]: cm for cm in kinds["ConfigMap"]})
    print(f"kubernetes-validate --strict against Kubernetes {version}")


# ---------------------------------------------------------------------------------------------
# parity


def normalise(obj: dict) -> dict:
    """An object without what the chart adds by convention: labels, annotations, selectors (the
    chart's select its release too); lists of named items sorted by name (their order carries no
    meaning, and $(VAR) references are checked in order by `render`); TOML parsed."""
    o = copy.deepcopy(obj)
    o["metadata"].pop("labels", None)
    o["metadata"].pop("annotations", None)
    spec = o.get("spec") or {}
    spec.pop("selector", None)
    if o["kind"] == "DaemonSet":
        template = spec["template"]
        template.pop("metadata", None)
        pod = template["spec"]
        pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
        for c in pod["containers"]:
            c["env"] = sorted(c.get("env", []), key=lambda e: e["name"])
            c["volumeMounts"] = sorted(c.get("volumeMounts", []), key=lambda m: m["name"])
    if o["kind"] == "ConfigMap":
        o["data"] = {k: tomllib.loads(v) if k.endswith(".toml") else v for k, v in o["data"].items()}
    return o


def differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a[k], b[k], f"{path}.{k}") if k in a and k in b
                          else [f"{path}.{k}: only in {'kustomize' if k in a else 'the chart'}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: kustomize {a!r}, the chart {b!r}"]


PARITY = [
    ("deploy/kubernetes/core", "ci/default-values.yaml"),
    ("deploy/kubernetes/processes", "ci/processes-values.yaml"),
    ("deploy/kubernetes/dra", "ci/dra-values.yaml"),
    ("deploy/kubernetes/health", "ci/health-values.yaml"),
    ("deploy/kubernetes", {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}),
]


def check_parity() -> None:
    chart = helm.Chart.load(CHART)
    for directory, values in PARITY:
        where = f"{directory} and the chart with {values}"
        if isinstance(values, str):
            values = load(CHART / values)
        before = len(problems)
        ours = {k: normalise(o) for k, o in by_key(render(chart, values)).items()}
        theirs = {k: normalise(o) for k, o in by_key(kustomize(directory)).items() if k[0] != "Namespace"}
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                problems.append(f"{where}: {key[0]} {key[1]} is rendered only by {'kustomize' if key in theirs else 'the chart'}")
                continue
            for d in differences(theirs[key], ours[key]):
                problems.append(f"{where}: {key[0]} {key[1]}{d}")
        if len(problems) == before:
            print(f"{directory}: {len(theirs)} objects agree")
    # The dashboards are dashboards/'s files, byte for byte.
    objects = render(chart, {"dashboards": {"enabled": True}})
    served = {k: v for o in objects if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]
              for k, v in o["data"].items()}
    shipped = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    check(served == shipped, f"dashboards: the ConfigMaps hold {sorted(served)}, dashboards/ has {sorted(shipped)}, or their contents differ")


# ---------------------------------------------------------------------------------------------
# config-change


def changed_objects(chart: helm.Chart, values: dict) -> list[tuple[str, str]]:
    before, after = by_key(render(chart, {})), by_key(render(chart, values))
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def check_config_change() -> None:
    chart = helm.Chart.load(CHART)
    config_map = [("ConfigMap", f"{RELEASE}-config")]
    for values in ({"config": {"log_format": "json", "idle_threshold": 0.2}},
                   {"config": {"log_format": "json", "dcgm_compat": "both"}},
                   {"collectors": {"nvlink-links": True}}):
        changed = changed_objects(chart, values)
        check(changed == config_map, f"{values}: changed {changed}, not only the ConfigMap (the exporter reloads it by itself)")
    for key, value in (("interval", "2s"), ("log_level", "debug")):
        changed = changed_objects(chart, {"config": {"log_format": "json", key: value}})
        check(changed == sorted(config_map + [("DaemonSet", RELEASE)]),
              f"config.{key}: changed {changed}; the exporter applies it only at start, so the pods must restart")
    # The list itself is generated from the binary's --help (scripts/gen-helm.py --check).
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    m = re.search(r'define "nvml-exporter.restartKeys" -}}\s*(.*?)\s*{{-', helpers, re.S)
    print(f"options needing a restart: {m.group(1) if m else '(none)'}")


# ---------------------------------------------------------------------------------------------
# bad-values


def check_bad_values() -> None:
    chart = helm.Chart.load(CHART)
    files = sorted((CHART / "ci/bad").glob("*.yaml"))
    check(bool(files), "ci/bad: no bad values files")
    for path in files:
        expect = re.search(r"^# expect: (.+)$", path.read_text(), re.M)
        if not check(expect is not None, f"ci/bad/{path.name}: no `# expect:` line"):
            continue
        try:
            render(chart, load(path))
            problems.append(f"ci/bad/{path.name}: rendered without an error")
        except helm.HelmValuesError as e:
            check(expect.group(1) in str(e), f"ci/bad/{path.name}: the error does not say {expect.group(1)!r}: {e}")
            print(f"ci/bad/{path.name}: {str(e).strip().splitlines()[-1].strip()}")


CHECKS = {"render": check_render, "parity": check_parity, "config-change": check_config_change,
          "bad-values": check_bad_values}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in CHECKS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(CHECKS)} [BINARY]")
    if sys.argv[1] == "render":
        check_render(sys.argv[2])
    else:
        CHECKS[sys.argv[1]]()
    if problems:
        print("\n".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

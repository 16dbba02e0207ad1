#!/usr/bin/env bash
# Live check of the busy-time counters: a real Prometheus scrapes the demo exporter every 7.5 s
# for 150 s on nvml-sim/scenarios/idle-waste.toml (GPU 0 busy 1.5 s in every 5, GPUs 1-3 idle,
# all four held by one pod of the fake kubelet), the exporter (ticking every 0.5 s) is restarted
# halfway, and rate() over 150 s must give the true mean within 2 %, and the pod its GPU-seconds
# (scripts/e2e/check_busy.py). That is the 15 s scrapes, rate()[5m] and 1 s ticks of a user's
# setup against a job busy 3 s in every 10, at half the time scale.
#
#   scripts/e2e-busy.sh [PATH/TO/nvml-exporter]
#
# Takes about 3 minutes, nearly all of it waiting: scripts/test.sh runs it next to its other
# steps. Without an argument the debug binary is taken from cargo's target directory (built if
# missing); it needs libnvml_sim.so next to it (--demo). Needs /usr/bin/prometheus (Debian
# package `prometheus`; installed when missing and run as root). Set PROMETHEUS to use another.
set -euo pipefail
bin=${1:+$(realpath "$1")}
cd "$(dirname "$0")/.."
source scripts/lib.sh
job=nvml-exporter-busy

need_prometheus
need_demo_binaries
make_work_dir

socket=$work/kubelet.sock
background "$work/kubelet.log" "$kubelet" "$socket" \
  ml/waste-0/train=GPU-7d1e0a00-5b3c-4e2a-9f10-3c5a7e9b1d00,GPU-7d1e0a01-5b3c-4e2a-9f10-3c5a7e9b1d01,GPU-7d1e0a02-5b3c-4e2a-9f10-3c5a7e9b1d02,GPU-7d1e0a03-5b3c-4e2a-9f10-3c5a7e9b1d03
wait_for_socket "$socket" "$work/kubelet.log"

exporter_port=$(free_port)
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 7500ms
  scrape_timeout: 5s
scrape_configs:
  - job_name: $job
    static_configs:
      - targets: ["127.0.0.1:$exporter_port"]
EOF
prometheus_port=$(free_port)
background "$work/prometheus.log" "$prometheus" --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/data" --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn

# One simulated clock for both runs of the exporter and the check (NVML_SIM_EPOCH), so the wave
# goes on across the restart as a GPU's load would, and the check knows where it is.
check_busy() {
  local epoch
  epoch=$(date +%s)
  python3 scripts/e2e/check_busy.py --prometheus "http://127.0.0.1:$prometheus_port" --job "$job" \
    --epoch "$epoch" -- \
    env -u NVML_SIM_TIME -u NVML_SIM_START NVML_SIM_SCENARIO=nvml-sim/scenarios/idle-waste.toml \
    NVML_SIM_EPOCH="$epoch" \
    "$bin" --demo --interval 500ms --listen "127.0.0.1:$exporter_port" --log-level warn \
    --collector.pipes --kubernetes --pod-resources-socket "$socket" && return 0
  echo "--- prometheus log"; tail -n 20 "$work/prometheus.log"
  echo "--- kubelet log"; tail -n 20 "$work/kubelet.log"
  return 1
}
step "busy-time counters: rate() over 150 s of 7.5 s scrapes, across a restart (check_busy.py)" check_busy

steps_verdict e2e-busy

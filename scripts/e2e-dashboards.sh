#!/usr/bin/env bash
# Checks the Grafana dashboards in dashboards/: first the static checks (structure, PromQL with
# promtool, metric names; scripts/check-dashboards.py static), then live: the demo exporter
# (8 simulated H100s) with --kubernetes against the fake kubelet (examples/fake-kubelet.rs), a real
# Prometheus scraping it every second for a minute, and every panel query of every dashboard, its
# variables resolved as Grafana does, must return data (scripts/check-dashboards.py live).
#
#   scripts/e2e-dashboards.sh [PATH/TO/nvml-exporter] [--check 'EXPORTER ARGS | FILE...']...
#
# Each --check adds an exporter with those extra arguments whose data FILE (a dashboard JSON or a
# query file, see check-dashboards.py) is checked against, like the lines of $checks below.
# Without an argument the debug binaries are taken from cargo's target directory (built if
# missing). Needs /usr/bin/prometheus and promtool (Debian package `prometheus`; installed when
# missing and run as root). Set PROMETHEUS / PROMTOOL to use other binaries.
set -euo pipefail
bin=
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --check) extra+=("$2"); shift 2 ;;
    *) bin=$(realpath "$1"); shift ;;
  esac
done
cd "$(dirname "$0")/.."

# What the live check runs: one line per exporter, "its extra arguments | the dashboards or query
# files checked against it". Every exporter is the demo with --kubernetes against the same fake
# kubelet ($socket is substituted), scraped by the same Prometheus under its own job and node.
# The one exporter serves both namings, so the same run checks dcgm-exporter's own dashboard
# (Grafana 12239, its queries in tests/fixtures/dcgm/) against --dcgm-compat.
checks=(
  "--dcgm-compat=both | dashboards/gpu-fleet.json dashboards/gpu-node.json dashboards/workloads.json tests/fixtures/dcgm/dashboard-12239.promql"
)
checks+=("${extra[@]}")

# The pods the fake kubelet assigns, by device name nvidiaN (the GPU of minor number N). GPU 7 is
# the scenario's allocated-but-idle GPU; GPU 4 is shared by two containers of two namespaces;
# GPUs 0, 5 and 6 are not assigned.
pods=(
  ml/trainer-0/train=nvidia2,nvidia3
  ml/notebook/jupyter=nvidia7
  ml/etl/worker=nvidia4
  inference/triton-0/server=nvidia1
  inference/embed/server=nvidia4
)
seconds=60
# What the stats of the first exporter's dashboards must say about that node: all 8 GPUs up; GPUs
# 1, 2, 3, 4 and 7 assigned (the pods make the node a Kubernetes one, so memory held elsewhere does
# not count); GPU 7 idle, as NvidiaGpuIdleWhileAllocated says; GPU 4 shared. Only with one exporter:
# a --check line adds GPUs.
expect=(
  "gpu-fleet.json:GPUs=8"
  "gpu-fleet.json:GPUs up=8"
  "gpu-fleet.json:GPUs lost=0"
  "gpu-fleet.json:GPUs allocated=5"
  "gpu-fleet.json:Allocated but idle now=1"
  "gpu-fleet.json:XID events over the range=1"
  "workloads.json:Pods holding GPUs=5"
  "workloads.json:GPUs held=5"
  "workloads.json:Shared GPUs=1"
  "workloads.json:Held GPUs idle now=1"
)

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

failed=0
step() { # name command...
  local name=$1; shift
  if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; failed=1; fi
}

# Static checks first: they take a second and a failure there makes the live run pointless.
step "dashboards are what scripts/gen-dashboards.py writes" python3 scripts/gen-dashboards.py --check
if ! python3 scripts/check-dashboards.py static --promtool "$promtool" dashboards/*.json; then
  failed=1
fi
if [ "$failed" != 0 ]; then
  echo "e2e-dashboards: FAIL (static checks)"
  exit 1
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
if [ ! -e "$(dirname "$bin")/libnvml_sim.so" ]; then
  echo "--demo needs libnvml_sim.so next to $bin (cargo build --workspace)" >&2
  exit 1
fi

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

socket=$work/kubelet.sock
"$kubelet" "$socket" "${pods[@]}" >"$work/kubelet.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done

# One exporter per line of $checks. The simulated clock starts at 10 s so GPU 6's XID 79 (t = 30 s)
# arrives 20 s into the run: well inside the minute the queries cover, and after its start, so the
# XID stat counts it as an event of the range.
scrape_configs=""
files=()
n=0
for line in "${checks[@]}"; do
  n=$((n + 1))
  args=${line%%|*}
  port=$(free_port)
  # shellcheck disable=SC2086 # the extra arguments are words
  env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=10 \
    "$bin" --demo --interval 1s --listen "127.0.0.1:$port" --log-level warn \
    --kubernetes --pod-resources-socket "$socket" ${args//\$socket/$socket} \
    >"$work/exporter-$n.log" 2>&1 &
  pids+=("$!")
  scrape_configs+="
  - job_name: nvml-exporter-$n
    static_configs:
      - targets: [\"127.0.0.1:$port\"]
        labels: {node: gpu-node-$n}"
  read -ra line_files <<<"${line#*|}"
  files+=("${line_files[@]}")
done

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:$scrape_configs
EOF
prometheus_port=$(free_port)
"$prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn \
  >"$work/prometheus.log" 2>&1 &
pids+=("$!")
url=http://127.0.0.1:$prometheus_port
expect_args=()
if [ "$n" = 1 ]; then
  for e in "${expect[@]}"; do expect_args+=(--expect "$e"); done
fi

if ! python3 scripts/check-dashboards.py live --prometheus "$url" --range "$seconds" \
  --wait-for "$n" "${expect_args[@]}" "${files[@]}"; then
  failed=1
  echo "--- prometheus log"; tail -n 20 "$work/prometheus.log"
  for log in "$work"/exporter-*.log "$work/kubelet.log"; do echo "--- $log"; tail -n 20 "$log"; done
fi

if [ "$failed" = 0 ]; then echo "e2e-dashboards: PASS"; else echo "e2e-dashboards: FAIL"; fi
exit "$failed"

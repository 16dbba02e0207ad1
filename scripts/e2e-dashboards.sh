#!/usr/bin/env bash
# Checks the Grafana dashboards in dashboards/: first the static checks (structure, PromQL with
# promtool, metric names; scripts/check-dashboards.py static), then live: the demo exporter
# (8 simulated H100s) with --kubernetes against the fake kubelet (examples/fake-kubelet.rs), a real
# Prometheus with the shipped rules (deploy/prometheus/alerts.yaml) scraping it every second for a
# minute, and every panel query of every dashboard, its
# variables resolved as Grafana does, must return data (scripts/check-dashboards.py live).
#
#   scripts/e2e-dashboards.sh [PATH/TO/nvml-exporter] [--check 'EXPORTER ARGS | FILE...']...
#
# Each --check adds an exporter with those extra arguments whose data FILE (a dashboard JSON or a
# query file, see check-dashboards.py) is checked against, like the lines of $checks below: leading
# NAME=VALUE words are its environment, $socket and $work are substituted, and a line that names
# its own --pod-resources-socket does not get the shared fake kubelet's.
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
source scripts/lib.sh

# What the live check runs: one line per exporter, "its extra arguments | the dashboards or query
# files checked against it". Every exporter is the demo with --kubernetes against the same fake
# kubelet ($socket is substituted), scraped by the same Prometheus under its own job and node.
# The first exporter serves both namings, so the same run checks dcgm-exporter's own dashboard
# (Grafana 12239 as released in 4.8.2, its queries and variables extracted into
# tests/fixtures/dcgm-exporter/4.8.2/dashboard.promql) against --dcgm-compat. The second runs the
# shared.toml scenario with --processes and a kubelet of its own ($shared_pods), so the Workloads
# panels' per-pod branch (nvidia_gpu_pod_*) is queried live next to the whole-GPU fallback, and
# the waste dashboard's memory held outside allocations (served with --processes) has series. The
# third is a MIG node: h100-mig.toml (GPU 0 in MIG mode, four instances; GPU 1 whole) serving both
# namings, with a kubelet of its own ($mig_pods) assigning MIG devices by MIG UUID, so every query
# meets a GPU's series next to its instances' (a join that ignores gpu_instance fails there). The
# fourth is an NVSwitch node: fabric.toml (GPU 2 never registers with the NVLink fabric, GPU 5's
# bandwidth is degraded; both failed at once with --fabric-registration-timeout 0s) on a PCI bus
# ($work/sys, made below) that lists a ninth GPU NVML does not enumerate, with a kubelet that
# assigns nothing, so the fabric and missing-GPU panels have data.
# All files are checked against everything Prometheus scrapes, so each is named once.
checks=(
  "--dcgm-compat=both | dashboards/gpu-fleet.json dashboards/gpu-node.json dashboards/workloads.json dashboards/waste.json tests/fixtures/dcgm-exporter/4.8.2/dashboard.promql"
  "NVML_SIM_SCENARIO=nvml-sim/scenarios/shared.toml --processes --host-proc \$work/proc --pod-resources-socket \$work/kubelet-shared.sock | dashboards/workloads.json"
  "NVML_SIM_SCENARIO=nvml-sim/scenarios/h100-mig.toml --dcgm-compat=both --pod-resources-socket \$work/kubelet-mig.sock |"
  "NVML_SIM_SCENARIO=nvml-sim/scenarios/fabric.toml --host-sys \$work/sys --fabric-registration-timeout 0s --pod-resources-socket \$work/kubelet-fabric.sock |"
)
builtin_checks=${#checks[@]}
checks+=("${extra[@]}")

# The pods the fake kubelet assigns, by device name nvidiaN (the GPU of minor number N). GPU 7 is
# the scenario's allocated-but-idle GPU; GPU 4 is shared by two containers of two namespaces;
# trainer-0 trains on GPUs 2 and 3 and holds the idle GPU 0 too (partially idle: the waste
# dashboard's table of such pods); GPUs 5 and 6 are not assigned.
pods=(
  ml/trainer-0/train=nvidia2,nvidia3,nvidia0
  ml/notebook/jupyter=nvidia7
  ml/etl/worker=nvidia4
  inference/triton-0/server=nvidia1
  inference/embed/server=nvidia4
)
# shared.toml's two GPUs, by UUID: GPU 0 time-sliced between two pods, GPU 1 one pod's. The
# exporter has no /pods list here (examples/fake-kubelet serves pod-resources only), so GPU 0's
# processes are nobody's (whole-GPU fallback) and GPU 1's are its only container's (per-pod
# series); tests/processes.rs tells the pods of a shared GPU apart with /pods.
shared_pods=(
  ml/train-a/main=GPU-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c01
  ml/infer-b/server=GPU-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c01
  ml/solo-c/trainer=GPU-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c02
)
# h100-mig.toml's devices, by MIG UUID (GPU 0's instances, nvml-sim/README.md) or GPU UUID
# (GPU 1, MIG off): GI 2 (3g.40gb, busy training), GI 9 (1g.10gb, allocated but idle) and GI 10
# (1g.10gb, bursty, never under 5 %) to three pods, GPU 1 whole to a fourth. GI 3 is left
# unassigned: the scenario destroys it at t = 60 s, inside the run.
mig_pods=(
  ml/mig-train/trainer=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b01
  ml/mig-notebook/jupyter=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b03
  inference/mig-burst/server=MIG-2b5f3e61-7a0c-5d4e-9f1b-6c8a2e4d0b04
  inference/mig-whole/server=GPU-4f6a8c0e-2d4b-4e6a-8c0e-2a4c6e8a0c22
)
seconds=60
# What the stats must say about the three nodes. GPUs: the demo's 8, shared.toml's 2 and
# h100-mig.toml's 2 (a GPU in MIG mode counts once, not once per instance), all up. Allocation is
# counted per assignable device, a whole GPU or a MIG instance: the demo's GPUs 0, 1, 2, 3, 4 and 7
# (the pods make the node a Kubernetes one, so memory held elsewhere does not count), both of
# shared.toml's, and on the MIG node GI 2, GI 9, GI 10 and GPU 1: 12. GPU 0 of the MIG node is
# never allocated itself (its instances are), though its memory is in use. Idle: the demo's GPUs 0
# and 7 and the MIG node's GI 9, as NvidiaGpuIdleWhileAllocated says; active, the other 9. Shared:
# the demo's GPU 4 and shared.toml's GPU 0; the MIG GPU whose three instances three pods hold is
# not shared. Pods: 5 + 3 + 4. Health: the demo's GPU 6 failed (XID 79, 20 s into the run) and
# GPU 5 degraded (thermal slowdown), every other GPU healthy. The waste dashboard's funnel reads
# the same from the rules; its saturated step is not pinned: GI 10's SM activity steps between
# 0.1 and the threshold 0.5.
# The NVSwitch node adds its 8 GPUs, all up; GPUs 2 and 5 failed by their fabric reasons; its
# bus's ninth GPU missing; no pod assigned there, so the GPUs holding memory are allocated (all
# but the idle GPU 2, busy: none idle).
# Only without --check lines, which add GPUs.
expect=(
  "gpu-fleet.json:GPUs=20"
  "gpu-fleet.json:GPUs up=20"
  "gpu-fleet.json:GPUs lost=0"
  "gpu-fleet.json:GPUs missing=1"
  "gpu-fleet.json:GPUs failed=3"
  "gpu-fleet.json:GPUs degraded=1"
  "gpu-fleet.json:GPUs allocated=19"
  "gpu-fleet.json:Allocated but idle now=3"
  "gpu-fleet.json:XID events over the range=1"
  "workloads.json:Pods holding GPUs=12"
  "workloads.json:GPUs held=12"
  "workloads.json:Shared GPUs=2"
  "workloads.json:Held GPUs idle now=3"
  "waste.json:GPUs present=20"
  "waste.json:GPUs allocated=19"
  "waste.json:GPUs active=16"
)

need_prometheus

# Static checks first: they take a second and a failure there makes the live run pointless.
step "dashboards are what scripts/gen-dashboards.py writes" python3 scripts/gen-dashboards.py --check
step "dashboards: structure, PromQL and metric names (check-dashboards.py static)" \
  python3 scripts/check-dashboards.py static --promtool "$promtool" dashboards/*.json
if [ ${#steps_failed[@]} != 0 ]; then
  echo "e2e-dashboards: FAIL (static checks)"
  exit 1
fi

need_demo_binaries
make_work_dir

socket=$work/kubelet.sock
background "$work/kubelet.log" "$kubelet" "$socket" "${pods[@]}"
mkdir "$work/proc" # the shared exporter's --host-proc: no host processes to name
# The NVSwitch node's PCI bus, laid out as sysfs lays it out: fabric.toml's eight H100s and a
# ninth at ca:00.0, each bound to the nvidia driver.
mkdir -p "$work/sys/bus/pci/devices" "$work/sys/bus/pci/drivers/nvidia"
for address in 0000:1b:00.0 0000:43:00.0 0000:52:00.0 0000:61:00.0 0000:9d:00.0 0000:c3:00.0 \
    0000:d1:00.0 0000:df:00.0 0000:ca:00.0; do
  device=$work/sys/devices/pci0000:00/$address
  mkdir -p "$device"
  echo 0x10de >"$device/vendor"; echo 0x2330 >"$device/device"; echo 0x030200 >"$device/class"
  ln -s ../../../bus/pci/drivers/nvidia "$device/driver"
  ln -s "../../../devices/pci0000:00/$address" "$work/sys/bus/pci/devices/$address"
done
background "$work/kubelet-shared.log" "$kubelet" "$work/kubelet-shared.sock" "${shared_pods[@]}"
background "$work/kubelet-mig.log" "$kubelet" "$work/kubelet-mig.sock" "${mig_pods[@]}"
background "$work/kubelet-fabric.log" "$kubelet" "$work/kubelet-fabric.sock"
for name in kubelet kubelet-shared kubelet-mig kubelet-fabric; do
  wait_for_socket "$work/$name.sock" "$work/$name.log"
done

# One exporter per line of $checks. The simulated clock starts at 10 s so GPU 6's XID 79 (t = 30 s)
# arrives 20 s into the run: well inside the minute the queries cover, and after its start, so the
# XID stat counts it as an event of the range.
scrape_configs=""
files=()
n=0
for line in "${checks[@]}"; do
  n=$((n + 1))
  args=${line%%|*}
  args=${args//\$socket/$socket}
  read -ra words <<<"${args//\$work/$work}"
  line_env=()
  while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} =~ ^[A-Z_]+= ]]; do
    line_env+=("${words[0]}")
    words=("${words[@]:1}")
  done
  kubelet_args=(--pod-resources-socket "$socket")
  if [[ " ${words[*]} " == *" --pod-resources-socket "* ]]; then kubelet_args=(); fi
  port=$(free_port)
  background "$work/exporter-$n.log" \
    env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=10 "${line_env[@]}" \
    "$bin" --demo --interval 1s --listen "127.0.0.1:$port" --log-level warn \
    --kubernetes "${kubelet_args[@]}" "${words[@]}"
  scrape_configs+="
  - job_name: nvml-exporter-$n
    static_configs:
      - targets: [\"127.0.0.1:$port\"]
        labels: {node: gpu-node-$n}"
  read -ra line_files <<<"${line#*|}"
  for f in "${line_files[@]}"; do
    [[ " ${files[*]} " == *" $f "* ]] || files+=("$f")
  done
done

# The shipped rules are loaded: the dashboards read the series they record.
rules_at_global_interval "$work/alerts.yaml"
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $work/alerts.yaml
scrape_configs:$scrape_configs
EOF
prometheus_port=$(free_port)
background "$work/prometheus.log" "$prometheus" --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/data" --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn
url=http://127.0.0.1:$prometheus_port
expect_args=()
if [ "$n" = "$builtin_checks" ]; then
  for e in "${expect[@]}"; do expect_args+=(--expect "$e"); done
fi

check_live() {
  python3 scripts/check-dashboards.py live --prometheus "$url" --range "$seconds" \
    --wait-for "$n" "${expect_args[@]}" "${files[@]}" && return 0
  echo "--- prometheus log"; tail -n 20 "$work/prometheus.log"
  for log in "$work"/exporter-*.log "$work"/kubelet*.log; do echo "--- $log"; tail -n 20 "$log"; done
  return 1
}
step "every panel query returns data from a live Prometheus (check-dashboards.py live)" check_live

steps_verdict e2e-dashboards

#!/usr/bin/env bash
# Live check of alert delivery: the shipped rules (deploy/prometheus/alerts.yaml) evaluated by a
# real Prometheus and, unchanged, by VictoriaMetrics (vmagent scraping into the single-node server,
# vmalert evaluating), both sending to one real Alertmanager that runs the shipped configuration
# (deploy/alertmanager/alertmanager.yml) with its receivers pointed at a webhook of the checker.
#
#   scripts/e2e-alerting.sh [PATH/TO/nvml-exporter]
#
# Two demo nodes (the default scenario: 8 simulated H100s, clock from 25 s so GPU 6's XID 79 comes
# during the run): gpu-node-1 with --kubernetes, pods from the fake kubelet (examples/fake-kubelet.rs)
# and the team label copied from them; gpu-node-2 without Kubernetes. scripts/e2e/check_alerting.py
# then checks that each expected alert reaches the expected receiver from both engines, grouped as
# configured, with its labels and annotations; that the inhibited ones (a failed GPU's XID) never
# do; that both engines raise the same alerts; and that every dashboard query answers from
# VictoriaMetrics with the series it gets from Prometheus. Last, gpu-node-2's exporter is
# stopped: NvmlExporterDown must arrive, and silence an alert about its GPUs that still fires.
#
# The copies the engines and Alertmanager run differ from the shipped files only in their waits:
# rule groups at the global 1 s interval and no `for:` (the check is about which alerts fire and
# where they go, not their durations), Alertmanager's group_wait and group_interval 1 s.
# Without an argument the debug binaries are taken from cargo's target directory (built if
# missing). Needs Debian's prometheus, prometheus-alertmanager and victoria-metrics (installed
# when missing and run as root) and PyYAML.
set -euo pipefail
bin=${1:+$(realpath "$1")}
cd "$(dirname "$0")/.."
source scripts/lib.sh

need_prometheus
need_alertmanager
need_victoria_metrics
need_python yaml pyyaml
need_demo_binaries
make_work_dir

# The pods of gpu-node-1, by device name nvidiaN (the GPU of minor number N) and with their
# labels. GPU 0 is idle and GPUs 2-3 train: trainer-0 is partially idle; GPU 7 is idle, held by a
# pod of a namespace no route names; GPU 1 is busy but unsaturated; GPU 6 fails with its XID 79.
mkdir "$work/pods-api"
background "$work/kubelet.log" "$kubelet" "$work/kubelet.sock" --pods-api "$work/pods-api" \
  "ml/trainer-0/train=nvidia2,nvidia3,nvidia0;team=research" \
  "scratch/notebook/jupyter=nvidia7" \
  "inference/triton-0/server=nvidia1" \
  "batch/sweep/worker=nvidia6;team=research"
wait_for_socket "$work/kubelet.sock" "$work/kubelet.log"

node1_port=$(free_port)
node2_port=$(free_port)
background "$work/exporter-1.log" env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=25 \
  "$bin" --demo --interval 1s --listen "127.0.0.1:$node1_port" --log-level warn \
  --kubernetes --pod-resources-socket "$work/kubelet.sock" \
  --kubelet-url "$(cat "$work/pods-api/url")" --kubelet-ca-file "$work/pods-api/ca.pem" \
  --kubelet-token-file "$work/pods-api/token" --kubernetes-pod-labels team
background "$work/exporter-2.log" env -u NVML_SIM_SCENARIO -u NVML_SIM_TIME NVML_SIM_START=25 \
  "$bin" --demo --interval 1s --listen "127.0.0.1:$node2_port" --log-level warn
node2_pid=$!

# The shipped rules without their waits, for both engines.
rules_at_global_interval "$work/alerts.yaml"
sed -i '/^        for: /d' "$work/alerts.yaml"

am_port=$(free_port)
webhook_port=$(free_port)
python3 - deploy/alertmanager/alertmanager.yml "$work/alertmanager.yml" "$webhook_port" <<'PY'
import sys, yaml
source, out, port = sys.argv[1:]
config = yaml.safe_load(open(source))
def quick(route):
    for key in ("group_wait", "group_interval"):
        if key in route:
            route[key] = "1s"
    for child in route.get("routes", []):
        quick(child)
quick(config["route"])
for receiver in config["receivers"]:
    for hook in receiver.get("webhook_configs", []):
        hook["url"] = f"http://127.0.0.1:{port}/{receiver['name']}"
yaml.safe_dump(config, open(out, "w"), sort_keys=False)
PY
background "$work/alertmanager.log" "$alertmanager" --config.file="$work/alertmanager.yml" \
  --storage.path="$work/alertmanager" --web.listen-address="127.0.0.1:$am_port" \
  --cluster.listen-address= --log.level=warn

# The same scrape jobs for Prometheus and vmagent (which takes scrape settings only).
scrape_configs="
scrape_configs:
  - job_name: nvml-exporter
    static_configs:
      - targets: [\"127.0.0.1:$node1_port\"]
        labels: {node: gpu-node-1}
      - targets: [\"127.0.0.1:$node2_port\"]
        labels: {node: gpu-node-2}"
cat >"$work/vmagent.yml" <<EOF
global:
  scrape_interval: 1s
$scrape_configs
EOF
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
  external_labels: {engine: prometheus}
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:$am_port"]
$scrape_configs
EOF
prometheus_port=$(free_port)
background "$work/prometheus.log" "$prometheus" --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/prometheus" --web.listen-address="127.0.0.1:$prometheus_port" \
  --log.level=warn
prometheus_pid=$!

# VictoriaMetrics answers queries up to now, not 30 s behind (-search.latencyOffset), and caches
# nothing, so that it is compared with Prometheus on the same data.
vm_port=$(free_port)
vmagent_port=$(free_port)
vmalert_port=$(free_port)
background "$work/victoria-metrics.log" "$victoria_metrics" -storageDataPath="$work/vm" \
  -retentionPeriod=1d -httpListenAddr="127.0.0.1:$vm_port" -search.latencyOffset=0s \
  -search.disableCache -loggerLevel=WARN
background "$work/vmagent.log" "$vmagent" -promscrape.config="$work/vmagent.yml" \
  -remoteWrite.url="http://127.0.0.1:$vm_port/api/v1/write" -remoteWrite.flushInterval=1s \
  -remoteWrite.tmpDataPath="$work/vmagent" -httpListenAddr="127.0.0.1:$vmagent_port" \
  -loggerLevel=WARN
# The rules start once both engines have scraped both nodes: without their `for:`, the alerts
# that an empty database raises (NvmlExporterDown's absent target) would fire at start.
scraped() { # url
  python3 - "$1" <<'PY'
import json, sys, time, urllib.parse, urllib.request
url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": "count(up == 1) == 2"})
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if json.load(r)["data"]["result"]:
                sys.exit(0)
    except OSError:
        pass  # not up yet
    time.sleep(0.5)
sys.exit(f"{sys.argv[1]} has not scraped both nodes after 60 s")
PY
}
scraped "http://127.0.0.1:$prometheus_port"
scraped "http://127.0.0.1:$vm_port"
printf 'rule_files:\n  - %s\n' "$work/alerts.yaml" >>"$work/prometheus.yml"
kill -HUP "$prometheus_pid"
background "$work/vmalert.log" "$vmalert" -rule="$work/alerts.yaml" \
  -datasource.url="http://127.0.0.1:$vm_port" -remoteWrite.url="http://127.0.0.1:$vm_port" \
  -notifier.url="http://127.0.0.1:$am_port" -evaluationInterval=1s \
  -external.label=engine=victoriametrics -httpListenAddr="127.0.0.1:$vmalert_port" \
  -loggerLevel=WARN

check_alerting() {
  python3 scripts/e2e/check_alerting.py --prometheus "http://127.0.0.1:$prometheus_port" \
    --victoria-metrics "http://127.0.0.1:$vm_port" --vmalert "http://127.0.0.1:$vmalert_port" \
    --alertmanager "http://127.0.0.1:$am_port" --webhook-port "$webhook_port" \
    --stop-pid "$node2_pid" --stop-node gpu-node-2 && return 0
  for log in "$work"/*.log; do echo "--- $log"; tail -n 20 "$log"; done
  return 1
}
step "alerts reach their receivers through Alertmanager from Prometheus and VictoriaMetrics (check_alerting.py)" \
  check_alerting

steps_verdict e2e-alerting

#!/usr/bin/env bash
# The whole test suite, on a fresh machine:
#   1. Rust unit and integration tests (the real binary against the simulated driver, golden file;
#      tests/lint.rs: promtool's lint of every collector group alone, all but one and all, on
#      every scenario);
#   2. promtool's lint of the exporter's --once for every shipped scenario;
#   3. third-party NVML clients (gpustat, pynvml, nvitop --once, its TUI, nvitop-exporter) against
#      the simulator;
#   4. every NVML symbol the simulator exports is one the real driver library exports;
#   5. the alert rules: promtool's unit tests, and a real Prometheus scraping the demo exporter;
#   6. the Kubernetes manifests: rendered with kubectl kustomize and validated; the Helm chart
#      rendered and linted by Helm's SDK, validated, and equal to the kustomize manifests;
#   7. the Grafana dashboards: structure, PromQL and metric names, then every panel query against a
#      live Prometheus scraping the demo with pods from the fake kubelet;
#   8. the node page in Debian's headless chromium against the demo and a MIG node
#      (scripts/check-page.py): values, marks, refresh in place, no request beyond 127.0.0.1, no
#      console error, a screenshot under target/node-page/;
#   9. the busy-time counters and GPU-seconds per workload: rate() over 150 s of 7.5 s scrapes
#      (a user's 5 minutes of 15 s scrapes at half the time scale) against a known square wave,
#      across an exporter restart (scripts/e2e-busy.sh);
#  10. alert delivery: the shipped rules in Prometheus and in vmalert on VictoriaMetrics, through
#      a real Alertmanager with the shipped routing to a webhook (scripts/e2e-alerting.sh);
#  11. the container image, built by scripts/build-image.sh from the debug binaries above and
#      run by podman as the DaemonSet runs it (scripts/check-image.sh).
# Steps 3, 5, 7, 8, 9, 10 and 11 mostly wait: they run in the background (lib.sh's
# background_step), 9 from the start, the others once the tests are done, and are reported at the
# end. Last comes the time each install, build and step took, and the total (lib.sh's steps_times).
# Installs what is missing (Debian's prometheus for promtool, prometheus-alertmanager,
# victoria-metrics, tmux and chromium, podman, buildah, mmdebstrap and runc, gpustat,
# nvidia-ml-py, nvitop, nvitop-exporter and websocket-client from PyPI, cargo-cyclonedx from
# crates.io, the real driver library from Debian non-free, unpacked under target/) when run as
# root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
root=$(pwd)

# The real NVML library (Debian non-free libnvidia-ml1), fetched with an apt configuration of its
# own so the machine's sources stay untouched. Without a GPU it answers "driver not loaded".
real_dir=$root/target/real-nvml
need_real_nvml() {
  real_lib=$(find "$real_dir" -name 'libnvidia-ml.so.1' 2>/dev/null | head -n1 || true)
  if [ -z "$real_lib" ]; then
    mkdir -p "$real_dir/lists/partial" "$real_dir/archives"
    echo "deb http://deb.debian.org/debian bookworm non-free" > "$real_dir/sources.list"
    local apt_opts=(-o "Dir::Etc::SourceList=$real_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$real_dir/lists" -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" update -qq
    (cd "$real_dir/archives" && apt-get "${apt_opts[@]}" download libnvidia-ml1 >/dev/null)
    dpkg -x "$real_dir"/archives/libnvidia-ml1_*.deb "$real_dir/root"
    real_lib=$(find "$real_dir/root" -name 'libnvidia-ml.so.1' | head -n1)
  fi
}

need_tools() {
  need_promtool
  need_python "gpustat, pynvml, nvitop, nvitop_exporter" gpustat nvidia-ml-py nvitop nvitop-exporter
  command -v tmux >/dev/null || apt_install tmux "tmux (for nvitop's TUI)"
  need_real_nvml
}
timed "tools: promtool, NVML's Python clients, tmux, the real driver library" need_tools
export NVML_EXPORTER_TEST_REAL_NVML=$real_lib

# The binary and the simulator, where cargo puts them (CARGO_TARGET_DIR or target/).
timed "cargo build (the exporter, nvml-sim, examples)" cargo build --workspace --lib --bins --examples --locked
target_dir=$(cargo_target_dir)
bin=$target_dir/debug/nvml-exporter
sim=$target_dir/debug/libnvml_sim.so

# The busy-time check needs three minutes of scrapes and almost no CPU: it starts now,
# with the binaries built above (the fake kubelet given, so that it calls no cargo while the tests
# build), runs next to the steps below and is waited for after them.
export kubelet=$target_dir/debug/examples/fake-kubelet
background_step "busy-time counters and GPU-seconds per workload against a live Prometheus (e2e-busy.sh)" \
  scripts/e2e-busy.sh "$bin"

# cargo-nextest (on every machine of this project's kind) runs the tests of every binary side by
# side, as .config/nextest.toml says; cargo test, one binary after another, where it is missing.
# No crate has doc tests.
if cargo nextest --version >/dev/null 2>&1; then
  tests=(cargo nextest run --workspace --locked)
else
  tests=(cargo test --workspace --locked)
fi
timed "${tests[*]:0:3} --no-run (the test binaries)" "${tests[@]}" --no-run

step "${tests[*]:0:3}" "${tests[@]}"

# The live checks mostly wait for scrapes and rule evaluations, and the third-party NVML clients
# for nvitop's redraws and nvitop-exporter's collections: they run next to each other and to the
# quick steps below, once the tests no longer take the CPUs. What they need is installed first,
# one install at a time.
need_live_tools() {
  command -v chromium >/dev/null || apt_install chromium "chromium (for the node page check)"
  need_python websocket websocket-client
  need_alertmanager
  need_victoria_metrics
  need_image_tools
}
timed "tools of the live checks: chromium, websocket-client, Alertmanager, VictoriaMetrics, podman" need_live_tools
background_step "alert rules: promtool unit tests and a live Prometheus against the demo and MIG nodes" scripts/e2e-prometheus.sh "$bin"
background_step "Grafana dashboards: static checks and every panel query against a live Prometheus" scripts/e2e-dashboards.sh "$bin"
background_step "node page in headless chromium: demo and MIG, values, marks, refresh, requests (check-page.py)" \
  python3 scripts/check-page.py "$bin" --screenshots "$target_dir/node-page"
background_step "alert delivery: Prometheus and VictoriaMetrics through Alertmanager's shipped routing (e2e-alerting.sh)" \
  scripts/e2e-alerting.sh "$bin"
background_step "container image: built without Docker, run by podman read-only, without capabilities, as the DaemonSet (check-image.sh)" \
  scripts/check-image.sh "$target_dir/debug"
background_step "gpustat, pynvml, nvitop and nvitop-exporter against nvml-sim, values as ours" \
  python3 nvml-sim/ci/check-gpustat.py "$sim" "$bin"

lint_scenarios() {
  local ok=0 scenario out
  for scenario in nvml-sim/scenarios/*.toml; do
    out=$(NVML_SIM_SCENARIO=$scenario NVML_SIM_TIME=60 "$bin" --once --nvml-lib "$sim" --log-level error) || { echo "$scenario: --once failed"; ok=1; continue; }
    if ! lint=$(printf '%s\n' "$out" | "$promtool" check metrics 2>&1) || [ -n "$lint" ]; then
      echo "$scenario: promtool check metrics:"; echo "$lint"; ok=1
    fi
  done
  return $ok
}
step "promtool check metrics (every scenario)" lint_scenarios

# --dcgm-compat=both: the native part must lint clean as above; dcgm-exporter's names break the
# naming conventions in exactly three ways we must not "fix" (dashboards and alerts query these
# names and labels): counters without _total, the camelCase label modelName, and the word
# "counter" in DCGM_FI_DEV_PCIE_REPLAY_COUNTER. Any other warning fails.
DCGM_INHERENT='^DCGM_FI_[A-Z0-9_]+ (counter metrics should have "_total" suffix|label names should be written in .snake_case. not .camelCase.)$|^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type .counter.$'
lint_dcgm_scenarios() {
  local ok=0 scenario out lint
  for scenario in nvml-sim/scenarios/*.toml; do
    out=$(NVML_SIM_SCENARIO=$scenario NVML_SIM_TIME=60 "$bin" --once --nvml-lib "$sim" --log-level error --dcgm-compat=both) || { echo "$scenario: --once --dcgm-compat failed"; ok=1; continue; }
    grep -q '^DCGM_FI_DEV_GPU_TEMP{' <<<"$out" || { echo "$scenario: no DCGM series"; ok=1; }
    lint=$(printf '%s\n' "$out" | "$promtool" check metrics 2>&1 | grep -vE "$DCGM_INHERENT")
    if [ -n "$lint" ]; then
      echo "$scenario: promtool check metrics (--dcgm-compat=both), beyond the inherent warnings:"; echo "$lint"; ok=1
    fi
  done
  return $ok
}
step "promtool check metrics --dcgm-compat=both (only the inherent DCGM naming warnings)" lint_dcgm_scenarios
step "nvml-sim exports only real NVML symbols" nvml-sim/ci/check-symbols.sh "$real_lib" "$sim"
step "Kubernetes manifests, PrometheusRule and Dockerfile (render, validate, lint)" scripts/check-manifests.sh
step "Helm chart (render, lint --strict, validate, parity with deploy/kubernetes, bad values)" scripts/check-helm.sh "$bin"
wait_background_steps
steps_times

echo "checks: $steps_passed passed, ${#steps_failed[@]} failed"
[ ${#steps_failed[@]} = 0 ]

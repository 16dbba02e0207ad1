# shellcheck shell=bash
# What the check scripts share; sourced from the repository root (`source scripts/lib.sh`) by
# scripts/test.sh, scripts/e2e-prometheus.sh, scripts/e2e-dashboards.sh, scripts/e2e-alerting.sh,
# scripts/check-manifests.sh, scripts/check-helm.sh, scripts/build-image.sh,
# scripts/check-image.sh and bench/run.sh. It installs the tools a check needs when they are
# missing (as root), finds cargo's target directory and the binaries a live check runs, picks
# free ports, ends background processes and removes the work directory on exit, and runs named
# steps, counting and timing them.
#
# Sourcing it sets an EXIT trap (and makes INT and TERM exit 130): a script that sources it
# leaves cleanup to it.

# ---------------------------------------------------------------------------------------------
# Installing what is missing

# Exits unless running as root, naming WHAT is missing.
need_root() { # what
  if [ "$(id -u)" != 0 ]; then
    echo "missing: $1; run as root to install it, or install it yourself" >&2
    exit 1
  fi
}

# Installs the Debian PACKAGE with apt-get (root only; WHAT names what is missing).
apt_install() { # package what
  need_root "$2 (Debian package $1)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null
}

pip_install() { # package...
  python3 -m pip install -q --disable-pip-version-check "$@"
}

# Installs the PyPI PACKAGEs unless python3 can import MODULES ("a, b", as `import` takes them).
need_python() { # modules package...
  python3 -c "import $1" 2>/dev/null || pip_install "${@:2}"
}

# Sets $promtool (PROMTOOL, or promtool on the PATH), installing Debian's prometheus if missing.
need_promtool() {
  promtool=${PROMTOOL:-promtool}
  command -v "$promtool" >/dev/null || apt_install prometheus promtool
}

# Sets $prometheus (PROMETHEUS, or /usr/bin/prometheus) and $promtool, installing Debian's
# prometheus when either is missing.
need_prometheus() {
  prometheus=${PROMETHEUS:-/usr/bin/prometheus}
  promtool=${PROMTOOL:-promtool}
  if ! command -v "$promtool" >/dev/null || [ ! -x "$prometheus" ]; then
    apt_install prometheus prometheus/promtool
  fi
}

# Sets $alertmanager (ALERTMANAGER, or Debian's /usr/bin/prometheus-alertmanager) and $amtool
# (AMTOOL, or amtool on the PATH), installing Debian's prometheus-alertmanager when either is
# missing.
need_alertmanager() {
  alertmanager=${ALERTMANAGER:-/usr/bin/prometheus-alertmanager}
  amtool=${AMTOOL:-amtool}
  if ! command -v "$amtool" >/dev/null || [ ! -x "$alertmanager" ]; then
    apt_install prometheus-alertmanager "Alertmanager and amtool"
  fi
}

# Sets $victoria_metrics, $vmagent and $vmalert (the single-node server, the scraper and the rule
# evaluator of VictoriaMetrics, from the PATH), installing Debian's victoria-metrics, which ships
# all three, when one is missing.
need_victoria_metrics() {
  local tool
  for tool in victoria-metrics vmagent vmalert; do
    command -v "$tool" >/dev/null || { apt_install victoria-metrics "VictoriaMetrics"; break; }
  done
  victoria_metrics=$(command -v victoria-metrics)
  vmagent=$(command -v vmagent)
  vmalert=$(command -v vmalert)
}

# Installs Debian's podman, buildah, mmdebstrap and runc when one is missing: what
# scripts/build-image.sh and scripts/check-image.sh build and run the image with.
need_image_tools() {
  local tool
  for tool in podman buildah mmdebstrap runc; do
    if ! command -v "$tool" >/dev/null; then
      need_root "$tool (the image build)"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        podman buildah mmdebstrap runc >/dev/null
      return
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# Binaries

# Prints where cargo puts what it builds (CARGO_TARGET_DIR, a configured target-dir, or target/).
cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# For a live check against the demo: keeps $bin when set, else sets it to the debug exporter in
# cargo's target directory (built when missing); keeps $kubelet when set (test.sh, which built
# it, so that a check started next to another build does not wait for cargo's lock), else sets
# it to the fake kubelet (examples/fake-kubelet.rs, built). Exits when $bin is not there or has no
# libnvml_sim.so next to it (--demo loads it from there).
need_demo_binaries() {
  local target_dir
  target_dir=$(cargo_target_dir)
  if [ -z "${bin:-}" ]; then
    bin=$target_dir/debug/nvml-exporter
    if [ ! -x "$bin" ] || [ ! -e "$target_dir/debug/libnvml_sim.so" ]; then
      cargo build --workspace
    fi
  fi
  if [ -z "${kubelet:-}" ]; then
    kubelet=$target_dir/debug/examples/fake-kubelet
    cargo build --quiet --example fake-kubelet
  fi
  if [ ! -x "$bin" ]; then
    echo "no exporter binary at $bin" >&2
    exit 1
  fi
  if [ ! -e "$(dirname "$bin")/libnvml_sim.so" ]; then
    echo "--demo needs libnvml_sim.so next to $bin (cargo build --workspace)" >&2
    exit 1
  fi
}

# ---------------------------------------------------------------------------------------------
# Processes, ports and the work directory, cleaned up on exit

lib_pids=()
lib_work=

lib_cleanup() {
  local pid
  for pid in "${lib_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${lib_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$lib_work" ]; then rm -rf "$lib_work"; fi
}
trap lib_cleanup EXIT
trap 'exit 130' INT TERM

# Sets $work to a new temporary directory, removed on exit.
make_work_dir() {
  work=$(mktemp -d)
  lib_work=$work
}

# Writes the shipped rules (deploy/prometheus/alerts.yaml) to OUT with every group at the global
# evaluation_interval: the live checks evaluate every second and test what the rules select,
# where the groups that run every minute would keep them waiting.
rules_at_global_interval() { # out
  sed '/^    interval: /d' deploy/prometheus/alerts.yaml >"$1"
}

# Starts COMMAND in the background, its output in LOG; it is ended on exit. Its pid is in $!.
background() { # log command...
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  lib_pids+=("$!")
}

# Prints a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for the unix socket SOCKET; if it does not appear, prints the end of LOG (what
# should have made it) and fails.
wait_for_socket() { # socket log
  local _
  for _ in $(seq 100); do
    if [ -S "$1" ]; then return 0; fi
    sleep 0.1
  done
  echo "no socket at $1 after 10 s; $2:" >&2
  tail -n 20 "$2" >&2
  return 1
}

# ---------------------------------------------------------------------------------------------
# Steps

steps_passed=0
steps_failed=()
# What each timed part took, for `steps_times`: "SECONDS WHERE NAME", in the order they ended.
steps_timed=()

# Runs COMMAND as the part NAME of the script's setup (installing, building), timed for
# `steps_times`. Not a step: under `set -e` its failure ends the script.
timed() { # name command...
  local started=$SECONDS
  "${@:2}"
  steps_timed+=("$((SECONDS - started)) setup $1")
}

# Runs COMMAND as the step NAME: a header, its output, then "PASS  NAME" or "FAIL  NAME". Counts
# it in $steps_passed or $steps_failed (the names) and returns 0 either way, so a failed step
# does not end a script under `set -e`.
step() { # name command...
  local name=$1 started=$SECONDS
  shift
  echo "=== $name"
  if "$@"; then
    echo "PASS  $name ($((SECONDS - started)) s)"
    steps_passed=$((steps_passed + 1))
  else
    echo "FAIL  $name ($((SECONDS - started)) s)"
    steps_failed+=("$name")
  fi
  steps_timed+=("$((SECONDS - started)) foreground $name")
}

# Starts COMMAND as the step NAME in the background, its output kept until
# `wait_background_steps`: for checks that mostly wait (a live Prometheus's scrapes and rule
# evaluations), so that they run next to each other and to the steps after them.
background_names=()
background_pids=()
background_logs=()
background_step() { # name command...
  local log
  log=$(mktemp)
  { local rc=0; "${@:2}" || rc=$?; echo "$rc $SECONDS" >"$log.end"; } >"$log" 2>&1 &
  background_pids+=("$!")
  lib_pids+=("$!")
  background_names+=("$1")
  background_logs+=("$log $SECONDS")
}

# Waits for every background step and reports each, in the order they started, as `step` does.
wait_background_steps() {
  local i log started rc ended
  for i in "${!background_pids[@]}"; do
    wait "${background_pids[$i]}" || true
    read -r log started <<<"${background_logs[$i]}"
    { read -r rc ended <"$log.end"; } 2>/dev/null || { rc=1; ended=$SECONDS; }
    echo "=== ${background_names[$i]} (in the background)"
    cat "$log"
    rm -f "$log" "$log.end"
    if [ "$rc" = 0 ]; then
      echo "PASS  ${background_names[$i]} ($((ended - started)) s)"
      steps_passed=$((steps_passed + 1))
    else
      echo "FAIL  ${background_names[$i]} ($((ended - started)) s)"
      steps_failed+=("${background_names[$i]}")
    fi
    steps_timed+=("$((ended - started)) background ${background_names[$i]}")
  done
}

# Prints what each timed part (`timed`, `step`, `background_step`) took, in the order they
# ended, and the script's wall time so far: background steps ran beside the others, so the
# seconds add up to more than the total.
steps_times() {
  local row seconds where name
  echo "=== time"
  printf '%7s  %-10s  %s\n' seconds where step
  for row in "${steps_timed[@]}"; do
    read -r seconds where name <<<"$row"
    printf '%7s  %-10s  %s\n' "$seconds" "$where" "$name"
  done
  printf '%7s  %-10s  %s\n' "$SECONDS" total "wall time, $(date -u -d "@$SECONDS" +%M:%S)"
}

# Prints "SCRIPT: PASS", or "SCRIPT: FAIL (N): the failed steps" on stderr and returns 1.
steps_verdict() { # script
  if [ ${#steps_failed[@]} = 0 ]; then
    echo "$1: PASS"
  else
    local names
    printf -v names '%s; ' "${steps_failed[@]}"
    echo "$1: FAIL (${#steps_failed[@]}): ${names%; }" >&2
    return 1
  fi
}

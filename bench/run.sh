#!/usr/bin/env bash
# One command for the whole benchmark (BENCHMARKS.md): builds the release exporter and nvml-sim,
# checks the tools, installs the peers when missing, runs bench/bench.py and writes
# bench/results/<date>.json and .md.
# Extra arguments go to bench.py, e.g. --footprint-seconds 20 --only scrape,startup; with --fleet
# first, the fleet benchmark runs instead (bench/fleet.py).
# BENCH_BASELINE=path/to/nvml-exporter adds a second build to every phase (BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

target=$(cargo_target_dir)
cargo build --release -p nvml-exporter -p nvml-sim

# `bench/run.sh --fleet [OPTIONS]`: the fleet benchmark alone (bench/fleet.py, about 15 minutes
# with Prometheus alone, --engines prometheus; needs prometheus and promtool, and victoria-metrics,
# vmagent and vmalert for VictoriaMetrics), written to bench/results/fleet-<date>.json and .md.
if [[ ${1:-} == --fleet ]]; then
  shift
  exec python3 bench/fleet.py --exporter "$target/release/nvml-exporter" --sim "$target/release/libnvml_sim.so" \
    --exporter-revision "$(git rev-parse --short HEAD)" --out "${BENCH_OUT:-bench/results/fleet-$(date +%F).json}" "$@"
fi

missing=()
for tool in wrk nginx valgrind callgrind_control callgrind_annotate; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "bench: missing ${missing[*]}; on Debian: apt-get install wrk nginx valgrind" >&2
  exit 2
fi
# The peers (BENCHMARKS.md): nvitop-exporter from PyPI, and all-smi from crates.io built once
# into the target directory (it needs protoc and links libdrm; cargo builds it in a directory of
# its own).
need_python "nvitop_exporter, pynvml" nvitop-exporter nvidia-ml-py
all_smi=$target/bench-tools/bin/all-smi
if [[ ! -x $all_smi ]]; then
  command -v protoc >/dev/null || apt_install protobuf-compiler "protoc (to build all-smi)"
  dpkg -s libdrm-dev >/dev/null 2>&1 || apt_install libdrm-dev "libdrm (to link all-smi)"
  env -u CARGO_TARGET_DIR cargo install all-smi --version 0.22.0 --locked --root "$target/bench-tools"
fi
python3 bench/gen_scenarios.py --check

# BENCH_OUT names the result file (e.g. a second run on one day); the .md goes next to it.
out="${BENCH_OUT:-bench/results/$(date +%F).json}"
# BENCH_BASELINE names a second exporter build (e.g. main's release binary) to measure side by
# side; BENCH_BASELINE_SIM its libnvml_sim.so when that is not next to it.
baseline=()
if [[ -n "${BENCH_BASELINE:-}" ]]; then
  baseline=(--baseline "$BENCH_BASELINE")
  if [[ -n "${BENCH_BASELINE_SIM:-}" ]]; then
    baseline+=(--baseline-sim "$BENCH_BASELINE_SIM")
  fi
fi
python3 bench/bench.py --exporter "$target/release/nvml-exporter" --sim "$target/release/libnvml_sim.so" --all-smi "$all_smi" --out "$out" \
  "${baseline[@]}" "$@"
python3 bench/report.py "$out" > "${out%.json}.md"
echo "bench: $out, ${out%.json}.md" >&2

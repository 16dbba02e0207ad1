#!/usr/bin/env bash
# Every nvml* symbol the simulator exports must also be exported by the real driver library
# (Debian non-free libnvidia-ml1, 535.x), so a client written against the sim never depends on
# an entry point the driver lacks. Symbols newer than 535 are allowed only when listed below.
#
# Usage: check-symbols.sh REAL_LIB SIM_LIB     (e.g. .../libnvidia-ml.so.1 target/release/libnvml_sim.so)
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 REAL_LIB SIM_LIB" >&2
    exit 2
fi
real=$1
sim=$2

# Newer-than-535 entry points the simulator may export, one per line, each with the driver
# branch that introduced it and the real header that declares it (no Debian package of that
# branch exists to compare with), e.g.:
#   nvmlDeviceGetSomethingNew   # 550
EXCEPTIONS=(
    # 550: declared from CUDA 12.4's nvml.h on (PyPI nvidia-nvml-dev-cu12 12.4.127; not in 12.3.101,
    # the R545 header), exported by Debian trixie's libnvidia-ml1 550.163.01, not by the 535.x here.
    nvmlDeviceGetGpuFabricInfoV
    # 590: nvml.h of CUDA 13 (PyPI nvidia-nvml-dev 13.x, nvidia/cu13/include/nvml.h) declares it,
    # and NVML's change log lists it under "Changes between v580 and v590".
    nvmlDeviceGetUnrepairableMemoryFlag_v1
)

exports() {
    nm -D --defined-only "$1" | awk '$3 ~ /^nvml/ { sub(/@.*/, "", $3); print $3 }' | sort -u
}

real_syms=$(exports "$real")
sim_syms=$(exports "$sim")
if [[ -z $real_syms ]]; then
    echo "check-symbols: $real exports no nvml* symbols" >&2
    exit 2
fi
if [[ -z $sim_syms ]]; then
    echo "check-symbols: $sim exports no nvml* symbols" >&2
    exit 2
fi

offenders=$(comm -23 <(echo "$sim_syms") <(echo "$real_syms") |
    grep -vxF -f <(printf '%s\n' "${EXCEPTIONS[@]}" ; echo '') || true)

count=$(echo "$sim_syms" | wc -l)
if [[ -n $offenders ]]; then
    echo "check-symbols: the simulator exports symbols the real driver library does not:" >&2
    echo "$offenders" | sed 's/^/  /' >&2
    exit 1
fi
newer=$(comm -23 <(echo "$sim_syms") <(echo "$real_syms") | wc -l)
echo "check-symbols: $((count - newer)) of the $count nvml* symbols of $sim exist in $real; the other $newer are newer, listed in EXCEPTIONS"

#!/usr/bin/env bash
# Writes the CycloneDX SBOMs of what the image ships into OUT: nvml-exporter.cdx.json (the
# exporter binary) and libnvml_sim.cdx.json (the simulated driver library), made by
# cargo-cyclonedx from Cargo.lock and cargo's resolution of the host target: every crate compiled
# into each, with its version, checksum, license and purl; build-only dependencies are left out.
# Used by scripts/build-image.sh and by the Dockerfile's build stage, so both ship the same.
#
#   scripts/sbom.sh OUT
#
# Needs cargo-cyclonedx (cargo install --locked cargo-cyclonedx --version 0.5.9).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/sbom.sh OUT}

# cargo-cyclonedx writes each file next to its package's Cargo.toml; they are moved out at once.
cargo cyclonedx --quiet --format json --spec-version 1.5 --describe binaries --no-build-deps
mkdir -p "$out"
mv nvml-exporter_bin.cdx.json "$out/nvml-exporter.cdx.json"
mv nvml-sim/nvml_sim_cdylib-rlib.cdx.json "$out/libnvml_sim.cdx.json"
rm -f nvml-record/nvml-record_bin.cdx.json

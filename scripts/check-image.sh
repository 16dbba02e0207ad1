#!/usr/bin/env bash
# Builds the container image with scripts/build-image.sh and runs it with podman the way the
# DaemonSet runs it: read-only root filesystem (no tmpfs added), every capability dropped, no
# new privileges, the DaemonSet's memory limit; once as the image's default user with --demo,
# once as uid 0 with a pod-resources socket mounted where the DaemonSet mounts the kubelet's
# (examples/fake-kubelet serving one pod). Checks:
#   1. the labels (version, revision), the user and the entrypoint the Dockerfile gives;
#   2. the files: no shell, no package manager, no executable but the exporter and shared
#      libraries; the SBOMs in /opt/nvml-exporter/sbom are target/image's, and list every crate
#      `cargo tree` compiles into each binary;
#   3. the size: the base (everything but /opt/nvml-exporter) at most BASE_MB;
#   4. each run: /healthz and / answer, /metrics has `nvidia_gpu_up 1` for every GPU the demo
#      has (and, as uid 0, the pod on GPU 0), the process's user, capabilities and
#      no_new_privs; SIGTERM (podman stop) ends it with status 0 within the pod's grace.
#
#   scripts/check-image.sh [BINARIES]    # BINARIES: cargo's target/debug by default
#
# scripts/test.sh runs it on the debug binaries it has built, their debug information stripped:
# a release build takes minutes that a test run does not have. The image is otherwise the one
# scripts/build-image.sh makes for users (the same base, Dockerfile stage, labels, user and
# SBOMs), tagged `check` so that a user's image is left alone; the size of the release image is
# in BENCHMARKS.md. Needs root; installs podman, buildah, mmdebstrap and runc (Debian) and
# cargo-cyclonedx (crates.io) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# The base's share of the 40 MB goal: the rest is the release binaries' (BENCHMARKS.md).
BASE_MB=${BASE_MB:-26}
# The DaemonSet's terminationGracePeriodSeconds (Kubernetes' default) and memory limit.
GRACE_S=30
MEMORY=128m

need_root "podman (the image check)"
target_dir=$(cargo_target_dir)
binaries=${1:-$target_dir/debug}
# The fake kubelet runs on the host: test.sh gives the one it built.
kubelet=${kubelet:-$target_dir/debug/examples/fake-kubelet}
version=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "nvml-exporter"))')
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
tag=check-$$
image=localhost/nvml-exporter:$tag
podman=(podman --runtime runc --cgroup-manager cgroupfs)
# podman's default limits are above what this host grants, and runc then refuses to start.
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
make_work_dir
containers=()
remove_containers() {
  local c
  for c in "${containers[@]}"; do "${podman[@]}" rm --force --time 0 "$c" >/dev/null 2>&1 || true; done
  "${podman[@]}" rmi --force "$image" >/dev/null 2>&1 || true
  rm -f "$target_dir/image/nvml-exporter-$tag.oci.tar"
  lib_cleanup
}
trap remove_containers EXIT

build() {
  mkdir -p "$work/bin"
  strip --strip-debug -o "$work/bin/nvml-exporter" "$binaries/nvml-exporter"
  strip --strip-debug -o "$work/bin/libnvml_sim.so" "$binaries/libnvml_sim.so"
  scripts/build-image.sh --binaries "$work/bin" --tag "$tag"
}
step "scripts/build-image.sh: base from bookworm's packages, the Dockerfile's final stage by buildah" build
if ! "${podman[@]}" image exists "$image"; then
  steps_verdict check-image
  exit 1
fi

config() {
  local got
  got=$("${podman[@]}" image inspect --format \
    '{{index .Labels "org.opencontainers.image.version"}} {{index .Labels "org.opencontainers.image.revision"}} {{.Config.User}} {{json .Config.Entrypoint}}' "$image")
  echo "$got"
  [ "$got" = "$version $revision 65534:65534 [\"/opt/nvml-exporter/nvml-exporter\"]" ] ||
    { echo "expected: $version $revision 65534:65534 [\"/opt/nvml-exporter/nvml-exporter\"]"; return 1; }
}
step "labels: version $version and revision $revision; user 65534; the exporter as entrypoint" config

files() {
  local c
  c=$("${podman[@]}" create "$image")
  containers+=("$c")
  "${podman[@]}" export "$c" >"$work/rootfs.tar"
  mkdir "$work/rootfs"
  tar -xf "$work/rootfs.tar" -C "$work/rootfs"
  python3 - "$work/rootfs" "$target_dir/image" <<'PY'
import json, os, pathlib, stat, subprocess, sys
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
problems = []
shells = {"sh", "bash", "dash", "ash", "zsh", "ksh", "csh", "busybox", "toybox"}
managers = {"apt", "apt-get", "dpkg", "dpkg-deb", "rpm", "yum", "dnf", "apk", "pip", "pip3", "python3", "perl"}
executables = []
for path in root.rglob("*"):
    rel = "/" + str(path.relative_to(root))
    if path.name in shells | managers and not path.is_dir():
        problems.append(f"{rel}: a shell or package manager")
    mode = path.lstat().st_mode
    if stat.S_ISREG(mode) and mode & 0o111 and not rel.startswith("/opt/nvml-exporter/") and ".so" not in path.name:
        executables.append(rel)
problems += [f"{e}: an executable" for e in executables]
for name in ("nvml-exporter", "libnvml_sim.so"):
    if not (root / "opt/nvml-exporter" / name).is_file():
        problems.append(f"/opt/nvml-exporter/{name} missing")
# The SBOMs: those beside the archive, and every crate cargo compiles into each binary.
for sbom, package in (("nvml-exporter.cdx.json", "nvml-exporter"), ("libnvml_sim.cdx.json", "nvml-sim")):
    inside = root / "opt/nvml-exporter/sbom" / sbom
    if not inside.is_file() or inside.read_bytes() != (out / sbom).read_bytes():
        problems.append(f"/opt/nvml-exporter/sbom/{sbom} is not {out / sbom}")
        continue
    bom = json.loads(inside.read_text())
    listed = {f"{c['name']} v{c['version']}" for c in bom.get("components", [])}
    tree = subprocess.run(["cargo", "tree", "--locked", "-e", "normal", "-p", package, "--prefix", "none",
                           "--format", "{p}"], check=True, capture_output=True, text=True).stdout
    crates = {" ".join(line.split()[:2]) for line in tree.splitlines() if line.strip()} - {f"{package} v{bom['metadata']['component']['version']}"}
    missing = sorted(crates - listed)
    if bom.get("bomFormat") != "CycloneDX" or bom["metadata"]["component"]["name"] not in (package, "nvml_sim") or missing:
        problems.append(f"{sbom}: {bom.get('bomFormat')} of {bom['metadata']['component']['name']}, missing {missing[:5]}")
    else:
        print(f"{sbom}: CycloneDX {bom['specVersion']}, {len(listed)} components, every crate of `cargo tree -p {package}`")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
}
step "files: no shell, no package manager, no other executable; the SBOMs, complete" files

no_shell() {
  local out
  if out=$("${podman[@]}" run --rm "${limits[@]}" --entrypoint /bin/sh "$image" -c true 2>&1); then
    echo "/bin/sh ran: $out"
    return 1
  fi
  echo "podman run --entrypoint /bin/sh: ${out##*exec: }"
  [[ "$out" == *'"/bin/sh": stat /bin/sh: no such file or directory'* ]]
}
step "no shell to run: podman run --entrypoint /bin/sh fails" no_shell

size() {
  local total base
  [ -d "$work/rootfs/opt/nvml-exporter" ] || { echo "no file system to measure (see above)"; return 1; }
  total=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
  base=$(($(tar -cf - --exclude=./opt/nvml-exporter -C "$work/rootfs" . | wc -c) / 1000000))
  echo "image with these binaries: $((total / 1000000)) MB; base (all but /opt/nvml-exporter): $base MB (at most $BASE_MB)"
  [ "$base" -le "$BASE_MB" ]
}
step "size: the base at most $BASE_MB MB" size

# The exporter's own count of the demo's GPUs, from the same binary outside the container.
gpus=$("$binaries/nvml-exporter" --demo --once --log-level error | grep -c '^nvidia_gpu_up{')

# Starts the image as the DaemonSet would, with EXTRA options before the image and ARGS after
# it; sets $container and $port.
start() { # extra... -- args...
  local extra=() _
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  port=$(free_port)
  container=$("${podman[@]}" run --detach --read-only --read-only-tmpfs=false --cap-drop=all \
    --security-opt=no-new-privileges --memory "$MEMORY" "${limits[@]}" \
    --env NODE_NAME=gpu-node-1 --publish "127.0.0.1:$port:9400" "${extra[@]}" "$image" "$@")
  containers+=("$container")
  # Ready (the kubelet's readiness probe): NVML answered and a sample is complete.
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
    sleep 0.2
  done
  echo "not ready on /readyz after 20 s:"
  "${podman[@]}" logs "$container" | tail -n 20
  return 1
}

# What every run must show: the paths, every GPU up, the process's identity, a clean SIGTERM.
serves() { # uid
  local ok=0 pid metrics page up status began took code
  metrics=$(curl -sf "http://127.0.0.1:$port/metrics") || { echo "/metrics failed"; ok=1; }
  up=$(grep -c '^nvidia_gpu_up{.*} 1$' <<<"$metrics" || true)
  echo "/metrics: $up of $gpus GPUs up"
  [ "$up" = "$gpus" ] || ok=1
  page=$(curl -sf "http://127.0.0.1:$port/") || true
  [[ "$page" == *"<html"* ]] || { echo "/ serves no page"; ok=1; }
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { echo "/healthz failed"; ok=1; }
  pid=$("${podman[@]}" inspect --format '{{.State.Pid}}' "$container")
  status=$(grep -E '^(Uid|CapEff|CapPrm|NoNewPrivs):' "/proc/$pid/status" | tr -s '\t ' ' ' | tr '\n' ';')
  echo "process: $status"
  [[ "$status" == "Uid: $1 $1 $1 $1;CapPrm: 0000000000000000;CapEff: 0000000000000000;NoNewPrivs: 1;" ]] ||
    { echo "expected uid $1, no capability, no_new_privs"; ok=1; }
  began=$(date +%s%N)
  "${podman[@]}" stop --time "$GRACE_S" "$container" >/dev/null
  took=$((($(date +%s%N) - began) / 1000000))
  code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$container")
  echo "SIGTERM: stopped in $took ms with status $code (grace ${GRACE_S} s)"
  [ "$code" = 0 ] && [ "$took" -lt $((GRACE_S * 1000)) ] || ok=1
  return $ok
}

default_user() {
  start -- --demo || return 1
  serves 65534
}
step "run as the default user: read-only, no capabilities, no new privileges; /metrics, /, /healthz, SIGTERM" default_user

pod_resources() {
  local sockets=$work/pod-resources
  mkdir -m 0755 "$sockets"
  background "$work/kubelet.log" "$kubelet" "$sockets/kubelet.sock" "ml/train-0/main=nvidia0"
  wait_for_socket "$sockets/kubelet.sock" "$work/kubelet.log" || return 1
  start --user 0:0 --volume "$sockets:/var/lib/kubelet/pod-resources:ro" -- --kubernetes --demo || return 1
  grep -q '^nvidia_gpu_pod_info{gpu="0",.*namespace="ml",pod="train-0",container="main"} 1$' \
    <<<"$(curl -sf "http://127.0.0.1:$port/metrics")" ||
    { echo "GPU 0 is not attributed to ml/train-0 through the mounted socket"; return 1; }
  echo "GPU 0 attributed to ml/train-0 through the mounted pod-resources socket"
  serves 0
}
step "run as uid 0 with the pod-resources socket mounted (--kubernetes): GPU 0's pod, and as above" pod_resources

steps_verdict check-image

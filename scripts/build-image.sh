#!/usr/bin/env bash
# Builds the container image without Docker and without any registry but Debian's archive, as
# root, with Debian's OCI tools:
#
#   scripts/build-image.sh                  # release build: localhost/nvml-exporter:VERSION
#   scripts/build-image.sh --binaries DIR   # from DIR/nvml-exporter and DIR/libnvml_sim.so
#   scripts/build-image.sh --tag TAG ...    # localhost/nvml-exporter:TAG (VERSION by default)
#
#   1. the runtime base, localhost/nvml-exporter-base:bookworm: mmdebstrap fetches from bookworm,
#      its updates and its security updates the packages distroless/cc-debian12 is made of
#      (base-files, netbase, tzdata, libc6, libssl3, libgcc-s1, gcc-12-base, libgomp1,
#      libstdc++6) and ca-certificates; their files are unpacked into one tree with /usr merged,
#      without documentation (the copyright files stay), with ca-certificates' bundle alone
#      (made by its own update-ca-certificates), a dpkg status file per package under
#      /var/lib/dpkg/status.d (for scanners), and root, nobody and nonroot as users: no shell,
#      no package manager, no executable outside the libraries;
#   2. the files of the build stage (/out): the binaries (cargo build --release, or --binaries)
#      and their SBOMs (scripts/sbom.sh, cargo-cyclonedx), as the image
#      localhost/nvml-exporter-files:TAG;
#   3. the Dockerfile's final stage, by buildah, with RUNTIME_IMAGE and FILES set to those two
#      (its build stage, which needs Docker Hub, is skipped), VERSION the crate's and
#      NVML_EXPORTER_REVISION git's: localhost/nvml-exporter:TAG in podman's storage;
#   4. target/image/nvml-exporter-TAG.oci.tar (an OCI archive: `skopeo copy
#      oci-archive:FILE docker://REGISTRY/nvml-exporter:VERSION` pushes it) and the SBOMs beside
#      it as target/image/*.cdx.json; prints the image's size.
#
# The binaries link against the host's glibc: build on Debian bookworm (glibc 2.36), or give
# --binaries built there. Installs what is missing (Debian's podman, buildah, mmdebstrap and
# runc; cargo-cyclonedx from crates.io).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

binaries='' tag=''
while [ $# -gt 0 ]; do
  case $1 in
    --binaries) binaries=${2:?--binaries DIR}; shift 2 ;;
    --tag) tag=${2:?--tag TAG}; shift 2 ;;
    *) echo "usage: scripts/build-image.sh [--binaries DIR] [--tag TAG]" >&2; exit 2 ;;
  esac
done

need_root "the image build (podman's storage, mmdebstrap)"
need_image_tools
command -v cargo-cyclonedx >/dev/null || cargo install --locked --quiet cargo-cyclonedx --version 0.5.9

version=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "nvml-exporter"))')
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
tag=${tag:-$version}
image=localhost/nvml-exporter:$tag
base=localhost/nvml-exporter-base:bookworm
files=localhost/nvml-exporter-files:$tag
out=$(cargo_target_dir)/image
# crun refuses the cgroup layout of some hosts (cgroup v1 beside v2); runc runs everywhere.
podman=(podman --runtime runc --cgroup-manager cgroupfs)
make_work_dir
mkdir -p "$out"

# 1. The base. The packages and their dependencies are fetched by mmdebstrap (unpacked, not
# installed: nothing runs), with the stable and security updates; only the packages named here
# are unpacked into the image.
packages=(base-files netbase tzdata libc6 libssl3 libgcc-s1 gcc-12-base libgomp1 libstdc++6 ca-certificates)
mmdebstrap --quiet --variant=extract --include="$(IFS=,; echo "${packages[*]}")" \
  --skip=cleanup/apt/cache bookworm "$work/debian" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
root=$work/rootfs
mkdir -p "$root/var/lib/dpkg/status.d"
for package in "${packages[@]}"; do
  deb=$(ls "$work/debian/var/cache/apt/archives/${package}_"*.deb)
  dpkg-deb -x "$deb" "$root"
  dpkg-deb -f "$deb" >"$root/var/lib/dpkg/status.d/$package"
done
# /usr merged, as on a Debian 12 system: /bin, /sbin, /lib and /lib64 link into /usr.
for dir in bin sbin lib lib64; do
  if [ -d "$root/$dir" ] && [ ! -L "$root/$dir" ]; then
    mkdir -p "$root/usr/$dir"
    cp -a "$root/$dir/." "$root/usr/$dir/"
    rm -rf "${root:?}/$dir"
  fi
  ln -s "usr/$dir" "$root/$dir"
done
# The CA bundle, by the package's own script (run by the host's shell and openssl), from all
# the certificates it ships, as its postinst does on a fresh system.
mkdir -p "$work/certs" "$work/hooks" "$root/etc/ssl/certs"
: >"$work/ca-certificates.conf"
bash "$root/usr/sbin/update-ca-certificates" --default --certsconf "$work/ca-certificates.conf" \
  --certsdir "$root/usr/share/ca-certificates" --localcertsdir "$work/none" \
  --etccertsdir "$work/certs" --hooksdir "$work/hooks" >/dev/null
install -m 0644 "$work/certs/ca-certificates.crt" "$root/etc/ssl/certs/ca-certificates.crt"
# Nothing but libraries, data and the bundle: no program (update-ca-certificates, the only one
# these packages ship outside the libraries, is a shell script), no documentation but the
# copyright files.
rm -rf "${root:?}"/usr/sbin "${root:?}"/usr/bin "${root:?}"/usr/share/{ca-certificates,man,info,lintian,gdb,bug} \
  "${root:?}"/etc/{ca-certificates,update-motd.d,profile.d,skel}
find "$root/usr/share/doc" -type f ! -name copyright -delete
find "$root/usr/share/doc" -type l -delete
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/tmp" "$root/home/nonroot" "$root/root"
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
chown 65532:65532 "$root/home/nonroot"
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
networks: files
protocols: files
services: files
EOF
# The tree as one layer, its order, owners and times fixed by the commit: the same packages give
# the same layer.
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
tar --create --file "$work/base.tar" --directory "$root" --sort=name --numeric-owner \
  --mtime="@$epoch" --clamp-mtime .
"${podman[@]}" import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  "$work/base.tar" "$base" >/dev/null
echo "base: $base ($(printf '%s ' "${packages[@]}")from bookworm)"

# 2. The build stage's /out.
mkdir -p "$work/files"
if [ -z "$binaries" ]; then
  NVML_EXPORTER_REVISION=$revision cargo build --release --locked -p nvml-exporter -p nvml-sim
  binaries=$(cargo_target_dir)/release
fi
install -m 0755 "$binaries/nvml-exporter" "$work/files/nvml-exporter"
install -m 0644 "$binaries/libnvml_sim.so" "$work/files/libnvml_sim.so"
scripts/sbom.sh "$work/files/sbom"
rm -f "$out"/*.cdx.json
cp "$work/files/sbom/"*.cdx.json "$out/"
container=$(buildah from scratch)
buildah copy --quiet "$container" "$work/files" /out >/dev/null
buildah commit --quiet --rm "$container" "$files" >/dev/null

# 3. The Dockerfile's final stage. The context is empty: the final stage copies from FILES only.
mkdir -p "$work/context"
buildah build --quiet --pull=never --identity-label=false --layers=false \
  --build-arg RUNTIME_IMAGE="$base" --build-arg FILES="$files" \
  --build-arg VERSION="$version" --build-arg NVML_EXPORTER_REVISION="$revision" \
  --file Dockerfile --tag "$image" "$work/context" >/dev/null
"${podman[@]}" rmi --force "$files" >/dev/null

# 4. The archive and the sizes.
archive=$out/nvml-exporter-$tag.oci.tar
rm -f "$archive"
"${podman[@]}" save --quiet --format oci-archive --output "$archive" "$image"
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
compressed=$(gzip -c "$archive" | wc -c)
echo "image: $image (revision $revision), $((size / 1000000)) MB ($size bytes; $((compressed / 1000000)) MB compressed)"
echo "archive: $archive; SBOMs: $(cd "$out" && echo ./*.cdx.json)"

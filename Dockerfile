# syntax=docker/dockerfile:1
#
# nvml-exporter: the exporter and the simulated driver library, on a runtime image without a shell.
#
#   docker build --build-arg NVML_EXPORTER_REVISION=$(git rev-parse --short=12 HEAD) \
#     -t nvml-exporter:0.1.0 .
#   docker run --rm -p 9400:9400 nvml-exporter:0.1.0 --demo       # eight simulated H100s
#   docker run --rm --gpus all -p 9400:9400 nvml-exporter:0.1.0   # the host's GPUs
#
# On a GPU host the driver's libnvidia-ml.so.1 and the /dev/nvidia* devices come from the NVIDIA
# container toolkit at run time (--gpus, or NVIDIA_VISIBLE_DEVICES with the nvidia runtime); the
# image ships no driver library. deploy/kubernetes runs it as a DaemonSet (docs/kubernetes.md).
#
# Without Docker or a registry, scripts/build-image.sh builds the same final stage with buildah:
# it gives RUNTIME_IMAGE a base made from the same Debian packages as distroless/cc-debian12,
# and FILES an image holding /out as the build stage leaves it, from binaries it built on the
# host.

# The builder's Debian release must match the runtime's (bookworm, glibc 2.36): the binaries link
# against the builder's glibc.
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
# distroless/cc: glibc, libgcc, libstdc++, libssl and CA certificates, nothing else (no shell, no
# package manager). distroless publishes no version tags, only rolling ones; a release build
# pins the digest (--build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:...).
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:latest
# Where the final stage takes /out from: the build stage below, or an image holding the same.
ARG FILES=build

FROM ${RUST_IMAGE} AS build
# The SBOM's tool (scripts/sbom.sh), in a layer of its own so that a source change keeps it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo install --locked cargo-cyclonedx --version 0.5.9
WORKDIR /src
COPY . .
# build.rs records the revision in nvml_exporter_build_info; .git is not in the build context
# (.dockerignore), so it comes from here ("unknown" when not given).
ARG NVML_EXPORTER_REVISION=unknown
# The registry and target caches speed up rebuilds; they are not part of the image, so the
# artefacts are copied out of the cache in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    NVML_EXPORTER_REVISION=${NVML_EXPORTER_REVISION} \
    cargo build --release --locked -p nvml-exporter -p nvml-sim \
    && install -D -m 0755 target/release/nvml-exporter /out/nvml-exporter \
    && install -D -m 0644 target/release/libnvml_sim.so /out/libnvml_sim.so \
    && scripts/sbom.sh /out/sbom

FROM ${FILES} AS files

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG NVML_EXPORTER_REVISION=unknown
LABEL org.opencontainers.image.title="nvml-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs: utilization vs saturation, pod attribution" \
      org.opencontainers.image.source="https://github.com/nvml-exporter/nvml-exporter" \
      org.opencontainers.image.documentation="https://github.com/nvml-exporter/nvml-exporter/blob/main/README.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${NVML_EXPORTER_REVISION}"
# Side by side: --demo loads libnvml_sim.so from the executable's directory. The SBOMs
# (CycloneDX) of both are in sbom/.
COPY --from=files /out/ /opt/nvml-exporter/
# For the NVIDIA container runtime: every GPU, and only the utility libraries (NVML). Harmless
# without that runtime; deploy/kubernetes sets the same on the DaemonSet.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# The exporter needs no privileges ("nobody"). The Kubernetes DaemonSet overrides this with uid 0,
# all capabilities dropped, only to connect to the kubelet's root-owned pod-resources socket.
USER 65534:65534
EXPOSE 9400
ENTRYPOINT ["/opt/nvml-exporter/nvml-exporter"]

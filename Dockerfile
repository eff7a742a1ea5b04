# syntax=docker/dockerfile:1.7
# libreyolo-server images (docs/OPERATIONS.md "Images").
#
#   CPU  (default; debian:12, LibTorch from the torch==2.11.0 CPU wheel, the same pin as CI):
#     docker build -t libreyolo/libreyolo-server:0.1.0-cpu .
#   CUDA (NVIDIA CUDA base + the official LibTorch CUDA distribution, CMake pointed at it with
#         Torch_DIR=/opt/libtorch/share/cmake/Torch):
#     docker build --build-arg FLAVOR=cuda -t libreyolo/libreyolo-server:0.1.0-cuda13.0 .
#
# The builder runs exactly what CI runs: scripts/setup.sh (Debian packages + the pinned venv),
# then scripts/build.sh (CMake + Ninja into build/). The runtime stage holds only the programs,
# their shared libraries (deploy/docker/collect-runtime.sh), the default configuration and the
# CA bundle for hub downloads; no package manager ran in it, so it has no package cache.
# Tests are not built here (CI builds and runs them): CMAKE_ARGS turns them off.

ARG FLAVOR=cpu
# Pinned tags (never `latest`). Debian point release of bookworm; CUDA 13.0 matches cu130 LibTorch.
ARG DEBIAN_TAG=12.15
ARG CUDA_VERSION=13.0.2
ARG CUDA_UBUNTU=ubuntu24.04

# ---------------------------------------------------------------------------------------------
# Builders: one per flavor; `FROM builder-${FLAVOR}` below picks one and BuildKit skips the other.
FROM debian:${DEBIAN_TAG} AS builder-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The CPU build of the same torch==2.11.0 pin (2.11.0+cpu satisfies ==2.11.0): no CUDA libraries
# in the image. PyPI stays reachable for the other pinned packages.
ENV PIP_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_EXTRA_INDEX_URL=https://pypi.org/simple \
    PIP_NO_CACHE_DIR=1 \
    LIBREYOLO_VENV=/opt/venv
WORKDIR /src
# setup.sh first, alone: its layer is cached until the script or the pins change.
COPY scripts/setup.sh scripts/requirements.txt scripts/
RUN bash scripts/setup.sh

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${CUDA_UBUNTU} AS builder-cuda
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-2.11.0%2Bcu130.zip
# Optional: the archive's SHA-256 (recommended for reproducible builds); empty skips the check.
ARG LIBTORCH_SHA256=
# setup.sh's venv only serves the Python peers here (CPU wheel: small); CMake takes the official
# LibTorch through Torch_DIR, which the top-level CMakeLists.txt prefers to the venv.
ENV PIP_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_EXTRA_INDEX_URL=https://pypi.org/simple \
    PIP_NO_CACHE_DIR=1 \
    LIBREYOLO_VENV=/opt/venv \
    Torch_DIR=/opt/libtorch/share/cmake/Torch
WORKDIR /src
COPY scripts/setup.sh scripts/requirements.txt scripts/
RUN bash scripts/setup.sh
RUN set -eu; \
    curl -fsSL --retry 3 -o /tmp/libtorch.zip "$LIBTORCH_URL"; \
    if [ -n "$LIBTORCH_SHA256" ]; then echo "$LIBTORCH_SHA256  /tmp/libtorch.zip" | sha256sum -c -; fi; \
    python3 -m zipfile -e /tmp/libtorch.zip /opt; \
    rm /tmp/libtorch.zip; \
    test -f "$Torch_DIR/TorchConfig.cmake"

# ---------------------------------------------------------------------------------------------
# hadolint ignore=DL3006
FROM builder-${FLAVOR} AS builder
ARG FLAVOR
# Extra CMake arguments (scripts/build.sh passes them through). CUDA: sm_90 SASS + PTX by default.
ARG CMAKE_ARGS="-DLIBREYOLO_BUILD_TESTS=OFF -DLIBREYOLO_BUILD_BENCHMARKS=OFF -DLIBREYOLO_TSAN=OFF"
ARG CUDA_ARCHITECTURES=90
ARG JOBS=
WORKDIR /src
COPY . .
# CMAKE_ARGS and extra are word lists: unquoted on purpose.
# hadolint ignore=SC2086
RUN set -eu; \
    extra=""; \
    if [ "$FLAVOR" = cuda ]; then \
      extra="-DTorch_DIR=$Torch_DIR -DLIBREYOLO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES"; \
    fi; \
    rm -rf build; \
    JOBS=${JOBS:-$(nproc)} BUILD_DIR=build bash scripts/build.sh $CMAKE_ARGS $extra; \
    bash deploy/docker/collect-runtime.sh build /out/opt/libreyolo; \
    install -D -m 0644 deploy/k8s/base/server.yaml /out/etc/libreyolo/server.yaml; \
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt; \
    LD_LIBRARY_PATH=/out/opt/libreyolo/lib /out/opt/libreyolo/bin/libreyolo-server \
        --config /out/etc/libreyolo/server.yaml --print-config >/dev/null

# ---------------------------------------------------------------------------------------------
# Runtime bases: the same distribution as the builder (same glibc and libstdc++).
FROM debian:${DEBIAN_TAG}-slim AS runtime-cpu
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-${CUDA_UBUNTU} AS runtime-cuda
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# hadolint ignore=DL3006
FROM runtime-${FLAVOR} AS runtime
ARG FLAVOR
LABEL org.opencontainers.image.title="libreyolo-server" \
      org.opencontainers.image.description="LibTorch gRPC inference daemon (KServe v2 / Open Inference Protocol) for DETR-lineage detectors" \
      org.opencontainers.image.version="0.1.0" \
      io.libreyolo.flavor="${FLAVOR}"
COPY --from=builder /out/ /
# A fixed numeric user, so that Kubernetes' runAsNonRoot can verify it; no login shell, no home.
RUN set -eu; \
    groupadd --system --gid 10001 libreyolo; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin libreyolo; \
    mkdir -p /models /var/cache/libreyolo/kernels; \
    chown 10001:10001 /var/cache/libreyolo/kernels
ENV PATH=/opt/libreyolo/bin:$PATH \
    LD_LIBRARY_PATH=/opt/libreyolo/lib \
    KERNELS_CACHE=/var/cache/libreyolo/kernels \
    HOME=/tmp
# Model repository (<repo>/<model>/<version>/...) and the hub-kernel cache (HF cache layout).
VOLUME ["/models", "/var/cache/libreyolo/kernels"]
USER 10001:10001
WORKDIR /
# 8000: HTTP admin (/metrics, /active, /v2/health/*); 8001: gRPC (inference + grpc.health.v1).
EXPOSE 8000 8001
# SIGTERM drains (server.drain_seconds), a second one exits at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["libreyolo-server"]
CMD ["--config", "/etc/libreyolo/server.yaml"]

# libreyolo-server images (docs/OPERATIONS.md "Images"). Two flavors, one target each:
#
#   CPU  (the default, last stage; debian:12, LibTorch from the torch==2.11.0 wheel on PyPI):
#     docker build -t libreyolo/libreyolo-server:0.1.0-cpu .
#     podman: scripts/build-image.sh (no registry needed; CI builds and checks it, scripts/test.d/40-image.sh)
#   CUDA (NVIDIA CUDA base + the official LibTorch CUDA distribution, CMake pointed at it with
#         Torch_DIR=/opt/libtorch/share/cmake/Torch; its bases come from NVIDIA's registry):
#     docker build --target cuda -t libreyolo/libreyolo-server:0.1.0-cuda13.0 .
#
# Targets, not a FLAVOR argument in FROM: podman 4.3 (Debian 12) decides which stages to skip
# before it expands arguments in FROM, and then misses a `FROM builder-${FLAVOR}` dependency.
#
# The builders run scripts/setup.sh in its image mode (the packages that build the programs and a
# venv holding only the torch wheel) and deploy/docker/build-in-image.sh (scripts/build.sh, what
# CI runs, with tests and benchmarks off, then deploy/docker/collect-runtime.sh). The runtime
# stages hold only the programs, the shared libraries they need, the default configuration and
# the CA bundle for hub downloads: no compiler, no venv, no package manager ran in them.

# Pinned tags (never `latest`). Debian point release of bookworm; CUDA 13.0 matches cu130 LibTorch.
ARG DEBIAN_TAG=12.15
ARG CUDA_VERSION=13.0.2
ARG CUDA_UBUNTU=ubuntu24.04

# ---------------------------------------------------------------------------------------------
# Builders: toolchain and LibTorch. Their layers stay cached until setup.sh or the pins change.
FROM debian:${DEBIAN_TAG} AS builder-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Optional package index for torch, e.g. https://download.pytorch.org/whl/cpu (its 2.11.0+cpu
# satisfies ==2.11.0 and is smaller to fetch); empty (the default): PyPI only.
ARG TORCH_INDEX_URL=
# Optional: a PEM bundle, visible inside the build, that pip trusts instead of its own (a TLS
# proxy's CA; scripts/build-image.sh mounts the host's bundle here). Not kept in the image.
ARG EXTRA_CA_CERTS=
ENV LIBREYOLO_SETUP=image \
    LIBREYOLO_VENV=/opt/venv \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY scripts/setup.sh scripts/requirements-image.txt scripts/
RUN LIBREYOLO_SETUP=image-packages bash scripts/setup.sh
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      export PIP_INDEX_URL="$TORCH_INDEX_URL" PIP_EXTRA_INDEX_URL=https://pypi.org/simple; \
    fi; \
    if [ -n "$EXTRA_CA_CERTS" ]; then export PIP_CERT="$EXTRA_CA_CERTS"; fi; \
    bash scripts/setup.sh
# The PyPI wheel is built with CUDA: link only its CPU side (no CUDA toolkit here; top-level
# CMakeLists.txt, LIBREYOLO_TORCH_CUDA). Debian 12's Python is 3.11.
ENV Torch_DIR=/opt/venv/lib/python3.11/site-packages/torch/share/cmake/Torch \
    LIBREYOLO_CMAKE_FLAVOR="-DLIBREYOLO_CUDA=OFF -DLIBREYOLO_TORCH_CUDA=OFF"

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${CUDA_UBUNTU} AS builder-cuda
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-2.11.0%2Bcu130.zip
# Optional: the archive's SHA-256 (recommended for reproducible builds); empty skips the check.
ARG LIBTORCH_SHA256=
# Optional: a PEM bundle curl trusts for the download (as in builder-cpu).
ARG EXTRA_CA_CERTS=
# CUDA: sm_90 SASS + PTX by default.
ARG CUDA_ARCHITECTURES=90
# Torch_DIR set: setup.sh installs the packages and no venv; CMake takes the official LibTorch.
ENV LIBREYOLO_SETUP=image \
    Torch_DIR=/opt/libtorch/share/cmake/Torch \
    LIBREYOLO_CMAKE_FLAVOR="-DLIBREYOLO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"
WORKDIR /src
COPY scripts/setup.sh scripts/requirements-image.txt scripts/
RUN bash scripts/setup.sh
RUN set -eu; \
    curl -fsSL --retry 3 ${EXTRA_CA_CERTS:+--cacert "$EXTRA_CA_CERTS"} -o /tmp/libtorch.zip "$LIBTORCH_URL"; \
    if [ -n "$LIBTORCH_SHA256" ]; then echo "$LIBTORCH_SHA256  /tmp/libtorch.zip" | sha256sum -c -; fi; \
    python3 -m zipfile -e /tmp/libtorch.zip /opt; \
    rm /tmp/libtorch.zip; \
    test -f "$Torch_DIR/TorchConfig.cmake"

# ---------------------------------------------------------------------------------------------
# Build steps (the same for both flavors). CMAKE_ARGS: extra CMake arguments for scripts/build.sh.
# Few instructions after the toolchain: with podman's vfs driver (scripts/podman-env.sh falls back
# to it where overlay cannot mount) each one is a full copy of it.
# /ccache is a cache mount (kept between builds); scripts/build-image.sh mounts the host's
# ccache there instead (podman build -v), so that CI's cache serves the image build too.
FROM builder-cuda AS build-cuda
ARG CMAKE_ARGS="-DLIBREYOLO_BUILD_TESTS=OFF -DLIBREYOLO_BUILD_BENCHMARKS=OFF -DLIBREYOLO_TSAN=OFF"
ARG JOBS=
COPY . .
RUN --mount=type=cache,id=libreyolo-ccache,target=/ccache CCACHE_DIR=/ccache bash deploy/docker/build-in-image.sh

FROM builder-cpu AS build-cpu
ARG CMAKE_ARGS="-DLIBREYOLO_BUILD_TESTS=OFF -DLIBREYOLO_BUILD_BENCHMARKS=OFF -DLIBREYOLO_TSAN=OFF"
ARG JOBS=
COPY . .
RUN --mount=type=cache,id=libreyolo-ccache,target=/ccache CCACHE_DIR=/ccache bash deploy/docker/build-in-image.sh

# ---------------------------------------------------------------------------------------------
# Runtimes: the same distribution as their builder (same glibc and libstdc++). The two stages
# below differ only in FROM, the build stage they copy from and the flavor label
# (tests/deploy/deploy_test.py checks that). The programs come last: with podman's vfs driver
# every instruction copies the whole tree, so the metadata goes first, while it is small.
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-${CUDA_UBUNTU} AS cuda
LABEL org.opencontainers.image.title="libreyolo-server" \
      org.opencontainers.image.description="LibTorch gRPC inference daemon (KServe v2 / Open Inference Protocol) for DETR-lineage detectors" \
      org.opencontainers.image.version="0.1.0" \
      io.libreyolo.flavor="cuda"
ENV PATH=/opt/libreyolo/bin:$PATH \
    LD_LIBRARY_PATH=/opt/libreyolo/lib \
    KERNELS_CACHE=/var/cache/libreyolo/kernels \
    HOME=/tmp
# 8000: HTTP admin (/metrics, /active, /v2/health/*); 8001: gRPC (inference + grpc.health.v1).
EXPOSE 8000 8001
# SIGTERM drains (server.drain_seconds), a second one exits at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["libreyolo-server"]
CMD ["--config", "/etc/libreyolo/server.yaml"]
WORKDIR /
# A fixed numeric user, so that Kubernetes' runAsNonRoot can verify it; no login shell, no home.
RUN set -eu; \
    groupadd --system --gid 10001 libreyolo; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin libreyolo; \
    mkdir -p /models /var/cache/libreyolo/kernels; \
    chown 10001:10001 /var/cache/libreyolo/kernels
# Model repository (<repo>/<model>/<version>/...) and the hub-kernel cache (HF cache layout).
VOLUME ["/models", "/var/cache/libreyolo/kernels"]
COPY --from=build-cuda /out/ /
USER 10001:10001

# The default target: last.
FROM debian:${DEBIAN_TAG}-slim AS cpu
LABEL org.opencontainers.image.title="libreyolo-server" \
      org.opencontainers.image.description="LibTorch gRPC inference daemon (KServe v2 / Open Inference Protocol) for DETR-lineage detectors" \
      org.opencontainers.image.version="0.1.0" \
      io.libreyolo.flavor="cpu"
ENV PATH=/opt/libreyolo/bin:$PATH \
    LD_LIBRARY_PATH=/opt/libreyolo/lib \
    KERNELS_CACHE=/var/cache/libreyolo/kernels \
    HOME=/tmp
# 8000: HTTP admin (/metrics, /active, /v2/health/*); 8001: gRPC (inference + grpc.health.v1).
EXPOSE 8000 8001
# SIGTERM drains (server.drain_seconds), a second one exits at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["libreyolo-server"]
CMD ["--config", "/etc/libreyolo/server.yaml"]
WORKDIR /
# A fixed numeric user, so that Kubernetes' runAsNonRoot can verify it; no login shell, no home.
RUN set -eu; \
    groupadd --system --gid 10001 libreyolo; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin libreyolo; \
    mkdir -p /models /var/cache/libreyolo/kernels; \
    chown 10001:10001 /var/cache/libreyolo/kernels
# Model repository (<repo>/<model>/<version>/...) and the hub-kernel cache (HF cache layout).
VOLUME ["/models", "/var/cache/libreyolo/kernels"]
COPY --from=build-cpu /out/ /
USER 10001:10001

#!/usr/bin/env bash
# The Dockerfile's build step (stages build-cpu and build-cuda), run from the source root /src:
# scripts/build.sh (CMake + Ninja, what CI runs) with the image's CMake arguments, then
# collect-runtime.sh into /out/opt/libreyolo, the default configuration and the CA bundle into
# /out/etc, a --print-config of that configuration with the collected libraries only, and the
# build tree removed (it would stay in the layer).
# Environment (from the Dockerfile): CMAKE_ARGS (word list), LIBREYOLO_CMAKE_FLAVOR (word list:
# the flavor's CUDA switches), JOBS (default: every core), CCACHE_DIR (a cache mount: kept
# between builds; podman build -v HOST_DIR:/ccache shares the host's cache, scripts/build-image.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf build
ccache -z >/dev/null 2>&1 || true
start=$(date +%s)
# Word lists: unquoted on purpose.
# shellcheck disable=SC2086
JOBS=${JOBS:-$(nproc)} BUILD_DIR=build bash scripts/build.sh $CMAKE_ARGS $LIBREYOLO_CMAKE_FLAVOR
echo "build-in-image: compiled in $(($(date +%s) - start)) s; ccache: $(ccache -s 2>/dev/null | grep -Ei 'hits|misses' | tr -s ' ' | paste -sd ';' -)"
bash deploy/docker/collect-runtime.sh build /out/opt/libreyolo
install -D -m 0644 deploy/k8s/base/server.yaml /out/etc/libreyolo/server.yaml
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt
# The programs must start with the collected libraries alone (what the runtime stage has).
LD_LIBRARY_PATH=/out/opt/libreyolo/lib /out/opt/libreyolo/bin/libreyolo-server \
  --config /out/etc/libreyolo/server.yaml --print-config >/dev/null
rm -rf build

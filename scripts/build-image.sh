#!/usr/bin/env bash
# Builds the CPU image from the Dockerfile with podman: no Docker daemon, no registry (the Debian
# bases come from debootstrap, scripts/podman-env.sh), only Debian's mirror and PyPI inside.
# Docker image format: OCI images drop SHELL. Cached between runs: podman's layers (LIBREYOLO_CONTAINERS, default
# ~/.cache/libreyolo-server/containers) and the compiler cache (the host's ccache, mounted at the
# Dockerfile's /ccache).
#
# usage: scripts/build-image.sh [TAG [PODMAN_BUILD_ARGS...]]   (TAG default libreyolo-server:dev-cpu)
#   e.g. scripts/build-image.sh libreyolo-server:0.1.0-cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Environment: JOBS (compile jobs, default 2), LIBREYOLO_IMAGE_NICE (default 10: other work on
# the machine keeps its cores), LIBREYOLO_CCACHE_DIR (default: `ccache -k cache_dir`),
# LIBREYOLO_IMAGE_CA (the CA bundle pip and curl trust inside the build; default the host's
# /etc/ssl/certs/ca-certificates.crt, empty: their own), LIBREYOLO_CONTAINERS.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-libreyolo-server:dev-cpu}
[ $# -gt 0 ] && shift
command -v podman >/dev/null || { echo "build-image: podman not found (scripts/setup.sh installs it)" >&2; exit 1; }
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
debian_tag=$(sed -n 's/^ARG DEBIAN_TAG=//p' Dockerfile)
libreyolo_podman_bases "$debian_tag"
ccache_dir=${LIBREYOLO_CCACHE_DIR:-$(ccache -k cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")}
mkdir -p "$ccache_dir"
# The build reaches PyPI with the CAs the host trusts (a TLS-intercepting proxy's CA is in the
# host's bundle, not in pip's own): the bundle is mounted read-only for the build steps only.
ca=${LIBREYOLO_IMAGE_CA:-/etc/ssl/certs/ca-certificates.crt}
ca_args=()
if [ -n "$ca" ] && [ -f "$ca" ]; then
  ca_args=(-v "$ca:/run/libreyolo-build-ca.pem:ro" --build-arg EXTRA_CA_CERTS=/run/libreyolo-build-ca.pem)
fi
start=$(date +%s)
nice -n "${LIBREYOLO_IMAGE_NICE:-10}" podman build --isolation=chroot --pull=never --layers --format docker \
  --build-arg JOBS="${JOBS:-2}" -v "$ccache_dir:/ccache" "${ca_args[@]}" -t "$tag" "$@" -f Dockerfile .
echo "build-image: $tag built in $(($(date +%s) - start)) s"

#!/usr/bin/env bash
# Configures and builds the project into ${BUILD_DIR:-build} (Release, Ninja, ccache when present).
# Extra CMake arguments are passed through, e.g.  scripts/build.sh -DLIBREYOLO_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake "$build" "$@"
fi
cmake --build "$build" -j "$jobs"

#!/usr/bin/env bash
# The main job: builds, then prints the resolved kernel table of this machine (every slot, the
# implementation selected, every candidate with its eligibility) under config/server.yaml and
# the environment (LIBREYOLO_KERNELS, LIBREYOLO_HUB_KERNELS, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
exec "$build/bin/libreyolo-kernels" --config config/server.yaml "$@"

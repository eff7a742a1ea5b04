#!/usr/bin/env bash
# Builds and runs the whole test suite: ctest (unit, parity, integration, the registry under
# ThreadSanitizer), then the bounded fuzz run and the live parity against transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
bash scripts/build.sh
export LIBREYOLO_VENV=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
# CTest runs the GoogleTest cases (one CTest test each); GPU tests skip without a device.
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 600
for extra in scripts/test.d/*.sh; do
  [ -e "$extra" ] || continue
  echo "== $extra"
  bash "$extra" "$build"
done

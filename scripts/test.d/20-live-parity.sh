#!/usr/bin/env bash
# Live parity against transformers 5.17 on fresh random checkpoints (tests/live_parity).
set -euo pipefail
build=${1:-build}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" tests/live_parity/live_parity.py "$build/bin/libreyolo-predict" "$work"

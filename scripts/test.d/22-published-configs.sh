#!/usr/bin/env bash
# Published configurations at full size against transformers 5.17 (tests/live_parity/published_configs.py).
set -euo pipefail
build=${1:-build}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" tests/live_parity/published_configs.py "$build/bin/libreyolo-predict" "$work"

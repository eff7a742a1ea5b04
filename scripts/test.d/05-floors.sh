#!/usr/bin/env bash
# No include points up a floor (scripts/check-floors.sh holds the order of the whole tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/check-floors.sh "$@"

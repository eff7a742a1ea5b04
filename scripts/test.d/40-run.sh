#!/usr/bin/env bash
# scripts/run.sh, the main job, with the flags its own comment suggests: it must use the
# addresses given (it polled 127.0.0.1:8001 whatever --grpc-address said, failed and left the
# daemon running), and no daemon may outlive it, on success or failure.
# Usage: scripts/test.d/40-run.sh [BUILD_DIR]   (needs BUILD_DIR/bin/libreyolo-server and -client)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
work=$(mktemp -d /tmp/libreyolo-run-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
free_port() {
  "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# Nothing accepts connections on 127.0.0.1:$1, and no process runs with that --grpc-address.
expect_gone() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "40-run: something still listens on 127.0.0.1:$1" >&2; exit 1
  fi
  if pgrep -f -- "--grpc-address 127.0.0.1:$1" >/dev/null; then
    echo "40-run: a libreyolo-server with --grpc-address 127.0.0.1:$1 is still running:" >&2
    pgrep -af -- "--grpc-address 127.0.0.1:$1" >&2; exit 1
  fi
}

# 1. Other ports, no build: the demo runs against them and the daemon stops (exit 0).
g=$(free_port); h=$(free_port)
LIBREYOLO_BUILD=0 LIBREYOLO_RUN_ONCE=1 BUILD_DIR=$build LIBREYOLO_HUB_KERNELS=0 \
  timeout 300 bash scripts/run.sh --grpc-address "127.0.0.1:$g" --http-address "127.0.0.1:$h" \
  >"$work/ok.log" 2>&1 || { echo "40-run: run.sh on 127.0.0.1:$g failed:" >&2; tail -30 "$work/ok.log" >&2; exit 1; }
for want in "== detections for tests/fixtures/images/astronaut.jpg" "== top classes for" \
  "== kernel slots (GET http://127.0.0.1:$h/active)" "== serving: gRPC 127.0.0.1:$g,"; do
  grep -qF -- "$want" "$work/ok.log" || { echo "40-run: missing '$want' in:" >&2; cat "$work/ok.log" >&2; exit 1; }
done
expect_gone "$g"
echo "40-run: run.sh --grpc-address 127.0.0.1:$g --http-address 127.0.0.1:$h: demo on those ports, daemon stopped"

# 2. A repository whose only model cannot load: never ready. run.sh gives up after its timeout,
# exits 1 and stops the daemon.
mkdir -p "$work/repo/broken/1"
echo '{"model_type": "no_such_family"}' >"$work/repo/broken/1/config.json"
g=$(free_port)
rc=0
LIBREYOLO_BUILD=0 LIBREYOLO_READY_TIMEOUT=5 BUILD_DIR=$build LIBREYOLO_HUB_KERNELS=0 \
  timeout 120 bash scripts/run.sh --grpc-address "127.0.0.1:$g" --http-address off \
  --model-repository "$work/repo" >"$work/fail.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || { echo "40-run: expected exit 1, got $rc:" >&2; cat "$work/fail.log" >&2; exit 1; }
grep -qF "run: libreyolo-server is not ready on 127.0.0.1:$g after 5 s; stopping it" "$work/fail.log" ||
  { echo "40-run: no timeout message in:" >&2; cat "$work/fail.log" >&2; exit 1; }
expect_gone "$g"
echo "40-run: a never-ready daemon: run.sh exit 1 after 5 s, daemon stopped"

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

# Stand-ins for `hf` (run.sh's LIBREYOLO_HF): CI never downloads from the real Hub. Each call is
# logged; "offline" fails as the real one does without a network, "download" copies the tiny
# RT-DETRv2 fixture where `--local-dir` says.
mkdir -p "$work/bin"
cat >"$work/bin/hf-offline" <<'STANDIN'
#!/usr/bin/env bash
echo "$*" >>"$HF_STANDIN_LOG"
echo "Error: Local entry not found. [Errno -2] Name or service not known" >&2
exit 1
STANDIN
cat >"$work/bin/hf-download" <<'STANDIN'
#!/usr/bin/env bash
echo "$*" >>"$HF_STANDIN_LOG"
[ "$1" = download ] || exit 2
dir=
while [ $# -gt 0 ]; do [ "$1" = --local-dir ] && dir=$2; shift; done
cp tests/fixtures/models/rtdetr_v2_tiny/{config.json,model.safetensors,preprocessor_config.json} "$dir/"
STANDIN
chmod +x "$work/bin/hf-offline" "$work/bin/hf-download"
export HF_STANDIN_LOG=$work/hf-calls.log
expect_in() {  # FILE LINE...: every LINE is in FILE
  local f=$1 want; shift
  for want in "$@"; do
    grep -qF -- "$want" "$f" || { echo "40-run: missing '$want' in:" >&2; cat "$f" >&2; exit 1; }
  done
}

# 1. Other ports, no build, the Hub not reachable: one line says so, the demo runs against the
# bundled models on those ports and the daemon stops (exit 0).
g=$(free_port); h=$(free_port)
LIBREYOLO_BUILD=0 LIBREYOLO_RUN_ONCE=1 BUILD_DIR=$build LIBREYOLO_HUB_KERNELS=0 \
  LIBREYOLO_HF=$work/bin/hf-offline LIBREYOLO_CACHE=$work/cache \
  timeout 300 bash scripts/run.sh --grpc-address "127.0.0.1:$g" --http-address "127.0.0.1:$h" \
  >"$work/ok.log" 2>&1 || { echo "40-run: run.sh on 127.0.0.1:$g failed:" >&2; tail -30 "$work/ok.log" >&2; exit 1; }
expect_in "$work/ok.log" "== the Hugging Face Hub is not reachable (hf download PekingU/rtdetr_v2_r18vd failed: Error: Local entry not found. [Errno -2] Name or service not known): serving the bundled random-weight models only" \
  "== detections for tests/fixtures/images/astronaut.jpg" "== top classes for" \
  "== kernel slots (GET http://127.0.0.1:$h/active)" \
  "== LIBREYOLO_RUN_ONCE=1: stopping the daemon (--drain-seconds 0: nothing is in flight)"
! grep -qF "== serving: gRPC" "$work/ok.log" || { echo "40-run: one-shot mode said it keeps serving" >&2; exit 1; }
! grep -qF "by PekingU/rtdetr_v2_r18vd" "$work/ok.log" || { echo "40-run: offline, yet a real detector ran" >&2; exit 1; }
expect_gone "$g"
echo "40-run: run.sh --grpc-address 127.0.0.1:$g --http-address 127.0.0.1:$h, the Hub unreachable: said in one line, demo on those ports, daemon stopped"

# 2. The Hub reachable (the stand-in): the three files are downloaded into the cache, served with
# the examples from a run repository removed at exit, and the boxes drawn to the printed PNG.
: >"$HF_STANDIN_LOG"
g=$(free_port)
LIBREYOLO_BUILD=0 LIBREYOLO_RUN_ONCE=1 BUILD_DIR=$build LIBREYOLO_HUB_KERNELS=0 \
  LIBREYOLO_HF=$work/bin/hf-download LIBREYOLO_CACHE=$work/cache \
  timeout 300 bash scripts/run.sh --grpc-address "127.0.0.1:$g" --http-address off \
  >"$work/real.log" 2>&1 || { echo "40-run: run.sh with a download failed:" >&2; tail -30 "$work/real.log" >&2; exit 1; }
png=$work/cache/rtdetr_v2_r18vd-astronaut.png
expect_in "$work/real.log" \
  "== a real detector: PekingU/rtdetr_v2_r18vd (in $work/cache/hub), served as rtdetr_v2_r18vd beside the examples" \
  "== detections for tests/fixtures/images/astronaut.jpg by PekingU/rtdetr_v2_r18vd (real weights)" \
  "tests/fixtures/images/astronaut.jpg: " "detections (model rtdetr_v2_r18vd version 1)" \
  "wrote $png (" "== detections for tests/fixtures/images/astronaut.jpg (random-weight example model)"
[ "$(cat "$HF_STANDIN_LOG")" = "download PekingU/rtdetr_v2_r18vd config.json model.safetensors preprocessor_config.json --local-dir $work/cache/hub/PekingU--rtdetr_v2_r18vd" ] ||
  { echo "40-run: unexpected hf calls:" >&2; cat "$HF_STANDIN_LOG" >&2; exit 1; }
[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  { echo "40-run: $png is not a PNG" >&2; exit 1; }
! compgen -G "$work/cache/run-repository.*" >/dev/null || { echo "40-run: the run repository was left behind" >&2; ls "$work/cache" >&2; exit 1; }
expect_gone "$g"
# Again, offline: the cached files serve without any call to hf.
: >"$HF_STANDIN_LOG"
LIBREYOLO_BUILD=0 LIBREYOLO_RUN_ONCE=1 BUILD_DIR=$build LIBREYOLO_HUB_KERNELS=0 \
  LIBREYOLO_HF=$work/bin/hf-offline LIBREYOLO_CACHE=$work/cache \
  timeout 300 bash scripts/run.sh --grpc-address "127.0.0.1:$g" --http-address off \
  >"$work/cached.log" 2>&1 || { echo "40-run: run.sh from the cache failed:" >&2; tail -30 "$work/cached.log" >&2; exit 1; }
expect_in "$work/cached.log" "wrote $png ("
[ ! -s "$HF_STANDIN_LOG" ] || { echo "40-run: hf was called with the files cached:" >&2; cat "$HF_STANDIN_LOG" >&2; exit 1; }
expect_gone "$g"
echo "40-run: the real detector: downloaded once into the cache, served, boxes drawn to $png; served from the cache offline"

# 3. A repository whose only model cannot load: never ready. run.sh gives up after its timeout,
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

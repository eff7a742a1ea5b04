#!/usr/bin/env bash
# Real peers we did not write, against the real daemon on loopback (tests/peers): NVIDIA's
# tritonclient (gRPC and HTTP/REST) and perf_analyzer, grpcio-health-checking, promtool and a
# Prometheus server.
# Usage: scripts/test.d/25-peers.sh [BUILD_DIR]   (default build; needs BUILD_DIR/bin/libreyolo-server)
# Environment: LIBREYOLO_VENV (the venv of scripts/setup.sh), LIBREYOLO_PERF_ANALYZER (default: the
# copy scripts/setup.sh installs), LIBREYOLO_PEERS_KEEP=1 keeps the temporary folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
python=$venv/bin/python
server=$build/bin/libreyolo-server
[ -x "$server" ] || { echo "25-peers: $server is not built" >&2; exit 1; }
[ -x "$python" ] || { echo "25-peers: no virtual environment at $venv (run scripts/setup.sh)" >&2; exit 1; }

work=$(mktemp -d /tmp/libreyolo-peers.XXXXXX)
daemon=
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null || true
  fi
  if [ "${LIBREYOLO_PEERS_KEEP:-0}" = 1 ]; then echo "25-peers: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A model repository with the tiny fixtures: the RT-DETR detector and the ViT classifier.
fixtures=$root/tests/fixtures/models
for m in rtdetr_tiny vit_tiny; do
  mkdir -p "$work/repo/$m/1"
  cp "$fixtures/$m/config.json" "$fixtures/$m/model.safetensors" "$fixtures/$m/preprocessor_config.json" \
    "$work/repo/$m/1/"
done
cat > "$work/repo/rtdetr_tiny/serving.yaml" <<'EOF'
max_batch_size: 8
max_queue_delay_microseconds: 2000
max_queue_size: 64
threshold: 0.5
EOF
cat > "$work/repo/vit_tiny/serving.yaml" <<'EOF'
max_batch_size: 4
EOF

grpc_port=$(free_port)
http_port=$(free_port)
while [ "$http_port" = "$grpc_port" ]; do http_port=$(free_port); done
cat > "$work/server.yaml" <<EOF
server:
  grpc_address: 127.0.0.1:$grpc_port
  http_address: 127.0.0.1:$http_port
  drain_seconds: 0
  preprocess_threads: 2
  log_level: warn
model_repository: $work/repo
device: cpu
# The peers compare with transformers' float32 outputs (tests/fixtures/golden): pin float32, since
# `dtype: auto` picks bfloat16 on CPUs with native bf16 (AVX-512 BF16, AMX).
dtype: float32
kernels:
  hub_kernels: off
EOF

LIBREYOLO_HUB_KERNELS=0 "$server" --config "$work/server.yaml" > "$work/server.log" 2>&1 &
daemon=$!
ready=0
for _ in $(seq 240); do
  if ! kill -0 "$daemon" 2>/dev/null; then break; fi
  if curl -sf -o /dev/null "http://127.0.0.1:$http_port/v2/health/ready"; then ready=1; break; fi
  sleep 0.25
done
if [ "$ready" != 1 ]; then
  echo "25-peers: the daemon did not become ready on 127.0.0.1:$http_port within 60 s; its log:" >&2
  tail -40 "$work/server.log" >&2
  exit 1
fi
echo "25-peers: daemon pid $daemon ready, gRPC 127.0.0.1:$grpc_port, HTTP 127.0.0.1:$http_port"

export LIBREYOLO_PEERS_GRPC=127.0.0.1:$grpc_port
export LIBREYOLO_PEERS_HTTP=127.0.0.1:$http_port
export LIBREYOLO_PEERS_WORK=$work
export LIBREYOLO_SOURCE_DIR=$root
export LIBREYOLO_PEERS_BUILD=$build
status=0
"$python" -m unittest discover -s "$root/tests/peers" -p '*_test.py' -v || status=$?
if ! kill -0 "$daemon" 2>/dev/null; then
  echo "25-peers: the daemon died during the tests; its log:" >&2
  tail -40 "$work/server.log" >&2
  status=1
fi
if [ "$status" != 0 ]; then
  echo "25-peers: FAILED; daemon log tail:" >&2
  tail -20 "$work/server.log" >&2
fi
exit "$status"

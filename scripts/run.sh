#!/usr/bin/env bash
# The main job: builds, starts libreyolo-server on config/server.yaml (the bundled example
# repository: a tiny RT-DETR, D-FINE, ViT and Swin with RANDOM weights), waits until it is ready, sends
# real photographs with the bundled client (detect, classify), shows the resolved kernel slots (/active), then keeps
# serving in the foreground until Ctrl-C (SIGINT drains and exits 0).
#   LIBREYOLO_RUN_ONCE=1 scripts/run.sh   stops the daemon after the demo (for scripted checks)
# Extra arguments go to libreyolo-server (e.g. --grpc-address 127.0.0.1:9001).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
echo "== building (first time: 15-30 min on 2 cores; ccache makes later builds fast)"
# Progress without the compiler's noise; a failed build stops here (pipefail).
bash scripts/build.sh 2>&1 | { grep -E "^\[[0-9]+/[0-9]+\] Linking|error|FAILED" || true; }
grpc=${LIBREYOLO_GRPC_ADDRESS:-127.0.0.1:8001}
http=${LIBREYOLO_HTTP_ADDRESS:-127.0.0.1:8000}
"$build/bin/libreyolo-server" --config config/server.yaml --grpc-address "$grpc" \
  --http-address "$http" "$@" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server' INT TERM
for _ in $(seq 1 120); do
  if "$build/bin/libreyolo-client" health --server "$grpc" --service readiness >/dev/null 2>&1; then break; fi
  if ! kill -0 $server 2>/dev/null; then echo "run: libreyolo-server exited during start-up" >&2; exit 1; fi
  sleep 0.5
done
echo "== detections for tests/fixtures/images/astronaut.jpg (random-weight example model)"
"$build/bin/libreyolo-client" detect --image tests/fixtures/images/astronaut.jpg --server "$grpc" \
  --model rtdetr_tiny --threshold 0.3
echo "== top classes for tests/fixtures/images/coffee.jpg (random-weight ViT)"
"$build/bin/libreyolo-client" classify --image tests/fixtures/images/coffee.jpg --server "$grpc" \
  --model vit_tiny --top-k 3
echo "== kernel slots (GET http://$http/active)"
curl -fsS "http://$http/active" | "${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}/bin/python" -c '
import json, sys
d = json.load(sys.stdin)
for slot, impl in d["active"].items():
    print("  slot", slot, "->", impl)
for m in d["models"]:
    print("  model", m["name"], m["state"], "on", m.get("device", "?"), "cuda_graphs:", m.get("cuda_graphs", "off"))
print("  fallback events:", len(d["fallback_events"]), " tf32:", d["torch"]["tf32"])
'
echo "== serving: gRPC $grpc, HTTP admin http://$http (metrics, active, health). Ctrl-C drains and stops."
if [ "${LIBREYOLO_RUN_ONCE:-0}" = 1 ]; then
  kill -INT $server
fi
wait $server

#!/usr/bin/env bash
# The main job: builds, starts libreyolo-server on config/server.yaml (the bundled example
# repository: tiny detectors, segmenters and classifiers with RANDOM weights), waits until it is ready, sends
# real photographs with the bundled client (detect, classify), shows the resolved kernel slots (/active), then keeps
# serving in the foreground until Ctrl-C (SIGINT drains and exits 0).
#   LIBREYOLO_RUN_ONCE=1 scripts/run.sh   stops the daemon after the demo (for scripted checks)
#   LIBREYOLO_BUILD=0 scripts/run.sh      serves again without building (the binaries of $BUILD_DIR)
#   LIBREYOLO_READY_TIMEOUT=S             seconds to wait for readiness (default 120)
# Extra arguments go to libreyolo-server, e.g. --grpc-address 127.0.0.1:9001 --http-address
# 127.0.0.1:9000 (the demo's client and /active then use those addresses; the last of each wins,
# as in libreyolo-server; --http-address off skips /active). LIBREYOLO_GRPC_ADDRESS and
# LIBREYOLO_HTTP_ADDRESS set them too. The daemon never outlives this script: any failure,
# Ctrl-C or SIGTERM stops it (SIGINT, then SIGKILL after 60 s).
# A real detector beside the random-weight examples: where the Hugging Face Hub is reachable,
# LIBREYOLO_REAL_MODEL (default PekingU/rtdetr_v2_r18vd: RT-DETRv2-R18, COCO, Apache-2.0, 80 MB)
# is downloaded once with `hf download` into $LIBREYOLO_CACHE/hub/ (default
# ~/.cache/libreyolo-server), served with the examples from a repository made for this run (hard
# links, removed at exit), and its detections on the bundled photograph are drawn to a PNG whose
# path is printed. Offline it says so in one line and serves the examples only.
#   LIBREYOLO_REAL_MODEL=        skips it; LIBREYOLO_HF=PATH another `hf` (tests: a stand-in)
#   --model-repository DIR       (an argument) serves DIR alone, without the real detector
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ "${LIBREYOLO_BUILD:-1}" != 0 ]; then
  echo "== building (the first build: about 25 min on 2 cores; ccache makes later builds fast)"
  # Progress without the compiler's noise; a failed build stops here (pipefail).
  bash scripts/build.sh 2>&1 | { grep --line-buffered -E "^\[[0-9]+/[0-9]+\] Linking|error|FAILED" || true; }
elif [ ! -x "$build/bin/libreyolo-server" ] || [ ! -x "$build/bin/libreyolo-client" ]; then
  echo "run: $build/bin/libreyolo-server or libreyolo-client is not built (run without LIBREYOLO_BUILD=0)" >&2
  exit 1
fi
grpc=${LIBREYOLO_GRPC_ADDRESS:-127.0.0.1:8001}
http=${LIBREYOLO_HTTP_ADDRESS:-127.0.0.1:8000}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
real=${LIBREYOLO_REAL_MODEL-PekingU/rtdetr_v2_r18vd}
args=("$@")
daemon_args=()  # the arguments without the address pairs, which are passed once, as resolved
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --grpc-address | --http-address)
      if [ $((i + 1)) -lt ${#args[@]} ]; then
        [ "${args[i]}" = --grpc-address ] && grpc=${args[i + 1]} || http=${args[i + 1]}
        i=$((i + 1))
        continue
      fi
      ;;
    --model-repository) real= ;;  # the operator's repository, as given
  esac
  daemon_args+=("${args[i]}")
done

# The real detector: its three files in the download cache (fetched when missing), then a run
# repository holding the examples and it. Sets real_name and run_repo, or explains in `why`.
cache=${LIBREYOLO_CACHE:-$HOME/.cache/libreyolo-server}
real_files=(config.json model.safetensors preprocessor_config.json)
real_name= run_repo= why=
fetch_real_model() {
  local dl=$cache/hub/${real//\//--} f missing=0
  for f in "${real_files[@]}"; do [ -s "$dl/$f" ] || missing=1; done
  if [ "$missing" = 1 ]; then
    local hf=${LIBREYOLO_HF:-$venv/bin/hf} endpoint=${HF_ENDPOINT:-https://huggingface.co}
    # The real `hf` retries for half a minute when offline: ask the Hub once, briefly, first.
    local err
    if [ -z "${LIBREYOLO_HF:-}" ] &&
      ! err=$(curl -fsS --max-time 10 -o /dev/null "$endpoint/api/models/$real" 2>&1); then
      # curl's own words: a timeout, a name that does not resolve, or an HTTP error status.
      why="$endpoint/api/models/$real: $(echo "$err" | tail -1)"
      return 1
    fi
    mkdir -p "$dl"
    if ! timeout "${LIBREYOLO_DOWNLOAD_TIMEOUT:-900}" "$hf" download "$real" "${real_files[@]}" \
      --local-dir "$dl" >"$dl.log" 2>&1; then
      why="hf download $real failed: $(grep -v '^[[:space:]]*$' "$dl.log" | tail -1)"
      return 1
    fi
    for f in "${real_files[@]}"; do
      [ -s "$dl/$f" ] || { why="hf download $real did not write $f"; return 1; }
    done
  fi
  # The model's name: the repository id's last part, as a plain folder name.
  real_name=$(basename "$real" | tr -c 'A-Za-z0-9_.\n-' '_')
  mkdir -p "$cache"
  run_repo=$(mktemp -d "$cache/run-repository.XXXXXX")
  # The examples' weights are links into tests/fixtures (one copy in the tree): -L follows them,
  # hard-linking the files they name where the file system allows it.
  cp -RlL examples/model_repository/. "$run_repo/" 2>/dev/null ||
    { rm -rf "${run_repo:?}"/*; cp -RL examples/model_repository/. "$run_repo/"; }
  mkdir -p "$run_repo/$real_name/1"
  for f in "${real_files[@]}"; do
    ln "$dl/$f" "$run_repo/$real_name/1/$f" 2>/dev/null || cp "$dl/$f" "$run_repo/$real_name/1/$f"
  done
  printf '%s\n' "# $real, downloaded by scripts/run.sh" "max_batch_size: 4" "threshold: 0.5" \
    >"$run_repo/$real_name/serving.yaml"
}
repo_args=()
if [ -n "$real" ]; then
  if fetch_real_model; then
    repo_args=(--model-repository "$run_repo")
    echo "== a real detector: $real (in $cache/hub), served as $real_name beside the examples"
  else
    real_name=
    echo "== the Hugging Face Hub is not reachable ($why): serving the bundled random-weight models only"
  fi
fi

server=
stop_server() {
  [ -n "$server" ] || return 0
  if kill -0 "$server" 2>/dev/null; then
    kill -INT "$server" 2>/dev/null || true
    for _ in $(seq 1 600); do
      kill -0 "$server" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$server" 2>/dev/null || true
  fi
  wait "$server" 2>/dev/null && stopped_rc=0 || stopped_rc=$?
  server=
}
# Ctrl-C: the daemon drains (it gets the terminal's SIGINT too; the same signal twice within 1 s
# is one stop request) and this script exits with its status, 0 after a clean drain.
stopped_rc=
trap 'stop_server; [ -z "$run_repo" ] || rm -rf "$run_repo"' EXIT
trap 'stop_server; exit "${stopped_rc:-130}"' INT
trap 'stop_server; exit "${stopped_rc:-143}"' TERM

# One-shot: nothing is in flight when the demo ends, so the stop need not wait out the drain
# (server.drain_seconds, 10 s in config/server.yaml); an operator's own --drain-seconds comes later
# on the command line and wins.
once_args=()
[ "${LIBREYOLO_RUN_ONCE:-0}" = 1 ] && once_args=(--drain-seconds 0)
"$build/bin/libreyolo-server" --config config/server.yaml "${repo_args[@]}" --grpc-address "$grpc" \
  --http-address "$http" "${once_args[@]}" "${daemon_args[@]}" &
server=$!
timeout=${LIBREYOLO_READY_TIMEOUT:-120}
ready=0
for _ in $(seq 1 $((timeout * 2))); do
  if "$build/bin/libreyolo-client" health --server "$grpc" --service readiness >/dev/null 2>&1; then
    ready=1
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    wait "$server" && rc=0 || rc=$?
    server=
    echo "run: libreyolo-server exited during start-up (exit $rc)" >&2
    exit 1
  fi
  sleep 0.5
done
if [ "$ready" != 1 ]; then
  echo "run: libreyolo-server is not ready on $grpc after $timeout s; stopping it" >&2
  exit 1
fi
echo "== detections for tests/fixtures/images/astronaut.jpg (random-weight example model)"
"$build/bin/libreyolo-client" detect --image tests/fixtures/images/astronaut.jpg --server "$grpc" \
  --model rtdetr_tiny --threshold 0.3
if [ -n "$real_name" ]; then
  echo "== detections for tests/fixtures/images/astronaut.jpg by $real (real weights)"
  "$build/bin/libreyolo-client" detect --image tests/fixtures/images/astronaut.jpg \
    --server "$grpc" --model "$real_name" --threshold 0.5 --out "$cache/$real_name-astronaut.png"
fi
echo "== top classes for tests/fixtures/images/coffee.jpg (random-weight ViT)"
"$build/bin/libreyolo-client" classify --image tests/fixtures/images/coffee.jpg --server "$grpc" \
  --model vit_tiny --top-k 3
if [ "$http" = off ] || [ "$http" = none ] || [ -z "$http" ]; then
  echo "== HTTP port off: no /active"
else
  echo "== kernel slots (GET http://$http/active)"
  curl -fsS "http://$http/active" | "${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}/bin/python" -c '
import json, sys
d = json.load(sys.stdin)
for slot, impl in d["active"].items():
    print("  slot", slot, "->", impl)
for m in d["models"]:
    print("  model", m["name"], m["state"], "on", m.get("device", "?"), "cuda_graphs:", m.get("cuda_graphs", "off"))
print("  fallback events:", len(d["fallback_events"]), " tf32:", d["torch"]["tf32"])
print("  model_repository:", d["server"]["model_repository"]["value"])
'
fi
if [ "${LIBREYOLO_RUN_ONCE:-0}" = 1 ]; then
  echo "== LIBREYOLO_RUN_ONCE=1: stopping the daemon (--drain-seconds 0: nothing is in flight)"
  kill -INT "$server"
else
  echo "== serving: gRPC $grpc, HTTP http://$http (KServe v2 REST, metrics, active, health). Ctrl-C drains and stops."
fi
wait "$server" && rc=0 || rc=$?
server=
exit $rc

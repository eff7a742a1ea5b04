#!/usr/bin/env bash
# The CPU image for real: builds it from the Dockerfile with podman (scripts/build-image.sh: no
# registry; podman's layers and the host's ccache are kept between runs), runs it on loopback
# with the example repository mounted, and checks from the host: gRPC health SERVING, a detect
# with the bundled client that returns exactly what the host build's daemon returns, /active,
# /metrics, a non-root process, no compiler or venv in the image, and that a stop (SIGTERM, the
# image's STOPSIGNAL) drains and exits 0. Prints the build time and the image size.
#
# Usage: scripts/test.d/40-image.sh [BUILD_DIR]   (default build; the host build to compare with:
#        BUILD_DIR/bin/libreyolo-server and libreyolo-client)
# Environment: LIBREYOLO_IMAGE_TEST=0 skips it (for developers; CI runs it), LIBREYOLO_IMAGE_TAG
# (default libreyolo-server:ci-cpu), LIBREYOLO_IMAGE_BUILD=0 checks the existing image of that tag
# without building, LIBREYOLO_IMAGE_KEEP=1 keeps the temporary folder and the container, and what
# scripts/build-image.sh reads (JOBS, LIBREYOLO_CONTAINERS, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
if [ "${LIBREYOLO_IMAGE_TEST:-1}" = 0 ]; then
  echo "40-image: SKIP (LIBREYOLO_IMAGE_TEST=0)"
  exit 0
fi
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
tag=${LIBREYOLO_IMAGE_TAG:-libreyolo-server:ci-cpu}
client=$build/bin/libreyolo-client
server=$build/bin/libreyolo-server
for exe in "$client" "$server"; do
  [ -x "$exe" ] || { echo "40-image: FAIL $exe is not built"; exit 1; }
done
for tool in podman runc debootstrap curl python3; do
  command -v "$tool" >/dev/null || { echo "40-image: FAIL $tool not found (scripts/setup.sh installs it)"; exit 1; }
done

failures=0
pass() { echo "40-image: PASS $*"; }
fail() { echo "40-image: FAIL $*"; failures=$((failures + 1)); }

echo "40-image: disk before: $(df -h / | awk 'NR==2 {print $4 " free of " $2}')"
start=$(date +%s)
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
if [ "${LIBREYOLO_IMAGE_BUILD:-1}" != 0 ]; then
  # What an interrupted earlier run left (build containers, stage images) goes before this
  # build adds its own; the tagged toolchain and its chain stay (scripts/podman-env.sh).
  libreyolo_podman_prune | sed 's/^/40-image: /'
fi
if [ "${LIBREYOLO_IMAGE_BUILD:-1}" = 0 ]; then
  echo "40-image: LIBREYOLO_IMAGE_BUILD=0: checking the existing $tag, not building it"
else
  # The whole build log goes to a file; the steps, cache hits and timings are shown.
  build_log=$(mktemp /tmp/libreyolo-image-build.XXXXXX.log)
  if ! bash scripts/build-image.sh "$tag" > "$build_log" 2>&1; then
    tail -60 "$build_log" | sed 's/^/40-image:   /'
    echo "40-image: FAIL podman build of $tag (log $build_log)"
    exit 1
  fi
  grep -E '^\[[0-9]/[0-9]\] STEP|^--> Using cache|^build-in-image:|^build-image:|^collect-runtime:|^podman-env:' "$build_log" |
    cut -c1-160 | sed 's/^/40-image:   /'
fi
build_s=$(($(date +%s) - start))
if [ "${LIBREYOLO_IMAGE_BUILD:-1}" != 0 ]; then
  # Keep the builder's toolchain (apt + the torch wheel) named: the prunes remove every image no
  # tagged image is built on, the builder stage included (the runtime stage only copies from
  # it), and the next run would fetch everything again. All cached: seconds.
  # Through build-image.sh: the same build arguments, or the cache would miss.
  bash scripts/build-image.sh "$tag-toolchain" --target builder-cpu > "$build_log" 2>&1 ||
    { tail -20 "$build_log" | sed 's/^/40-image:   /'; echo "40-image: FAIL tagging the toolchain"; exit 1; }
  rm -f "$build_log"
  pass "image $tag built in $build_s s"
fi
podman image exists "$tag" || { echo "40-image: FAIL no image $tag"; exit 1; }

work=$(mktemp -d /tmp/libreyolo-image.XXXXXX)
chmod 0755 "$work"
cname=libreyolo-image-test-$$
host_daemon=
cleanup() {
  if [ -n "$host_daemon" ] && kill -0 "$host_daemon" 2>/dev/null; then
    kill -TERM "$host_daemon" 2>/dev/null || true
    wait "$host_daemon" 2>/dev/null || true
  fi
  if [ "${LIBREYOLO_IMAGE_KEEP:-0}" = 1 ]; then
    echo "40-image: kept $work and container $cname"
  else
    podman rm -f "$cname" >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
  # This build's stage images (COPY . and the compile: 4-5 GB with vfs) and whatever lost its tag
  # (the previous toolchain, replaced) hold full layer copies: only tagged images and their
  # ancestors (the build cache) stay.
  libreyolo_podman_prune | sed 's/^/40-image: /'
  echo "40-image: disk after: $(df -h / | awk 'NR==2 {print $4 " free of " $2}')"
}
trap cleanup EXIT

size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "40-image: image size $((size / 1000000)) MB ($size bytes)"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$tag" | awk "NR <= 4" | cut -c1-120 | sed 's/^/40-image:   layer /'

# The runtime stage: no toolchain, no venv, no LibTorch CUDA side; the programs resolve every
# library (ldd runs the image's own loader).
content=$(podman run --rm --network none --entrypoint /bin/sh "$tag" -c '
  for p in gcc g++ cc c++ cmake ninja python3 pip pip3 nvcc; do command -v "$p" && echo "tool: $p"; done
  for d in /opt/venv /usr/include/c++ /usr/lib/gcc; do [ -e "$d" ] && echo "path: $d"; done
  ls /opt/libreyolo/lib | grep -E "^lib(torch_cuda|c10_cuda|cudnn|cublas|nccl)" | sed "s/^/lib: /"
  for b in /opt/libreyolo/bin/*; do ldd "$b" | grep "not found" | sed "s|^|missing in $b: |"; done
  ls /opt/libreyolo/bin | tr "\n" " "' 2>&1) || true
if echo "$content" | grep -Eq '^(tool|path|lib|missing in [^:]*): '; then
  fail "runtime stage content: $(echo "$content" | grep -E '^(tool|path|lib|missing in [^:]*): ' | tr '\n' ';')"
elif echo "$content" | grep -q 'libreyolo-server' && echo "$content" | grep -q 'libreyolo-client'; then
  pass "runtime stage: no compiler, no venv, no CUDA libraries, every library resolved; programs: $(echo "$content" | tail -1)"
else
  fail "runtime stage: unexpected listing: $content"
fi

# The image's own configuration parses (the container listens on it by default).
if out=$(podman run --rm --network none "$tag" --config /etc/libreyolo/server.yaml --print-config 2>&1) &&
   echo "$out" | grep -q 'grpc_address: 0.0.0.0:8001'; then
  pass "default configuration /etc/libreyolo/server.yaml parses (grpc_address 0.0.0.0:8001)"
else
  fail "--print-config of the default configuration: $(echo "$out" | tail -5)"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ports=()
while [ ${#ports[@]} -lt 4 ]; do
  p=$(free_port)
  case " ${ports[*]} " in *" $p "*) ;; *) ports+=("$p") ;; esac
done
grpc=${ports[0]} http=${ports[1]} host_grpc=${ports[2]} host_http=${ports[3]}
drain=5
write_config() {  # write_config FILE GRPC HTTP REPOSITORY
  cat > "$1" <<EOF
server:
  grpc_address: 127.0.0.1:$2
  http_address: 127.0.0.1:$3
  drain_seconds: $drain
  log_level: info
model_repository: $4
device: cpu
kernels:
  hub_kernels: off
EOF
  chmod 0644 "$1"
}
# The container: host network, but every port on 127.0.0.1 (its configuration mounted over the
# image's default, so that the image's own ENTRYPOINT/CMD start it).
write_config "$work/server.yaml" "$grpc" "$http" /models
write_config "$work/host.yaml" "$host_grpc" "$host_http" "$root/examples/model_repository"
# The examples' weights are relative links into tests/fixtures: mounted at /tests/fixtures, they
# resolve from /models (docs/OPERATIONS.md's command).
podman run -d --name "$cname" --network host \
  -v "$root/examples/model_repository:/models:ro" -v "$root/tests/fixtures:/tests/fixtures:ro" -v "$work/server.yaml:/etc/libreyolo/server.yaml:ro" \
  "$tag" >/dev/null
LIBREYOLO_HUB_KERNELS=0 "$server" --config "$work/host.yaml" > "$work/host.log" 2>&1 &
host_daemon=$!

wait_ready() {  # wait_ready HTTP_PORT WHAT: 0 once /v2/health/ready answers 200 (300 s at most:
  # four models load and warm up on a shared 2-core machine)
  local deadline=$(($(date +%s) + 300))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if curl -sf -o /dev/null "http://127.0.0.1:$1/v2/health/ready"; then return 0; fi
    if [ "$2" = container ] && [ "$(podman inspect --format '{{.State.Running}}' "$cname")" != true ]; then return 1; fi
    if [ "$2" = host ] && ! kill -0 "$host_daemon" 2>/dev/null; then return 1; fi
    sleep 0.25
  done
  return 1
}
if ! wait_ready "$http" container; then
  fail "the container did not become ready on 127.0.0.1:$http within 300 s; its log:"
  podman logs --tail 40 "$cname" 2>&1 | sed 's/^/40-image:   /'
  exit 1
fi
if ! wait_ready "$host_http" host; then
  fail "the host build's daemon did not become ready; its log:"
  tail -20 "$work/host.log" | sed 's/^/40-image:   /'
  exit 1
fi
echo "40-image: container $cname ready, gRPC 127.0.0.1:$grpc, HTTP 127.0.0.1:$http"

# gRPC health (grpc.health.v1) through the bundled client, each service the probes use.
for svc in "" liveness readiness; do
  if out=$("$client" health --server "127.0.0.1:$grpc" --service "$svc" 2>&1) && [ "$out" = SERVING ]; then
    pass "gRPC health service '${svc}': SERVING"
  else
    fail "gRPC health service '${svc}': '$out'"
  fi
done

# The process: the image's ENTRYPOINT is PID 1 of the container; its credentials from the host.
pid=$(podman inspect --format '{{.State.Pid}}' "$cname")
uids=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
gids=$(awk '/^Gid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
comm=$(cat "/proc/$pid/comm")
if [ "$uids" = "10001 10001 10001 10001" ] && [ "$gids" = "10001 10001 10001 10001" ] && [ "$comm" = libreyolo-serve ]; then
  pass "host pid $pid ($comm) runs as uid/gid 10001 (real, effective, saved, fs)"
else
  fail "host pid $pid ($comm): Uid $uids, Gid $gids (want 10001 everywhere, libreyolo-server)"
fi

# One detect, container vs the host build on the same photograph: the same text, box for box.
image=$root/tests/fixtures/images/astronaut.jpg
detect() { "$client" detect --image "$image" --server "127.0.0.1:$1" --model rtdetr_tiny --threshold 0.2 2>&1; }
# The first call of a fresh channel may find a loaded 2-core machine slow to send the HTTP/2
# SETTINGS frame (UNAVAILABLE before the request is sent); /metrics below counts what arrived.
first_detect() { detect "$1" || { sleep 1; detect "$1"; }; }
if in_image=$(first_detect "$grpc") && on_host=$(first_detect "$host_grpc"); then
  n=$(echo "$in_image" | sed -n '1s/.*: \([0-9]*\) detections.*/\1/p')
  if [ "$in_image" = "$on_host" ] && [ "${n:-0}" -gt 0 ]; then
    pass "detect rtdetr_tiny: $n boxes, identical to the host build's ($(echo "$in_image" | sed -n 2p | tr -s ' '))"
  else
    fail "detect rtdetr_tiny: image and host differ (or no boxes):"
    diff <(echo "$in_image") <(echo "$on_host") | awk "NR <= 20" | sed 's/^/40-image:   /'
  fi
else
  fail "detect: image: $in_image / host: $on_host"
fi

# /active: the served models and the configuration in effect.
if active=$(curl -sf "http://127.0.0.1:$http/active") &&
   summary=$(echo "$active" | python3 -c '
import json, sys
a = json.load(sys.stdin)
models = sorted((m["name"], m["state"], m["device"]) for m in a["models"])
want = [(n, "READY", "cpu") for n in ("conditional_detr_tiny", "dab_detr_tiny", "deimv2_tiny", "deit_tiny", "detr_panoptic_tiny", "detr_tiny_timm", "dfine_tiny", "grounding_dino_tiny", "lw_detr_tiny", "mm_grounding_dino_tiny", "omdet_turbo_tiny", "owlv2_tiny", "owlvit_tiny", "pp_doclayout_v2_tiny", "pp_doclayout_v3_tiny", "rf_detr_seg_tiny", "rf_detr_tiny", "rtdetr_tiny", "swin_tiny", "table_transformer_tiny", "vit_tiny", "yolos_tiny")]
assert models == want, models
assert a["ready"] is True and a["draining"] is False, (a["ready"], a["draining"])
assert a["server"]["grpc_address"]["value"] == sys.argv[1], a["server"]["grpc_address"]
assert a["server"]["grpc_address"]["origin"].startswith("/etc/libreyolo/server.yaml:"), a["server"]["grpc_address"]
print("models", " ".join(m[0] for m in models), "READY on cpu;", len(a["slots"]), "kernel slots; ready, not draining")
' "127.0.0.1:$grpc" 2>&1); then
  pass "/active: $summary"
else
  fail "/active: ${summary:-no answer}"
fi

# /metrics: Prometheus text with the one detect counted.
if metrics=$(curl -sf "http://127.0.0.1:$http/metrics") &&
   line=$(echo "$metrics" | grep -E '^libreyolo_inference_requests_total\{code="OK",model="rtdetr_tiny",version="1"\} 1$'); then
  pass "/metrics: $(echo "$metrics" | grep -c '^libreyolo_') libreyolo_ samples; $line"
else
  fail "/metrics: no libreyolo_inference_requests_total{model=\"rtdetr_tiny\"} 1 sample: $(echo "${metrics:-}" | grep '^libreyolo_inference_requests_total' | awk "NR <= 5")"
fi

# Stop as an orchestrator does (podman stop: the image's STOPSIGNAL, SIGTERM): readiness turns
# NOT_SERVING at once, requests are still served for drain_seconds, then the process exits 0.
t0=$(date +%s.%N)
podman stop --time 60 "$cname" >/dev/null 2>&1 &
stopper=$!
seen="" during=""
while kill -0 "$stopper" 2>/dev/null; do
  seen=$("$client" health --server "127.0.0.1:$grpc" --service readiness 2>&1 || true)
  if [ "$seen" = NOT_SERVING ]; then
    during=$(detect "$grpc" || true)
    break
  fi
  sleep 0.05
done
wait "$stopper" || true
t1=$(date +%s.%N)
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$cname")
took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
drained=$(podman logs "$cname" 2>&1 | grep -c "draining for $drain" || true)
# Only a lower bound on the time: podman's own stop takes seconds more on a loaded machine.
if [ "$seen" = NOT_SERVING ] && [ "$during" = "$in_image" ] && [ "$exit_code" = 0 ] && [ "$drained" = 1 ] &&
   python3 -c "import sys; sys.exit(0 if $t1 - $t0 >= $drain else 1)"; then
  pass "SIGTERM: readiness NOT_SERVING, a detect still served during the drain, exit 0 after $took s (drain_seconds $drain)"
else
  fail "SIGTERM: readiness '$seen', detect during drain $([ "$during" = "$in_image" ] && echo ok || echo "'$during'"), 'draining for $drain' logged $drained times, exit code $exit_code after $took s"
  podman logs --tail 20 "$cname" 2>&1 | sed 's/^/40-image:   /'
fi

if [ "$failures" -gt 0 ]; then
  echo "40-image: FAILED ($failures checks)"
  exit 1
fi
echo "40-image: all checks passed (build $build_s s, image $((size / 1000000)) MB)"

#!/usr/bin/env bash
# Memory soak: does libreyolo-server's resident memory grow without bound under load?
# Starts the daemon on 127.0.0.1 (free ports, the tiny RT-DETR of tests/fixtures), drives it with
# the project's load generator (libreyolo-bench, closed loop) in steps of SOAK_STEP seconds, and
# samples VmRSS from /proc/<pid>/status every SOAK_SAMPLE seconds. Stops by itself after
# SOAK_SECONDS or once SOAK_MAX_REQUESTS requests completed, whichever comes first, and prints a
# summary: RSS after the first step, at half time and at the end, the peak, the growth over the
# second half (median RSS of its last half minus that of its first half) and its slope (least
# squares, MB per hour).
#
#   scripts/soak.sh [BUILD_DIR]                  (default build)
# Environment (defaults): SOAK_SECONDS=3600 SOAK_CONCURRENCY=64 SOAK_MAX_REQUESTS=100000000
#   SOAK_STEP=60 SOAK_SAMPLE=5 SOAK_MODEL=rtdetr_tiny (a folder of tests/fixtures/models)
#   SOAK_IMAGE=tests/fixtures/images/astronaut.jpg SOAK_OUT=(a new /tmp folder: rss.csv,
#   steps.csv, server.log, summary.md) SOAK_MAX_GROWTH_MB (unset: report only; set: exit 1 when
#   the second half grew more than this) SOAK_IDLE=30 (seconds without load before the last RSS
#   sample) SOAK_MAX_IDLE_MB (unset: report only; set: exit 1 above it) SOAK_SERVING_YAML (the model's serving.yaml; default
#   "warmup: false"). MALLOC_ARENA_MAX and the like reach the daemon unchanged.
# Exit: 0 done (and within SOAK_MAX_GROWTH_MB), 1 the bound was exceeded or the daemon died, 2 setup.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
seconds=${SOAK_SECONDS:-3600}
concurrency=${SOAK_CONCURRENCY:-64}
max_requests=${SOAK_MAX_REQUESTS:-100000000}
step=${SOAK_STEP:-60}
sample=${SOAK_SAMPLE:-5}
model=${SOAK_MODEL:-rtdetr_tiny}
image=${SOAK_IMAGE:-$root/tests/fixtures/images/astronaut.jpg}
out=${SOAK_OUT:-$(mktemp -d /tmp/libreyolo-soak.XXXXXX)}
server_bin=$build/bin/libreyolo-server
bench_bin=$build/bin/libreyolo-bench
for b in "$server_bin" "$bench_bin"; do
  [ -x "$b" ] || { echo "soak: $b is not built" >&2; exit 2; }
done
mkdir -p "$out/repo/$model/1"
cp "$root/tests/fixtures/models/$model/"{config.json,model.safetensors,preprocessor_config.json} \
  "$out/repo/$model/1/"
printf '%s\n' "${SOAK_SERVING_YAML:-warmup: false}" >"$out/repo/$model/serving.yaml"
free_port() {
  "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
gport=$(free_port)
cat >"$out/server.yaml" <<EOF
server:
  grpc_address: 127.0.0.1:$gport
  http_address: "off"
  drain_seconds: 0
  log_level: warn
model_repository: $out/repo
device: cpu
kernels:
  hub_kernels: off
EOF

daemon=
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null || true
  fi
}
trap cleanup EXIT

"$server_bin" --config "$out/server.yaml" >"$out/server.log" 2>&1 &
daemon=$!
for _ in $(seq 240); do
  "$build/bin/libreyolo-client" health --server "127.0.0.1:$gport" --service readiness >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { echo "soak: the daemon exited during start-up:" >&2; cat "$out/server.log" >&2; exit 2; }
  sleep 0.5
done
t0=$(date +%s)
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$daemon/status" 2>/dev/null || echo 0; }
echo "t_s,rss_kb,threads" >"$out/rss.csv"
(
  while kill -0 "$daemon" 2>/dev/null; do
    echo "$(($(date +%s) - t0)),$(rss_kb),$(ls "/proc/$daemon/task" 2>/dev/null | wc -l)" >>"$out/rss.csv"
    sleep "$sample"
  done
) &
sampler=$!
echo "soak: daemon pid $daemon on 127.0.0.1:$gport, $model, concurrency $concurrency, up to $seconds s or $max_requests requests; output $out"
echo "t_s,ok,errors,requests_per_s,p50_ms,p99_ms,rss_mb" >"$out/steps.csv"
done_requests=0
errors_total=0
while :; do
  now=$(($(date +%s) - t0))
  left=$((seconds - now))
  [ "$left" -gt 0 ] && [ "$done_requests" -lt "$max_requests" ] || break
  d=$((left < step ? left : step))
  [ "$d" -ge 1 ] || break
  if ! "$bench_bin" --server "127.0.0.1:$gport" --model "$model" --image "$image" \
    --concurrency "$concurrency" --duration "$d" --warmup 0 --timeout 120 \
    --csv "$out/step.csv" >"$out/step.txt" 2>&1; then
    echo "soak: libreyolo-bench failed:" >&2; cat "$out/step.txt" >&2
    kill -0 "$daemon" 2>/dev/null || { echo "soak: the daemon died" >&2; tail -20 "$out/server.log" >&2; exit 1; }
    exit 1
  fi
  # mode,load,batch,window_s,ok,errors,dropped,inferences_per_s,requests_per_s,p50_ms,p90_ms,p99_ms,...
  IFS=, read -r _ _ _ _ ok errs _ _ rps p50 _ p99 _ < <(sed -n 2p "$out/step.csv")
  done_requests=$((done_requests + ok))
  errors_total=$((errors_total + errs))
  echo "$(($(date +%s) - t0)),$ok,$errs,$rps,$p50,$p99,$(($(rss_kb) / 1024))" >>"$out/steps.csv"
done
kill -0 "$daemon" 2>/dev/null || { echo "soak: the daemon died" >&2; exit 1; }
echo "$(($(date +%s) - t0)),$(rss_kb),$(ls "/proc/$daemon/task" | wc -l)" >>"$out/rss.csv"
kill "$sampler" 2>/dev/null || true
sampler=
# Idle: what the daemon keeps once the load is gone (freed memory returned to the kernel or not).
idle=${SOAK_IDLE:-30}
sleep "$idle"
idle_mb=$(($(rss_kb) / 1024))
echo "soak: RSS $idle_mb MB after $idle s without load"

# Summary over the samples taken after the first step (start-up and the first allocations).
"$venv/bin/python" - "$out" "$done_requests" "$errors_total" "$concurrency" "$step" "${SOAK_MAX_GROWTH_MB:-}" "$idle_mb" "${SOAK_MAX_IDLE_MB:-}" <<'PY'
import csv, sys
out, requests, errors, conc, step, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), sys.argv[6]
idle_mb, idle_bound = int(sys.argv[7]), sys.argv[8]
rows = [(float(r["t_s"]), int(r["rss_kb"]) / 1024) for r in csv.DictReader(open(f"{out}/rss.csv")) if int(r["rss_kb"]) > 0]
threads = max(int(r["threads"]) for r in csv.DictReader(open(f"{out}/rss.csv")))
end = rows[-1][0]
after = [r for r in rows if r[0] >= min(step, end / 2)] or rows
half = [r for r in rows if r[0] >= end / 2] or rows[-1:]
def slope(pts):
    if len(pts) < 2: return 0.0
    n = len(pts); mx = sum(t for t, _ in pts) / n; my = sum(v for _, v in pts) / n
    den = sum((t - mx) ** 2 for t, _ in pts)
    return 0.0 if den == 0 else sum((t - mx) * (v - my) for t, v in pts) / den * 3600
# Growth over the second half: the median RSS of its last half minus that of its first half
# (medians: a sample during a burst of allocations is not a trend).
def median(v):
    v = sorted(v); return v[len(v) // 2] if v else 0.0
q3 = [v for t, v in half if t < end * 0.75] or [half[0][1]]
q4 = [v for t, v in half if t >= end * 0.75] or [half[-1][1]]
growth = median(q4) - median(q3)
text = (f"| {end/60:.1f} min | {conc} | {requests} | {errors} | {after[0][1]:.0f} | {half[0][1]:.0f} | "
        f"{rows[-1][1]:.0f} | {max(v for _, v in rows):.0f} | {growth:+.1f} | {slope(half):+.1f} | {threads} | {idle_mb} |")
header = ("| ran | concurrency | requests OK | errors | RSS after first step (MB) | RSS at half time (MB) | "
          "RSS at end (MB) | peak (MB) | second-half growth (MB) | second-half slope (MB/h) | most threads | "
          "RSS idle after (MB) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
open(f"{out}/summary.md", "w").write(header + "\n" + text + "\n")
print(header); print(text)
failed = False
if bound and growth > float(bound):
    print(f"soak: RSS grew {growth:.1f} MB in the second half, above the bound of {bound} MB")
    failed = True
if idle_bound and idle_mb > float(idle_bound):
    print(f"soak: RSS {idle_mb} MB without load, above the bound of {idle_bound} MB")
    failed = True
sys.exit(1 if failed else 0)
PY

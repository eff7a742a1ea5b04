#!/usr/bin/env bash
# Memory soak: does libreyolo-server's resident memory grow without bound under load?
# Starts the daemon on 127.0.0.1 (free ports, the tiny RT-DETR of tests/fixtures), drives it with
# closed-loop load and samples VmRSS from /proc/<pid>/status every SOAK_SAMPLE seconds. Stops by
# itself after SOAK_SECONDS (or, SOAK_MODE=grpc, once SOAK_MAX_REQUESTS requests completed) and
# prints a summary: RSS after the first step, at half time and at the end, the peak, the growth
# over the second half (median RSS of its last half minus that of its first half), its slope
# (least squares, MB per hour) and the growth from SOAK_GROWTH_FROM to the end (median RSS of the
# minute after it against that of the last minute, in %).
# The binaries are copied to SOAK_OUT/bin and SOAK_OUT/lib first (a rebuild of BUILD_DIR during
# the run does not change them); the daemon and the load run under `nice -n SOAK_NICE`.
#
# SOAK_MODE=grpc (default): the project's load generator, libreyolo-bench (JPEG over plain-text
#   gRPC), in steps of SOAK_STEP seconds.
# SOAK_MODE=mixed: TLS on both ports (a test CA, server and client certificates made with openssl
#   in SOAK_OUT/tls; mutual TLS), HTTP on, and tools/soak_load.py for the whole run: the
#   concurrency split evenly across JPEG over gRPC, pixel_values as REST JSON, pixel_values in the
#   REST binary tensor extension and pixel_values in system shared memory (registered over gRPC
#   from loopback); errors counted per kind (load.json) and per step (steps.csv).
#
#   scripts/soak.sh [BUILD_DIR]                  (default build)
# Environment (defaults): SOAK_MODE=grpc SOAK_SECONDS=3600 SOAK_CONCURRENCY=64
#   SOAK_MAX_REQUESTS=100000000 (grpc mode) SOAK_STEP=60 SOAK_SAMPLE=5 SOAK_MODEL=rtdetr_tiny (a
#   folder of tests/fixtures/models) SOAK_IMAGE=tests/fixtures/images/astronaut.jpg SOAK_NICE=10
#   SOAK_OUT=(a new /tmp folder: rss.csv, steps.csv, server.log, summary.md; mixed: load.json,
#   tls/) SOAK_MAX_GROWTH_MB (unset: report only; set: exit 1 when the second half grew more than
#   this) SOAK_GROWTH_FROM=1200 (seconds; a third of the run when the run is shorter than 1.5x it)
#   SOAK_MAX_GROWTH_PCT (mixed default 5, grpc unset: exit 1 when the growth from SOAK_GROWTH_FROM
#   is at or above it) SOAK_IDLE=30 (seconds without load before the last RSS sample)
#   SOAK_MAX_IDLE_MB (unset: report only; set: exit 1 above it) SOAK_SERVING_YAML (the model's
#   serving.yaml; default "warmup: false"). MALLOC_ARENA_MAX and the like reach the daemon
#   unchanged.
# Exit: 0 done (within the bounds set, and mixed: no error of any kind), 1 a bound was exceeded, an
#   error was counted or the daemon died, 2 setup.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-ca.sh
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
mode=${SOAK_MODE:-grpc}
nice_n=${SOAK_NICE:-10}
growth_from=${SOAK_GROWTH_FROM:-1200}
max_growth_pct=${SOAK_MAX_GROWTH_PCT:-}
case $mode in
  grpc) ;;
  mixed) max_growth_pct=${max_growth_pct:-5} ;;
  *) echo "soak: SOAK_MODE is grpc or mixed, not $mode" >&2; exit 2 ;;
esac
out=${SOAK_OUT:-$(mktemp -d /tmp/libreyolo-soak.XXXXXX)}
mkdir -p "$out"
for b in libreyolo-server libreyolo-bench libreyolo-client; do
  [ -x "$build/bin/$b" ] || { echo "soak: $build/bin/$b is not built" >&2; exit 2; }
done
# Copies: others may rebuild BUILD_DIR during an hour-long run. RUNPATH $ORIGIN/../lib finds lib/.
mkdir -p "$out/bin" "$out/lib"
cp "$build/bin/"{libreyolo-server,libreyolo-bench,libreyolo-client} "$out/bin/"
cp -P "$build/lib/"*.so* "$out/lib/"
server_bin=$out/bin/libreyolo-server
bench_bin=$out/bin/libreyolo-bench
client_bin=$out/bin/libreyolo-client
mkdir -p "$out/repo/$model/1"
cp "$root/tests/fixtures/models/$model/"{config.json,model.safetensors,preprocessor_config.json} \
  "$out/repo/$model/1/"
printf '%s\n' "${SOAK_SERVING_YAML:-warmup: false}" >"$out/repo/$model/serving.yaml"
free_port() {
  "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
gport=$(free_port)
http_address='"off"'
tls_yaml=
client_tls=()
if [ "$mode" = mixed ]; then
  hport=$(free_port)
  http_address=127.0.0.1:$hport
  # A test CA, the daemon's certificate (localhost, 127.0.0.1) and a client certificate.
  t=$out/tls
  make_test_ca "$t" soak
  tls_yaml="  tls:
    cert_file: tls/server.crt
    key_file: tls/server.key
    client_ca_file: tls/ca.crt"
  client_tls=(--tls-ca "$t/ca.crt" --tls-cert "$t/client.crt" --tls-key "$t/client.key")
fi
cat >"$out/server.yaml" <<EOF
server:
  grpc_address: 127.0.0.1:$gport
  http_address: $http_address
  drain_seconds: 0
  log_level: warn
$tls_yaml
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

nice -n "$nice_n" "$server_bin" --config "$out/server.yaml" >"$out/server.log" 2>&1 &
daemon=$!
ready=
for _ in $(seq 240); do
  "$client_bin" health --server "127.0.0.1:$gport" --service readiness "${client_tls[@]}" >/dev/null 2>&1 &&
    { ready=1; break; }
  kill -0 "$daemon" 2>/dev/null || { echo "soak: the daemon exited during start-up:" >&2; cat "$out/server.log" >&2; exit 2; }
  sleep 0.5
done
[ -n "$ready" ] || { echo "soak: the daemon did not turn ready in 120 s" >&2; exit 2; }
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
done_requests=0
errors_total=0
if [ "$mode" = mixed ]; then
  echo "soak: daemon pid $daemon on 127.0.0.1:$gport (gRPC) and :$hport (HTTP), mutual TLS, $model, mixed load at concurrency $concurrency for $seconds s; output $out"
  # soak_load.py exits 1 when it counted errors: they are reported below, not fatal here.
  rc=0
  nice -n "$nice_n" "$venv/bin/python" "$root/tools/soak_load.py" --grpc "127.0.0.1:$gport" \
    --http "127.0.0.1:$hport" --model "$model" --image "$image" --concurrency "$concurrency" \
    --duration "$seconds" --step "$step" --timeout 120 --ca "$t/ca.crt" --cert "$t/client.crt" \
    --key "$t/client.key" --csv "$out/steps.csv" --json "$out/load.json" >"$out/load.txt" 2>&1 || rc=$?
  [ "$rc" -le 1 ] || { echo "soak: soak_load.py failed ($rc):" >&2; tail -20 "$out/load.txt" >&2; exit 1; }
  read -r done_requests errors_total < <("$venv/bin/python" -c '
import json, sys; k = json.load(open(sys.argv[1]))["kinds"].values()
print(sum(v["ok"] for v in k), sum(v["errors"] for v in k))' "$out/load.json")
else
echo "soak: daemon pid $daemon on 127.0.0.1:$gport, $model, concurrency $concurrency, up to $seconds s or $max_requests requests; output $out"
echo "t_s,ok,errors,requests_per_s,p50_ms,p99_ms,rss_mb" >"$out/steps.csv"
while :; do
  now=$(($(date +%s) - t0))
  left=$((seconds - now))
  [ "$left" -gt 0 ] && [ "$done_requests" -lt "$max_requests" ] || break
  d=$((left < step ? left : step))
  [ "$d" -ge 1 ] || break
  if ! nice -n "$nice_n" "$bench_bin" --server "127.0.0.1:$gport" --model "$model" --image "$image" \
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
fi
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
"$venv/bin/python" - "$out" "$done_requests" "$errors_total" "$concurrency" "$step" "${SOAK_MAX_GROWTH_MB:-}" "$idle_mb" "${SOAK_MAX_IDLE_MB:-}" "$growth_from" "$max_growth_pct" "$mode" <<'PY'
import csv, json, os, sys
out, requests, errors, conc, step, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), sys.argv[6]
idle_mb, idle_bound = int(sys.argv[7]), sys.argv[8]
growth_from, pct_bound, mode = float(sys.argv[9]), sys.argv[10], sys.argv[11]
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
# RSS each minute (the sample nearest to it) and the growth from growth_from to the end: the
# median of the minute after growth_from against the median of the last minute.
if end < 1.5 * growth_from:
    growth_from = end / 3
minutes = ""
if end >= 60:
    minutes = "| minute | " + " | ".join(str(m) for m in range(1, int(end // 60) + 1)) + " |\n"
    minutes += "|---|" + "---|" * int(end // 60) + "\n| RSS (MB) | " + " | ".join(
        f"{min(rows, key=lambda r: abs(r[0] - 60 * m))[1]:.0f}" for m in range(1, int(end // 60) + 1)) + " |\n"
a = median([v for t, v in rows if growth_from <= t < growth_from + 60]) or rows[0][1]
b = median([v for t, v in rows if t >= end - 60]) or rows[-1][1]
growth_pct = (b - a) / a * 100
growth_line = (f"RSS from {growth_from / 60:.1f} min to the end ({end / 60:.1f} min), medians of a minute: "
               f"{a:.0f} MB -> {b:.0f} MB, {growth_pct:+.1f}%")
kinds = ""
if os.path.exists(f"{out}/load.json"):
    load = json.load(open(f"{out}/load.json"))
    kinds = ("| kind | workers | requests OK | errors | errors by message |\n|---|---|---|---|---|\n" +
             "".join(f"| {k} | {v['workers']} | {v['ok']} | {v['errors']} | "
                     f"{'; '.join(f'{m} x{n}' for m, n in v['errors_by_message'].items()) or '-'} |\n"
                     for k, v in load["kinds"].items()))
open(f"{out}/summary.md", "w").write(header + "\n" + text + "\n\n" + growth_line + "\n\n" + minutes +
                                     ("\n" + kinds if kinds else ""))
print(header); print(text); print(growth_line); print(minutes); print(kinds)
failed = False
if pct_bound and growth_pct >= float(pct_bound):
    print(f"soak: RSS grew {growth_pct:.1f}% from {growth_from / 60:.1f} min to the end, at or above {pct_bound}%")
    failed = True
if mode == "mixed" and errors:
    print(f"soak: {errors} requests failed (load.json)")
    failed = True
if bound and growth > float(bound):
    print(f"soak: RSS grew {growth:.1f} MB in the second half, above the bound of {bound} MB")
    failed = True
if idle_bound and idle_mb > float(idle_bound):
    print(f"soak: RSS {idle_mb} MB without load, above the bound of {idle_bound} MB")
    failed = True
sys.exit(1 if failed else 0)
PY

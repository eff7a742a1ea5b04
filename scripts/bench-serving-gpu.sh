#!/usr/bin/env bash
# Serving overhead on the GPU machine: libreyolo-server with device cuda and
# max_batch_size MAX_BATCH (default 8) serving a full-size random-weight RT-DETR-R50, loaded by
# libreyolo-bench, against the same model's forward-only throughput at batch MAX_BATCH
# (libreyolo-bench-models) in the same run. Targets: serving throughput >= 0.90 x forward-only
# for pixel_values and for JPEG images decoded by the daemon (MAX_BATCH 32/64).
#
# Run from the repository root ON the GPU machine, after the project is built in build-gpu
# (scripts/test-gpu.sh does that; the three binaries are built here when missing):
#   scripts/bench-serving-gpu.sh [CHECKPOINTS]
# CHECKPOINTS holds rtdetr_r50vd/ written by tools/bench_models/make_random_checkpoint.py (default
# $CKPT_DIR or $CKPT, else /tmp/ckpt; written there when missing). Environment: BIN (default build-gpu/bin),
# OUT (default ./bench-serving-out), DURATION / WARMUP seconds per step (10 / 3), CONCURRENCY
# (1,2,4,8,16,32,64), MODEL (rtdetr_r50vd), DEVICE (cuda; cpu only to try the script itself),
# FORWARD (images/s: skips the forward-only measurement and uses this number instead; measured,
# it is batch / the mean forward time, since 2026-12-07; before, batch / the median), DTYPE
# (float32; or bfloat16/float16), CUDA_GRAPHS (off; on: serving.yaml cuda_graphs and
# libreyolo-bench-models --cuda-graph), SHM (empty; a comma list of system,cuda: also serve the
# batch-8 pixel_values from a registered shared-memory region, libreyolo-bench --shm KIND, the
# the target: served >= 0.90 x forward-only), INSTANCE_GROUP (empty; a serving.yaml
# instance_group value in flow style, e.g. "[{count: 1, kind: KIND_GPU}]": one instance per GPU,
# what scripts/bench-instances-gpu.sh runs), B8_CONCURRENCY (1,2,4,8: the batch-MAX_BATCH
# pixel_values steps, one request = MAX_BATCH images, and the SHM steps; none skips them),
# JPEG_CONCURRENCY (CONCURRENCY: the one-JPEG-per-request steps; the batcher groups them up to
# MAX_BATCH), SKIP_B1 (0; 1 skips the batch-1 pixel_values steps), MAX_CONCURRENT_RPCS (256:
# server.max_concurrent_rpcs; the JPEG steps need more in flight than 2 instances x
# max_batch_size), QUEUE_DELAY_US (empty: the daemon's default max_queue_delay_microseconds, 0;
# the runs before 2026-12-06 set 2000), REFILL_WAIT_FRACTION (empty: the daemon's default; 0
# turns the batcher's refill wait off, Triton's behaviour), GPU_IMAGE_DECODE (empty: the daemon's default,
# auto, on for a bfloat16/float16 CUDA model; on / off: server.gpu_image_decode), SIZE (empty: 640;
# the forward-only side's --size, which must be the size the model's processor resizes to, e.g.
# 384 for RF-DETR nano), ROUNDS (1; N > 1 alternates N forward-only measurements with N served
# windows, batch-MAX_BATCH pixel_values at B8_CONCURRENCY then JPEG, while the daemon stays up;
# the JPEG ratio is the median of the N pairs: for a VM whose speed drifts between minutes),
# FORWARD_ITERS (30: timed forwards per measurement).
# Both sides run with TF32 off (the daemon's `tf32: off`).
# Writes to $OUT: summary.txt, forward_only.log, serving_*.{csv,json,log}, server.log,
# bench_serving_gpu.json (everything together, with the ratio); with ROUNDS > 1 also
# forward_only_rN.log, serving_{round_pixel_values_bB,images_b1}_rN.*, rounds.txt. Results of an
# earlier run in $OUT are removed first.
# Exit status: 0 when every measurement ran (whether or not the target is met; summary.txt says),
# 1 when something could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ckpt=${1:-${CKPT_DIR:-${CKPT:-/tmp/ckpt}}}
model=${MODEL:-rtdetr_r50vd}
bin=${BIN:-build-gpu/bin}
OUT=${OUT:-$root/bench-serving-out}
duration=${DURATION:-10}
warmup=${WARMUP:-3}
concurrency=${CONCURRENCY:-1,2,4,8,16,32,64}
device=${DEVICE:-cuda}
dtype=${DTYPE:-float32}
max_batch=${MAX_BATCH:-8}
case $max_batch in '' | *[!0-9]*) echo "bench-serving-gpu: MAX_BATCH must be a positive integer" >&2; exit 2 ;; esac
graphs=${CUDA_GRAPHS:-off}
graph_flag=
[ "$graphs" = on ] && graph_flag=--cuda-graph
mkdir -p "$OUT"
rm -f "$OUT"/serving_*.json "$OUT"/serving_*.csv "$OUT"/serving_*.log "$OUT/rounds.txt" "$OUT"/forward_only*.log
summary=$OUT/summary.txt
: >"$summary"
note() { echo "bench-serving-gpu: $*" | tee -a "$summary"; }
die() { note "FAIL: $*"; exit 1; }

if [ -f .device-kit/env.sh ]; then
  # shellcheck disable=SC1091
  source .device-kit/env.sh >/dev/null 2>&1 || note "warning: sourcing .device-kit/env.sh failed"
else
  note "warning: .device-kit/env.sh not found; using the current environment"
fi
export LIBREYOLO_HUB_KERNELS=0  # the GPU machine has no network
python=$(command -v python3 || true)
note "date $(date -u +%FT%TZ), gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

# --- binaries ----------------------------------------------------------------------------------
need=(libreyolo-server libreyolo-bench libreyolo-bench-models)
missing=()
for b in "${need[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ -f "$(dirname "$bin")/build.ninja" ] || die "$bin lacks ${missing[*]} and $(dirname "$bin") is not a configured build folder (run scripts/test-gpu.sh first)"
  note "building ${missing[*]} in $(dirname "$bin")"
  timeout 1800 ninja -C "$(dirname "$bin")" "${missing[@]}" >"$OUT/build.log" 2>&1 ||
    die "building ${missing[*]} failed (tail of $OUT/build.log: $(tail -3 "$OUT/build.log" | tr '\n' ' '))"
fi

# --- checkpoint ----------------------------------------------------------------------------------
if [ ! -f "$ckpt/$model/model.safetensors" ]; then
  [ -n "$python" ] || die "no $ckpt/$model and no python3 to write it"
  note "writing random checkpoints to $ckpt (tools/bench_models/make_random_checkpoint.py)"
  timeout 900 "$python" tools/bench_models/make_random_checkpoint.py "$ckpt" >"$OUT/checkpoint.log" 2>&1 ||
    die "make_random_checkpoint.py failed: $(tail -3 "$OUT/checkpoint.log" | tr '\n' ' ')"
fi
[ -f "$ckpt/$model/config.json" ] || die "$ckpt/$model/config.json missing"

# --- forward only, batch MAX_BATCH ---------------------------------------------------------------
# measure_forward LOG: libreyolo-bench-models at batch MAX_BATCH into $OUT/LOG; sets `forward`
# (images/s). Run before the daemon starts (the GPU is the benchmark's alone) or, with ROUNDS > 1,
# between served windows while the daemon idles.
measure_forward() {
  local log=$OUT/$1
  timeout 600 "$bin/libreyolo-bench-models" --model "$ckpt/$model" --device "$device" --batch "$max_batch" \
    --dtype "$dtype" $graph_flag ${SIZE:+--size "$SIZE"} --iters "${FORWARD_ITERS:-30}" --warmup 5 >"$log" 2>&1 ||
    die "libreyolo-bench-models failed: $(tail -3 "$log" | tr '\n' ' ')"
  # batch / mean forward time: what back-to-back forwards deliver, as a served window's images
  # over its wall time does (batch / median overstates it where forwards spread, on a VM's CPU).
  local mean
  mean=$(sed -n "s/.*batch=$max_batch .*mean_ms=\([0-9.eE+-]*\).*/\1/p" "$log" | tail -1)
  [ -n "$mean" ] || die "no mean_ms for batch=$max_batch in $log"
  forward=$(awk "BEGIN{printf \"%.4f\", 1000 * $max_batch / $mean}")
}
rounds=${ROUNDS:-1}
case $rounds in '' | *[!0-9]*) echo "bench-serving-gpu: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
rounds=$((10#$rounds))
[ "$rounds" -ge 1 ] || { echo "bench-serving-gpu: ROUNDS must be a positive integer" >&2; exit 2; }
if [ -n "${FORWARD:-}" ]; then
  forward=$FORWARD
  note "forward only batch $max_batch: $forward images/s (given as FORWARD, not measured)"
else
  note "forward only: $bin/libreyolo-bench-models --model $ckpt/$model --device $device --batch $max_batch"
  measure_forward forward_only.log
  note "forward only batch $max_batch: $forward images/s from the mean forward ($(grep "batch=$max_batch " "$OUT/forward_only.log" | tail -1))"
fi
forward0=$forward  # the steps outside ROUNDS compare with this one (the rounds overwrite `forward`)

# --- the daemon ----------------------------------------------------------------------------------
work=$(mktemp -d /tmp/bench-serving-gpu.XXXXXX)
daemon=
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  [ -f "$work/server.log" ] && cp "$work/server.log" "$OUT/server.log"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p "$work/repo/$model/1"
for f in config.json model.safetensors preprocessor_config.json; do
  ln "$ckpt/$model/$f" "$work/repo/$model/1/$f" 2>/dev/null || cp "$ckpt/$model/$f" "$work/repo/$model/1/$f" ||
    die "cannot copy $ckpt/$model/$f"
done
cat >"$work/repo/$model/serving.yaml" <<EOF
device: $device
dtype: $dtype
cuda_graphs: $graphs
max_batch_size: $max_batch
max_queue_size: 1024
threshold: 0.5
warmup: true
EOF
[ -n "${QUEUE_DELAY_US:-}" ] && echo "max_queue_delay_microseconds: $QUEUE_DELAY_US" >>"$work/repo/$model/serving.yaml"
[ -n "${INSTANCE_GROUP:-}" ] && echo "instance_group: $INSTANCE_GROUP" >>"$work/repo/$model/serving.yaml"
[ -n "${REFILL_WAIT_FRACTION:-}" ] && echo "refill_wait_fraction: $REFILL_WAIT_FRACTION" >>"$work/repo/$model/serving.yaml"
port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
  echo $((20000 + RANDOM % 20000)); }
gp=$(port)
hp=$(port)
while [ "$hp" = "$gp" ]; do hp=$(port); done
cat >"$work/server.yaml" <<EOF
server:
  grpc_address: 127.0.0.1:$gp
  http_address: 127.0.0.1:$hp
  drain_seconds: 0
  max_message_bytes: 268435456
  max_concurrent_rpcs: ${MAX_CONCURRENT_RPCS:-256}
  log_level: warn
${GPU_IMAGE_DECODE:+  gpu_image_decode: $GPU_IMAGE_DECODE
}model_repository: $work/repo
device: $device
tf32: off
kernels:
  hub_kernels: off
EOF
"$bin/libreyolo-server" --config "$work/server.yaml" >"$work/server.log" 2>&1 &
daemon=$!
ready=0
for _ in $(seq 600); do  # 300 s: loading + CUDA warm-up
  kill -0 "$daemon" 2>/dev/null || break
  if curl -sf -o /dev/null "http://127.0.0.1:$hp/v2/health/ready"; then ready=1; break; fi
  sleep 0.5
done
[ "$ready" = 1 ] || die "the daemon was not ready within 300 s; tail of its log: $(tail -5 "$work/server.log" | tr '\n' ' ')"
note "daemon ready: gRPC 127.0.0.1:$gp, HTTP 127.0.0.1:$hp, model $model (device $device, $dtype, cuda_graphs $graphs, max_batch_size $max_batch${INSTANCE_GROUP:+, instance_group $INSTANCE_GROUP})"
# server.gpu_image_decode as the daemon resolved it for the model (/active).
note "gpu_image_decode: $(curl -sf "http://127.0.0.1:$hp/active" | "$python" -c 'import json,sys; a=json.load(sys.stdin); print("; ".join("%s %s (%s)" % (m["name"], m["gpu_image_decode"]["value"], m["gpu_image_decode"]["source"]) for m in a["models"] if "gpu_image_decode" in m))' 2>/dev/null)"

# --- serving -------------------------------------------------------------------------------------
# name, concurrency levels, then libreyolo-bench arguments. pixel_values runs carry no image decoding (the same work as
# the forward-only number plus the serving path); the images run adds JPEG decoding on the CPU.
bench() {
  local name=$1 levels=$2
  shift 2
  local steps
  steps=$(echo "$levels" | tr ',' '\n' | wc -l)
  local limit=$(( steps * (${duration%.*} + ${warmup%.*} + 30) + 60 ))
  note "serving $name: libreyolo-bench --concurrency $levels $* (limit ${limit} s)"
  local before dev0 t0 stages0
  before=$(batch_counts)
  stages0=$(stage_snapshot)
  dev0=$(device_seconds)
  t0=$(date +%s.%N)
  if ! timeout "$limit" "$bin/libreyolo-bench" --server "127.0.0.1:$gp" --model "$model" \
      --duration "$duration" --warmup "$warmup" --timeout 60 --concurrency "$levels" "$@" \
      --csv "$OUT/serving_$name.csv" --json "$OUT/serving_$name.json" >"$OUT/serving_$name.log" 2>&1; then
    note "FAIL: libreyolo-bench $name: $(tail -3 "$OUT/serving_$name.log" | tr '\n' ' ')"
    return 1
  fi
  sed 's/^/    /' "$OUT/serving_$name.log" | grep -v "^    libreyolo-bench:" | tee -a "$summary" >/dev/null
  # The batches the daemon formed over the step (warm-up included): /v2/models/NAME/stats.
  read -r i0 e0 <<<"$before"
  read -r i1 e1 <<<"$(batch_counts)"
  [ -n "$e1" ] && [ $((e1 - e0)) -gt 0 ] &&
    note "$name: the daemon ran $((i1 - i0)) images in $((e1 - e0)) forwards (mean batch $(awk "BEGIN{printf \"%.2f\", ($i1 - $i0) / ($e1 - $e0)}"))"
  # CUDA: per instance, libreyolo_instance_device_seconds_total's increase (its batches' spans on
  # its stream, CUDA events) over the wall time of this call's levels, warm-ups included. Below
  # 1, the stream had nothing queued for the rest (gaps between batches); not the GPU's
  # utilisation (launch stalls inside an eager forward count as busy; instances sharing a GPU
  # overlap).
  local dev1 wall
  dev1=$(device_seconds)
  wall=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
  [ -n "$dev1" ] &&
    note "$name: the instances' streams held batches for $(LC_ALL=C join -a2 -e0 -o 0,1.2,2.2 <(echo "$dev0" | tr ' ' '\n' | grep = | tr '=' ' ' | LC_ALL=C sort -k1,1) <(echo "$dev1" | tr ' ' '\n' | tr '=' ' ' | LC_ALL=C sort -k1,1) |
      awk -v w="$wall" '{printf "%s%s %.3f", sep, $1, ($3 - $2) / w; sep = ", "}') of the wall time over levels $levels (libreyolo_instance_device_seconds_total)"
  local stages
  stages=$(stage_means "$stages0")
  [ -n "$stages" ] && note "$name: per request over the step (ms): $stages"
  return 0
}
# "INSTANCE=SECONDS ...": the device time each instance's batches took so far (empty without
# the CUDA series).
device_seconds() {
  curl -sf "http://127.0.0.1:$hp/metrics" |
    sed -n 's/^libreyolo_instance_device_seconds_total{.*instance="\([^"]*\)".*} \([0-9.eE+-]*\)$/\1=\2/p' | tr '\n' ' ' | sed 's/ $//'
}
# "INFERENCE_COUNT EXECUTION_COUNT" of the model so far (empty when the daemon does not answer).
batch_counts() {
  curl -sf "http://127.0.0.1:$hp/v2/models/$model/stats" | "$python" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]
print(s["inference_count"], s["execution_count"])' 2>/dev/null || true
}
# Where a request's time went over one step (mean ms per successful request between two
# stage_snapshot calls, the step's warm-up included): the preprocessing (Prometheus
# libreyolo_preprocess_duration_seconds), then Triton's statistics: queue, compute_input (the
# preprocessing again, plus the batch's assembly), compute_infer (the forward, until the instance
# read its end), compute_output (the request's own post-processing), and the whole request.
# stage_snapshot prints one line of cumulative sums; stage_means BEFORE prints the step's means.
stage_snapshot() {
  local metrics pre
  metrics=$(curl -sf "http://127.0.0.1:$hp/metrics") || return 0  # no answer: no snapshot
  # No histogram series yet (nothing preprocessed so far) counts as 0 images.
  pre=$(echo "$metrics" | awk '
    /^libreyolo_preprocess_duration_seconds_sum/ {s += $2} /^libreyolo_preprocess_duration_seconds_count/ {c += $2}
    END {printf "%.9f %d", s, c}')
  curl -sf "http://127.0.0.1:$hp/v2/models/$model/stats" | "$python" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]["inference_stats"]
print(sys.argv[1], s["success"]["count"], *(s[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output", "success")))' "$pre" 2>/dev/null || true
}
stage_means() {
  local after
  after=$(stage_snapshot)
  [ "$(echo "$1" | wc -w)" = 8 ] && [ "$(echo "$after" | wc -w)" = 8 ] || return 0
  "$python" -c '
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
d = [y - x for x, y in zip(a, b)]
if d[2] <= 0:
    print("no successful request in the step" if d[2] == 0 else "the statistics went back (a restarted daemon?)")
    sys.exit(0)
pre = "%.3f" % (1000 * d[0] / d[1]) if d[1] > 0 else "?"
ms = [1e-6 * v / d[2] for v in d[3:]]
print("preprocess %s, queue %.3f, compute_input %.3f, compute_infer %.3f, compute_output %.3f, request %.3f" % (pre, *ms))' "$1" "$after" 2>/dev/null || true
}
status=0
[ "${SKIP_B1:-0}" = 1 ] || bench pixel_values_b1 "$concurrency" --shape 1,3,640,640 --channels 4 || status=1
b8_levels=${B8_CONCURRENCY:-1,2,4,8}
[ "$rounds" -gt 1 ] && [ -n "${SHM:-}" ] && note "SHM=$SHM ignored: ROUNDS > 1 runs plain pixel_values and JPEG windows"
if [ "$b8_levels" != none ] && [ "$rounds" = 1 ]; then
  bench "pixel_values_b$max_batch" "$b8_levels" --shape "$max_batch,3,640,640" --channels 4 || status=1
  for kind in $(echo "${SHM:-}" | tr ',' ' '); do
    bench "pixel_values_b${max_batch}_shm_$kind" "$b8_levels" --shape "$max_batch,3,640,640" --channels 4 --shm "$kind" || status=1
  done
fi
jpeg_levels=${JPEG_CONCURRENCY:-$concurrency}
if [ "$rounds" = 1 ]; then
  bench images_b1 "$jpeg_levels" --image tests/fixtures/images/astronaut.jpg --channels 4 || status=1
else
  # ROUNDS > 1: forward-only and served windows alternate (the batch-MAX_BATCH pixel_values step
  # unless B8_CONCURRENCY=none, then JPEG), so that each ratio compares windows a minute or two
  # apart on the same machine speed (a VM's speed drifts by more than the difference measured).
  # The daemon stays up and idle while forward-only runs. rounds.txt: round, forward-only,
  # served JPEG, served pixel_values (0 when not run), images/s.
  : >"$OUT/rounds.txt"
  best_of() { "$python" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(max([s["inferences_per_s"] for s in r["steps"] if s["errors"] == 0] or [0]))' "$1"; }
  for r in $(seq "$rounds"); do
    [ -n "${FORWARD:-}" ] || measure_forward "forward_only_r$r.log"
    pv=0
    if [ "$b8_levels" != none ]; then
      bench "round_pixel_values_b${max_batch}_r$r" "$b8_levels" --shape "$max_batch,3,640,640" --channels 4 &&
        pv=$(best_of "$OUT/serving_round_pixel_values_b${max_batch}_r$r.json") || status=1
      pv=${pv:-0}
      [ "$pv" != 0 ] || { note "FAIL: round $r: no error-free pixel_values step"; status=1; }
    fi
    bench "images_b1_r$r" "$jpeg_levels" --image tests/fixtures/images/astronaut.jpg --channels 4 || { status=1; continue; }
    served=$(best_of "$OUT/serving_images_b1_r$r.json")
    served=${served:-0}
    # A window whose steps all failed is a failure, not a ratio of 0 in the median.
    [ "$served" != 0 ] || { note "FAIL: round $r: no error-free JPEG step"; status=1; continue; }
    echo "$r $forward $served $pv" >>"$OUT/rounds.txt"
    [ "$pv" = 0 ] || note "round $r: served pixel_values batch $max_batch $pv images/s = $(awk "BEGIN{printf \"%.3f\", $pv / $forward}") x forward only"
    note "round $r: forward only $forward images/s, served JPEG $served images/s = $(awk "BEGIN{printf \"%.3f\", $served / $forward}") x forward only"
  done
fi
kill -0 "$daemon" 2>/dev/null || { note "FAIL: the daemon died; tail of its log: $(tail -5 "$work/server.log" | tr '\n' ' ')"; status=1; }
curl -sf "http://127.0.0.1:$hp/metrics" -o "$OUT/metrics.txt" || true

# --- ratio ---------------------------------------------------------------------------------------
"$python" - "$OUT" "$forward0" "$model" "$max_batch" <<'PY' | tee -a "$summary"
import glob, json, os, sys
out, forward, model, max_batch = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
runs = {}
for p in sorted(glob.glob(os.path.join(out, "serving_*.json"))):
    with open(p) as f:
        runs[os.path.basename(p)[8:-5]] = json.load(f)
best = {}
for name, r in runs.items():
    ok = [s for s in r["steps"] if s["errors"] == 0]
    if ok:
        best[name] = max(ok, key=lambda s: s["inferences_per_s"])
tensor = {k: v for k, v in best.items() if k.startswith("pixel_values")}
result = {"model": model, "max_batch_size": max_batch, "forward_only_images_per_s": forward,
          "serving": runs, "best": best}
for name, step in sorted(tensor.items()):
    print(f"bench-serving-gpu: {name}: {step['inferences_per_s']:.1f} images/s = "
          f"{step['inferences_per_s'] / forward:.3f} x forward-only (concurrency {step['concurrency']})")
if tensor:
    name, step = max(tensor.items(), key=lambda kv: kv[1]["inferences_per_s"])
    ratio = step["inferences_per_s"] / forward
    result.update(ratio=ratio, ratio_run=name, target=0.90, target_met=ratio >= 0.90)
    print(f"bench-serving-gpu: best serving (pixel_values, no errors): {step['inferences_per_s']:.1f} images/s "
          f"({name}, concurrency {step['concurrency']}, p99 {step['latency_ms']['p99']:.1f} ms)")
    print(f"bench-serving-gpu: forward only batch {max_batch}: {forward:.1f} images/s")
    print(f"bench-serving-gpu: RATIO serving/forward-only = {ratio:.3f} (target >= 0.90: "
          f"{'MET' if ratio >= 0.90 else 'MISSED'})")
elif any(k.startswith("pixel_values") for k in runs):  # none ran: B8_CONCURRENCY=none, SKIP_B1=1
    print("bench-serving-gpu: FAIL: no error-free pixel_values serving step; no ratio")
if "images_b1" in best:
    s = best["images_b1"]
    jpeg = s["inferences_per_s"] / forward
    result.update(jpeg_ratio=jpeg, jpeg_target_met=jpeg >= 0.90)
    print(f"bench-serving-gpu: JPEG images (decoded by the daemon, max_batch_size {max_batch}): "
          f"{s['inferences_per_s']:.1f} images/s at concurrency {s['concurrency']} (p99 "
          f"{s['latency_ms']['p99']:.1f} ms) = {jpeg:.3f} x forward only (target >= 0.90: "
          f"{'MET' if jpeg >= 0.90 else 'MISSED'})")
rounds_path = os.path.join(out, "rounds.txt")
if os.path.exists(rounds_path):
    with open(rounds_path) as f:
        rows = [tuple(float(x) for x in line.split()[1:4]) for line in f if len(line.split()) == 4]
    median_of = lambda v: v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
    ratios = sorted(served / fwd for fwd, served, _ in rows if fwd > 0 and served > 0)
    pv = sorted(p / fwd for fwd, _, p in rows if fwd > 0 and p > 0)
    if pv:
        result.update(ratio=median_of(pv), ratio_run=f"round_pixel_values_b{max_batch} (median of rounds)",
                      target=0.90, target_met=median_of(pv) >= 0.90)
        print(f"bench-serving-gpu: pixel_values batch {max_batch} in {len(pv)} alternating rounds: "
              f"{', '.join('%.3f' % r for r in pv)} x forward only, median {median_of(pv):.3f}")
    if ratios:
        median = median_of(ratios)
        result.update(rounds=[{"forward_only_images_per_s": fwd, "served_images_per_s": served,
                               "served_pixel_values_images_per_s": p} for fwd, served, p in rows],
                      jpeg_ratio=median, jpeg_target_met=median >= 0.90)
        print(f"bench-serving-gpu: JPEG images (decoded by the daemon, max_batch_size {max_batch}) in "
              f"{len(ratios)} alternating rounds: {', '.join('%.3f' % r for r in ratios)} x forward only, "
              f"median {median:.3f} (target >= 0.90: {'MET' if median >= 0.90 else 'MISSED'})")
with open(os.path.join(out, "bench_serving_gpu.json"), "w") as f:
    json.dump(result, f, indent=2)
PY
exit $status

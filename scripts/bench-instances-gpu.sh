#!/usr/bin/env bash
# The multi-GPU instance_group run: the same model served by one daemon with one
# instance on GPU 0, then with one instance per GPU (serving.yaml
# `instance_group: [{count: 1, kind: KIND_GPU}]`), each through scripts/bench-serving-gpu.sh;
# prints the throughput ratio all / one against the target 0.9 x N, the images each instance
# ran (libreyolo_instance_images_total) and the GPU memory per device
# (libreyolo_gpu_memory_*_bytes) from the daemon's /metrics.
#
# Run ON a multi-GPU machine from the repository root after building build-gpu (scripts/test-gpu.sh
# or the device kit): scripts/bench-instances-gpu.sh [CHECKPOINTS]
# Environment: OUT (default ./bench-instances-out), GPUS (default: nvidia-smi -L count), DTYPE
# (bfloat16), CUDA_GRAPHS (on), SHM (cuda: the input path that does not limit one GPU;
# empty: plain gRPC), CONCURRENCY (8,64: the batch-1 steps), DURATION / WARMUP (10 / 3).
# DEVICE=cpu tries the script on a CPU host: KIND_CPU instances, GPUS instances (default 2).
# Exit status: 0 when both runs ran (summary.txt says whether the target is met), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
OUT=${OUT:-$root/bench-instances-out}
mkdir -p "$OUT"
device=${DEVICE:-cuda}
if [ "$device" = cpu ]; then
  n=${GPUS:-2}
  one="[{count: 1, kind: KIND_CPU}]"
  all="[{count: $n, kind: KIND_CPU}]"
else
  n=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  one="[{count: 1, kind: KIND_GPU, gpus: [0]}]"
  all="[{count: 1, kind: KIND_GPU, gpus: [$(seq -s ', ' 0 $((n - 1)))]}]"
fi
[ "$n" -ge 1 ] || { echo "bench-instances-gpu: no GPU (nvidia-smi -L lists none)"; exit 1; }
summary=$OUT/summary.txt
echo "bench-instances-gpu: $(date -u +%FT%TZ), $n instances, device $device" | tee "$summary"
export DTYPE=${DTYPE:-bfloat16} CUDA_GRAPHS=${CUDA_GRAPHS:-on} SHM=${SHM-cuda}
export CONCURRENCY=${CONCURRENCY:-8,64}
[ "$device" = cpu ] && export SHM=
status=0
OUT=$OUT/one INSTANCE_GROUP=$one B8_CONCURRENCY=1,2,4,8 bash scripts/bench-serving-gpu.sh "$@" || status=1
forward=$(sed -n 's/^bench-serving-gpu: forward only batch 8: \([0-9.eE+-]*\) images\/s.*/\1/p' "$OUT/one/summary.txt" | head -1)
[ -n "$forward" ] || { echo "bench-instances-gpu: FAIL: no forward-only number in $OUT/one/summary.txt" | tee -a "$summary"; exit 1; }
levels=$(for c in 1 2 4 8; do printf '%s,' $((c * n)); done)
OUT=$OUT/all INSTANCE_GROUP=$all FORWARD=$forward B8_CONCURRENCY=${levels%,} \
  bash scripts/bench-serving-gpu.sh "$@" || status=1
python3 - "$OUT" "$n" <<'PY' | tee -a "$summary"
import json, os, re, sys
out, n = sys.argv[1], int(sys.argv[2])
def best(run):
    with open(os.path.join(out, run, "bench_serving_gpu.json")) as f:
        r = json.load(f)
    b = {k: v for k, v in r["best"].items() if k.startswith("pixel_values_b8")}
    name, step = max(b.items(), key=lambda kv: kv[1]["inferences_per_s"])
    return name, step
one_name, one = best("one")
all_name, every = best("all")
ratio = every["inferences_per_s"] / one["inferences_per_s"]
print(f"bench-instances-gpu: one instance: {one['inferences_per_s']:.1f} images/s ({one_name}, "
      f"concurrency {one['concurrency']})")
print(f"bench-instances-gpu: {n} instances: {every['inferences_per_s']:.1f} images/s ({all_name}, "
      f"concurrency {every['concurrency']})")
print(f"bench-instances-gpu: RATIO {n} / one = {ratio:.2f} (target >= {0.9 * n:.1f}: "
      f"{'MET' if ratio >= 0.9 * n else 'MISSED'})")
metrics = open(os.path.join(out, "all", "metrics.txt")).read()
for line in metrics.splitlines():
    if re.match(r"libreyolo_(instance_images_total|instance_ready|gpu_memory_\w+_bytes)\{", line):
        print("bench-instances-gpu:   " + line)
PY
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status

#!/usr/bin/env bash
# Attention alone on the GPU machine: manual math vs the SDPA formulations at ViT-B,
# Swin-T stage-1 windows (shifted and plain) and RT-DETR AIFI, fp32 (TF32 off) / fp16 / bf16;
# then the CUDA checks of each formulation (test_gpu, AttentionPathCuda.*).
# Run ON the GPU machine from the repository root, after `source .device-kit/env.sh` and a build
# in build-gpu (scripts/test-gpu.sh, or `ninja -C build-gpu bench_attention test_gpu`).
# Writes to $OUT (./gpu-out when unset):
#   bench_attention.txt   the table (docs/bench/attention.md explains the columns)
#   bench_attention.json  the same rows as JSON
#   attention_path_test.log  test_gpu --gtest_filter='*AttentionPathCuda*'
# Exit status 0 when the benchmark and the tests ran and passed.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
build=${BUILD_DIR:-build-gpu}
bin=$build/bin/bench_attention
status=0
if [ ! -x "$bin" ]; then
  echo "FAIL: $bin not built (ninja -C $build bench_attention)" | tee "$OUT/bench_attention.txt"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
  >"$OUT/bench_attention.txt" 2>&1 || true
timeout 500 "$bin" --json "$OUT/bench_attention.json" --repeats "${REPEATS:-7}" 2>&1 |
  tee -a "$OUT/bench_attention.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ -x "$build/bin/test_gpu" ]; then
  timeout 120 "$build/bin/test_gpu" --gtest_filter='*AttentionPathCuda*' \
    >"$OUT/attention_path_test.log" 2>&1 || status=1
  tail -3 "$OUT/attention_path_test.log"
else
  echo "test_gpu not built: AttentionPathCuda skipped" | tee "$OUT/attention_path_test.log"
fi
exit $status

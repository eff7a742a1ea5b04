#!/usr/bin/env bash
# End-to-end ViT-B/16 and Swin-T forward on the GPU machine: full-size configurations
# with random weights at 224x224, batch 1 and 32, manual vs fused attention (the attention_path()
# policy), fp32 (TF32 off) and fp16, eager and replayed from a CUDA graph.
# Run ON the GPU machine from the repository root, after `source .device-kit/env.sh` and a build
# in build-gpu (scripts/test-gpu.sh, or `ninja -C build-gpu libreyolo-bench-models`).
# Writes $OUT/bench_classifiers.log (one line per measurement). Exit status 0 when every run worked.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log=$OUT/bench_classifiers.log
bin=${BUILD_DIR:-build-gpu}/bin/libreyolo-bench-models
ckpt=${CKPT_DIR:-/tmp/ckpt}
status=0
[ -x "$bin" ] || { echo "FAIL: $bin not built" | tee -a "$log"; exit 1; }
if [ ! -f "$ckpt/swin_tiny/model.safetensors" ]; then
  python3 tools/bench_models/make_random_checkpoint.py "$ckpt" classifiers >>"$log" 2>&1 || {
    echo "FAIL: make_random_checkpoint.py classifiers (transformers missing?)" | tee -a "$log"
    exit 1
  }
fi
export LIBREYOLO_HUB_KERNELS=0
for model in vit_base swin_tiny; do
  for dtype in float32 float16; do
    for fused in off on; do
      for graph in "" --cuda-graph; do
        echo "== $model $dtype fused_attention=$fused ${graph:-eager}" | tee -a "$log"
        timeout 120 "$bin" --model "$ckpt/$model" --size 224 --device cuda --dtype $dtype \
          --batch 1,32 --iters 30 --warmup 5 --fused-attention $fused $graph 2>&1 |
          grep -v "^  \|^\[" | tee -a "$log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
    done
  done
done
exit $status

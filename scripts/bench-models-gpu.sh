#!/usr/bin/env bash
# End-to-end RT-DETR forward on the GPU machine: full-size R50-vd and R18-vd with
# random weights at 640x640, batch 1/8/32, fp32 (TF32 off), once with the registry's normal
# selection (the in-tree `cuda` ms_deform_attn) and once with LIBREYOLO_KERNELS=reference (the
# portable grid_sample path); plus bf16 with the cuda kernel. Each line names the ms_deform_attn
# implementation that ran and its call count. Also: TF32 on (PyTorch's default for cuDNN, what a
# transformers eager run uses) and CUDA-graph replay (no host launch cost).
# Run ON the GPU machine from the repository root, after `source .device-kit/env.sh` and a build
# in build-gpu (scripts/test-gpu.sh, or `ninja -C build-gpu libreyolo-bench-models`).
# Writes $OUT/bench_models.log (one line per measurement). Exit status 0 when every run worked.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log=$OUT/bench_models.log
bin=${BUILD_DIR:-build-gpu}/bin/libreyolo-bench-models
ckpt=${CKPT_DIR:-/tmp/ckpt}
status=0
[ -x "$bin" ] || { echo "FAIL: $bin not built" | tee -a "$log"; exit 1; }
if [ ! -f "$ckpt/rtdetr_r50vd/model.safetensors" ]; then
  python3 tools/bench_models/make_random_checkpoint.py "$ckpt" >>"$log" 2>&1 || {
    echo "FAIL: make_random_checkpoint.py (transformers missing?)" | tee -a "$log"
    exit 1
  }
fi
export LIBREYOLO_HUB_KERNELS=0
run() {  # label, env assignment, model, dtype, extra flags
  echo "== $1" | tee -a "$log"
  env $2 timeout 240 "$bin" --model "$ckpt/$3" --device cuda --dtype "$4" --batch 1,8,32 \
    --iters 20 --warmup 5 ${5:-} 2>&1 | grep -v "^  \|^\[" | tee -a "$log" || status=1
}
run "R50 fp32, selection auto (cuda kernel)" "LIBREYOLO_KERNELS=" rtdetr_r50vd float32
run "R50 fp32, LIBREYOLO_KERNELS=reference (portable path)" "LIBREYOLO_KERNELS=reference" rtdetr_r50vd float32
run "R18 fp32, selection auto" "LIBREYOLO_KERNELS=" rtdetr_r18vd float32
run "R18 fp32, LIBREYOLO_KERNELS=reference" "LIBREYOLO_KERNELS=reference" rtdetr_r18vd float32
run "R50 bf16, selection auto" "LIBREYOLO_KERNELS=" rtdetr_r50vd bfloat16
run "R50 bf16, LIBREYOLO_KERNELS=reference" "LIBREYOLO_KERNELS=reference" rtdetr_r50vd bfloat16
run "R50 fp32 with TF32 (PyTorch's cuDNN default, as a transformers eager run)" "LIBREYOLO_KERNELS=" rtdetr_r50vd float32 --tf32
run "R50 fp32, CUDA graph replay" "LIBREYOLO_KERNELS=" rtdetr_r50vd float32 --cuda-graph
run "R50 bf16, CUDA graph replay" "LIBREYOLO_KERNELS=" rtdetr_r50vd bfloat16 --cuda-graph
run "R18 fp32, CUDA graph replay" "LIBREYOLO_KERNELS=" rtdetr_r18vd float32 --cuda-graph
exit $status

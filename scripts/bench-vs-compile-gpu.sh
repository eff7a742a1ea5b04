#!/usr/bin/env bash
# The speed benchmark against the anchors, in one command on the GPU machine (docs/BENCHMARKS.md
# "Against torch.compile"): full-size random-weight RT-DETR-R50 and R18 (640x640) through
# libreyolo-bench-models with layouts off (the unfused modules) and on (folded conv+BN, fused
# activations, RepVGG, channels_last), bf16 with CUDA graphs at batch 1 and 32, fp32 with TF32 off
# at batch 32; then transformers 5.17 eager (fp32, bf16 + channels_last) and torch.compile
# (default mode, bf16 + channels_last) on the same checkpoints, inputs and batches
# (tools/bench_models/anchors.py). Also the profile of one R50 batch-32 bf16 forward by op class,
# layouts off and on (--profile, the torch profiler from C++).
# Run ON the GPU machine from the repository root after `source .device-kit/env.sh` and a build
# of libreyolo-bench-models in ${BUILD_DIR:-build-gpu}. Writes $OUT/bench_vs_compile.log.
# SKIP_ANCHORS=1 skips the Python anchors (they take about 5 minutes, mostly compiling).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log=$OUT/bench_vs_compile.log
bin=${BUILD_DIR:-build-gpu}/bin/libreyolo-bench-models
ckpt=${CKPT_DIR:-/tmp/ckpt}
status=0
export LIBREYOLO_HUB_KERNELS=0
{
  echo "date: $(date -u +%FT%TZ)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
  echo "versions: $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee -a "$log"
[ -x "$bin" ] || { echo "FAIL: $bin not built" | tee -a "$log"; exit 1; }
if [ ! -f "$ckpt/rtdetr_r50vd/model.safetensors" ]; then
  python3 tools/bench_models/make_random_checkpoint.py "$ckpt" >>"$log" 2>&1 || exit 1
fi
ours() {  # label, model, dtype, batches, extra flags
  echo "== ours: $1" | tee -a "$log"
  timeout 300 "$bin" --model "$ckpt/$2" --device cuda --dtype "$3" --batch "$4" --iters 30 \
    --warmup 5 ${5:-} 2>&1 | grep -E "batch|layout|applied|cuda_graph|error|FAIL|profile|class" |
    tee -a "$log" || status=1
}
for layouts in off on; do
  ours "R50 bf16 graphs layouts=$layouts" rtdetr_r50vd bfloat16 1,32 "--cuda-graph --layouts $layouts"
  ours "R18 bf16 graphs layouts=$layouts" rtdetr_r18vd bfloat16 1,32 "--cuda-graph --layouts $layouts"
  ours "R50 fp32 (TF32 off) layouts=$layouts" rtdetr_r50vd float32 32 "--layouts $layouts"
  ours "R50 bf16 eager profile layouts=$layouts" rtdetr_r50vd bfloat16 32 "--layouts $layouts --profile"
done
if [ "${SKIP_ANCHORS:-0}" != 1 ]; then
  for m in rtdetr_r50vd rtdetr_r18vd; do
    echo "== anchors: $m" | tee -a "$log"
    timeout 420 python3 tools/bench_models/anchors.py "$ckpt/$m" --batch 1,32 \
      --modes eager_fp32,eager_bf16_cl,compile_bf16_cl 2>&1 | grep -E "^anchor|Error" |
      tee -a "$log" || status=1
  done
fi
exit $status

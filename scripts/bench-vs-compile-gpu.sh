#!/usr/bin/env bash
# The speed benchmark against the anchors, on the GPU machine (docs/BENCHMARKS.md "Against
# torch.compile"): full-size random-weight checkpoints (tools/bench_models/make_random_checkpoint.py)
# through libreyolo-bench-models (ours: bf16, CUDA graphs, layouts default and on, the kernel
# bindings of every run: which implementation each slot bound and its calls) and, in the same run
# on the same checkpoints, inputs and batches, transformers 5.17 eager and torch.compile (default
# mode), bf16 (+ channels_last for the conv families) (tools/bench_models/anchors.py).
#
# Rows (ROWS=comma list; each row is one model, ours + eager + compile):
#   r50        RT-DETR-R50vd 640, batch 1 and 32 (ours: layouts off/default/on; profile by op class
#              of the batch-32 forward, layouts default and on; batch 32 with cuDNN's heuristics
#              instead of benchmark mode); anchors at 32 (FULL=1: and 1)
#   r18        RT-DETR-R18vd 640, batch 1 and 32, profile by op class of the batch-32 forward;
#              anchors at 32 (FULL=1: and 1)
#   dfine      D-FINE L (HGNetV2-B4) 640, batch 1 and 32; anchors at 32 (FULL=1: and 1)
#   deformable Deformable DETR (ResNet-50) 800x1333, batch 1 and 8; anchors at 8 (FULL=1: and 1)
#   vit        ViT-B/16 224, batch 32; anchors at 32
#   swin       Swin-T 224, batch 32; anchors at 32
#   fp32       RT-DETR-R50 fp32 (TF32 off) batch 32, layouts off and default, profile by op class
#              (layouts default: folded, NCHW for float32 without TF32); no anchors
#   rf_detr    RF-DETR base 560 (issue 16), batch 1 and 32, bf16 (graphs; fused attention default
#              and on) and fp32 (TF32 off); anchors eager fp32 / bf16 and torch.compile bf16 at
#              32 and 1
#   rf_detr_nano  RF-DETR nano 384, the same
#   lw_detr    LW-DETR small 640, the same
#   deimv2     DEIMv2 N 640 (HGNetV2), the same, channels_last anchors
# `layouts=default` is what the daemon runs; `layouts=on` adds the layouts that are not on by
# default yet (avgpool_fold), so default vs on measures them.
# Each row prints `== row <name> done in <s> s`. Device-call plan (each under 9 minutes, first
# call includes writing the checkpoints): ROWS=r50 | ROWS=r18,vit,swin | ROWS=dfine |
# ROWS=deformable | ROWS=rf_detr,rf_detr_nano | ROWS=lw_detr,deimv2.
#
# Run ON the GPU machine from the repository root after `source .device-kit/env.sh` and a build
# of libreyolo-bench-models in ${BUILD_DIR:-build-gpu}. Writes $OUT/bench_vs_compile.log.
# SKIP_ANCHORS=1 runs ours only. QUICK=1 is the former quick set (ROWS=r50). DRY_RUN=1 prints the
# commands instead of running them (no GPU needed: the CPU check of this script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log=$OUT/bench_vs_compile.log
bin=${BUILD_DIR:-build-gpu}/bin/libreyolo-bench-models
ckpt=${CKPT_DIR:-/tmp/ckpt}
python=${PYTHON:-python3}
rows=${ROWS:-r50,r18,dfine,deformable,vit,swin}
[ "${QUICK:-0}" = 1 ] && rows=r50
full=${FULL:-0}
dry=${DRY_RUN:-0}
status=0
export LIBREYOLO_HUB_KERNELS=0

for r in ${rows//,/ }; do
  case $r in r50 | r18 | dfine | deformable | vit | swin | fp32 | rf_detr | rf_detr_nano | lw_detr | deimv2) ;;
  *)
    echo "FAIL: ROWS: unknown row '$r' (expected r50, r18, dfine, deformable, vit, swin, fp32," \
      "rf_detr, rf_detr_nano, lw_detr, deimv2)" >&2
    exit 2
    ;;
  esac
done

run() {  # a command, or its echo under DRY_RUN=1
  if [ "$dry" = 1 ]; then
    echo "+ $*"
  else
    "$@"
  fi
}

{
  echo "date: $(date -u +%FT%TZ) rows: $rows"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
  echo "versions: $($python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee -a "$log"
[ "$dry" = 1 ] || [ -x "$bin" ] || {
  echo "FAIL: $bin not built" | tee -a "$log"
  exit 1
}

checkpoint() {  # folder name, make_random_checkpoint.py set
  [ -f "$ckpt/$1/model.safetensors" ] && return 0
  echo "== writing $ckpt/$1 ($2)" | tee -a "$log"
  run timeout 600 "$python" tools/bench_models/make_random_checkpoint.py "$ckpt" "$2" >>"$log" 2>&1 || {
    echo "FAIL: make_random_checkpoint.py $2" | tee -a "$log"
    status=1
    return 1
  }
}

ours() {  # label, model, dtype, size, batches, extra flags
  echo "== ours: $1" | tee -a "$log"
  if [ "$dry" = 1 ]; then
    echo "+ $bin --model $ckpt/$2 --device cuda --dtype $3 --size $4 --batch $5 --iters 30 --warmup 5 ${6:-}" | tee -a "$log"
    return
  fi
  # shellcheck disable=SC2086 # $6 is a list of flags: word-split on purpose
  timeout 300 "$bin" --model "$ckpt/$2" --device cuda --dtype "$3" --size "$4" --batch "$5" \
    --iters 30 --warmup 5 ${6:-} 2>&1 |
    grep -E "batch=|layout|applied|binding|cuda_graph|error|FAIL|profile" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

anchors() {  # model, size, batches, modes
  [ "${SKIP_ANCHORS:-0}" = 1 ] && return
  echo "== anchors: $1 $2 batch $3 ($4)" | tee -a "$log"
  if [ "$dry" = 1 ]; then
    echo "+ $python tools/bench_models/anchors.py $ckpt/$1 --size $2 --batch $3 --modes $4" | tee -a "$log"
    return
  fi
  timeout 480 "$python" tools/bench_models/anchors.py "$ckpt/$1" --size "$2" --batch "$3" \
    --modes "$4" 2>&1 | grep -E "^anchor|Error" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

conv_modes=eager_bf16_cl,compile_bf16_cl
for r in ${rows//,/ }; do
  t0=$SECONDS
  case $r in
  r50)
    checkpoint rtdetr_r50vd detectors || continue
    for layouts in off default on; do
      ours "R50 bf16 graphs layouts=$layouts" rtdetr_r50vd bfloat16 640 1,32 "--cuda-graph --layouts $layouts"
    done
    for layouts in default on; do
      ours "R50 bf16 eager profile layouts=$layouts" rtdetr_r50vd bfloat16 640 32 "--layouts $layouts --profile"
    done
    ours "R50 bf16 graphs layouts=default cuDNN heuristics" rtdetr_r50vd bfloat16 640 32 \
      "--cuda-graph --layouts default --no-cudnn-benchmark"
    anchors rtdetr_r50vd 640 "$([ "$full" = 1 ] && echo 32,1 || echo 32)" $conv_modes
    ;;
  r18)
    checkpoint rtdetr_r18vd detectors || continue
    for layouts in default on; do
      ours "R18 bf16 graphs layouts=$layouts" rtdetr_r18vd bfloat16 640 1,32 "--cuda-graph --layouts $layouts"
    done
    ours "R18 bf16 eager profile layouts=default" rtdetr_r18vd bfloat16 640 32 "--layouts default --profile"
    anchors rtdetr_r18vd 640 "$([ "$full" = 1 ] && echo 32,1 || echo 32)" $conv_modes
    ;;
  dfine)
    checkpoint dfine_l dfine || continue
    for layouts in default on; do
      ours "D-FINE-L bf16 graphs layouts=$layouts" dfine_l bfloat16 640 1,32 "--cuda-graph --layouts $layouts"
    done
    anchors dfine_l 640 "$([ "$full" = 1 ] && echo 32,1 || echo 32)" $conv_modes
    ;;
  deformable)
    checkpoint deformable_detr deformable || continue
    ours "Deformable DETR bf16 graphs" deformable_detr bfloat16 800x1333 1,8 "--cuda-graph --layouts default"
    ours "Deformable DETR bf16 eager" deformable_detr bfloat16 800x1333 1,8 "--layouts default"
    anchors deformable_detr 800x1333 "$([ "$full" = 1 ] && echo 8,1 || echo 8)" $conv_modes
    ;;
  vit | swin)
    m=$([ "$r" = vit ] && echo vit_base || echo swin_tiny)
    checkpoint "$m" classifiers || continue
    ours "$m bf16 graphs" "$m" bfloat16 224 32 "--cuda-graph --layouts default"
    ours "$m bf16 graphs fused_attention=on" "$m" bfloat16 224 32 "--cuda-graph --layouts default --fused-attention on"
    anchors "$m" 224 32 eager_bf16,compile_bf16
    ;;
  rf_detr | rf_detr_nano | lw_detr | deimv2)
    case $r in
    rf_detr) m=rf_detr_base size=560 modes=eager_fp32,eager_bf16,compile_bf16 ;;
    rf_detr_nano) m=rf_detr_nano size=384 modes=eager_fp32,eager_bf16,compile_bf16 ;;
    lw_detr) m=lw_detr_small size=640 modes=eager_fp32,eager_bf16,compile_bf16 ;;
    deimv2) m=deimv2_n size=640 modes=eager_fp32,eager_bf16_cl,compile_bf16_cl ;;
    esac
    checkpoint "$m" families || continue
    ours "$m bf16 graphs" "$m" bfloat16 "$size" 1,32 "--cuda-graph --layouts default"
    ours "$m bf16 graphs fused_attention=on" "$m" bfloat16 "$size" 1,32 \
      "--cuda-graph --layouts default --fused-attention on"
    ours "$m fp32 (TF32 off)" "$m" float32 "$size" 1,32 "--layouts default"
    anchors "$m" "$size" 32,1 "$modes"
    ;;
  fp32)
    checkpoint rtdetr_r50vd detectors || continue
    for layouts in off default; do
      ours "R50 fp32 (TF32 off) layouts=$layouts" rtdetr_r50vd float32 640 32 "--layouts $layouts"
    done
    ours "R50 fp32 (TF32 off) eager profile layouts=default" rtdetr_r50vd float32 640 32 "--layouts default --profile"
    ;;
  esac
  echo "== row $r done in $((SECONDS - t0)) s" | tee -a "$log"
done
exit $status

#!/usr/bin/env bash
# The speed benchmark against the anchors, on the GPU machine (docs/BENCHMARKS.md "Against
# torch.compile"): full-size random-weight checkpoints (tools/bench_models/make_random_checkpoint.py)
# through libreyolo-bench-models at the daemon's defaults (bf16, CUDA graphs, layouts and fused
# attention as the daemon decides them: the kernel bindings of every run show which
# implementation each slot bound and its calls) and, in the same run on the same checkpoints,
# inputs and batches, the anchor a PyTorch deployer uses (tools/bench_models/anchors.py):
# torch.compile with Inductor freezing (bf16, + channels_last for the conv families,
# inference_mode) at batch 32, and the same with mode="reduce-overhead" (CUDA graphs) at batch 1.
# EAGER=1 adds transformers eager (bf16) at batch 32. FP8=1 adds ours with `--quantization fp8`
# (serving.yaml `quantization: fp8`) to the vit, swin, rf_detr*, lw_detr and deimv2 rows.
#
# Rows (ROWS=comma list; each row is one model, ours + anchors):
#   r50        RT-DETR-R50vd 640, batch 1 and 32 (ours: layouts off/default/on; profile by op class
#              of the batch-32 forward, layouts default)
#   r18        RT-DETR-R18vd 640, batch 1 and 32, profile by op class of the batch-32 forward
#   dfine      D-FINE L (HGNetV2-B4) 640, batch 1 and 32, profile
#   deformable Deformable DETR (ResNet-50) 800x1333, batch 1 and 8; anchors at 8 and 1
#   detr       DETR-R50 (facebook/detr-resnet-50's configuration, timm ResNet-50) 800x1333, batch 1
#              and 8 (+ profile), anchors at 8 (transformers eager too) and 1
#   doclayout  PP-DocLayoutV3 (PPDocLayoutV3Config()'s defaults, 25 classes) 800x800, batch 1 and 8
#              (+ profile), anchors at 8 (transformers eager too) and 1
#   vit        ViT-B/16 224, batch 32; anchors at 32
#   swin       Swin-T 224, batch 32; anchors at 32
#   fp32       RT-DETR-R50 fp32 (TF32 off) batch 32, layouts off and default, profile by op class
#              (layouts default: folded, NCHW for float32 without TF32); no anchors
#   rf_detr    RF-DETR base 560, batch 1 and 32, bf16 defaults (+ profile) and fp32 (TF32 off)
#   rf_detr_nano  RF-DETR nano 384, the same
#   rf_detr_small, rf_detr_medium  RF-DETR small 512 and medium 576 (the current published sizes;
#              medium replaced base), the same
#   lw_detr    LW-DETR small 640, the same
#   deimv2     `deimv2_default`: Deimv2Config()'s defaults (HGNetV2, 29.9 M parameters,
#              92.6 GFLOPs at 640; NOT the published DEIMv2-N of about 3.6 M), the same, channels_last
#              anchors
#   deimv2_s   DEIMv2-S as published (Intellindust-AI-Lab/DEIMv2 configs/deimv2/deimv2_dinov3_s_coco.yml:
#              DINOv3 ViT-Tiny + STA, 9.9 M parameters, 27.9 GFLOPs at 640), the same
#   owlvit     OWL-ViT B/32 (google/owlvit-base-patch32's configuration) 768, text "a cat. a dog."
#              (two labels), batch 1 and 8, ours with the prompt cache off (text tower every
#              forward) and on (the daemon's cache hit: vision + heads), + profile (cache on);
#              anchors transformers eager and torch.compile + freezing (bf16, the text given
#              every call) at 8 and at 1
#   owlv2      OWLv2 B/16 (google/owlv2-base-patch16-ensemble) 960, the same
#   grounding_dino  Grounding DINO tiny (IDEA-Research/grounding-dino-tiny: Swin-T, BERT-base)
#              800x1333, caption "a cat. a dog.", the same (its prompt cache keeps the caption's
#              BERT + text_projection output: on = everything after BERT)
#   omdet_turbo  OmDet-Turbo Swin-T (omlab/omdet-turbo-swin-tiny-hf's configuration with
#              transformers' Swin-T) 640, labels "a cat. a dog.", the same (the family does not
#              cache its text encoding: cache on prints n/a)
# The prompted checkpoints' tokenizers are the repository's fixtures (make_random_checkpoint.py
# says why): the token counts, hence the times, are the published tokenizers'.
# Each row prints `== row <name> done in <s> s`. A row with its anchors takes 2-5 minutes (the
# compiles); plan device calls of two or three rows.
#
# Run ON the GPU machine from the repository root after `source .device-kit/env.sh` and a build
# of libreyolo-bench-models in ${BUILD_DIR:-build-gpu}. Writes $OUT/bench_vs_compile.log.
# SKIP_ANCHORS=1 runs ours only. DRY_RUN=1 prints the commands instead of running them (no GPU
# needed: the CPU check of this script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log=$OUT/bench_vs_compile.log
bin=${BUILD_DIR:-build-gpu}/bin/libreyolo-bench-models
ckpt=${CKPT_DIR:-/tmp/ckpt}
python=${PYTHON:-python3}
rows=${ROWS:-r50,r18,dfine,deformable,vit,swin}
dry=${DRY_RUN:-0}
status=0
export LIBREYOLO_HUB_KERNELS=0

for r in ${rows//,/ }; do
  case $r in r50 | r18 | dfine | deformable | detr | doclayout | vit | swin | fp32 | rf_detr | rf_detr_nano | rf_detr_small | rf_detr_medium | lw_detr | deimv2 | deimv2_s | owlvit | owlv2 | grounding_dino | omdet_turbo) ;;
  *)
    echo "FAIL: ROWS: unknown row '$r' (expected r50, r18, dfine, deformable, detr, doclayout, vit, swin, fp32," \
      "rf_detr, rf_detr_nano, rf_detr_small, rf_detr_medium, lw_detr, deimv2, deimv2_s, owlvit, owlv2, grounding_dino, omdet_turbo)" >&2
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
    grep -E "batch=|layout|applied|binding|cuda_graph|quantization|error|FAIL|profile" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

anchor() {  # model, size, batch, modes
  echo "== anchors: $1 $2 batch $3 ($4)" | tee -a "$log"
  if [ "$dry" = 1 ]; then
    echo "+ $python tools/bench_models/anchors.py $ckpt/$1 --size $2 --batch $3 --modes $4" | tee -a "$log"
    return
  fi
  timeout 480 "$python" tools/bench_models/anchors.py "$ckpt/$1" --size "$2" --batch "$3" \
    --modes "$4" 2>&1 | grep -E "^anchor|Error" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

anchors() {  # model, size, large batch, "_cl" or "": freezing at the large batch, + CUDA graphs at 1
  [ "${SKIP_ANCHORS:-0}" = 1 ] && return
  local modes=freeze_bf16$4
  [ "${EAGER:-0}" = 1 ] && modes=eager_bf16$4,$modes
  anchor "$1" "$2" "$3" "$modes"
  anchor "$1" "$2" 1 "freezero_bf16$4"
}

for r in ${rows//,/ }; do
  t0=$SECONDS
  case $r in
  r50)
    checkpoint rtdetr_r50vd detectors || continue
    for layouts in off default on; do
      ours "R50 bf16 graphs layouts=$layouts" rtdetr_r50vd bfloat16 640 1,32 "--cuda-graph --layouts $layouts"
    done
    ours "R50 bf16 eager profile (defaults)" rtdetr_r50vd bfloat16 640 32 "--profile"
    anchors rtdetr_r50vd 640 32 _cl
    ;;
  r18)
    checkpoint rtdetr_r18vd detectors || continue
    ours "R18 bf16 graphs (defaults)" rtdetr_r18vd bfloat16 640 1,32 "--cuda-graph"
    ours "R18 bf16 eager profile (defaults)" rtdetr_r18vd bfloat16 640 32 "--profile"
    anchors rtdetr_r18vd 640 32 _cl
    ;;
  dfine)
    checkpoint dfine_l dfine || continue
    ours "D-FINE-L bf16 graphs (defaults)" dfine_l bfloat16 640 1,32 "--cuda-graph"
    ours "D-FINE-L bf16 eager profile (defaults)" dfine_l bfloat16 640 32 "--profile"
    anchors dfine_l 640 32 _cl
    ;;
  deformable)
    checkpoint deformable_detr deformable || continue
    ours "Deformable DETR bf16 graphs (defaults)" deformable_detr bfloat16 800x1333 1,8 "--cuda-graph"
    ours "Deformable DETR bf16 eager (defaults)" deformable_detr bfloat16 800x1333 1,8 ""
    anchors deformable_detr 800x1333 8 _cl
    ;;
  detr)
    checkpoint detr_resnet50 detr || continue
    ours "DETR-R50 bf16 graphs (defaults)" detr_resnet50 bfloat16 800x1333 1,8 "--cuda-graph"
    ours "DETR-R50 bf16 eager profile (defaults)" detr_resnet50 bfloat16 800x1333 8 "--profile"
    EAGER=1 anchors detr_resnet50 800x1333 8 _cl
    ;;
  doclayout)
    checkpoint pp_doclayout_v3 doclayout || continue
    ours "PP-DocLayoutV3 bf16 graphs (defaults)" pp_doclayout_v3 bfloat16 800 1,8 "--cuda-graph"
    ours "PP-DocLayoutV3 bf16 eager profile (defaults)" pp_doclayout_v3 bfloat16 800 8 "--profile"
    EAGER=1 anchors pp_doclayout_v3 800 8 _cl
    ;;
  vit | swin)
    m=$([ "$r" = vit ] && echo vit_base || echo swin_tiny)
    checkpoint "$m" classifiers || continue
    ours "$m bf16 graphs (defaults)" "$m" bfloat16 224 1,32 "--cuda-graph"
    [ "${FP8:-0}" = 1 ] && ours "$m bf16 graphs fp8" "$m" bfloat16 224 1,32 "--cuda-graph --quantization fp8"
    anchors "$m" 224 32 ""
    ;;
  rf_detr | rf_detr_nano | rf_detr_small | rf_detr_medium | lw_detr | deimv2 | deimv2_s)
    case $r in
    rf_detr) m=rf_detr_base size=560 cl="" ;;
    rf_detr_nano) m=rf_detr_nano size=384 cl="" ;;
    rf_detr_small) m=rf_detr_small size=512 cl="" ;;
    rf_detr_medium) m=rf_detr_medium size=576 cl="" ;;
    lw_detr) m=lw_detr_small size=640 cl="" ;;
    deimv2) m=deimv2_default size=640 cl=_cl ;;
    deimv2_s) m=deimv2_s size=640 cl="" ;;
    esac
    checkpoint "$m" families || continue
    ours "$m bf16 graphs (defaults)" "$m" bfloat16 "$size" 1,32 "--cuda-graph"
    [ "${FP8:-0}" = 1 ] && ours "$m bf16 graphs fp8" "$m" bfloat16 "$size" 1,32 "--cuda-graph --quantization fp8"
    ours "$m bf16 eager profile (defaults)" "$m" bfloat16 "$size" 32 "--profile"
    [ "${FP32:-0}" = 1 ] && ours "$m fp32 (TF32 off)" "$m" float32 "$size" 1,32 ""
    anchors "$m" "$size" 32 "$cl"
    ;;
  owlvit | owlv2 | grounding_dino | omdet_turbo)
    pc=on # the profile's text side: the cache's hit where the family caches its text
    case $r in
    owlvit) m=owlvit_base_patch32 size=768 set=owl ;;
    owlv2) m=owlv2_base_patch16 size=960 set=owl ;;
    grounding_dino) m=grounding_dino_tiny size=800x1333 set=grounding_dino ;;
    omdet_turbo) m=omdet_turbo_swin_tiny size=640 set=omdet pc=off ;;
    esac
    checkpoint "$m" "$set" || continue
    ours "$m bf16 prompt cache off and on (defaults)" "$m" bfloat16 "$size" 1,8 "--prompt-cache off,on"
    ours "$m bf16 eager profile, prompt cache $pc (defaults)" "$m" bfloat16 "$size" 8 "--prompt-cache $pc --profile"
    if [ "${SKIP_ANCHORS:-0}" != 1 ]; then
      anchor "$m" "$size" 8 eager_bf16,freeze_bf16
      anchor "$m" "$size" 1 eager_bf16,freeze_bf16
    fi
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

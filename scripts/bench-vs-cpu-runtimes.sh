#!/usr/bin/env bash
# The CPU path against ONNX Runtime and OpenVINO on the same CPU (issue 35; docs/BENCHMARKS.md
# "Against ONNX Runtime and OpenVINO on CPU"): full-size random-weight checkpoints
# (tools/bench_models/make_random_checkpoint.py) through libreyolo-bench-models at the daemon's
# defaults (--device cpu, --dtype as the daemon's CPU policy picks it (server/instance/
# dtype_policy.cpp: bfloat16 where /proc/cpuinfo lists amx_bf16 with amx_tile, or avx512_bf16,
# else float32; DTYPE overrides it); layouts, kernels and attention as the daemon decides
# them; the thread count through OMP_NUM_THREADS, which the daemon reads too: the tool has no
# --threads), where that is bfloat16 also `ours_float32` (OURS_FLOAT32=0 drops it),
# with OURS_PORTABLE=1 (the default) also `ours_portable` (float32): the same binary with
# LIBREYOLO_KERNELS=mem_efficient, which leaves every slot these models call on CPU on its
# portable path (conv2d_bias_act included: main's CPU path before a CPU implementation of it),
# and, in interleaved rounds on the same checkpoint, batch and size, the anchors of
# tools/bench_models/cpu_anchors.py: ONNX Runtime, OpenVINO (the model exported by
# torch.onnx.export), transformers eager and torch.compile + freezing. Each round runs ours,
# ours_portable, ORT, OpenVINO, eager, compile in that order; every runtime gets THREADS threads.
# cpu_anchors.py checks the anchors' logits and boxes against eager first (LayerNorm eps 1e-30 to
# break the random-weight ties of the query selection) and prints the exporter that worked.
#
# Rows (ROWS=comma list): r18 (RT-DETR-R18vd), r50 (RT-DETR-R50vd), dfine (D-FINE L), all 640x640.
# BATCHES (default 1; 8 takes about 10x as long), THREADS (2), ROUNDS (3), ITERS (3 forwards per
# round and runtime), WARMUP (1 per round and runtime), RUNTIMES (ort,openvino,eager,compile;
# where ours runs bfloat16 also openvino_bf16 and compile_bf16, the anchors' bf16 defaults),
# WAIT_QUIET (seconds to wait before each measurement until other processes take < 0.1 of the
# CPU; default 30), QUIET (0.15: the results use only the measurements during which others took
# less than that, where there are any; every measurement prints its others_cpu).
# Needs: build/bin/libreyolo-bench-models (BUILD_DIR), the venv of scripts/requirements.txt plus
# tools/bench_models/requirements-cpu-anchors.txt (PYTHON). Writes the checkpoints to CKPT_DIR
# (default /tmp/libreyolo-cpu-ckpt; kept between runs), the ONNX files to $CKPT_DIR/onnx, the log
# to LOG (default cpu-runtimes.log). The binary and its build/lib are copied to $CKPT_DIR/ours
# first (the log names their build times and the uncommitted files of kernels/ and models/), so a
# rebuild of a shared build directory during the run changes nothing. Prints the table: ms per
# image (median over rounds of the round medians / least single forward) and ours / anchor of
# the same run (< 1: ours is faster).
# Exit codes: 0 ok, 1 a run failed, 2 usage error.
set -uo pipefail
bin=${BUILD_DIR:-build}/bin/libreyolo-bench-models
python=${PYTHON:-$HOME/.cache/libreyolo-server/venv-torch2.11/bin/python}
ckpt=${CKPT_DIR:-/tmp/libreyolo-cpu-ckpt}
log=${LOG:-cpu-runtimes.log}
rows=${ROWS:-r18}
threads=${THREADS:-2}
status=0
# The daemon's CPU dtype policy (server/instance/dtype_policy.cpp), read from the same flags.
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
if [[ $flags == *" amx_bf16 "* && $flags == *" amx_tile "* ]] || [[ $flags == *" avx512_bf16 "* ]]; then
  policy_dtype=bfloat16
else
  policy_dtype=float32
fi
dtype=${DTYPE:-$policy_dtype}
if [[ $dtype == bfloat16 ]]; then
  runtimes=${RUNTIMES:-ort,openvino,openvino_bf16,eager,compile,compile_bf16}
else
  runtimes=${RUNTIMES:-ort,openvino,eager,compile}
fi
here=$(cd "$(dirname "$0")/.." && pwd)

declare -A folder=([r18]=rtdetr_r18vd [r50]=rtdetr_r50vd [dfine]=dfine_l)
declare -A set=([r18]=detectors [r50]=detectors [dfine]=dfine)
for r in ${rows//,/ }; do
  if [[ -z ${folder[$r]:-} ]]; then
    echo "FAIL: ROWS: unknown row '$r' (expected r18, r50, dfine)" >&2
    exit 2
  fi
done
if [[ ! -x $bin ]]; then
  echo "FAIL: $bin not built (cmake --build build --target libreyolo-bench-models)" >&2
  exit 2
fi

# The snapshot of ours: bin/ and lib/ side by side, as its RPATH ($ORIGIN/../lib) expects.
lib=$(dirname "$bin")/../lib
mkdir -p "$ckpt/ours/bin" "$ckpt/ours/lib"
cp "$bin" "$ckpt/ours/bin/" && cp "$lib"/*.so "$ckpt/ours/lib/" || exit 1
ours=$ckpt/ours/bin/$(basename "$bin")

{
  echo "== cpu-runtimes $(date -u +%FT%TZ) commit $(git -C "$here" rev-parse --short HEAD) rows=$rows" \
    "batches=${BATCHES:-1} threads=$threads dtype=$dtype (policy $policy_dtype) rounds=${ROUNDS:-3} iters=${ITERS:-3} warmup=${WARMUP:-1}"
  echo "ours: $bin built $(date -u -r "$bin" +%FT%TZ), libreyolo_kernels.so built" \
    "$(date -u -r "$lib/libreyolo_kernels.so" +%FT%TZ); uncommitted in kernels/ and models/:" \
    "$(git -C "$here" status --short -- kernels models | tr '\n' ' ')"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L[23])'
  echo "flags: $(grep -m1 -o -E '\b(avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*)\b' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  "$python" -c 'import torch, transformers, onnxruntime, openvino, onnx, onnxscript
print("versions: torch", torch.__version__, "transformers", transformers.__version__,
      "onnxruntime", onnxruntime.__version__, "openvino", openvino.__version__,
      "onnx", onnx.__version__, "onnxscript", onnxscript.__version__)'
} 2>&1 | tee "$log"

for r in ${rows//,/ }; do
  dir=$ckpt/${folder[$r]}
  if [[ ! -f $dir/config.json ]]; then
    "$python" "$here/tools/bench_models/make_random_checkpoint.py" "$ckpt" "${set[$r]}" 2>&1 |
      grep -v 'Writing model shards' | tee -a "$log"
  fi
  cmd="$ours --model $dir --device cpu --size 640"
  variants=(--ours "ours=$cmd --dtype $dtype")
  [[ $dtype != float32 && ${OURS_FLOAT32:-1} == 1 ]] && variants+=(--ours "ours_float32=$cmd --dtype float32")
  [[ ${OURS_PORTABLE:-1} == 1 ]] && variants+=(--ours "ours_portable=env LIBREYOLO_KERNELS=mem_efficient $cmd --dtype float32")
  start=$SECONDS
  "$python" "$here/tools/bench_models/cpu_anchors.py" "$dir" --batch "${BATCHES:-1}" --size 640 \
    --threads "$threads" --rounds "${ROUNDS:-3}" --iters "${ITERS:-3}" --warmup "${WARMUP:-1}" \
    --runtimes "$runtimes" --work "$ckpt/onnx" \
    --wait-quiet "${WAIT_QUIET:-30}" --quiet "${QUIET:-0.15}" "${variants[@]}" 2>&1 |
    grep --line-buffered -E '^(setup|export|check|noise|round|result|ours_binding|Traceback|[A-Za-z]*Error)' | tee -a "$log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== row $r done in $((SECONDS - start)) s" | tee -a "$log"
done

# The table: one line per (model, batch), one column per runtime in the order the log first
# names them, from the `result` lines of this log.
awk '
  /^result / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    key = f["model"] " | " f["batch"]
    if (!(key in seen)) { seen[key] = 1; keys[++n] = key }
    if (!(f["runtime"] in named)) { named[f["runtime"]] = 1; rts[++m] = f["runtime"] }
    med[key, f["runtime"]] = f["median_ms_per_image"]; low[key, f["runtime"]] = f["min_ms_per_image"]
  }
  function cell(k, rt) {
    if (!((k, rt) in med)) return "-"
    s = med[k, rt] " / " low[k, rt]
    if (rt != "ours" && (k, "ours") in med && med[k, rt] > 0)
      s = s sprintf(" (ours %.2fx / %.2fx)", med[k, "ours"] / med[k, rt], low[k, "ours"] / low[k, rt])
    return s
  }
  END {
    print ""
    print "ms per image, median / min; in brackets ours / that runtime, median / min (< 1: ours faster)"
    head = "| model | batch |"; rule = "|---|---|"
    for (j = 1; j <= m; j++) { head = head " " rts[j] " |"; rule = rule "---|" }
    print head; print rule
    for (i = 1; i <= n; i++) {
      line = "| " keys[i] " |"
      for (j = 1; j <= m; j++) line = line " " cell(keys[i], rts[j]) " |"
      print line
    }
  }' "$log" | tee -a "$log"
exit $status

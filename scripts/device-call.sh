#!/usr/bin/env bash
# One call on the GPU machine (run it through the `device` tool, carry [".device-kit"]): the CUDA
# build, then whatever the environment asks, within DEADLINE seconds of the script's start, with
# every log packed into $OUT/logs.tgz (the tool brings back 8 files). Stage the kit first:
# ../shared/device/stage.sh, then scripts/device-kit-extras.sh.
#   BUILD=0            reuse build-gpu/ (a warm machine keeps it)
#   TESTS='filter'     test_gpu --gtest_filter (TEST_S seconds)
#   KBENCH=ops         bench_kernels --ops (e.g. bias_act,max_pool)
#   ROWS=r50,fp32,...  scripts/bench-vs-compile-gpu.sh rows
#   PROFILES="model:set:size ..."  --profile of a bf16 batch-32 forward (checkpoint written first)
#   ITESTS='filter'    test_integration --gtest_filter (ITEST_S seconds)
#   SERVE="model:size:conc ..."  served JPEG at the daemon's defaults (bf16, CUDA graphs,
#                      max_batch_size 32) against forward-only batch 32 in the same run, through
#                      scripts/bench-serving-gpu.sh; checkpoints of CKSETS (detectors,families) first
#   EXTRA='cmd'        anything else, its log's tail printed
# The label printed first is .device-kit/COMMIT: echo one in (the tree travels with its .git,
# but git rev-parse shows HEAD, not the uncommitted change under test).
# Example: TESTS='*' KBENCH=bias_act,max_pool ROWS=r18 DEADLINE=575 bash scripts/device-call.sh
set -uo pipefail
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - t0) )); }
L=$OUT/l; mkdir -p $L
source .device-kit/env.sh > $L/env.log 2>&1
export LIBREYOLO_HUB_KERNELS=0
echo "commit: $(cat .device-kit/COMMIT 2>/dev/null)"
if [ "${BUILD:-1}" = 1 ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLIBREYOLO_CUDA=ON -DLIBREYOLO_TSAN=OFF > $L/build.log 2>&1 || { el "configure FAILED"; tail -30 $L/build.log; }
  ninja -C build-gpu -j16 -k 0 ${TARGETS:-} >> $L/build.log 2>&1 && el "build ok" || { el "build FAILED"; grep -m10 -A3 "error:\|FAILED:" $L/build.log | head -40; }
fi
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_S:-200} build-gpu/bin/test_gpu --gtest_filter="$TESTS" > $L/test_gpu.log 2>&1; el "test_gpu rc=$?"
  grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]|FAILED  \] [A-Z]" $L/test_gpu.log
fi
if [ -n "${ITESTS:-}" ]; then
  timeout ${ITEST_S:-200} build-gpu/bin/test_integration --gtest_filter="$ITESTS" > $L/test_integration.log 2>&1; el "test_integration rc=$?"
  grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]|FAILED  \] [A-Z]" $L/test_integration.log
fi
if [ -n "${KBENCH:-}" ]; then
  timeout ${KBENCH_S:-90} build-gpu/bin/bench_kernels --ops "$KBENCH" > $L/kbench.log 2>&1; el "bench_kernels rc=$?"
  tail -20 $L/kbench.log
fi
if [ -n "${ROWS:-}" ]; then
  mkdir -p $L/bench
  ROWS=$ROWS OUT=$L/bench timeout $(left) bash scripts/bench-vs-compile-gpu.sh > $L/bench/stdout.log 2>&1; el "bench rows $ROWS rc=$?"
  grep -E "^== |batch=|^profile class|^profile total|^anchor" $L/bench/bench_vs_compile.log | cut -c1-230
fi
for spec in ${PROFILES:-}; do   # model:set:size
  m=${spec%%:*}; rest=${spec#*:}; set_=${rest%%:*}; size=${rest#*:}
  [ $(left) -gt 40 ] || { el "skip profile $m (time)"; continue; }
  [ -f /tmp/ckpt/$m/model.safetensors ] || timeout $(left) python3 tools/bench_models/make_random_checkpoint.py /tmp/ckpt $set_ > $L/ckpt-$set_.log 2>&1
  timeout $(left) build-gpu/bin/libreyolo-bench-models --model /tmp/ckpt/$m --device cuda --dtype bfloat16 --size $size --batch 32 --iters 30 --warmup 5 --layouts default --profile > $L/profile-$m.log 2>&1
  el "profile $m rc=$?"
  grep -E "batch=|^profile class|^profile total|^profile kernel|^profile op_chain" $L/profile-$m.log | head -40 | cut -c1-330
done
if [ -n "${SERVE:-}" ]; then
  for spec in $SERVE; do   # model:size:concurrency
    m=${spec%%:*}; rest=${spec#*:}; size=${rest%%:*}; conc=${rest#*:}
    [ "$conc" != "$rest" ] || { el "skip serve $spec (not model:size:concurrency)"; continue; }
    [ $(left) -gt 60 ] || { el "skip serve $m (time)"; continue; }
    [ -f /tmp/ckpt/$m/model.safetensors ] || timeout $(left) python3 tools/bench_models/make_random_checkpoint.py /tmp/ckpt ${CKSETS:-detectors,families} > $L/ckpt-serve.log 2>&1
    [ $(left) -gt 60 ] || { el "skip serve $m (time)"; continue; }
    MODEL=$m SIZE=$size DTYPE=bfloat16 CUDA_GRAPHS=on MAX_BATCH=32 DURATION=${DURATION:-5} WARMUP=1 SKIP_B1=1 \
      B8_CONCURRENCY=none CONCURRENCY=$conc JPEG_CONCURRENCY=$conc OUT=$L/serve-$m-$conc \
      timeout $(left) bash scripts/bench-serving-gpu.sh /tmp/ckpt > $L/serve-$m-$conc.log 2>&1
    el "serve $m c$conc rc=$?"
    grep -E "forward only batch|mean batch|streams held|per request|JPEG images|round [0-9]|FAIL" $L/serve-$m-$conc/summary.txt | cut -c1-260
  done
fi
if [ -n "${EXTRA:-}" ]; then timeout $(left) bash -c "$EXTRA" > $L/extra.log 2>&1; el "extra rc=$?"; tail -${EXTRA_LINES:-40} $L/extra.log; fi
tar czf $OUT/logs.tgz -C $OUT l && rm -rf $L
el done

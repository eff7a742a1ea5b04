#!/usr/bin/env bash
# Builds and tests everything on the GPU machine, then benchmarks the CUDA kernels. Run from the
# repository root ON that machine, with the device kit (.device-kit/env.sh: the environment that
# points the build at the machine's CUDA LibTorch; staged outside the repository and carried to
# the machine with the working tree; scripts/device-kit-extras.sh adds cpp-httplib to it):
#   scripts/test-gpu.sh                 whole project in build-gpu: ctest (every label), the gpu
#                                       label verbose, bench_kernels
#   scripts/test-gpu.sh --kernels-only  only the kernels, test_gpu and bench_kernels
#                                       (tools/bench_kernels/standalone) in build-gpu-kernels
#   scripts/test-gpu.sh --bench         the whole project as above, then the end-to-end
#                                       benchmarks: scripts/bench-models-gpu.sh,
#                                       bench-attention-gpu.sh, bench-serving-gpu.sh
#                                       (their outputs packed into $OUT/bench.tgz)
# When the whole project does not configure there (a dependency missing from the kit), the script
# says so in the summary and falls back to --kernels-only.
# Results go to $OUT (the device run's output folder; ./gpu-out when unset), at most 8 files:
#   summary.txt, build.log, ctest.log, test_gpu.log, test_gpu.xml, bench_kernels.log,
#   bench_kernels.json, bench.tgz (--bench)
# Exit status: 0 when everything built and every test passed.
set -uo pipefail

mode=full
bench=0
[ "${1:-}" = "--kernels-only" ] && mode=kernels
[ "${1:-}" = "--bench" ] && bench=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
jobs=$(nproc)
status=0

if [ ! -f .device-kit/env.sh ]; then
  note "FAIL: .device-kit/env.sh missing (stage the device kit and carry .device-kit)"
  exit 2
fi
# shellcheck disable=SC1091
source .device-kit/env.sh >>"$OUT/build.log" 2>&1
note "date: $(date -u +%FT%TZ)"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
note "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
note "nvcc: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cmake: $(cmake --version | head -1), g++: $(g++ -dumpversion)"
for h in curl/curl.h openssl/sha.h png.h turbojpeg.h; do
  found=$(ls /usr/include/$h /usr/include/x86_64-linux-gnu/$h /opt/deps/usr/include/$h 2>/dev/null | head -1)
  note "header $h: ${found:-MISSING}"
done

# No hub downloads from the GPU machine (it has no network): the hub provider stays unloaded.
export LIBREYOLO_HUB_KERNELS=0

build=build-gpu
if [ "$mode" = full ]; then
  if cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLIBREYOLO_CUDA=ON \
      -DLIBREYOLO_TSAN=OFF >>"$OUT/build.log" 2>&1; then
    note "configure (whole project): ok"
  else
    note "configure (whole project): FAILED (see build.log); falling back to --kernels-only"
    grep -m5 "CMake Error\|Could NOT find\|not found" "$OUT/build.log" | tee -a "$summary"
    mode=kernels
    status=1
  fi
fi
if [ "$mode" = kernels ]; then
  build=build-gpu-kernels
  if cmake -S tools/bench_kernels/standalone -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      >>"$OUT/build.log" 2>&1; then
    note "configure (kernels only): ok"
  else
    note "configure (kernels only): FAILED (see build.log)"
    exit 1
  fi
fi

start=$(date +%s)
if ninja -C $build -j"$jobs" -k 0 >>"$OUT/build.log" 2>&1; then
  note "build: ok ($(($(date +%s) - start)) s)"
else
  note "build: FAILED ($(($(date +%s) - start)) s); first errors:"
  grep -m10 -A3 "error:\|FAILED:" "$OUT/build.log" | head -40 | tee -a "$summary"
  status=1
fi

if [ "$mode" = full ]; then
  ctest --test-dir $build -j8 --timeout 600 --output-on-failure >"$OUT/ctest.log" 2>&1 || status=1
  note "ctest (every label): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Exception)" "$OUT/ctest.log" \
    | head -30 | tee -a "$summary"
fi
ctest --test-dir $build -L gpu --timeout 600 >>"$OUT/ctest.log" 2>&1 || status=1
note "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"

# The classifier serving tests once more with the models on the GPU (they default to cpu).
if [ "$mode" = full ] && [ -x $build/bin/test_integration ]; then
  LIBREYOLO_TEST_DEVICE=cuda $build/bin/test_integration --gtest_filter='*Classif*' \
    >>"$OUT/ctest.log" 2>&1 || status=1
  note "test_integration *Classif* on cuda: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/ctest.log" | tail -1)"
fi

# The gpu tests once more in one process, verbose: they print their measured maxima.
if [ -x $build/bin/test_gpu ]; then
  $build/bin/test_gpu --gtest_output=xml:"$OUT/test_gpu.xml" >"$OUT/test_gpu.log" 2>&1 || status=1
  note "test_gpu: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$OUT/test_gpu.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/test_gpu.log" | tee -a "$summary"
else
  note "test_gpu: not built"
  status=1
fi

if [ -x $build/bin/bench_kernels ]; then
  timeout 300 $build/bin/bench_kernels --json "$OUT/bench_kernels.json" >"$OUT/bench_kernels.log" 2>&1 \
    || status=1
  note "bench_kernels:"
  tee -a "$summary" <"$OUT/bench_kernels.log"
else
  note "bench_kernels: not built"
  status=1
fi
if [ "$bench" = 1 ] && [ "$mode" = full ]; then
  work=$(mktemp -d)
  for b in models attention serving; do
    mkdir -p "$work/$b"
    start=$(date +%s)
    if OUT=$work/$b BUILD_DIR=$build BIN=$build/bin bash scripts/bench-$b-gpu.sh >"$work/$b/stdout.log" 2>&1; then
      note "bench-$b-gpu.sh: ok ($(($(date +%s) - start)) s)"
    else
      note "bench-$b-gpu.sh: FAILED ($(($(date +%s) - start)) s): $(tail -3 "$work/$b/stdout.log" | tr '\n' ' ')"
      status=1
    fi
  done
  [ -f "$work/serving/summary.txt" ] && tee -a "$summary" <"$work/serving/summary.txt"
  tar czf "$OUT/bench.tgz" -C "$work" .
fi
note "exit status: $status"
exit $status

#!/usr/bin/env bash
# Bounded libFuzzer run of every fuzz target (tests/fuzz, docs/FUZZING.md; clang, ASan+UBSan):
# the torch-free parsers and, against the main build's libraries, the torch targets (image
# preprocessing, the OIP request path, model configs, checkpoints). Each target first runs its
# whole seed corpus tests/fuzz/corpus/<target>/ (the regression inputs of fixed findings
# included), then fuzzes for FUZZ_SECONDS (default 10) on a copy of it; FUZZ_PARALLEL targets
# (default 2) at a time. A crash, a sanitizer report, a timeout or an out-of-memory fails the
# script and names the input. Measured on 2 cores: see docs/FUZZING.md "CI share".
# FUZZ_TARGETS="a b" runs only those; FUZZ_TORCH=0 skips the torch targets; FUZZ_BUILD_ONLY=1
# builds and stops (scripts/fuzz-campaign.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
fuzz_build=$build/fuzz
seconds=${FUZZ_SECONDS:-10}
parallel=${FUZZ_PARALLEL:-2}
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs it)"; exit 1
fi
t0=$(date +%s)
main_build=""
if [ "${FUZZ_TORCH:-1}" != 0 ]; then main_build=$(cd "$build" && pwd); fi
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# A fuzz build configured from another source folder (the targets lived in models/fuzz before
# tests/fuzz) is stale: its build.ninja names CMakeLists.txt that no longer exist.
if [ -f "$fuzz_build/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD/tests/fuzz" "$fuzz_build/CMakeCache.txt"; then
  rm -rf "$fuzz_build"
fi
if [ ! -f "$fuzz_build/build.ninja" ] || ! grep -q "LIBREYOLO_FUZZ_MAIN_BUILD:PATH=$main_build\$" "$fuzz_build/CMakeCache.txt"; then
  CC=clang CXX=clang++ cmake -S tests/fuzz -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLIBREYOLO_FUZZ_MAIN_BUILD="$main_build" >/dev/null
fi
ninja -C "$fuzz_build" -j "${JOBS:-$(nproc)}" >/dev/null
t1=$(date +%s)
echo "fuzz: targets built in $((t1 - t0)) s"
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

targets=${FUZZ_TARGETS:-$(cd "$fuzz_build/bin" && ls *_fuzz | sed 's/_fuzz$//' | sort)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LIBREYOLO_FUZZ_FIXTURES=$PWD/tests/fixtures LIBREYOLO_LOG_LEVEL=${LIBREYOLO_LOG_LEVEL:-error}
run_one() {
  local t=$1 corpus=$work/$1/corpus artifacts=$work/$1/artifacts/
  mkdir -p "$corpus" "$artifacts"
  cp tests/fuzz/corpus/"$t"/* "$corpus/"
  # The seeds whole first (regression inputs may be larger than what the fuzzing generates),
  # then fuzzing with the target's input size bound (scripts/fuzz-max-len.sh).
  if "$fuzz_build/bin/${t}_fuzz" -runs=0 -timeout=30 -rss_limit_mb=6144 \
       -artifact_prefix="$artifacts" tests/fuzz/corpus/"$t" >"$work/$t.seeds.log" 2>&1 &&
     "$fuzz_build/bin/${t}_fuzz" -max_total_time="$seconds" -max_len="$(fuzz_max_len "$t")" \
       -timeout=30 -rss_limit_mb=6144 -print_final_stats=1 -artifact_prefix="$artifacts" \
       "$corpus" >"$work/$t.log" 2>&1; then
    local runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/$t.log" | tail -1)
    echo "fuzz: $t: ${runs:-?} executions in $seconds s, $cov, no crash"
  else
    echo "fuzz: $t FAILED"; tail -n 40 "$work/$t.seeds.log" "$work/$t.log" 2>/dev/null
    ls "$artifacts" | sed "s|^|fuzz: $t: input |"
    return 1
  fi
}
source scripts/fuzz-max-len.sh
export -f run_one fuzz_max_len
export work seconds fuzz_build
status=0
printf '%s\n' $targets | xargs -P "$parallel" -I{} bash -c 'run_one {}' || status=1
echo "fuzz: $(echo $targets | wc -w) targets in $(( $(date +%s) - t0 )) s (build $((t1 - t0)) s)"
exit $status

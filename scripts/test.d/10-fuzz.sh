#!/usr/bin/env bash
# Bounded libFuzzer runs (clang, ASan+UBSan), 60 s each: the safetensors header parser on the
# seed corpus tests/fixtures/fuzz/safetensors, the KServe REST codec on tests/fixtures/fuzz/kserve.
# Neither has a torch dependency, so each fuzz target builds in its own small CMake project with
# clang whatever compiler the main build uses.
set -euo pipefail
build=${1:-build}
fuzz_build=$build/fuzz
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs it)"; exit 1
fi
if [ ! -f "$fuzz_build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S models/fuzz -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$fuzz_build" safetensors_fuzz >/dev/null
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp tests/fixtures/fuzz/safetensors/* "$corpus/"
bin=$(find "$fuzz_build" -name safetensors_fuzz -type f -perm -u+x | head -1)
"$bin" -max_total_time="${FUZZ_SECONDS:-60}" -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
echo "fuzz: no crash in ${FUZZ_SECONDS:-60} s"

# The KServe v2 REST codec (server/http/kserve_json.h: request body + header -> InferRequest,
# response rendering), seeds tests/fixtures/fuzz/kserve.
http_build=$build/fuzz-http
if [ ! -f "$http_build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S server/http/fuzz -B "$http_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$http_build" kserve_fuzz >/dev/null
http_corpus=$(mktemp -d)
trap 'rm -rf "$corpus" "$http_corpus"' EXIT
cp tests/fixtures/fuzz/kserve/* "$http_corpus/"
"$http_build/bin/kserve_fuzz" -max_total_time="${FUZZ_SECONDS:-60}" -print_final_stats=1 "$http_corpus" 2>&1 | tail -n 12
echo "fuzz (kserve): no crash in ${FUZZ_SECONDS:-60} s"

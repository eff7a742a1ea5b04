#!/usr/bin/env bash
# Bounded libFuzzer run on the safetensors header parser (clang, ASan+UBSan), 60 s on the seed
# corpus tests/fixtures/fuzz/safetensors. The parser has no torch dependency, so the fuzz target
# builds in its own small CMake project with clang whatever compiler the main build uses.
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

#!/usr/bin/env bash
# JPEG decode + preprocess on the GPU (issue 32): bench_preprocess's GPU rows (the
# `image_decode_batch` slot's nvjpeg, nvjpegDecodeBatched on the hardware decoder, then resize /
# rescale / normalise into a (B, 3, 640, 640) bfloat16 batch by the image processor's ATen ops on
# the GPU: BM_GpuDecodePreprocess, or by the `image_preprocess` slot's one kernel:
# BM_GpuDecodePreprocessSlot; and the preprocessing alone, ATen ops against the slot:
# BM_GpuPreprocess/path:0|1) and their anchor, torchvision.io.decode_jpeg(list, device="cuda") + torchvision.transforms.v2 Resize /
# ToDtype / Normalize on the GPU (tools/bench_preprocess/decode_anchor.py), on the same files
# (36 baseline 4:2:0 640x480 JPEGs of the fixture photographs at qualities 75 / 85 / 95) and batch
# sizes, in one call. Targets: >= 10,000 images/s, and >= 1.5x the anchor.
#
# Run ON the GPU machine from the repository root (it sources .device-kit/env.sh when present), after
# a build in build-gpu (scripts/test-gpu.sh, or `ninja -C build-gpu bench_preprocess`):
#   scripts/bench-decode-gpu.sh
# Environment: BUILD_DIR (build-gpu), OUT (./gpu-out), BATCHES (32,128), JPEG_DIR (where the files
# are made; default $OUT/decode-jpegs), MIN_TIME (Google Benchmark --benchmark_min_time, seconds: 3).
# Writes to $OUT: bench_decode.txt (both sides and the ratios), bench_preprocess_gpu.json,
# decode_anchor.json.
# Exit status 0 when both sides ran (whether or not the targets are met; bench_decode.txt says).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
build=${BUILD_DIR:-build-gpu}
bin=$build/bin/bench_preprocess
batches=${BATCHES:-32,128}
jpegs=${JPEG_DIR:-$OUT/decode-jpegs}
txt=$OUT/bench_decode.txt
if [ -f .device-kit/env.sh ]; then
  # shellcheck disable=SC1091
  source .device-kit/env.sh >/dev/null 2>&1 || echo "bench-decode-gpu: warning: sourcing .device-kit/env.sh failed"
fi
python=$(command -v python3 || true)
: >"$txt"
note() { echo "bench-decode-gpu: $*" | tee -a "$txt"; }
if [ -f "$build/build.ninja" ]; then  # (re)build: the GPU row is new
  timeout 1200 ninja -C "$build" bench_preprocess >"$OUT/bench_decode_build.log" 2>&1 ||
    { note "FAIL: ninja -C $build bench_preprocess (tail of $OUT/bench_decode_build.log: $(tail -3 "$OUT/bench_decode_build.log" | tr '\n' ' '))"; exit 1; }
fi
[ -x "$bin" ] || { note "FAIL: $bin not built (ninja -C $build bench_preprocess)"; exit 1; }
[ -n "$python" ] || { note "FAIL: no python3 (the anchor and the files need torch, torchvision, PIL)"; exit 1; }
note "date $(date -u +%FT%TZ), gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
"$python" tools/bench_preprocess/decode_anchor.py --make "$jpegs" 2>&1 | tee -a "$txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { note "FAIL: making the JPEGs"; exit 1; }

sizes="$(echo "$batches" | tr ',' '|')"
filter="BM_GpuDecodePreprocess(Slot)?/batch:($sizes)/|BM_GpuPreprocess/batch:($sizes)/"
JPEG_DIR=$jpegs timeout 300 "$bin" --benchmark_filter="$filter" \
  --benchmark_min_time="${MIN_TIME:-3}" --benchmark_out="$OUT/bench_preprocess_gpu.json" \
  --benchmark_out_format=json 2>&1 | tee -a "$txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { note "FAIL: bench_preprocess"; exit 1; }
timeout 300 "$python" tools/bench_preprocess/decode_anchor.py --dir "$jpegs" --batch "$batches" \
  --json "$OUT/decode_anchor.json" 2>&1 | tee -a "$txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { note "FAIL: decode_anchor.py"; exit 1; }

"$python" - "$OUT/bench_preprocess_gpu.json" "$OUT/decode_anchor.json" <<'PY' | tee -a "$txt"
import json, re, sys
rows = {}  # (row, batch) -> images/s
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    m = re.match(r"(BM_\w+)/batch:(\d+)(?:/path:(\d))?", b["name"])
    if m and "items_per_second" in b:
        row = m.group(1) + ("" if m.group(3) is None else ("/slot" if m.group(3) == "1" else "/aten"))
        rows[(row, int(m.group(2)))] = b["items_per_second"]
for row in json.load(open(sys.argv[2])):
    b, theirs = row["batch"], row["images_per_s"]
    for name, what in (("BM_GpuDecodePreprocess", "ATen preprocess"),
                       ("BM_GpuDecodePreprocessSlot", "image_preprocess slot")):
        ours = rows.get((name, b))
        if ours is None:
            print(f"batch {b}: no {name} row")
            continue
        ratio = ours / theirs
        verdict = "MET" if ours >= 10000 and ratio >= 1.5 else "not met"
        print(f"batch {b} ({what}): libreyolo {ours:.0f} images/s, torchvision {theirs:.0f} "
              f"images/s, {ratio:.2f}x (target >= 10000 images/s and >= 1.5x: {verdict})")
    aten, slot = rows.get(("BM_GpuPreprocess/aten", b)), rows.get(("BM_GpuPreprocess/slot", b))
    if aten and slot:
        print(f"batch {b} preprocess only: ATen ops {aten:.0f} images/s, image_preprocess slot "
              f"{slot:.0f} images/s ({slot / aten:.2f}x)")
PY
exit 0

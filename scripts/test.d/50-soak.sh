#!/usr/bin/env bash
# A few minutes of scripts/soak.sh (concurrency 64 on the tiny RT-DETR) with a bound on the RSS
# growth of the second half: catches a gross per-request leak (an image or a tensor kept per
# request grows by MB per second), not a slow one; the hour-long run and its results are in
# docs/SOAK.md. SOAK_CI_SECONDS (default 240) and SOAK_CI_MAX_GROWTH_MB (default 200; the noise
# of the median between two minutes at this load is about +-100 MB on 2 cores) tune it.
# Usage: scripts/test.d/50-soak.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
SOAK_SECONDS=${SOAK_CI_SECONDS:-240} SOAK_CONCURRENCY=64 SOAK_STEP=30 SOAK_SAMPLE=2 \
  SOAK_MAX_REQUESTS=200000 SOAK_MAX_GROWTH_MB=${SOAK_CI_MAX_GROWTH_MB:-200} \
  bash scripts/soak.sh "$build"

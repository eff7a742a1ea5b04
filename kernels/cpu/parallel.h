// at::parallel_for for the CPU kernels, with the check that it is parallel at all: ATen's
// OpenMP backend splits the range in an inline function of its headers (ATen/ParallelOpenMP.h),
// so in a file compiled without -fopenmp the whole range runs on the calling thread, silently.
// The Winograd convolution ran its transforms that way until 2026-12-08 (docs/BENCHMARKS.md
// "Winograd on every thread"). Include this instead of <ATen/Parallel.h> and list the file in
// libreyolo_openmp_sources (CMakeLists.txt).
#pragma once

#ifndef _OPENMP
#error \
    "at::parallel_for runs on one thread in a file built without OpenMP: list this file in libreyolo_openmp_sources (CMakeLists.txt)"
#endif

#include <ATen/Parallel.h>

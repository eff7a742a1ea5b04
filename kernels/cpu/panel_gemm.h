// A single-threaded float32 GEMM whose right operand is a constant packed once (a weight): the
// Winograd convolution's 36 GEMMs per tile block (kernels/conv/cpu/conv2d_bias_act_winograd.cpp).
//
// Why not MKL's sgemm (at::bmm_out): on a Zen 1 core its batches of 36 GEMMs of about 100 rows by
// 48-256 columns ran at 36-40 GFLOP/s, this kernel at 43-45 (the core's FMA peak at its boost
// clock is about 46; docs/BENCHMARKS.md "Winograd's GEMMs in a packed-panel kernel"). It is the
// classic register-blocked kernel (Goto & van de Geijn, "Anatomy of High-Performance Matrix
// Multiplication", ACM TOMS 2008): 6 rows of A by 16 columns of B in 12 AVX2 accumulators, B
// packed into 16-column panels so that each k step loads two contiguous vectors.
#pragma once

#include <cstdint>

namespace libreyolo::kernels {

/// Floats in B (K x N) packed for gemm_panels: ceil(N / 16) panels of K x 16, zero past column N.
int64_t panel_size(int64_t k, int64_t n);

/// Packs B (K x N, row stride `ldb`) into `out` (panel_size(k, n) floats): panel j holds columns
/// [16 j, 16 j + 16) as K consecutive rows of 16.
void pack_panels(const float* b, int64_t ldb, int64_t k, int64_t n, float* out);

/// Whether gemm_panels runs on this CPU: AVX2 and FMA without AVX-512F (on AVX-512 CPUs MKL's
/// sgemm uses vectors twice as wide: the caller keeps it there).
bool panel_gemm_available();

/// C (M x N, row stride `ldc`) = A (M x K, row stride `lda`) B, with B packed by pack_panels.
/// Each C element is one chain of FMAs in k order. Only columns [0, N) of C are written.
/// Throws std::logic_error where panel_gemm_available() is false.
void gemm_panels(const float* a, int64_t lda, int64_t m, int64_t k, const float* b_panels,
                 int64_t n, float* c, int64_t ldc);

}  // namespace libreyolo::kernels

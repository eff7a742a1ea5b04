// The packed-panel GEMM (kernels/cpu/panel_gemm.h): AVX2 + FMA intrinsics in functions compiled
// for those features alone, chosen at run time (panel_gemm_available), so the rest of the build
// keeps the baseline ISA.
#include "kernels/cpu/panel_gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LIBREYOLO_PANEL_GEMM 1
#endif

namespace libreyolo::kernels {

namespace {
constexpr int64_t kPanel = 16;  ///< columns per panel: two AVX2 vectors
constexpr int kRows = 6;        ///< rows per register block: 12 accumulators, 2 B vectors, 1 A
}  // namespace

int64_t panel_size(int64_t k, int64_t n) { return (n + kPanel - 1) / kPanel * kPanel * k; }

void pack_panels(const float* b, int64_t ldb, int64_t k, int64_t n, float* out) {
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t cols = std::min(kPanel, n - j0);
    for (int64_t kk = 0; kk < k; ++kk, out += kPanel) {
      std::memcpy(out, b + kk * ldb + j0, static_cast<size_t>(cols) * sizeof(float));
      std::fill(out + cols, out + kPanel, 0.0f);
    }
  }
}

#ifdef LIBREYOLO_PANEL_GEMM

bool panel_gemm_available() {
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                !__builtin_cpu_supports("avx512f");
  return available;
}

namespace {

/// C rows [0, R) x columns [0, cols) of one panel (cols <= 16): R x 16 accumulators over k.
template <int R>
__attribute__((target("avx2,fma"))) void block(const float* a, int64_t lda, int64_t k,
                                               const float* b, float* c, int64_t ldc, int cols) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk, b += kPanel) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + kk);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  if (cols == kPanel) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(c + r * ldc, acc[r][0]);
      _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
    return;
  }
  // The last panel's columns past N: masked stores (lane i kept where i < cols).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
  // Unrolled like every loop over acc: an indexed access would keep acc in memory, stored at
  // every k step.
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_maskstore_ps(c + r * ldc, m0, acc[r][0]);
    _mm256_maskstore_ps(c + r * ldc + 8, m1, acc[r][1]);
  }
}

using Block = void (*)(const float*, int64_t, int64_t, const float*, float*, int64_t, int);
constexpr Block kBlocks[kRows + 1] = {nullptr,   &block<1>, &block<2>, &block<3>,
                                      &block<4>, &block<5>, &block<6>};

}  // namespace

void gemm_panels(const float* a, int64_t lda, int64_t m, int64_t k, const float* b_panels,
                 int64_t n, float* c, int64_t ldc) {
  // Panel-major: one panel (k x 16 floats) stays in L1 while every row block streams A past it.
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const float* b = b_panels + j0 * k;
    const int cols = static_cast<int>(std::min(kPanel, n - j0));
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      kBlocks[rows](a + i * lda, lda, k, b, c + i * ldc + j0, ldc, cols);
    }
  }
}

#else

bool panel_gemm_available() { return false; }

void gemm_panels(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t) {
  throw std::logic_error("gemm_panels: not built for this CPU (panel_gemm_available() is false)");
}

#endif

}  // namespace libreyolo::kernels

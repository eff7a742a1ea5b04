// The `fp8_gemm` slot: y = x W^T + b with W stored in FP8 (E4M3FN), one float32 scale per output
// channel, and x quantised per row (token) to E4M3FN on the fly: the execute half of FP8, whose
// numbers the `fake_quant_fp8` slot simulates (kernels/quant/fake_quant_fp8.h: the same clamp and
// round-to-nearest-even cast).
//
// Implementations: `scaled_mm` (kernels/gemm/cuda/fp8_gemm_cuda.cpp): at::_scaled_mm with
// row-wise scales (aten/src/ATen/native/cuda/Blas.cpp, RowwiseScaledMM.cu: FP8 tensor cores of
// sm89 and later, bfloat16 output and bias). No portable implementation: the caller keeps the
// dense Linear and runs it when the handle is empty or declines (fp8_linear below).
//
// Shapes and dtypes:
//   x       (..., K)  the model's dtype (bfloat16 for `scaled_mm`)
//   weight  Fp8Weight: data (N, K) float8_e4m3fn, scale (N) float32, x's device
//   bias    (N) x's dtype, or undefined
//   output  (..., N) in x's dtype
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// Largest finite float8_e4m3fn magnitude (OCP 8-bit floating point spec, E4M3: 1.75 * 2^8).
inline constexpr double kFp8E4m3Max = 448.0;

/// A Linear weight quantised once: weight ~= data * scale[:, None].
struct Fp8Weight {
  at::Tensor data;   ///< (N, K) float8_e4m3fn, contiguous
  at::Tensor scale;  ///< (N) float32, > 0
  bool defined() const { return data.defined(); }
  /// Output channels [start, start + n) (a packed q/k/v projection's q and k rows).
  Fp8Weight rows(int64_t start, int64_t n) const {
    return {data.narrow(0, start, n), scale.narrow(0, start, n)};
  }
};

/// Per-output-channel quantisation of `weight` (N, K), any floating dtype and device:
/// scale[n] = amax(|weight[n, :]|) / 448 (1 for an all-zero row), data = e4m3fn(clamp(weight /
/// scale, -448, 448)), computed in float32: data * scale equals
/// fake_quant_fp8_reference(weight, scale[:, None]) bit for bit. Throws c10::Error for a weight
/// that is not 2-D or not floating, or holds a non-finite value (naming the row).
Fp8Weight quantize_fp8_weight(const at::Tensor& weight);

/// Per-row quantisation of activations x (M, K), any floating dtype: {data (M, K)
/// float8_e4m3fn, scale (M, 1) float32} with the rule of quantize_fp8_weight (a row of zeros gets
/// scale 1; non-finite values are not checked: a NaN row stays NaN, as the dense GEMM's would).
std::pair<at::Tensor, at::Tensor> quantize_fp8_rows(const at::Tensor& x);

/// The slot's declaration.
inline constexpr SlotDef<at::Tensor(const at::Tensor& x, const at::Tensor& weight_data,
                                    const at::Tensor& weight_scale, const at::Tensor& bias)>
    kFp8Gemm{"fp8_gemm"};
using Fp8GemmHandle = Handle<decltype(kFp8Gemm)::Signature>;

/// The model-facing entry point: y = x W^T + b through `handle` on `w8` when it is bound and
/// accepts, else at::linear(x, dense_weight, bias) (the dense Linear the module keeps). Validates
/// first (c10::Error naming the tensor): w8 (N, K) float8_e4m3fn with scale (N), dense_weight
/// (N, K), x (..., K), bias (N).
at::Tensor fp8_linear(const Fp8GemmHandle& handle, const at::Tensor& x, const Fp8Weight& w8,
                      const at::Tensor& dense_weight, const at::Tensor& bias);

}  // namespace libreyolo::kernels

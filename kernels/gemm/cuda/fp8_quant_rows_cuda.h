// The activation half of the `scaled_mm` fp8_gemm (kernels/gemm/cuda/fp8_gemm_cuda.cpp): one CUDA
// kernel for what quantize_fp8_rows (kernels/gemm/fp8_gemm.h) computes with eight ATen kernels
// and float32 temporaries four times x's size, which cost more than the FP8 GEMM saves.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace libreyolo::kernels::cuda {

/// Whether quantize_fp8_rows_bf16 takes `x`: a contiguous 2-D bfloat16 CUDA tensor whose rows
/// are whole 16-byte vectors (K a multiple of 8, a 16-byte aligned pointer).
bool quantize_fp8_rows_bf16_accepts(const at::Tensor& x);

/// quantize_fp8_rows for a bfloat16 x (M, K) in one pass per row (a warp per row: |x| max,
/// then x / scale clamped to +-448 and cast to E4M3FN by cvt.rn.satfinite): {data (M, K)
/// float8_e4m3fn, scale (M, 1) float32}, bit-identical to quantize_fp8_rows (scale = amax / 448
/// by IEEE division, 1 for a zero row and for a row holding NaN, whose NaNs stay NaN). Throws
/// c10::Error when quantize_fp8_rows_bf16_accepts(x) is false. Current stream, no sync.
std::pair<at::Tensor, at::Tensor> quantize_fp8_rows_bf16(const at::Tensor& x);

}  // namespace libreyolo::kernels::cuda

// The CUDA kernel of the `cuda` add_layer_norm (kernels/norm/add_layer_norm.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/norm/add_layer_norm.h"

namespace libreyolo::kernels::cuda {

/// The widest row the kernel holds in registers: 1,024 elements (ViT-L); wider rows are
/// refused (c10::Error) and the slot declines them first.
inline constexpr int64_t kMaxLayerNormWidth = 1024;

/// Whether the kernel takes rows of width `d` in `dtype`: d <= kMaxLayerNormWidth and a whole
/// number of 16-byte vectors (d % 8 for 16-bit dtypes, d % 4 for float32).
bool add_layer_norm_supports(int64_t d, at::ScalarType dtype);

/// add_layer_norm on CUDA tensors: x (..., D) contiguous, float32 / float16 / bfloat16, 16-byte
/// aligned; delta (x's shape, contiguous, aligned) or undefined; scale (D) or undefined; weight
/// and bias (D); all of x's dtype and device, with add_layer_norm_supports(D). One warp per row:
/// the row is read once into registers (16-byte loads), the sum rounded to the dtype as the
/// unfused ops round it, mean and variance reduced in float32 across the warp (two passes over
/// the registers), and the sum (when delta is given) and the normalised row written once.
/// Row orders (add_layer_norm.h): x (..., N, D); norm_rows (R) / delta_rows (N), one image's
/// indices, contiguous int64 on x's device; a warp then reads its row of x and delta and writes
/// its sum and norm rows at the indexed positions of its image (norm (..., R, D), a -1 norm row
/// written as zeros; with delta and norm_rows, only the sum rows that norm_rows names are
/// written), delta (..., M, D) with delta_rows; at most 2^32 - 1 rows of x and of norm.
/// Returns {sum, norm} (sum is x when delta is undefined); runs on the current stream. Throws
/// c10::Error for any other input (the slot's predicate checks first). Indices are not range-
/// checked on the device (models/swin/windows.h window_rows builds them).
SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps,
                          const at::Tensor& norm_rows = {}, const at::Tensor& delta_rows = {});

}  // namespace libreyolo::kernels::cuda

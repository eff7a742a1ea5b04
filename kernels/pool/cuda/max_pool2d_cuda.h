// The CUDA kernel of the `cuda` max_pool2d (kernels/pool/max_pool2d.h): channels_last only, no
// argmax indices.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/pool/max_pool2d.h"

namespace libreyolo::kernels::cuda {

/// y = max over each window of x, channels_last. x: (B, C, H, W) CUDA tensor, float32 /
/// float16 / bfloat16, contiguous in channels_last; returns (B, C, H', W') channels_last in x's
/// dtype (H', W': max_pool2d_output_size). NaN propagates as in at::max_pool2d (a NaN in the
/// window is the result); out-of-range positions (padding) never win. The result equals
/// at::max_pool2d bit for bit (a max is exact). One thread per output pixel and 16 bytes of
/// channels when C allows, else per element; runs on the current stream. Throws c10::Error on
/// any other input (the caller checks first: kernels/pool/cuda/max_pool2d_cuda.cpp).
at::Tensor max_pool2d_nhwc(const at::Tensor& x, const PoolGeometry& geometry);

/// The most (pixel, 16-byte channel group) items one output row may hold: OW * C / N, with N
/// elements per 16 bytes (N = 1 off the 16-byte path). The kernel indexes a row in 32 bits;
/// larger rows are refused (c10::Error), and the slot declines them first.
inline constexpr int64_t kMaxRowItems = (int64_t{1} << 31) - 1024;

}  // namespace libreyolo::kernels::cuda

// The CUDA kernel of the `cuda` sampling_locations (kernels/attention/sampling_locations.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace libreyolo::kernels::cuda {

/// loc = xy + ((offsets (* 1/divisor | * per_point[n])) * wh) * factor on CUDA tensors, one
/// thread per point, each step rounded to the dtype as ATen's CUDA ops round it (computed in
/// float32; a division by a number is ATen's multiplication by its float32 reciprocal,
/// aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu).
/// offsets (B, Q, H, N, 2) contiguous float32 / float16 / bfloat16; reference_boxes (B, Q, 4) of
/// the same dtype and device, last dimension contiguous (any other strides); per_point (N)
/// contiguous of the dtype, or undefined with divisor > 0. Returns (B, Q, H, N, 2) contiguous;
/// runs on the current stream. Throws c10::Error for any other input (the slot declines first)
/// and for B * Q * H * N >= 2^31 - 1.
at::Tensor sampling_locations(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const at::Tensor& per_point, double divisor, double factor);

}  // namespace libreyolo::kernels::cuda

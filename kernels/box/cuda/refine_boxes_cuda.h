// The CUDA kernel of the `cuda` refine_boxes (kernels/box/refine_boxes.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace libreyolo::kernels::cuda {

/// sigmoid(delta + inverse_sigmoid(reference, eps)) on CUDA tensors, one thread per value, each
/// of upstream's nine ops computed in float32 and rounded to the dtype as ATen's CUDA kernels
/// round it (aten/src/ATen/native/cuda: TensorCompare.cu's clamps, the sub, DivFunctor, log's
/// ::log, sigmoid's 1 / (1 + exp(-x))), NaN kept as the clamps keep it.
/// delta, reference: one shape, contiguous, float32 / float16 / bfloat16, one device. Returns a
/// contiguous tensor of that shape; runs on the current stream. Throws c10::Error for any other
/// input (the slot declines first) and for 2^31 values or more.
at::Tensor refine_boxes(const at::Tensor& delta, const at::Tensor& reference, double eps);

}  // namespace libreyolo::kernels::cuda

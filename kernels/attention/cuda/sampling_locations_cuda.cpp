// The `cuda` implementation of sampling_locations: kernels/attention/cuda/sampling_locations_cuda.h
// for contiguous offsets of the 16-bit dtypes and float32 without autograd; anything else declines
// to the portable path (the ATen expression on CUDA).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>
#include <limits>

#include "kernels/attention/cuda/sampling_locations_cuda.h"
#include "kernels/attention/sampling_locations.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> sampling_locations_cuda(const at::Tensor& offsets,
                                            const at::Tensor& reference_boxes,
                                            const at::Tensor& per_point, double divisor,
                                            double factor) {
  if (!offsets.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  if (offsets.dim() != 5 || offsets.size(4) != 2)
    return Decline{"cuda: offsets not (B, Q, H, N, 2)"};
  const auto dtype = offsets.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() && (offsets.requires_grad() || reference_boxes.requires_grad() ||
                                     (per_point.defined() && per_point.requires_grad())))
    return Decline{"cuda: autograd (no backward)"};
  if (reference_boxes.dim() != 3 || reference_boxes.size(0) != offsets.size(0) ||
      reference_boxes.size(1) != offsets.size(1) || reference_boxes.size(2) != 4 ||
      reference_boxes.scalar_type() != dtype)
    return Decline{"cuda: reference_boxes not (B, Q, 4) of the offsets' B, Q and dtype"};
  if (per_point.defined() ? (per_point.dim() != 1 || per_point.size(0) != offsets.size(3))
                          : !(divisor > 0.0))
    return Decline{"cuda: per_point not (N), or no divisor > 0"};
  if (reference_boxes.device() != offsets.device() ||
      (per_point.defined() && per_point.device() != offsets.device()))
    return Decline{"cuda: tensors on different devices"};
  if (per_point.defined() && per_point.scalar_type() != dtype)
    return Decline{"cuda: per_point not of the offsets' dtype"};
  if (!offsets.is_contiguous() || reference_boxes.stride(2) != 1 ||
      (per_point.defined() && !per_point.is_contiguous()))
    return Decline{"cuda: offsets or per_point not contiguous, or boxes' last dimension strided"};
  if (offsets.numel() / 2 >= std::numeric_limits<int>::max())
    return Decline{"cuda: 2^31 - 1 points or more"};
  return cuda::sampling_locations(offsets, reference_boxes, per_point, divisor, factor);
}

}  // namespace

void register_sampling_locations_cuda(Registry& registry) {
  registry.register_impl(
      kSamplingLocations, "cuda", &sampling_locations_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels

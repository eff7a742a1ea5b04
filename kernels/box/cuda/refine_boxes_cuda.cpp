// The `cuda` implementation of refine_boxes: kernels/box/cuda/refine_boxes_cuda.h for contiguous
// float32 / float16 / bfloat16 tensors without autograd; anything else declines to the portable
// path (the ATen expression on CUDA).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>
#include <limits>

#include "kernels/box/cuda/refine_boxes_cuda.h"
#include "kernels/box/refine_boxes.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> refine_boxes_cuda(const at::Tensor& delta, const at::Tensor& reference,
                                      double eps) {
  if (!delta.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = delta.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() && (delta.requires_grad() || reference.requires_grad()))
    return Decline{"cuda: autograd (no backward)"};
  if (!delta.is_contiguous() || !reference.is_contiguous())
    return Decline{"cuda: delta or reference not contiguous"};
  if (delta.numel() >= std::numeric_limits<int>::max())
    return Decline{"cuda: 2^31 - 1 values or more"};
  return cuda::refine_boxes(delta, reference, eps);
}

}  // namespace

void register_refine_boxes_cuda(Registry& registry) {
  registry.register_impl(
      kRefineBoxes, "cuda", &refine_boxes_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels

// The `cuda` implementation of the `fake_quant_fp8` slot: per-call input checks (Decline, never
// throw), the straight-through gradient, and its registration.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/quant/cuda/fake_quant_fp8_cuda.h"
#include "kernels/quant/fake_quant_fp8.h"

namespace libreyolo::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Straight-through estimator: gradient identity to x (clamped elements included), none to scale
// (LibreYOLO libreyolo/quant/fake_quant.py `_ste`).
struct FakeQuantFp8Function : torch::autograd::Function<FakeQuantFp8Function> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const at::Tensor& scale) {
    return cuda::fake_quant_fp8_forward(x, scale);
  }
  static variable_list backward(AutogradContext*, variable_list grad_outputs) {
    return {grad_outputs[0], at::Tensor()};
  }
};

Outcome<at::Tensor> fake_quant_fp8_cuda(const at::Tensor& x, const at::Tensor& scale) {
  if (!x.defined() || !scale.defined() || !x.is_cuda() || !scale.is_cuda())
    return Decline{"cpu tensor"};
  if (x.device() != scale.device()) return Decline{"device mismatch"};
  if (x.scalar_type() != at::kFloat || scale.scalar_type() != at::kFloat)
    return Decline{"unsupported dtype"};
  if (!x.is_contiguous()) return Decline{"non-contiguous"};
  // The result must have x's shape: per tensor, a scale of one element and no more dims than x;
  // per channel, (C, 1, ..., 1) with as many dims as x and C = x.size(0).
  bool ok = false;
  if (scale.numel() == 1) {
    ok = scale.dim() <= x.dim();
  } else if (x.dim() >= 1 && scale.dim() == x.dim() && scale.size(0) == x.size(0)) {
    ok = scale.numel() == x.size(0);
  }
  if (!ok) return Decline{"unsupported scale shape"};
  return FakeQuantFp8Function::apply(x, scale);
}

}  // namespace

/// Registers `cuda` for `fake_quant_fp8` (eligible when a CUDA device is present).
void register_fake_quant_fp8_cuda(Registry& registry) {
  registry.register_impl(
      kFakeQuantFp8, "cuda", FakeQuantFp8Impl(&fake_quant_fp8_cuda),
      [] { return at::cuda::is_available(); }, cuda_models_only);
}

}  // namespace libreyolo::kernels

// The `cublaslt` implementation of linear_act (kernels/gemm/linear_act.h): bias and GELU or ReLU
// in the GEMM's epilogue through at::_addmm_activation, which runs cuBLASLt's GELU_BIAS epilogue on
// CUDA (aten/src/ATen/native/cuda/Blas.cpp; where cuBLASLt cannot take the call ATen runs
// addmm and the same tanh GELU in place). float16 / bfloat16 only: see the slot's header for why
// float32 declines.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/gemm/linear_act.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> linear_act_cublaslt(const at::Tensor& x, const at::Tensor& weight,
                                        const at::Tensor& bias, Activation act) {
  if (act != Activation::gelu && act != Activation::relu)
    return Decline{"cublaslt: activation (gelu and relu only)"};
  if (!x.is_cuda()) return Decline{"cublaslt: not a CUDA tensor"};
  const auto dtype = x.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cublaslt: dtype (float16, bfloat16 only: the epilogue's tanh GELU)"};
  if (!bias.defined()) return Decline{"cublaslt: no bias"};
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || bias.requires_grad()))
    return Decline{"cublaslt: autograd (no backward)"};
  if (weight.device() != x.device() || bias.device() != x.device() ||
      weight.scalar_type() != dtype || bias.scalar_type() != dtype)
    return Decline{"cublaslt: weight or bias of another device or dtype"};
  if (x.numel() == 0) return Decline{"cublaslt: empty input"};
  const int64_t k = x.size(-1), n = weight.size(0);
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = n;
  const at::Tensor rows = x.reshape({-1, k});
  // use_gelu false: cuBLASLt's RELU_BIAS epilogue (the decoder FFNs of D-FINE, Deformable
  // DETR, LW-DETR, Grounding DINO), exact like the unfused ReLU.
  return at::_addmm_activation(bias, rows, weight.t(), /*beta=*/1, /*alpha=*/1,
                               /*use_gelu=*/act == Activation::gelu)
      .view(out_sizes);
}

/// CUDA models in float16 / bfloat16: a float32 model keeps the exact erf GELU.
const char* reduced_precision_cuda_models(const BindContext& c) {
  if (const char* why = cuda_models_only(c)) return why;
  return c.dtype == "float32" ? "a float32 model keeps the exact erf GELU" : nullptr;
}

}  // namespace

void register_linear_act_cuda(Registry& registry) {
  registry.register_impl(
      kLinearAct, "cublaslt", &linear_act_cublaslt, [] { return at::cuda::is_available(); },
      reduced_precision_cuda_models);
}

}  // namespace libreyolo::kernels

// The `cublaslt` and `cublaslt_heuristic` implementations of linear_act (kernels/gemm/linear_act.h)
// and linear (kernels/gemm/linear.h): one cuBLASLt matmul with the bias, and GELU or ReLU, in its
// epilogue (kernels/gemm/cuda/cublaslt_gemm.h). `cublaslt` times the heuristic's algorithms once
// per problem and keeps the fastest; `cublaslt_heuristic` runs the heuristic's first, as ATen's
// at::_addmm_activation and at::linear do (aten/src/ATen/native/cuda/Blas.cpp), for A/B runs
// (`--slot linear=cublaslt_heuristic`). float16 / bfloat16 models only: float32 keeps ATen's
// GEMMs (and their TF32 setting) and, for linear_act, the exact erf GELU (the epilogue computes
// the tanh form: see linear_act.h). ReLU is exact.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/gemm/cuda/cublaslt_gemm.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

/// Why neither implementation takes the call, or nullptr.
const char* declines(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad())))
    return "cublaslt: autograd (no backward)";
  return cuda::cublaslt_linear_declines(x, weight, bias);
}

template <cuda::GemmAlgorithm algorithm>
Outcome<at::Tensor> linear_act_cublaslt(const at::Tensor& x, const at::Tensor& weight,
                                        const at::Tensor& bias, Activation act) {
  if (act != Activation::gelu && act != Activation::relu)
    return Decline{"cublaslt: activation (gelu and relu only)"};
  if (const char* why = declines(x, weight, bias)) return Decline{why};
  return cuda::cublaslt_linear(
      x, weight, bias,
      act == Activation::gelu ? cuda::GemmEpilogue::gelu : cuda::GemmEpilogue::relu, algorithm);
}

template <cuda::GemmAlgorithm algorithm>
Outcome<at::Tensor> linear_cublaslt(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias) {
  if (const char* why = declines(x, weight, bias)) return Decline{why};
  auto out = cuda::cublaslt_linear(x, weight, bias, cuda::GemmEpilogue::none, algorithm);
  if (!out.defined()) return Decline{"cublaslt: no algorithm for these operands"};
  return out;
}

/// CUDA models in float16 / bfloat16: a float32 model keeps ATen's GEMMs and the exact erf GELU.
const char* reduced_precision_cuda_models(const BindContext& c) {
  if (const char* why = cuda_models_only(c)) return why;
  return c.dtype == "float32" ? "a float32 model keeps ATen's GEMMs and the exact erf GELU"
                              : nullptr;
}

}  // namespace

void register_linear_act_cuda(Registry& registry) {
  // The newest registration is called first (kernels/registry.h): `cublaslt_heuristic` is
  // registered before `cublaslt`, so a model calls the timed one first; the other declines what
  // it declines, and answers alone where a policy allows only it.
  auto available = [] { return at::cuda::is_available(); };
  registry.register_impl(kLinearAct, "cublaslt_heuristic",
                         &linear_act_cublaslt<cuda::GemmAlgorithm::heuristic>, available,
                         reduced_precision_cuda_models);
  registry.register_impl(kLinearAct, "cublaslt", &linear_act_cublaslt<cuda::GemmAlgorithm::timed>,
                         available, reduced_precision_cuda_models);
  registry.register_impl(kLinear, "cublaslt_heuristic",
                         &linear_cublaslt<cuda::GemmAlgorithm::heuristic>, available,
                         reduced_precision_cuda_models);
  registry.register_impl(kLinear, "cublaslt", &linear_cublaslt<cuda::GemmAlgorithm::timed>,
                         available, reduced_precision_cuda_models);
}

}  // namespace libreyolo::kernels

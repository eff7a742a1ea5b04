// The `scaled_mm` implementation of fp8_gemm (kernels/gemm/fp8_gemm.h): x quantised per row to
// E4M3FN (quantize_fp8_rows, in one kernel: kernels/gemm/cuda/fp8_quant_rows_cuda.h), then
// at::_scaled_mm with row-wise scales, the bias and a bfloat16 output in the GEMM
// (aten/src/ATen/native/cuda/Blas.cpp _scaled_mm_out_cuda, which runs RowwiseScaledMM.cu's CUTLASS
// kernel on sm89 / sm90 / sm100).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <optional>

#include "kernels/gemm/cuda/fp8_quant_rows_cuda.h"
#include "kernels/gemm/fp8_gemm.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> fp8_gemm_scaled_mm(const at::Tensor& x, const at::Tensor& weight_data,
                                       const at::Tensor& weight_scale, const at::Tensor& bias) {
  if (!x.is_cuda()) return Decline{"scaled_mm: not a CUDA tensor"};
  // Row-wise scaled GEMMs write bfloat16 only (Blas.cpp: "Only bf16 high precision output
  // types are supported for row-wise scaling").
  if (x.scalar_type() != at::kBFloat16) return Decline{"scaled_mm: dtype (bfloat16 only)"};
  if (at::GradMode::is_enabled() && (x.requires_grad() || (bias.defined() && bias.requires_grad())))
    return Decline{"scaled_mm: autograd (no backward)"};
  if (weight_data.device() != x.device() || weight_scale.device() != x.device() ||
      (bias.defined() && (bias.device() != x.device() || bias.scalar_type() != at::kBFloat16)))
    return Decline{"scaled_mm: weight or bias of another device or dtype"};
  const int64_t k = x.size(-1), n = weight_data.size(0);
  // cuBLASLt / CUTLASS FP8 operands: 16-byte aligned leading dimensions.
  if (k % 16 != 0 || n % 16 != 0) return Decline{"scaled_mm: K or N not a multiple of 16"};
  if (x.numel() == 0) return Decline{"scaled_mm: empty input"};
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = n;
  const auto rows = x.reshape({-1, k});
  // One kernel where the rows are whole 16-byte vectors; the ATen ops otherwise (same numbers).
  const auto [xq, x_scale] = cuda::quantize_fp8_rows_bf16_accepts(rows)
                                 ? cuda::quantize_fp8_rows_bf16(rows)
                                 : quantize_fp8_rows(rows);
  // weight_data (N, K) row-major: its transpose is the column-major (K, N) operand _scaled_mm
  // wants for mat2.
  const auto out = at::_scaled_mm(xq, weight_data.t(), x_scale, weight_scale.view({1, n}),
                                  bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                                  /*scale_result=*/std::nullopt, at::kBFloat16,
                                  /*use_fast_accum=*/false);
  return out.view(out_sizes);
}

/// CUDA bfloat16 models on a GPU with FP8 tensor cores (compute capability 8.9 and later).
const char* fp8_cuda_models(const BindContext& c) {
  if (const char* why = cuda_models_only(c)) return why;
  if (c.dtype != "bfloat16") return "the model is not bfloat16 (row-wise FP8 GEMMs write bfloat16)";
  const int index = c.device_index >= 0 ? c.device_index : at::cuda::current_device();
  const auto* p = at::cuda::getDeviceProperties(index);
  if (p == nullptr) return "the device's properties are unknown";
  if (p->major * 10 + p->minor < 89)
    return "the GPU has no FP8 tensor cores (compute capability below 8.9)";
  return nullptr;
}

}  // namespace

void register_fp8_gemm_cuda(Registry& registry) {
  registry.register_impl(
      kFp8Gemm, "scaled_mm", &fp8_gemm_scaled_mm, [] { return at::cuda::is_available(); },
      fp8_cuda_models);
}

}  // namespace libreyolo::kernels

#include "kernels/gemm/fp8_gemm.h"

#include <c10/util/Exception.h>

#include <string>

namespace libreyolo::kernels {
namespace {

std::string sizes_of(const at::Tensor& t) {
  return t.defined() ? c10::str(t.sizes()) : std::string("an undefined tensor");
}

/// Row-wise quantisation of float32 `x` (..., K): the rule of quantize_fp8_weight. The clamp
/// comes before the cast because ATen's float8 cast does not saturate (448.5 would be NaN).
/// 448 is a tensor, not a scalar: ATen's CUDA division by a CPU scalar multiplies by its
/// reciprocal (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), which would make the scale
/// depend on the device; tensor by tensor is an IEEE division on both (as the CUDA kernel of
/// kernels/gemm/cuda/fp8_quant_rows_cuda.h computes it).
std::pair<at::Tensor, at::Tensor> quantize_float_rows(const at::Tensor& x) {
  const auto amax = x.abs().amax(-1, /*keepdim=*/true);
  const auto scale = at::where(amax > 0, amax / at::scalar_tensor(kFp8E4m3Max, amax.options()),
                               at::ones_like(amax));
  auto data = (x / scale).clamp(-kFp8E4m3Max, kFp8E4m3Max).to(at::kFloat8_e4m3fn);
  return {data.contiguous(), scale.contiguous()};
}

}  // namespace

Fp8Weight quantize_fp8_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.defined() && weight.dim() == 2, "fp8: weight must be (N, K), got ",
              sizes_of(weight));
  TORCH_CHECK(at::isFloatingType(weight.scalar_type()), "fp8: weight must be floating, got ",
              weight.scalar_type());
  const auto w = weight.to(at::kFloat);
  const auto finite_rows = at::isfinite(w).all(1);
  if (!finite_rows.all().item<bool>()) {
    const int64_t row = (~finite_rows).nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "fp8: weight row ", row, " of ", sizes_of(weight),
                " holds a non-finite value");
  }
  auto [data, scale] = quantize_float_rows(w);
  return {data, scale.squeeze(1)};
}

std::pair<at::Tensor, at::Tensor> quantize_fp8_rows(const at::Tensor& x) {
  TORCH_CHECK(x.defined() && x.dim() == 2, "fp8: x must be (M, K), got ", sizes_of(x));
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "fp8: x must be floating, got ",
              x.scalar_type());
  return quantize_float_rows(x.to(at::kFloat));
}

at::Tensor fp8_linear(const Fp8GemmHandle& handle, const at::Tensor& x, const Fp8Weight& w8,
                      const at::Tensor& dense_weight, const at::Tensor& bias) {
  TORCH_CHECK(
      w8.data.defined() && w8.data.dim() == 2 && w8.data.scalar_type() == at::kFloat8_e4m3fn,
      "fp8_gemm: weight data must be (N, K) float8_e4m3fn, got ", sizes_of(w8.data));
  const int64_t n = w8.data.size(0), k = w8.data.size(1);
  TORCH_CHECK(w8.scale.defined() && w8.scale.dim() == 1 && w8.scale.size(0) == n &&
                  w8.scale.scalar_type() == at::kFloat,
              "fp8_gemm: weight scale must be (", n, ") float32, got ", sizes_of(w8.scale));
  TORCH_CHECK(dense_weight.defined() && dense_weight.sizes() == w8.data.sizes(),
              "fp8_gemm: the dense weight must be (", n, ", ", k, "), got ",
              sizes_of(dense_weight));
  TORCH_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == k, "fp8_gemm: x must be (..., ", k,
              "), got ", sizes_of(x));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == n), "fp8_gemm: bias must be (",
              n, "), got ", sizes_of(bias));
  if (!handle.empty()) {
    if (auto out = handle(x, w8.data, w8.scale, bias)) return std::move(*out);
  }
  return at::linear(x, dense_weight, bias);
}

}  // namespace libreyolo::kernels

// FP8 (E4M3FN) fake quantization: the reference that defines the numbers and the slot entry.
// Math from LibreYOLO libreyolo/quant/fake_quant.py (fake_quant_fp8, _ste).
#include "kernels/quant/fake_quant_fp8.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

namespace libreyolo::kernels {
namespace {

constexpr double kE4m3Max = 448.0;   // largest finite float8_e4m3fn
constexpr double kScaleEps = 1e-12;  // scale floor (LibreYOLO _EPS)

/// Throws c10::Error unless x is float32 and scale is per-tensor (one element, rank <= x's) or
/// per-channel (C, 1, ..., 1) with x's rank and C = x.size(0), on x's device.
void check_inputs(const at::Tensor& x, const at::Tensor& scale) {
  TORCH_CHECK(x.defined() && scale.defined(), "fake_quant_fp8: x and scale must be defined");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "fake_quant_fp8: x must be float32, got ",
              x.scalar_type());
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "fake_quant_fp8: scale must be float32, got ",
              scale.scalar_type());
  TORCH_CHECK(scale.device() == x.device(), "fake_quant_fp8: scale is on ", scale.device(),
              " but x is on ", x.device());
  const bool per_tensor = scale.numel() == 1 && scale.dim() <= std::max<int64_t>(x.dim(), 1);
  bool per_channel = x.dim() >= 1 && scale.dim() == x.dim() && scale.size(0) == x.size(0);
  for (int64_t d = 1; per_channel && d < scale.dim(); ++d) per_channel = scale.size(d) == 1;
  TORCH_CHECK(per_tensor || per_channel,
              "fake_quant_fp8: scale must be per-tensor (1) or per-channel (C, 1, ..., 1) with C = "
              "x.size(0) for x of shape ",
              x.sizes(), ", got ", scale.sizes());
}

/// The quantize-dequantize value, no autograd: q = float32(e4m3fn(clamp(x / s, +-448))) * s.
at::Tensor quantize_dequantize(const at::Tensor& x, const at::Tensor& scale) {
  const auto s = at::clamp_min(scale, kScaleEps);
  // True division (not x * (1 / s): they differ by one ulp), then the explicit clamp: the float8
  // cast does not saturate (c10's software cast maps |y| >= 464 to NaN).
  const auto y = at::clamp(at::div(x, s), -kE4m3Max, kE4m3Max);
  return y.to(at::kFloat8_e4m3fn).to(at::kFloat).mul(s);
}

/// Straight-through estimator as an autograd function: the forward value is q exactly (unlike
/// x + (q - x).detach(), which is off by rounding and NaN for infinite x), the gradient to x is
/// the incoming gradient unchanged (saturated elements included), scale gets none.
struct FakeQuantFp8Ste : torch::autograd::Function<FakeQuantFp8Ste> {
  /// Quantize-dequantize (autograd is off inside).
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x,
                            const at::Tensor& scale) {
    return quantize_dequantize(x, scale);
  }
  /// Identity to x, nothing to scale.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grad_output) {
    return {grad_output[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor fake_quant_fp8_reference(const at::Tensor& x, const at::Tensor& scale) {
  check_inputs(x, scale);
  if (at::GradMode::is_enabled() && (x.requires_grad() || scale.requires_grad())) {
    return FakeQuantFp8Ste::apply(x, scale);
  }
  return quantize_dequantize(x, scale);
}

at::Tensor fake_quant_fp8(const FakeQuantFp8Handle& handle, const at::Tensor& x,
                          const at::Tensor& scale) {
  // Validate here so that a malformed input is the caller's error and never counts as a runtime
  // failure that would disable an implementation for the rest of the process.
  check_inputs(x, scale);
  auto out = handle(x, scale);
  if (out) return std::move(*out);
  return fake_quant_fp8_reference(x, scale);  // every implementation (reference too) failed
}

/// Registers `reference` for the `fake_quant_fp8` slot (called by register_references in
/// kernels/builtin.cpp).
void register_fake_quant_fp8_reference(Registry& registry) {
  registry.declare(kFakeQuantFp8);
  registry.register_impl(kFakeQuantFp8, kReference,
                         FakeQuantFp8Impl{[](const at::Tensor& x, const at::Tensor& scale) {
                           return Outcome<at::Tensor>(fake_quant_fp8_reference(x, scale));
                         }});
}

}  // namespace libreyolo::kernels

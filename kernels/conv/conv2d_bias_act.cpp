#include "kernels/conv/conv2d_bias_act.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace libreyolo::kernels {

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::none:
      return "none";
    case Activation::relu:
      return "relu";
    case Activation::silu:
      return "silu";
    case Activation::gelu:
      return "gelu";
    case Activation::tanh:
      return "tanh";
  }
  return "none";
}

at::Tensor apply_activation(Activation act, const at::Tensor& x) {
  switch (act) {
    case Activation::none:
      return x;
    case Activation::relu:
      return at::relu(x);
    case Activation::silu:
      return at::silu(x);
    case Activation::gelu:
      return at::gelu(x);
    case Activation::tanh:
      return at::tanh(x);
  }
  return x;
}

at::Tensor& apply_activation_(Activation act, at::Tensor& x) {
  switch (act) {
    case Activation::none:
      return x;
    case Activation::relu:
      return at::relu_(x);
    case Activation::silu:
      return at::silu_(x);
    case Activation::gelu:
      return at::gelu_(x);
    case Activation::tanh:
      return at::tanh_(x);
  }
  return x;
}

at::Tensor conv2d_bias_act_portable(const at::Tensor& input, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& residual,
                                    const ConvGeometry& g, Activation act) {
  auto y = at::conv2d(input, weight, bias, {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w},
                      {g.dilation_h, g.dilation_w}, g.groups);
  // y is this call's own fresh tensor: without autograd the residual add and the activation run
  // in place on it (no second and third output allocation; the same kernels, so the same bits).
  if (at::GradMode::is_enabled() && y.requires_grad()) {
    if (residual.defined()) y = y + residual;
    return apply_activation(act, y);
  }
  if (residual.defined()) y.add_(residual);
  return apply_activation_(act, y);
}

namespace {

void check_inputs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvGeometry& g) {
  TORCH_CHECK(input.defined() && input.dim() == 4,
              "conv2d_bias_act: input must be (B, C_in, H, W), got ",
              input.defined() ? c10::str(input.sizes()) : std::string("an undefined tensor"));
  TORCH_CHECK(weight.defined() && weight.dim() == 4,
              "conv2d_bias_act: weight must be (C_out, C_in/groups, kH, kW)");
  TORCH_CHECK(g.groups >= 1 && input.size(1) == weight.size(1) * g.groups,
              "conv2d_bias_act: input has ", input.size(1), " channels, weight expects ",
              weight.size(1) * g.groups);
  TORCH_CHECK(input.scalar_type() == weight.scalar_type() && input.device() == weight.device(),
              "conv2d_bias_act: weight must be ", input.scalar_type(), " on ", input.device(),
              ", got ", weight.scalar_type(), " on ", weight.device());
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "conv2d_bias_act: bias must be (C_out) = (", weight.size(0), ")");
}

}  // namespace

at::Tensor conv2d_bias_act(const Conv2dBiasActHandle& handle, const at::Tensor& input,
                           const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& residual, const ConvGeometry& geometry,
                           Activation act) {
  // The by-value copy is a second reference: no implementation writes into the caller's residual.
  return conv2d_bias_act_consuming(handle, input, weight, bias, residual, geometry, act);
}

at::Tensor conv2d_bias_act_consuming(const Conv2dBiasActHandle& handle, const at::Tensor& input,
                                     const at::Tensor& weight, const at::Tensor& bias,
                                     at::Tensor residual, const ConvGeometry& geometry,
                                     Activation act) {
  check_inputs(input, weight, bias, geometry);
  if (!handle.empty()) {
    if (auto out = handle(input, weight, bias, residual, geometry, act)) return std::move(*out);
  }
  return conv2d_bias_act_portable(input, weight, bias, residual, geometry, act);
}

}  // namespace libreyolo::kernels

// The `cuda` implementation of conv2d_bias_act: cuDNN's fused convolution + bias + ReLU
// (+ residual) through ATen's cudnn_convolution_relu / cudnn_convolution_add_relu
// (aten/src/ATen/native/cudnn/ConvShared.cpp: relu(conv(x, w) + bias) and
// relu(conv(x, w) + alpha * z + bias), one cuDNN fused operation graph where the backend
// supports it). cuDNN fuses ReLU only: other activations decline (the portable path runs them).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> conv2d_bias_act_cuda(const at::Tensor& input, const at::Tensor& weight,
                                         const at::Tensor& bias, const at::Tensor& residual,
                                         const ConvGeometry& g, Activation act) {
  if (act != Activation::relu) return Decline{"cuda: cuDNN fuses ReLU only"};
  if (!input.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return Decline{"cuda: autograd (the fused op has no backward)"};
  if (residual.defined() && residual.scalar_type() != dtype)
    return Decline{"cuda: residual dtype differs"};
  // cuDNN's suggested memory format follows the input; channels_last weights with
  // channels_last inputs (the layout's choice) give NHWC kernels.
  const c10::optional<at::Tensor> b =
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::optional<at::Tensor>();
  const std::vector<int64_t> stride{g.stride_h, g.stride_w}, padding{g.pad_h, g.pad_w},
      dilation{g.dilation_h, g.dilation_w};
  if (residual.defined()) {
    return at::cudnn_convolution_add_relu(input, weight, residual, /*alpha=*/1.0, b, stride,
                                          padding, dilation, g.groups);
  }
  return at::cudnn_convolution_relu(input, weight, b, stride, padding, dilation, g.groups);
}

}  // namespace

void register_conv2d_bias_act_cuda(Registry& registry) {
  registry.register_impl(
      kConv2dBiasAct, "cuda", &conv2d_bias_act_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels

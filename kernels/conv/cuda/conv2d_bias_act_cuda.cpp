// The `cuda` implementation of conv2d_bias_act. ReLU: cuDNN's fused convolution + bias + ReLU
// (+ residual) through ATen's cudnn_convolution_relu / cudnn_convolution_add_relu
// (aten/src/ATen/native/cudnn/ConvShared.cpp: relu(conv(x, w) + bias) and
// relu(conv(x, w) + alpha * z + bias), one cuDNN fused operation graph where the backend
// supports it). Every other activation (none, SiLU, GELU, tanh), which cuDNN does not fuse:
// at::cudnn_convolution without bias, then one epilogue kernel for bias, residual and activation
// (kernels/conv/cuda/bias_act_cuda.h) instead of ATen's broadcast bias add, residual add and
// activation.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/bias_act_cuda.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> conv2d_bias_act_cuda(const at::Tensor& input, const at::Tensor& weight,
                                         const at::Tensor& bias, const at::Tensor& residual,
                                         const ConvGeometry& g, Activation act) {
  if (!input.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return Decline{"cuda: autograd (the fused op has no backward)"};
  if (residual.defined() && residual.scalar_type() != dtype)
    return Decline{"cuda: residual dtype differs"};
  if (bias.defined() && bias.scalar_type() != dtype) return Decline{"cuda: bias dtype differs"};
  // cuDNN's suggested memory format follows the input; channels_last weights with
  // channels_last inputs (the layout's choice) give NHWC kernels.
  const std::vector<int64_t> stride{g.stride_h, g.stride_w}, padding{g.pad_h, g.pad_w},
      dilation{g.dilation_h, g.dilation_w};
  if (act == Activation::relu) {
    const c10::optional<at::Tensor> b =
        bias.defined() ? c10::optional<at::Tensor>(bias) : c10::optional<at::Tensor>();
    if (residual.defined()) {
      return at::cudnn_convolution_add_relu(input, weight, residual, /*alpha=*/1.0, b, stride,
                                            padding, dilation, g.groups);
    }
    return at::cudnn_convolution_relu(input, weight, b, stride, padding, dilation, g.groups);
  }
  const auto& ctx = at::globalContext();
  auto y =
      at::cudnn_convolution(input, weight, padding, stride, dilation, g.groups,
                            ctx.benchmarkCuDNN(), ctx.deterministicCuDNN(), ctx.allowTF32CuDNN());
  if (!y.is_contiguous(at::MemoryFormat::ChannelsLast) && !y.is_contiguous())
    y = y.contiguous(input.suggest_memory_format());
  at::Tensor r = residual;
  if (r.defined() && r.strides() != y.strides()) r = r.contiguous(y.suggest_memory_format());
  if (bias.defined() || r.defined() || act != Activation::none)
    cuda::bias_act_(y, bias.defined() ? bias.contiguous() : bias, r, act);
  return y;
}

}  // namespace

void register_conv2d_bias_act_cuda(Registry& registry) {
  registry.register_impl(
      kConv2dBiasAct, "cuda", &conv2d_bias_act_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels

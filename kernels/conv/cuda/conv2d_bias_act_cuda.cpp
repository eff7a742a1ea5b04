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
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <atomic>
#include <mutex>

#include "kernels/conv/cuda/conv2d_bias_act_cuda.h"

#include "kernels/conv/cuda/bias_act_cuda.h"
#include "kernels/cuda/verified_once.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

using cuda::Verified;

/// The epilogue kernel against ATen's ops once per dtype, on the device of its first call and
/// before it serves a convolution: channels_last and NCHW, the 16-byte and the one-element
/// paths, bias and residual, every activation, and maps large enough that each thread takes
/// several grid-stride steps. A mismatch keeps the path declined for the process (the fallback
/// shows in the binding's declined reasons). Not inside a CUDA graph capture (the comparison
/// synchronises): the daemon's capture follows an eager warm-up, which runs the check.
Verified verify_epilogue(at::ScalarType dtype, const at::Device& device) {
  static cuda::VerifiedOnce once;
  return once.get(dtype, [&] {
    const at::NoGradGuard no_grad;
    const auto opts = at::TensorOptions().device(device).dtype(dtype);
    const double tol = dtype == at::kFloat ? 1e-5 : 0.05;  // a bfloat16 ulp at |x| = 6
    // y0 in [-6, 6], bias in [-1, 1], residual = y0 reversed along the batch; act(sum) from ATen's
    // ops in float32 against the kernel.
    auto agrees = [&](int64_t B, int64_t C, int64_t H, int64_t W, at::MemoryFormat format,
                      Activation act) {
      const auto y0 =
          at::linspace(-6.0, 6.0, B * C * H * W, opts).view({B, C, H, W}).contiguous(format);
      const auto bias = at::linspace(-1.0, 1.0, C, opts);
      const auto residual = y0.flip(0).contiguous(format);
      auto y = y0.clone();
      cuda::bias_act_(y, bias, residual, act);
      const auto ref =
          apply_activation(act, y0.to(at::kFloat) + bias.to(at::kFloat).view({1, C, 1, 1}) +
                                    residual.to(at::kFloat))
              .to(dtype);
      return (y.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>() <= tol;
    };
    bool ok = true;
    // Every activation's kernel, both layouts, the 16-byte (C = 24) and the one-element (C = 20)
    // paths.
    for (auto act :
         {Activation::none, Activation::relu, Activation::silu, Activation::gelu, Activation::tanh})
      for (int64_t C : {24, 20})
        for (auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous})
          ok = ok && agrees(2, C, 8, 8, format, act);
    // Maps of about two and a half grid sweeps (sms * 8 blocks * 256 threads * 16 bytes): every
    // thread steps more than once, so the channel carried across steps is checked.
    const int64_t sweep =
        int64_t{at::cuda::getDeviceProperties(device.index())->multiProcessorCount} * 8 * 256 *
        (16 / static_cast<int64_t>(c10::elementSize(dtype)));
    const int64_t B = 5 * sweep / (2 * 72 * 8 * 8) + 1;
    for (auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous})
      ok = ok && agrees(B, 72, 8, 8, format, Activation::silu);
    return ok;
  });
}

}  // namespace

namespace cuda {

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
  switch (verify_epilogue(dtype, input.device())) {
    case Verified::no:
      return Decline{"cuda: epilogue kernel failed its check against ATen on this device"};
    case Verified::unknown:
      return Decline{"cuda: epilogue kernel not checked yet (first call inside a graph capture)"};
    case Verified::yes:
      break;
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

}  // namespace cuda

void register_conv2d_bias_act_cuda(Registry& registry) {
  registry.register_impl(
      kConv2dBiasAct, "cuda", &cuda::conv2d_bias_act_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels

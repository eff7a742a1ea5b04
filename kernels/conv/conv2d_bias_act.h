// The `conv2d_bias_act` slot: y = act(conv2d(x, w) + bias + residual), the fused form of a
// convolution whose BatchNorm was folded into it (a layout, models/layouts/), optionally with the
// residual add of a ResNet block before the activation.
//
// Implementations: the portable path (below, ATen ops one after another); `cuda`: cuDNN's
// fused convolution through ATen's cudnn_convolution_relu / cudnn_convolution_add_relu
// (aten/src/ATen/native/cudnn/ConvShared.cpp), which fuse ReLU only, and for other activations
// cuDNN's convolution plus one epilogue kernel; `cuda_depthwise` (tried first): depthwise
// convolutions of channels_last maps in one kernel with bias, residual and activation
// (kernels/conv/cuda/depthwise_conv2d_cuda.h); `onednn` (CPU float32 models): oneDNN's
// convolution with bias, residual add and activation as post-ops on weights reordered once into
// its blocked format, activations channels_last (kernels/conv/cpu/conv2d_bias_act_onednn.cpp);
// `winograd` (CPU float32, tried before `onednn`): 3x3 stride-1 convolutions by Winograd's
// F(4x4, 3x3), close to but not bit-equal with ATen's (kernels/conv/cpu/
// conv2d_bias_act_winograd.cpp).
//
// Shapes and dtypes:
//   input     (B, C_in, H, W)        float32 / float16 / bfloat16, any memory format
//   weight    (C_out, C_in/groups, kH, kW), input's dtype and device
//   bias      (C_out) or undefined
//   residual  (B, C_out, H', W') (the output's shape) or undefined
//   output    (B, C_out, H', W') in input's dtype; channels_last when input is
//
// The residual's memory: an implementation may write the output into it (oneDNN's in-place sum
// post-op, which saves copying the residual first) only when nothing else holds it: the tensor's
// and its storage's use counts are 1. conv2d_bias_act() passes a copy of the caller's reference
// on, so that never happens there; conv2d_bias_act_consuming() takes the residual by value and
// lets it happen when the caller moved its last reference in.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/slot.h"

namespace libreyolo::kernels {

/// nn.Conv2d geometry (per axis: height, width).
struct ConvGeometry {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

/// The slot's declaration.
inline constexpr SlotDef<at::Tensor(const at::Tensor& input, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& residual,
                                    const ConvGeometry& geometry, Activation act)>
    kConv2dBiasAct{"conv2d_bias_act"};
using Conv2dBiasActHandle = Handle<decltype(kConv2dBiasAct)::Signature>;

/// The model-facing entry point: validates (c10::Error naming the tensor), calls `handle`, and
/// runs conv2d_bias_act_portable when the handle is empty or every candidate declined.
at::Tensor conv2d_bias_act(const Conv2dBiasActHandle& handle, const at::Tensor& input,
                           const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& residual, const ConvGeometry& geometry,
                           Activation act);

/// conv2d_bias_act with the residual handed over: when the caller passed its last reference
/// (std::move) the output may be written into the residual's memory (see the header comment).
/// The result is the same tensor values either way.
at::Tensor conv2d_bias_act_consuming(const Conv2dBiasActHandle& handle, const at::Tensor& input,
                                     const at::Tensor& weight, const at::Tensor& bias,
                                     at::Tensor residual, const ConvGeometry& geometry,
                                     Activation act);

/// at::conv2d, then + residual, then the activation (transformers' order: the residual is added
/// before the block's activation), the last two in place on the convolution's output unless
/// autograd records it. Bit-identical to the unfused modules when the weights are.
at::Tensor conv2d_bias_act_portable(const at::Tensor& input, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& residual,
                                    const ConvGeometry& geometry, Activation act);

/// y = act(x) for the activations above (gelu: exact erf form).
at::Tensor apply_activation(Activation act, const at::Tensor& x);

/// The same in place on `x` (at::relu_ / silu_ / gelu_ / tanh_; bit-identical to
/// apply_activation); returns x. For tensors the caller owns and no autograd graph needs.
at::Tensor& apply_activation_(Activation act, at::Tensor& x);

}  // namespace libreyolo::kernels

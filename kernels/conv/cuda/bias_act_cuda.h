// The epilogue of the `cuda` conv2d_bias_act for the activations cuDNN does not fuse: one pass
// over the convolution's output instead of ATen's broadcast bias add, residual add and
// activation (three kernels and five passes over the map; what such bias adds cost an RT-DETR-R50
// forward: docs/BENCHMARKS.md, "Against torch.compile, third run").
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/activation.h"

namespace libreyolo::kernels::cuda {

/// y = act(y + bias[c] + residual) in place (bias and residual optional), c the channel of each
/// element, computed in float32 and rounded once to y's dtype; the sum order is ATen's
/// ((y + bias) + residual), so float32 results are those of the unfused ops. act: the exact
/// forms of kernels/conv/conv2d_bias_act.h (silu x / (1 + exp(-x)), gelu with erf); for
/// float16 / bfloat16 outputs SiLU's exp is __expf (2 + floor(|1.173 x|) float32 ulps: under 1e-5
/// relative for |x| < 80, far below the output's rounding).
/// y: (B, C, H, W) CUDA tensor, float32 / float16 / bfloat16, contiguous in channels_last or in
/// NCHW; bias: (C) of y's dtype and device or undefined; residual: y's sizes, dtype, device and
/// strides, or undefined. Runs on the current stream, no synchronisation. Throws c10::Error on
/// any other input (callers check first: kernels/conv/cuda/conv2d_bias_act_cuda.cpp).
void bias_act_(at::Tensor& y, const at::Tensor& bias, const at::Tensor& residual, Activation act);

}  // namespace libreyolo::kernels::cuda

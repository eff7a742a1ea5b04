// The `cuda_depthwise` implementation of conv2d_bias_act: a depthwise convolution (groups ==
// C_in == C_out) of channels_last (NHWC) tensors with the bias, the residual add and the
// activation in the same kernel. cuDNN runs these convolutions with a grouped kernel that wants
// NCHW and transposes the map there and back around it (D-FINE's HGNetV2 and SCDown depthwise
// convolutions; docs/BENCHMARKS.md, D-FINE L profile); this kernel reads and writes NHWC once.
//
// The eligibility rules are inline and host-only here (no CUDA calls), so that a CPU unit test
// checks them (tests/unit/depthwise_conv2d_decline_test.cpp); the kernel is in
// depthwise_conv2d_kernels.cu, the registration in depthwise_conv2d_cuda.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/conv/conv2d_bias_act.h"

namespace libreyolo::kernels::cuda {

/// The largest kernel height and width the implementation accepts (the tests cover 1..7).
inline constexpr int64_t kDepthwiseMaxKernel = 7;

/// The output size of one axis of a convolution, as at::conv2d computes it; 0 when the padded
/// input is smaller than the (dilated) kernel (at::conv2d refuses those). stride >= 1.
inline int64_t conv_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride,
                                int64_t dilation) {
  // Checked before dividing: C++ division truncates toward zero, so -1 / 2 + 1 would be 1.
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

/// Why cuda::depthwise_conv2d_nhwc cannot compute conv2d_bias_act(input, weight, bias,
/// residual, g, act), or nullptr when it can. Everything but the device, autograd and the
/// kernel's self-check (the implementation checks those first): dtype float32 / float16 /
/// bfloat16 with bias and residual of the same dtype on input's device; depthwise with depth
/// multiplier 1 (groups == C_in == C_out, weight (C, 1, kH, kW)); input contiguous in
/// channels_last; kH, kW <= kDepthwiseMaxKernel; strides 1 or 2 (each axis); dilation >= 1;
/// padding >= 0; an output of at least one pixel; a residual of the output's shape. The
/// arguments passed kernels/conv/conv2d_bias_act.cpp's check_inputs (4-d, channel counts). The
/// reasons are string literals (registry Decline).
inline const char* depthwise_conv2d_decline(const at::Tensor& input, const at::Tensor& weight,
                                            const at::Tensor& bias, const at::Tensor& residual,
                                            const ConvGeometry& g) {
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return "cuda_depthwise: dtype (float32, float16, bfloat16 only)";
  const int64_t C = input.size(1);
  if (g.groups != C || weight.size(0) != C || weight.size(1) != 1)
    return "cuda_depthwise: not depthwise (groups == C_in == C_out only)";
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast))
    return "cuda_depthwise: input not channels_last";
  const int64_t kh = weight.size(2), kw = weight.size(3);
  if (kh > kDepthwiseMaxKernel || kw > kDepthwiseMaxKernel)
    return "cuda_depthwise: kernel larger than 7x7";
  if (g.stride_h < 1 || g.stride_h > 2 || g.stride_w < 1 || g.stride_w > 2)
    return "cuda_depthwise: stride other than 1 or 2";
  if (g.dilation_h < 1 || g.dilation_w < 1 || g.pad_h < 0 || g.pad_w < 0)
    return "cuda_depthwise: negative padding or dilation < 1";
  const int64_t oh = conv_output_size(input.size(2), kh, g.pad_h, g.stride_h, g.dilation_h);
  const int64_t ow = conv_output_size(input.size(3), kw, g.pad_w, g.stride_w, g.dilation_w);
  if (oh < 1 || ow < 1) return "cuda_depthwise: input smaller than the kernel";
  if (bias.defined() && (bias.scalar_type() != dtype || bias.device() != input.device()))
    return "cuda_depthwise: bias dtype or device differs";
  if (residual.defined()) {
    if (residual.scalar_type() != dtype || residual.device() != input.device())
      return "cuda_depthwise: residual dtype or device differs";
    if (residual.dim() != 4 || residual.size(0) != input.size(0) || residual.size(1) != C ||
        residual.size(2) != oh || residual.size(3) != ow)
      return "cuda_depthwise: residual shape is not the output's";
  }
  return nullptr;
}

/// Whether depthwise_conv2d_nhwc takes its tiled path for this geometry (each thread four
/// neighbouring output pixels of a row, the kernel width unrolled: kW in {3, 5, 7}, stride_h ==
/// stride_w, dilation 1) rather than its generic one (one output pixel per thread, any size,
/// stride and dilation the decline rules accept). Both give the same sums in the same order.
inline bool depthwise_conv2d_tiled(int64_t kw, const ConvGeometry& g) {
  return (kw == 3 || kw == 5 || kw == 7) && g.stride_h == g.stride_w && g.dilation_h == 1 &&
         g.dilation_w == 1;
}

/// The weight as the kernel reads it: (C, 1, kH, kW) in any memory format -> (kH * kW, C)
/// contiguous, row r * kW + s holding every channel's tap (r, s), so that consecutive channels
/// are one 16-byte load. An ATen copy; the implementation caches it per weight tensor.
inline at::Tensor depthwise_weight_khwc(const at::Tensor& weight) {
  return weight.reshape({weight.size(0), weight.size(2) * weight.size(3)}).t().contiguous();
}

/// y = act(depthwise_conv2d(x, w) + bias + residual) in one pass over NHWC memory, summed in
/// float32 (taps in row-major order, then + bias, then + residual: the portable path's order)
/// and rounded once to x's dtype. x: (B, C, H, W) CUDA tensor contiguous in channels_last,
/// float32 / float16 / bfloat16; weight_khwc: depthwise_weight_khwc of the (C, 1, kh, kw)
/// weight, x's dtype and device; bias: (C) or undefined; residual: the output's shape or
/// undefined (any strides: made channels_last if it is not). Returns (B, C, H', W')
/// channels_last. 16-byte loads and stores where C is a multiple of 16 bytes' elements and
/// every pointer is 16-byte aligned, else one element per load. Runs on the current stream, no
/// synchronisation. Throws c10::Error on inputs depthwise_conv2d_decline refuses.
at::Tensor depthwise_conv2d_nhwc(const at::Tensor& x, const at::Tensor& weight_khwc, int64_t kh,
                                 int64_t kw, const at::Tensor& bias, const at::Tensor& residual,
                                 const ConvGeometry& g, Activation act);

}  // namespace libreyolo::kernels::cuda

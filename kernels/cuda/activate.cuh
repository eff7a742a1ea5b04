// The activations of kernels/activation.h in float, as the in-tree CUDA kernels apply them after
// their float32 arithmetic (kernels/conv/cuda/bias_act_kernels.cu,
// kernels/conv/cuda/depthwise_conv2d_kernels.cu): one definition, so that the fused paths round
// the same values.
#pragma once

#include "kernels/activation.h"

namespace libreyolo::kernels::cuda {

/// act(x) as ATen computes it in float (aten/src/ATen/native/cuda/ActivationSiluKernel.cu,
/// ActivationGeluCore.cu, UnaryGeometricTanhKernel.cu); relu keeps a NaN like at::relu. `Fast`:
/// SiLU's exp through the MUFU unit (__expf: 2 + floor(|1.173 x|) float32 ulps, CUDA C++
/// Programming Guide), for results rounded to a 16-bit type, whose half ulp (2^-9 or 2^-12
/// relative) is far larger; float32 results keep expf (the unfused ops' bits).
template <Activation Act, bool Fast>
__device__ __forceinline__ float activate(float x) {
  if constexpr (Act == Activation::relu) {
    return x <= 0.f ? 0.f : x;
  } else if constexpr (Act == Activation::silu) {
    return x / (1.f + (Fast ? __expf(-x) : expf(-x)));
  } else if constexpr (Act == Activation::gelu) {
    return x * 0.5f * (1.f + erff(x * 0.70710678118654752440f));
  } else if constexpr (Act == Activation::tanh) {
    return tanhf(x);
  } else {
    return x;
  }
}

}  // namespace libreyolo::kernels::cuda

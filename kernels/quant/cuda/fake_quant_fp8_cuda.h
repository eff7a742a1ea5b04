// The in-tree CUDA kernel of `fake_quant_fp8`, without the slot logic.
#pragma once

#include <ATen/core/Tensor.h>

namespace libreyolo::kernels::cuda {

/// q = float32(e4m3fn_rne(clamp(x / s, -448, 448))) * s with s = max(scale, 1e-12), bit-exact to
/// fake_quant_fp8_reference (kernels/quant/fake_quant_fp8.h): IEEE division (__fdiv_rn), NaN kept
/// through the clamp, RNE conversion by the hardware (cvt.rn.satfinite.e4m3x2 on sm_89+).
/// x: contiguous float32 CUDA tensor of any shape; scale: float32 on the same device with one
/// element (per tensor) or x.size(0) elements (per channel, channel = index / (numel / size(0))).
/// Returns a new contiguous float32 tensor of x's shape. Runs on the current stream, no sync.
at::Tensor fake_quant_fp8_forward(const at::Tensor& x, const at::Tensor& scale);

}  // namespace libreyolo::kernels::cuda

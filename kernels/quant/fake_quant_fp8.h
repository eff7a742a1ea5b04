// FP8 (E4M3FN) fake quantization: the `fake_quant_fp8` slot and its reference, which defines the
// numbers (LibreYOLO libreyolo/quant/fake_quant.py, see shared/docs/research/libreyolo-kernels.md
// section 7.1):
//   s = max(scale, 1e-12)
//   q = float32(e4m3fn_round_nearest_even(clamp(x / s, -448, 448))) * s
// The clamp comes first because the float8 cast does not saturate. Gradient: identity to x
// (straight-through, clamped elements included), none to scale.
#pragma once

#include <ATen/ATen.h>

#include "kernels/registry.h"

namespace libreyolo::kernels {

inline constexpr const char* kFakeQuantFp8 = "fake_quant_fp8";

/// Signature every `fake_quant_fp8` implementation registers with.
using FakeQuantFp8Impl =
    std::function<Outcome<at::Tensor>(const at::Tensor& x, const at::Tensor& scale)>;

/// Slot entry point (Registry::global()). x: float32 any shape; scale: float32, per-tensor
/// shape (1) or per-channel (C, 1, ..., 1) with C = x.size(0). Returns float32 of x's shape.
/// Throws c10::Error for other dtypes or scale shapes.
at::Tensor fake_quant_fp8(const at::Tensor& x, const at::Tensor& scale);

/// The reference implementation alone (any device), never the slot.
at::Tensor fake_quant_fp8_reference(const at::Tensor& x, const at::Tensor& scale);

}  // namespace libreyolo::kernels

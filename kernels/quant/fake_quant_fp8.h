// FP8 (E4M3FN) fake quantization: the `fake_quant_fp8` slot and its reference, which defines the
// numbers (LibreYOLO libreyolo/quant/fake_quant.py):
//   s = max(scale, 1e-12)
//   q = float32(e4m3fn_round_nearest_even(clamp(x / s, -448, 448))) * s
// The clamp comes first because the float8 cast does not saturate. Gradient: identity to x
// (straight-through, clamped elements included), none to scale.
#pragma once

#include <ATen/ATen.h>

#include "kernels/registry.h"
#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration: (x, scale) -> fake-quantised x.
inline constexpr SlotDef<at::Tensor(const at::Tensor& x, const at::Tensor& scale)> kFakeQuantFp8{
    "fake_quant_fp8"};
using FakeQuantFp8Impl = decltype(kFakeQuantFp8)::Fn;
using FakeQuantFp8Handle = Handle<decltype(kFakeQuantFp8)::Signature>;

/// Slot entry point: calls `handle` (bound with Registry::bind), the reference when every
/// candidate failed or the handle is empty. x: float32 any shape; scale: float32 on x's device,
/// per-tensor (one element: shape (1) or a scalar) or per-channel (C, 1, ..., 1) with x's rank
/// and C = x.size(0). Returns float32 of x's shape. Inputs are validated before any
/// implementation runs: throws c10::Error (naming dtype or shapes) for other dtypes or scale
/// shapes, and a bad input never disables an implementation.
at::Tensor fake_quant_fp8(const FakeQuantFp8Handle& handle, const at::Tensor& x,
                          const at::Tensor& scale);

/// The reference implementation alone (any device), never the slot. Division is IEEE x / s (not
/// x * (1 / s)); the cast is ATen's float8_e4m3fn (round to nearest even) after the clamp.
/// Special values: NaN x -> NaN; +-inf x -> +-448 * s; |x / s| beyond 448 -> +-448 * s; results
/// with |x / s| <= 2^-10 (half the smallest subnormal) -> signed zero; scale <= 0 -> 1e-12; NaN
/// scale -> NaN everywhere; +inf scale -> NaN (0 * inf). When x or scale requires grad (and grad
/// mode is on) it runs as a torch::autograd::Function: forward value bit-identical to the no-grad
/// one, backward identity to x and no gradient to scale.
at::Tensor fake_quant_fp8_reference(const at::Tensor& x, const at::Tensor& scale);

}  // namespace libreyolo::kernels

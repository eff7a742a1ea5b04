// The `sampling_locations` slot: deformable attention's sampling locations, the predicted offsets
// scaled by the reference box's size and added to its centre, as the decoders of RT-DETR
// (modeling_rt_detr.py RTDetrMultiscaleDeformableAttention), D-FINE / RT-DETRv2
// (modeling_d_fine.py DFineMultiscaleDeformableAttention) and Deformable DETR / LW-DETR / RF-DETR
// (modeling_deformable_detr.py, four-coordinate references) write it:
//   loc = xy + ((offsets (/ divisor | * per_point[n])) * wh) * factor
// Upstream, four broadcasting elementwise ops on a (B, Q, H, N, 2) tensor: four kernels per decoder
// layer on the GPU (a batch-1 forward is launch-bound), and on the CPU 0.05-0.1 ms each for
// D-FINE L's 57,600 values (an inner TensorIterator loop of 2), about 1.5 ms of a 79 ms bf16
// forward over six layers.
//
// Implementations: the portable path (a CPU loop with ATen's roundings, or the ATen expression
// itself), and `cuda` (kernels/attention/cuda/sampling_locations_cuda.h: one thread per point).
// Every implementation gives the ATen expression's values bit for bit on its device: one rounding
// to the dtype per op, in upstream's operand order (ATen computes 16-bit ops in float32).
#pragma once

#include <ATen/ATen.h>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// How each point's offset is scaled before the box size multiplies it: upstream's two forms.
struct PointScale {
  /// RT-DETR v1 / Deformable DETR: offsets / n_points.
  static PointScale divide_by(double divisor) { return {divisor, {}}; }
  /// RT-DETR v2 / D-FINE: offsets * num_points_scale[n], one value per point (N) in the offsets'
  /// dtype.
  static PointScale multiply_by(const at::Tensor& per_point) { return {0.0, per_point}; }

  double divisor = 0.0;  ///< > 0: divide form
  at::Tensor per_point;  ///< defined: multiply form
};

/// The slot's declaration: (offsets (B, Q, H, N, 2), reference_boxes (B, Q, 4), per_point (N) or
/// undefined, divisor (> 0 when per_point is undefined), factor) -> (B, Q, H, N, 2) locations in
/// the offsets' dtype. The entry point below has validated the shapes and dtypes.
inline constexpr SlotDef<at::Tensor(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                                    const at::Tensor& per_point, double divisor, double factor)>
    kSamplingLocations{"sampling_locations"};
using SamplingLocationsHandle = Handle<decltype(kSamplingLocations)::Signature>;

/// The model-facing entry point. offsets (B, Q, H, N, 2) float32 / bfloat16 / float16 (float64
/// too, portable), reference_boxes (B, Q, 4) or (B, Q, 1, 4) (cx, cy, w, h; upstream's level axis
/// of 1) in the same dtype -> (B, Q, H, N, 2) locations:
///   loc = xy + ((offsets (/ divisor | * per_point[n])) * wh) * factor
/// Calls `handle`, and the portable path when it is empty or every candidate declined. Throws
/// c10::Error naming the argument on a shape or dtype mismatch, or when neither or both scale
/// forms are given.
at::Tensor sampling_locations(const SamplingLocationsHandle& handle, const at::Tensor& offsets,
                              const at::Tensor& reference_boxes, const PointScale& scale,
                              double factor);

/// The portable path alone (same contract, validated by the entry point): CPU tensors of
/// float32 / bfloat16 / float16 take one loop (single-threaded, inference only) that rounds
/// after each step as ATen's CPU ops do; anything else (CUDA, float64, a tensor that requires
/// grad under GradMode) the ATen expression itself.
at::Tensor sampling_locations_portable(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                                       const PointScale& scale, double factor);

/// Whether the portable path takes its CPU loop for these operands (tests use it to know which
/// path they compared).
bool sampling_locations_fused(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const PointScale& scale);

}  // namespace libreyolo::kernels

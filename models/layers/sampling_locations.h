// Deformable attention's sampling locations: the predicted offsets scaled by the reference box's
// size and added to its centre. Upstream writes it as four broadcasting elementwise ops on a
// (B, Q, H, N, 2) tensor; on the CPU each took about 0.05-0.1 ms for D-FINE L's 57,600 values (a
// TensorIterator loop over an inner dimension of 2): about 1.5 ms of a 79 ms bf16 forward over
// its six layers. One loop computes the same values, rounding after each step as ATen does.
#pragma once

#include <ATen/ATen.h>

namespace libreyolo::models::layers {

/// How each point's offset is scaled before the box size multiplies it: upstream's two forms.
struct PointScale {
  /// RT-DETR v1 (modeling_rt_detr.py RTDetrMultiscaleDeformableAttention): offsets / n_points.
  static PointScale divide_by(double divisor) { return {divisor, {}}; }
  /// RT-DETR v2 / D-FINE (modeling_d_fine.py DFineMultiscaleDeformableAttention): offsets *
  /// num_points_scale[n], one value per point (N) in the offsets' dtype.
  static PointScale multiply_by(const at::Tensor& per_point) { return {0.0, per_point}; }

  double divisor = 0.0;  ///< > 0: divide form
  at::Tensor per_point;  ///< defined: multiply form
};

/// offsets (B, Q, H, N, 2) float32 / bfloat16 / float16, reference_boxes (B, Q, 4) or (B, Q, 1, 4)
/// (cx, cy, w, h; upstream's level axis of 1) in the same dtype -> (B, Q, H, N, 2) locations:
///   loc = xy + ((offsets (/ divisor | * per_point[n])) * wh) * factor
/// in upstream's operand order, each step rounded to the dtype as ATen rounds it (opmath float).
/// CPU tensors of those dtypes take one fused loop (single-threaded: 57,600 values per image;
/// inference only, no autograd); anything else (CUDA, float64, a tensor that requires grad
/// under GradMode) the ATen expression itself. Throws c10::Error on a shape mismatch.
at::Tensor sampling_locations(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const PointScale& scale, double factor);

/// Whether sampling_locations() takes its fused CPU loop for these operands (tests use it to
/// know which path they compared).
bool sampling_locations_fused(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const PointScale& scale);

}  // namespace libreyolo::models::layers

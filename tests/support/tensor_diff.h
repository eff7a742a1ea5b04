// Tensor differences for the tests' tolerances: one definition for every test executable (two
// different inline bodies of one name in one executable, as test_gpu had, break the ODR).
#pragma once

#include <ATen/ATen.h>

namespace libreyolo::test {

/// max |a - b| as a double: both tensors moved to the CPU and converted to float64 first, so the
/// difference itself adds no rounding; 0 when the difference is empty (no detections kept).
/// Throws c10::Error when the shapes do not broadcast.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto d = (a.detach().to(at::kCPU, at::kDouble) - b.detach().to(at::kCPU, at::kDouble));
  return d.numel() == 0 ? 0.0 : d.abs().max().item<double>();
}

/// max |a - b| / max |b| (b is the reference; divided by 1 when b is all zeros).
inline double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.detach().to(at::kCPU, at::kDouble).abs().max().item<double>();
  return max_abs_diff(a, b) / (scale > 0 ? scale : 1.0);
}

}  // namespace libreyolo::test

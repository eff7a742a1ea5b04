// The pixel_mask rule of the families that take one (Deformable DETR, LW-DETR).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace libreyolo::models::core {

/// pixel_mask (B, H, W) of an integer or bool dtype, 1 on real pixels, moved to `device` (its
/// dtype kept); undefined: all ones, (B, H, W) int64 on `device`, for `pixel_values`
/// (B, C, H, W). Throws std::invalid_argument "<model_type>: pixel_mask must be
/// (B, H, W) = (...), got [...]" or "<model_type>: pixel_mask must be an integer or bool tensor,
/// got Float".
at::Tensor checked_pixel_mask(const std::string& model_type, const at::Tensor& pixel_values,
                              const at::Tensor& pixel_mask, const at::Device& device);

}  // namespace libreyolo::models::core

// Window helpers of Swin (transformers 5.17 models/swin/modeling_swin.py: window_partition,
// window_reverse, SwinLayer.get_attn_mask, SwinRelativePositionBias).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace libreyolo::models::swin {

/// (B, H, W, C) -> (B * H/ws * W/ws, ws, ws, C); windows in row-major order per image.
/// H and W must be multiples of `window` (checked, c10::Error otherwise).
at::Tensor window_partition(const at::Tensor& x, int64_t window);

/// Inverse of window_partition: (B * nW, ws, ws, C) -> (B, H, W, C).
at::Tensor window_reverse(const at::Tensor& windows, int64_t window, int64_t height, int64_t width);

/// Additive mask of a shifted-window block on the padded map (height, width): (nW, ws*ws, ws*ws)
/// with 0 between tokens of the same region and -100.0 otherwise. Regions per axis:
/// [0, L - ws), [L - ws, L - shift), [L - shift, L); id = h_region * 3 + w_region.
at::Tensor shifted_window_mask(int64_t height, int64_t width, int64_t window, int64_t shift,
                               at::ScalarType dtype, const at::Device& device);

/// (ws*ws, ws*ws) int64 index into a relative-position table built for `table_window`
/// ((2*tw-1)^2 rows): (dy + tw - 1) * (2*tw - 1) + (dx + tw - 1), dy/dx = coord_i - coord_j over
/// the row-major positions of a `window` x `window` window (window <= table_window). Equals
/// transformers' relative_position_index when window == table_window.
at::Tensor relative_position_index(int64_t window, int64_t table_window);

}  // namespace libreyolo::models::swin

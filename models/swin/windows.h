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

/// The row maps of a (shifted) window attention over a height x width token map (row-major), for
/// the add_layer_norm slot's row orders (kernels/norm/add_layer_norm.h; one image's, the same
/// for every image): the LayerNorm before the attention writes the window order, the residual add
/// after it reads the attention output from there.
struct WindowRows {
  /// (nW * ws*ws) int64: the map row at each window-order position (windows in
  /// window_partition's order on the padded, rolled map), -1 at padding positions.
  at::Tensor rows;
  /// (height * width) int64: each map row's window-order position.
  at::Tensor inverse;
};

/// WindowRows of the given geometry on `device`, built by running the modules' own ops on a
/// map of row numbers (so the order is theirs by construction): transformers' SwinLayer pads the
/// map right / bottom to a multiple of `window` (with -1 here), rolls it by -shift on both axes
/// and partitions it, and reverses with window_reverse, roll(+shift) and a crop;
/// roll_before_pad (timm's SwinTransformerBlock._attn) rolls the unpadded map first and crops
/// before rolling back. shift 0: no roll. Throws c10::Error for a window < 1.
WindowRows window_rows(int64_t height, int64_t width, int64_t window, int64_t shift,
                       bool roll_before_pad, const at::Device& device);

/// (ws*ws, ws*ws) int64 index into a relative-position table built for `table_window`
/// ((2*tw-1)^2 rows): (dy + tw - 1) * (2*tw - 1) + (dx + tw - 1), dy/dx = coord_i - coord_j over
/// the row-major positions of a `window` x `window` window (window <= table_window). Equals
/// transformers' relative_position_index when window == table_window.
at::Tensor relative_position_index(int64_t window, int64_t table_window);

}  // namespace libreyolo::models::swin

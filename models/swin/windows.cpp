#include "models/swin/windows.h"

namespace libreyolo::models::swin {

at::Tensor window_partition(const at::Tensor& x, int64_t window) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  TORCH_CHECK(window > 0 && H % window == 0 && W % window == 0, "swin window_partition: map ", H,
              "x", W, " is not a multiple of window ", window);
  return x.view({B, H / window, window, W / window, window, C})
      .transpose(2, 3)
      .contiguous()
      .view({-1, window, window, C});
}

at::Tensor window_reverse(const at::Tensor& windows, int64_t window, int64_t height,
                          int64_t width) {
  const int64_t C = windows.size(-1);
  return windows.view({-1, height / window, width / window, window, window, C})
      .transpose(2, 3)
      .contiguous()
      .view({-1, height, width, C});
}

WindowRows window_rows(int64_t height, int64_t width, int64_t window, int64_t shift,
                       bool roll_before_pad, const at::Device& device) {
  TORCH_CHECK(window > 0, "swin window_rows: window ", window, " must be positive");
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const int64_t pad_r = (window - width % window) % window;
  const int64_t pad_b = (window - height % window) % window;
  const int64_t hp = height + pad_b, wp = width + pad_r;
  // The same ops as the unfused SwinLayer, on row numbers instead of features.
  auto map = at::arange(height * width, opts).view({1, height, width, 1});
  if (shift > 0 && roll_before_pad) map = at::roll(map, {-shift, -shift}, {1, 2});
  map = at::constant_pad_nd(map, {0, 0, 0, pad_r, 0, pad_b}, -1);
  if (shift > 0 && !roll_before_pad) map = at::roll(map, {-shift, -shift}, {1, 2});
  WindowRows out;
  out.rows = window_partition(map, window).view({-1});
  auto back =
      window_reverse(at::arange(hp * wp, opts).view({-1, window, window, 1}), window, hp, wp);
  if (shift > 0 && !roll_before_pad) back = at::roll(back, {shift, shift}, {1, 2});
  back = back.slice(1, 0, height).slice(2, 0, width);
  if (shift > 0 && roll_before_pad) back = at::roll(back, {shift, shift}, {1, 2});
  out.inverse = back.reshape({-1});
  return out;
}

at::Tensor shifted_window_mask(int64_t height, int64_t width, int64_t window, int64_t shift,
                               at::ScalarType dtype, const at::Device& device) {
  // Same arithmetic as transformers SwinLayer.get_attn_mask (region ids, then differences).
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const auto h = at::arange(height, opts), w = at::arange(width, opts);
  const auto h_region = (h >= height - window).to(at::kLong) + (h >= height - shift).to(at::kLong);
  const auto w_region = (w >= width - window).to(at::kLong) + (w >= width - shift).to(at::kLong);
  const auto img = (h_region.view({1, -1, 1, 1}) * 3 + w_region.view({1, 1, -1, 1})).to(dtype);
  const auto windows = window_partition(img, window).view({-1, window * window});
  auto mask = windows.unsqueeze(1) - windows.unsqueeze(2);
  return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0);
}

at::Tensor relative_position_index(int64_t window, int64_t table_window) {
  TORCH_CHECK(window > 0 && window <= table_window, "swin: window ", window,
              " larger than the relative-position table's window ", table_window);
  const auto coords = at::arange(window, at::kLong);
  const auto yy = coords.view({-1, 1}).expand({window, window}).reshape({-1});
  const auto xx = coords.view({1, -1}).expand({window, window}).reshape({-1});
  const auto dy = yy.view({-1, 1}) - yy.view({1, -1}) + (table_window - 1);
  const auto dx = xx.view({-1, 1}) - xx.view({1, -1}) + (table_window - 1);
  return dy * (2 * table_window - 1) + dx;
}

}  // namespace libreyolo::models::swin

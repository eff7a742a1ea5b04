#include "tools/client/overlay.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "models/image/decode.h"
#include "models/image/encode.h"
#include "tools/client/font6x10.h"

namespace libreyolo::client {

namespace {

// Distinct, saturated colours (Tableau 10), cycled.
constexpr uint8_t kPalette[10][3] = {
    {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

std::vector<uint8_t> to_png(image::RgbImage& rgb) {
  image::PngSpec png;
  png.width = static_cast<int>(rgb.width);
  png.height = static_cast<int>(rgb.height);
  png.color_type = image::PngSpec::ColorType::rgb;
  png.samples = std::move(rgb.rgb);
  return image::encode_png(png);
}

/// Draws `text` (ASCII; other bytes as '?', at most 40 characters) in white on a bar of colour
/// `c` whose bottom-left is (x, y) - 1, or whose top-left is (x, y) when there is no room above.
void caption(image::RgbImage& rgb, const std::string& text, int64_t x, int64_t y,
             const uint8_t* c) {
  constexpr size_t kMaxChars = 40;
  constexpr int64_t kPad = 1;
  const int64_t n = static_cast<int64_t>(std::min(text.size(), kMaxChars));
  const int64_t bar_w = n * kGlyphWidth + 2 * kPad, bar_h = kGlyphHeight + 2 * kPad;
  const int64_t top = y - bar_h >= 0 ? y - bar_h : y;
  for (int64_t by = 0; by < bar_h; ++by)
    for (int64_t bx = 0; bx < bar_w; ++bx) {
      const int64_t px = x + bx, py = top + by;
      if (px < 0 || py < 0 || px >= rgb.width || py >= rgb.height) continue;
      bool ink = false;
      const int64_t gx = bx - kPad, gy = by - kPad;
      if (gx >= 0 && gy >= 0 && gx < n * kGlyphWidth && gy < kGlyphHeight) {
        const auto ch = static_cast<unsigned char>(text[static_cast<size_t>(gx / kGlyphWidth)]);
        const int glyph = ch >= 32 && ch < 127 ? ch - 32 : '?' - 32;
        ink = (kFont6x10[glyph][gy] >> (kGlyphWidth - 1 - gx % kGlyphWidth)) & 1;
      }
      uint8_t* p = rgb.rgb.data() + (py * rgb.width + px) * 3;
      for (int i = 0; i < 3; ++i) p[i] = ink ? 255 : c[i];
    }
}

}  // namespace

std::vector<uint8_t> mask_overlay_png(const std::string& image, const uint8_t* masks, int64_t k,
                                      int64_t h, int64_t w, int64_t stride, int64_t plane_stride) {
  auto rgb = image::decode_rgb(reinterpret_cast<const uint8_t*>(image.data()), image.size());
  if (h > rgb.height || w > rgb.width)
    throw std::runtime_error("masks of " + std::to_string(h) + "x" + std::to_string(w) +
                             " do not fit the " + std::to_string(rgb.height) + "x" +
                             std::to_string(rgb.width) + " image");
  for (int64_t j = 0; j < k; ++j) {
    const uint8_t* c = kPalette[j % 10];
    const uint8_t* plane = masks + j * plane_stride;
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        if (!plane[y * stride + x]) continue;
        uint8_t* p = rgb.rgb.data() + (y * rgb.width + x) * 3;
        for (int ch = 0; ch < 3; ++ch) p[ch] = static_cast<uint8_t>((p[ch] + c[ch] + 1) / 2);
      }
  }
  return to_png(rgb);
}

std::vector<uint8_t> panoptic_overlay_png(const std::string& image, const int32_t* segmentation,
                                          int64_t h, int64_t w, int64_t stride) {
  auto rgb = image::decode_rgb(reinterpret_cast<const uint8_t*>(image.data()), image.size());
  if (h > rgb.height || w > rgb.width)
    throw std::runtime_error("a segmentation map of " + std::to_string(h) + "x" +
                             std::to_string(w) + " does not fit the " + std::to_string(rgb.height) +
                             "x" + std::to_string(rgb.width) + " image");
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const int32_t id = segmentation[y * stride + x];
      if (id <= 0) continue;
      const uint8_t* c = kPalette[id % 10];
      uint8_t* p = rgb.rgb.data() + (y * rgb.width + x) * 3;
      for (int ch = 0; ch < 3; ++ch) p[ch] = static_cast<uint8_t>((p[ch] + c[ch] + 1) / 2);
    }
  return to_png(rgb);
}

std::vector<uint8_t> box_overlay_png(const std::string& image, const float* boxes,
                                     const int64_t* labels, int64_t k) {
  return box_overlay_png(image, boxes, labels, k, {});
}

std::vector<uint8_t> box_overlay_png(const std::string& image, const float* boxes,
                                     const int64_t* labels, int64_t k,
                                     const std::vector<std::string>& captions) {
  auto rgb = image::decode_rgb(reinterpret_cast<const uint8_t*>(image.data()), image.size());
  const int64_t w = rgb.width, h = rgb.height;
  constexpr int64_t kThickness = 3;
  for (int64_t j = 0; j < k; ++j) {
    const float* b = boxes + j * 4;
    if (!std::isfinite(b[0]) || !std::isfinite(b[1]) || !std::isfinite(b[2]) ||
        !std::isfinite(b[3]))
      continue;
    // The pixel columns and rows the box covers, clipped to the image (in double: a float far
    // outside the int64 range must not overflow the conversion).
    const double fx0 = std::max(0.0, std::floor(double(b[0])));
    const double fy0 = std::max(0.0, std::floor(double(b[1])));
    const double fx1 = std::min(double(w - 1), std::ceil(double(b[2])) - 1);
    const double fy1 = std::min(double(h - 1), std::ceil(double(b[3])) - 1);
    if (fx0 > fx1 || fy0 > fy1) continue;
    const auto x0 = static_cast<int64_t>(fx0), y0 = static_cast<int64_t>(fy0);
    const auto x1 = static_cast<int64_t>(fx1), y1 = static_cast<int64_t>(fy1);
    const uint8_t* c = kPalette[(labels[j] % 10 + 10) % 10];
    for (int64_t y = y0; y <= y1; ++y)
      for (int64_t x = x0; x <= x1; ++x) {
        const bool edge = x - x0 < kThickness || x1 - x < kThickness || y - y0 < kThickness ||
                          y1 - y < kThickness;
        if (!edge) continue;
        uint8_t* p = rgb.rgb.data() + (y * w + x) * 3;
        p[0] = c[0];
        p[1] = c[1];
        p[2] = c[2];
      }
    if (static_cast<size_t>(j) < captions.size()) caption(rgb, captions[j], x0, y0, c);
  }
  return to_png(rgb);
}

}  // namespace libreyolo::client

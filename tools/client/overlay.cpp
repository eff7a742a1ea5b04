#include "tools/client/overlay.h"

#include <stdexcept>

#include "models/image/decode.h"
#include "models/image/encode.h"

namespace libreyolo::client {

std::vector<uint8_t> mask_overlay_png(const std::string& image, const uint8_t* masks, int64_t k,
                                      int64_t h, int64_t w, int64_t stride, int64_t plane_stride) {
  auto rgb = image::decode_rgb(reinterpret_cast<const uint8_t*>(image.data()), image.size());
  if (h > rgb.height || w > rgb.width)
    throw std::runtime_error("masks of " + std::to_string(h) + "x" + std::to_string(w) +
                             " do not fit the " + std::to_string(rgb.height) + "x" +
                             std::to_string(rgb.width) + " image");
  // Distinct, saturated colours (Tableau 10), cycled.
  static const uint8_t palette[10][3] = {
      {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
      {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
  for (int64_t j = 0; j < k; ++j) {
    const uint8_t* c = palette[j % 10];
    const uint8_t* plane = masks + j * plane_stride;
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        if (!plane[y * stride + x]) continue;
        uint8_t* p = rgb.rgb.data() + (y * rgb.width + x) * 3;
        for (int ch = 0; ch < 3; ++ch) p[ch] = static_cast<uint8_t>((p[ch] + c[ch] + 1) / 2);
      }
  }
  image::PngSpec png;
  png.width = static_cast<int>(rgb.width);
  png.height = static_cast<int>(rgb.height);
  png.color_type = image::PngSpec::ColorType::rgb;
  png.samples = std::move(rgb.rgb);
  return image::encode_png(png);
}

}  // namespace libreyolo::client

// Encoders (libpng / TurboJPEG) for every layout the decoder accepts. Used by the tests to make
// grayscale, palette, 16-bit, interlaced PNGs and grayscale, CMYK, progressive JPEGs, and by
// tools that write images. No torch here.
#pragma once

#include <cstdint>
#include <vector>

namespace libreyolo::image {

/// A PNG to write. `samples` are rows of `width * channels` samples for the color type
/// (gray 1, gray+alpha 2, RGB 3, RGBA 4, palette 1 index), packed as libpng expects them:
/// bit depths < 8 packed MSB first per row, 16-bit big-endian (2 bytes per sample).
struct PngSpec {
  enum class ColorType { gray, gray_alpha, rgb, rgba, palette };
  int width = 0, height = 0;
  ColorType color_type = ColorType::rgb;
  int bit_depth = 8;        ///< 1, 2, 4, 8 or 16 as the PNG color type allows
  bool interlaced = false;  ///< Adam7
  std::vector<uint8_t> samples;
  std::vector<uint8_t> palette_rgb;    ///< palette: 3 bytes per entry
  std::vector<uint8_t> palette_alpha;  ///< palette: optional tRNS alpha per entry
};

/// Encodes a PNG. Throws std::runtime_error with libpng's message on invalid specs.
std::vector<uint8_t> encode_png(const PngSpec& spec);

/// A JPEG to write from interleaved 8-bit pixels.
struct JpegSpec {
  enum class Pixels { rgb, gray, cmyk };  ///< input layout: 3, 1 or 4 bytes per pixel
  int width = 0, height = 0;
  Pixels pixels = Pixels::rgb;
  std::vector<uint8_t> data;
  int quality = 90;
  /// TurboJPEG TJSAMP_*: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0 (ignored for gray input).
  int subsampling = 0;
  bool progressive = false;
};

/// Encodes a JPEG with TurboJPEG (CMYK input is written as YCCK/CMYK with an Adobe marker,
/// samples stored as given). Throws std::runtime_error with TurboJPEG's message.
std::vector<uint8_t> encode_jpeg(const JpegSpec& spec);

}  // namespace libreyolo::image

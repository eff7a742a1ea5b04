// Image decoding: encoded JPEG / PNG bytes -> 8-bit RGB, with the same conventions as
// `PIL.Image.open(f).convert("RGB")` (what transformers' load_image and the fixtures use).
// No torch here: the server's transport and the fuzzers use it without LibTorch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace libreyolo::image {

/// Bad image input: empty, truncated, corrupt, unknown format, or too large. The message names
/// the problem (the server maps it to INVALID_ARGUMENT).
class ImageError : public std::invalid_argument {
 public:
  explicit ImageError(const std::string& message) : std::invalid_argument(message) {}
};

/// Container format, recognised from the magic bytes (never from a file name).
enum class ImageFormat { unknown, jpeg, png };

/// "jpeg", "png" or "unknown".
const char* format_name(ImageFormat format);

/// Limits applied before any pixel is decoded.
struct DecodeOptions {
  /// Largest accepted width * height, checked from the header (default 40 Mpx, like PIL's
  /// MAX_IMAGE_PIXELS order of magnitude; a decompression-bomb guard).
  int64_t max_pixels = 40'000'000;
  /// JPEG: libjpeg warnings are errors ("Corrupt JPEG data: ...", "Premature end of JPEG
  /// file"). False accepts what libjpeg recovered from, as PIL does, except truncation.
  bool strict_jpeg = true;
};

/// What the header says.
struct ImageInfo {
  ImageFormat format = ImageFormat::unknown;
  int64_t height = 0;  ///< pixels
  int64_t width = 0;   ///< pixels
};

/// A decoded image: interleaved RGB, row-major, `rgb.size() == height * width * 3`.
struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb;
};

/// Recognises JPEG (FF D8 FF) and PNG (89 'PNG' 0D 0A 1A 0A) signatures.
ImageFormat sniff_format(const uint8_t* data, size_t size);

/// Reads only the header (JPEG: up to the frame header; PNG: IHDR).
/// Throws ImageError for empty input, an unknown format or an unreadable header.
ImageInfo read_image_info(const uint8_t* data, size_t size);

/// Decodes to 8-bit RGB. Conversions (PIL's convert("RGB")): grayscale is replicated, alpha is
/// dropped (not composited), palettes are expanded, 16-bit samples keep their high byte,
/// CMYK/YCCK JPEGs use PIL's formula `R = (255-C)(255-K)/255` on Adobe-inverted samples.
/// JPEG uses the accurate integer IDCT and fancy upsampling (libjpeg's defaults, as in PIL).
/// EXIF orientation is NOT applied.
/// Throws ImageError (message names the problem) for: zero bytes, unknown format, corrupt or
/// truncated data (libjpeg warnings too unless options.strict_jpeg is false), and
/// width * height above options.max_pixels (checked from the header before decoding).
RgbImage decode_rgb(const uint8_t* data, size_t size, const DecodeOptions& options = {});

/// Reads a whole file. Throws ImageError naming the path when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace libreyolo::image

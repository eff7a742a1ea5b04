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
  /// Apply the EXIF orientation (1-8) as PIL's `ImageOps.exif_transpose` does, which
  /// transformers' `load_image` calls: boxes and sizes are then in the displayed frame. False
  /// returns the stored frame.
  bool apply_orientation = true;
};

/// What the header says (the stored frame: orientation not applied).
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
/// The orientation of image_orientation() is applied (unless options.apply_orientation is
/// false): orientations 5-8 swap width and height.
/// Throws ImageError (message names the problem) for: zero bytes, unknown format, corrupt or
/// truncated data (libjpeg warnings too unless options.strict_jpeg is false), and
/// width * height above options.max_pixels (checked from the header before decoding).
RgbImage decode_rgb(const uint8_t* data, size_t size, const DecodeOptions& options = {});

/// The EXIF orientation (1-8) PIL's `Image.getexif()` reports for these bytes, as
/// `ImageOps.exif_transpose` (Pillow 13, src/PIL/ImageOps.py) uses it: JPEG: tag 0x0112 of IFD0
/// of the first APP1 "Exif\0\0" segment before the scan, else `tiff:Orientation` of the XMP
/// APP1 segment; PNG: the same tag of the eXIf chunk. 1 (as stored) when there is none, when the
/// value is outside 1-8 or not a single BYTE/SHORT/LONG, and when the EXIF data is malformed
/// (never an error: PIL would fail or ignore it; the pixels are still good). Not read: PNG
/// "Raw profile type exif" text chunks and PNG XMP.
int image_orientation(const uint8_t* data, size_t size);

/// `image` as PIL's `Image.transpose` gives it for EXIF orientation `orientation`:
/// 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE,
/// 8 ROTATE_90 (5-8 swap width and height); any other value returns `image` unchanged.
RgbImage apply_orientation(RgbImage image, int orientation);

/// Reads a whole file. Throws ImageError naming the path when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace libreyolo::image

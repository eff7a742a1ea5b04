// libFuzzer target: JPEG and PNG decoding as the daemon does it (models/image/decode.cpp with the
// options ServerCore uses: strict JPEG, EXIF orientation applied, the pixel limit checked from the
// header). Every input either decodes to an image whose size agrees with its header and the limit,
// or throws ImageError; crashes, sanitizer reports, other exceptions and broken invariants are
// bugs. Seed corpus: tests/fuzz/corpus/image_decode/ (the fixtures' photographs and EXIF images,
// the hostile tests' bombs and truncations).
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/image/decode.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

/// The daemon's default is 40 Mpx (server.max_pixels_per_image); a lower limit keeps one
/// execution short while exercising the same check (an image above it is refused from the header).
constexpr int64_t kMaxPixels = int64_t{1} << 22;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::image;
  using libreyolo::fuzz::fail;
  const ImageFormat format = sniff_format(data, size);
  const int orientation = image_orientation(data, size);
  if (orientation < 1 || orientation > 8) fail("orientation " + std::to_string(orientation));
  ImageInfo info;
  bool have_info = false;
  try {
    info = read_image_info(data, size);
    have_info = true;
    if (info.format != format) fail("read_image_info format differs from sniff_format");
    if (info.height <= 0 || info.width <= 0) fail("non-positive header size");
  } catch (const ImageError&) {
  }
  DecodeOptions options;
  options.max_pixels = kMaxPixels;
  try {
    const RgbImage image = decode_rgb(data, size, options);
    if (!have_info) fail("decoded an image whose header read_image_info refused");
    if (image.height <= 0 || image.width <= 0) fail("empty image decoded");
    if (image.height * image.width > kMaxPixels) fail("pixel limit not applied");
    if (image.rgb.size() != static_cast<size_t>(image.height * image.width * 3))
      fail("rgb buffer size");
    const bool swapped = orientation >= 5;
    const int64_t h = swapped ? info.width : info.height;
    const int64_t w = swapped ? info.height : info.width;
    if (image.height != h || image.width != w) fail("decoded size differs from the header");
  } catch (const ImageError& e) {
    if (std::string(e.what()).empty()) fail("empty ImageError message");
  }
  return 0;
}

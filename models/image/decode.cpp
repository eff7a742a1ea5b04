// JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng's progressive-free low-level
// API (the simplified png_image API treats 16-bit data as linear light and composites alpha,
// neither of which PIL does).
#include "models/image/decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

namespace libreyolo::image {
namespace {

std::string pixels_text(int64_t width, int64_t height) {
  std::ostringstream s;
  s << width << "x" << height << " = " << width * height << " pixels";
  return s.str();
}

void check_limit(const ImageInfo& info, const DecodeOptions& options) {
  if (info.width <= 0 || info.height <= 0) {
    std::ostringstream s;
    s << "corrupt " << format_name(info.format) << " header: empty image size " << info.width << "x"
      << info.height;
    throw ImageError(s.str());
  }
  if (info.width * info.height > options.max_pixels) {
    std::ostringstream s;
    s << format_name(info.format) << " image is " << pixels_text(info.width, info.height)
      << ", above the limit of " << options.max_pixels << " pixels";
    throw ImageError(s.str());
  }
}

void check_not_empty(const uint8_t* data, size_t size) {
  if (data == nullptr || size == 0) throw ImageError("image data is empty (0 bytes)");
}

// ---------------------------------------------------------------------------------------------
// JPEG

struct TjDeleter {
  void operator()(void* h) const {
    if (h) tjDestroy(h);
  }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

TjHandle tj_decompressor() {
  TjHandle h(tjInitDecompress());
  if (!h)
    throw std::runtime_error(std::string("tjInitDecompress failed: ") + tjGetErrorStr2(nullptr));
  return h;
}

struct JpegHeader {
  ImageInfo info;
  int colorspace = 0;
};

// `strict`: a libjpeg warning while reading the markers is an error too.
JpegHeader jpeg_header(tjhandle h, const uint8_t* data, size_t size, bool strict) {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    const bool recovered = tjGetErrorCode(h) == TJERR_WARNING && width > 0 && height > 0;
    if (strict || !recovered)
      throw ImageError(std::string("corrupt JPEG header: ") + tjGetErrorStr2(h));
  }
  JpegHeader out;
  out.info = {ImageFormat::jpeg, height, width};
  out.colorspace = colorspace;
  return out;
}

// Pillow's MULDIV255 (libImaging/ImagingUtils.h): round(a * b / 255) in integers.
inline int muldiv255(int a, int b) {
  const int tmp = a * b + 128;
  return ((tmp >> 8) + tmp) >> 8;
}

RgbImage decode_jpeg(const uint8_t* data, size_t size, const DecodeOptions& options) {
  TjHandle handle = tj_decompressor();
  tjhandle h = handle.get();
  const JpegHeader header = jpeg_header(h, data, size, options.strict_jpeg);
  check_limit(header.info, options);
  const int width = static_cast<int>(header.info.width);
  const int height = static_cast<int>(header.info.height);
  // Accurate (islow) IDCT is libjpeg's and PIL's default (TJFLAG_ACCURATEDCT only makes it
  // explicit; the fast IDCT differs by up to 7 on the fixture photographs).
  const int flags = TJFLAG_ACCURATEDCT | (options.strict_jpeg ? TJFLAG_STOPONWARNING : 0);
  // A failed tjDecompress2: an error, or (not strict) a warning other than truncation, which
  // libjpeg recovered from (PIL accepts those files too).
  auto check = [&](int rc, const char* what) {
    if (rc == 0) return;
    const std::string message = tjGetErrorStr2(h);
    const bool truncated = message.find("Premature end") != std::string::npos;
    if (!options.strict_jpeg && tjGetErrorCode(h) == TJERR_WARNING && !truncated) return;
    throw ImageError(std::string(truncated ? "truncated " : "corrupt ") + what + ": " + message);
  };
  RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.resize(static_cast<size_t>(width) * height * 3);
  const bool cmyk = header.colorspace == TJCS_CMYK || header.colorspace == TJCS_YCCK;
  if (!cmyk) {
    check(tjDecompress2(h, data, static_cast<unsigned long>(size), out.rgb.data(), width, 0, height,
                        TJPF_RGB, flags),
          "JPEG");
    return out;
  }
  std::vector<uint8_t> cmyk_px(static_cast<size_t>(width) * height * 4);
  check(tjDecompress2(h, data, static_cast<unsigned long>(size), cmyk_px.data(), width, 0, height,
                      TJPF_CMYK, flags),
        "CMYK JPEG");
  // PIL reads CMYK JPEGs as Adobe-inverted ("CMYK;I"), then cmyk2rgb (libImaging/Convert.c):
  // nk = 255 - K; R = nk - MULDIV255(C, nk). With inverted samples s: C = 255 - s_c, nk = s_k.
  const size_t n = static_cast<size_t>(width) * height;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &cmyk_px[4 * i];
    const int nk = p[3];
    for (int c = 0; c < 3; ++c) {
      const int v = nk - muldiv255(255 - p[c], nk);
      out.rgb[3 * i + c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// PNG

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void png_read_mem(png_structp png, png_bytep out, png_size_t length) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > src->size - src->pos) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, src->data + src->pos, length);
  src->pos += length;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", message ? message : "unknown error");
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // PIL ignores ancillary-chunk warnings

// Owns the libpng structs; destroyed on every path (normal return, longjmp, throw).
struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// Everything that may longjmp lives in this function, whose frame owns no C++ object with a
// destructor (rows and pixels are owned by the caller). Returns false on a libpng error.
bool png_run(PngReader& r, PngSource& src, ImageInfo& info, const DecodeOptions& options,
             std::vector<uint8_t>& pixels, std::vector<png_bytep>& rows, bool& over_limit) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_set_read_fn(r.png, &src, png_read_mem);
  png_read_info(r.png, r.info);
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(r.png, r.info, &width, &height, &bit_depth, &color_type, &interlace, nullptr,
               nullptr);
  info = {ImageFormat::png, static_cast<int64_t>(height), static_cast<int64_t>(width)};
  if (info.width * info.height > options.max_pixels) {
    over_limit = true;
    return true;
  }
  // PIL's convert("RGB"): palette -> RGB, low-bit gray -> 8 bits, 16 -> 8 by the high byte,
  // gray -> RGB, alpha dropped (not composited).
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(r.png);
  if (bit_depth == 16) png_set_strip_16(r.png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA)
    png_set_gray_to_rgb(r.png);
  // Palette expansion also turns tRNS into an alpha channel: strip it as well.
  if ((color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(r.png, r.info, PNG_INFO_tRNS))
    png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_rowbytes(r.png, r.info) != static_cast<size_t>(width) * 3) {
    png_error(r.png, "unsupported PNG layout after conversion to RGB");
  }
  pixels.resize(static_cast<size_t>(width) * height * 3);
  rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y)
    rows[y] = pixels.data() + static_cast<size_t>(y) * width * 3;
  png_read_image(r.png, rows.data());
  return true;
}

// IHDR read straight from the bytes: png_read_info would first read every chunk up to IDAT.
// Signature (8), length (4), "IHDR" (4), width (4, big-endian), height (4).
ImageInfo png_ihdr(const uint8_t* data, size_t size) {
  if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0)
    throw ImageError("corrupt or truncated PNG: no IHDR chunk at the start");
  auto be32 = [&](size_t at) {
    return static_cast<int64_t>(data[at]) << 24 | static_cast<int64_t>(data[at + 1]) << 16 |
           static_cast<int64_t>(data[at + 2]) << 8 | static_cast<int64_t>(data[at + 3]);
  };
  return {ImageFormat::png, be32(20), be32(16)};
}

RgbImage decode_png_impl(const uint8_t* data, size_t size, const DecodeOptions& options,
                         bool header_only, ImageInfo& info) {
  info = png_ihdr(data, size);
  if (header_only) return {};
  check_limit(info, options);
  PngSource src{data, size, 0, {0}};
  PngReader r;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  if (!r.png) throw std::runtime_error("png_create_read_struct failed");
  r.info = png_create_info_struct(r.png);
  if (!r.info) throw std::runtime_error("png_create_info_struct failed");
  RgbImage out;
  std::vector<png_bytep> rows;
  bool over_limit = false;
  if (!png_run(r, src, info, options, out.rgb, rows, over_limit)) {
    throw ImageError(std::string("corrupt or truncated PNG: ") + src.message);
  }
  if (over_limit) check_limit(info, options);
  out.height = info.height;
  out.width = info.width;
  return out;
}

}  // namespace

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::jpeg:
      return "JPEG";
    case ImageFormat::png:
      return "PNG";
    default:
      return "unknown";
  }
}

ImageFormat sniff_format(const uint8_t* data, size_t size) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (data && size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
    return ImageFormat::jpeg;
  if (data && size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

ImageInfo read_image_info(const uint8_t* data, size_t size) {
  check_not_empty(data, size);
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg: {
      TjHandle h = tj_decompressor();
      return jpeg_header(h.get(), data, size, /*strict=*/false).info;
    }
    case ImageFormat::png: {
      ImageInfo info;
      decode_png_impl(data, size, DecodeOptions{}, /*header_only=*/true, info);
      return info;
    }
    default:
      throw ImageError("unknown image format (not JPEG or PNG; " + std::to_string(size) +
                       " bytes)");
  }
}

RgbImage decode_rgb(const uint8_t* data, size_t size, const DecodeOptions& options) {
  check_not_empty(data, size);
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg:
      return decode_jpeg(data, size, options);
    case ImageFormat::png: {
      ImageInfo info;
      return decode_png_impl(data, size, options, /*header_only=*/false, info);
    }
    default:
      throw ImageError("unknown image format (not JPEG or PNG; " + std::to_string(size) +
                       " bytes)");
  }
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ImageError(path + ": cannot open file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw ImageError(path + ": read error");
  return bytes;
}

}  // namespace libreyolo::image

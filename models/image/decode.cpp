// JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng's progressive-free low-level
// API (the simplified png_image API treats 16-bit data as linear light and composites alpha,
// neither of which PIL does).
#include "models/image/decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

namespace libreyolo::image {
namespace {

std::string pixels_text(int64_t width, int64_t height) {
  std::ostringstream s;
  s << width << "x" << height;
  // Header sizes are 32-bit (PNG) or 16-bit (JPEG): the product fits in 64 unsigned bits, not
  // always in int64 (a 2785018110x4294953472 PNG header overflowed it: preprocess_fuzz,
  // tests/fuzz/corpus/image_decode/regress-png-size-overflow.png).
  if (width >= 0 && height >= 0 && width <= UINT32_MAX && height <= UINT32_MAX)
    s << " = " << static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  s << " pixels";
  return s.str();
}

void check_not_empty_size(const ImageInfo& info) {
  if (info.width <= 0 || info.height <= 0) {
    std::ostringstream s;
    s << "corrupt " << format_name(info.format) << " header: empty image size " << info.width << "x"
      << info.height;
    throw ImageError(s.str());
  }
}

void check_limit(const ImageInfo& info, const DecodeOptions& options) {
  check_not_empty_size(info);
  if (info.width > options.max_pixels / info.height) {  // width * height > max, no overflow
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
  // tjDecompressHeader3 succeeds on a tables-only ("abbreviated") datastream with a 0x0 size
  // (image_decode_fuzz, tests/fuzz/corpus/image_decode/regress-tables-only.jpg).
  if (width <= 0 || height <= 0)
    throw ImageError("corrupt JPEG header: no image (a tables-only JPEG datastream)");
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
  if (info.width > options.max_pixels / info.height) {  // width * height > max, no overflow
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

// ---------------------------------------------------------------------------------------------
// EXIF orientation, as Pillow 13 reads it (src/PIL/JpegImagePlugin.py APP, PngImagePlugin.py
// chunk_eXIf, Image.py Image.getexif / Exif.load, TiffImagePlugin.py ImageFileDirectory_v2).
// Every read is bounds-checked; anything malformed means "no orientation" (1).

constexpr uint16_t kOrientationTag = 0x0112;

/// Orientation tag of IFD0 of a TIFF stream (Exif.load: leading "Exif\0\0" stripped up to
/// twice). Returns 0 when the tag is absent, -1 when the data is not TIFF or the tag is not one
/// integer (PIL would fail or ignore it), else the value.
int tiff_orientation(const uint8_t* d, size_t n) {
  for (int i = 0; i < 2 && n >= 6 && std::memcmp(d, "Exif\0\0", 6) == 0; ++i) {
    d += 6;
    n -= 6;
  }
  if (n < 8) return -1;
  bool little;
  if (std::memcmp(d, "II*\0", 4) == 0) {
    little = true;
  } else if (std::memcmp(d, "MM\0*", 4) == 0) {
    little = false;
  } else {
    return -1;
  }
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? d[at] | d[at + 1] << 8 : d[at] << 8 | d[at + 1];
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
  };
  const size_t ifd = u32(4);
  if (ifd > n || n - ifd < 2) return -1;
  const size_t count = u16(ifd);
  int found = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e > n || n - e < 12) return found ? found : -1;  // truncated IFD
    if (u16(e) != kOrientationTag) continue;
    const uint32_t type = u16(e + 2), values = u32(e + 4);
    if (values != 1) return -1;
    // SHORT, LONG and their signed forms read as one int; PIL keeps a BYTE as bytes, which
    // matches no orientation. (RATIONAL/FLOAT orientations are not read.)
    int64_t v;
    if (type == 3) {
      v = u16(e + 8);
    } else if (type == 8) {
      v = static_cast<int16_t>(u16(e + 8));
    } else if (type == 4) {
      v = u32(e + 8);
    } else if (type == 9) {
      v = static_cast<int32_t>(u32(e + 8));
    } else {
      return -1;
    }
    found = v >= 1 && v <= 8 ? static_cast<int>(v) : -1;  // the last entry wins (a dict in PIL)
  }
  return found;
}

/// `tiff:Orientation="N"` or `<tiff:Orientation>N` in XMP text (Image.getexif's fallback): N,
/// else 0.
int xmp_orientation(const uint8_t* d, size_t n) {
  static const char kKey[] = "tiff:Orientation";
  const size_t k = sizeof kKey - 1;
  for (size_t i = 0; i + k < n; ++i) {
    if (std::memcmp(d + i, kKey, k) != 0) continue;
    size_t at = i + k;
    if (at + 1 < n && d[at] == '=' && d[at + 1] == '"') {
      at += 2;
    } else if (at < n && d[at] == '>') {
      at += 1;
    } else {
      continue;
    }
    if (at < n && d[at] >= '0' && d[at] <= '9') return d[at] - '0';
  }
  return 0;
}

/// Orientation of a whole file's EXIF and XMP payloads: the EXIF tag when present (even an
/// unusable value: PIL looks at XMP only when EXIF has no orientation tag), else XMP's.
int orientation_of(const std::string& exif, bool has_exif, const std::string& xmp) {
  if (has_exif) {
    const int t = tiff_orientation(reinterpret_cast<const uint8_t*>(exif.data()), exif.size());
    if (t != 0) return t < 0 ? 1 : t;
  }
  const int x = xmp_orientation(reinterpret_cast<const uint8_t*>(xmp.data()), xmp.size());
  return x >= 1 && x <= 8 ? x : 1;
}

int jpeg_orientation(const uint8_t* d, size_t n) {
  static const char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // then one NUL
  std::string exif, xmp;
  bool has_exif = false;
  size_t at = 2;  // after SOI
  while (at + 4 <= n) {
    if (d[at] != 0xFF) break;              // not a marker: PIL would fail; stop reading metadata
    while (at < n && d[at] == 0xFF) ++at;  // fill bytes
    if (at >= n) break;
    const uint8_t marker = d[at++];
    if (marker == 0xD9 || marker == 0xDA) break;  // EOI, SOS: no metadata after the scan
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length
    if (at + 2 > n) break;
    const size_t length = static_cast<size_t>(d[at]) << 8 | d[at + 1];
    if (length < 2 || length > n - at) break;
    const uint8_t* s = d + at + 2;
    const size_t len = length - 2;
    if (marker == 0xE1 && len >= 6 && std::memcmp(s, "Exif\0\0", 6) == 0) {
      // PIL: the first segment whole, later ones appended without their "Exif\0\0".
      if (has_exif) {
        exif.append(reinterpret_cast<const char*>(s) + 6, len - 6);
      } else {
        exif.assign(reinterpret_cast<const char*>(s), len);
        has_exif = true;
      }
    } else if (marker == 0xE1 && len >= sizeof kXmp && std::memcmp(s, kXmp, sizeof kXmp) == 0) {
      xmp.assign(reinterpret_cast<const char*>(s) + sizeof kXmp, len - sizeof kXmp);  // last wins
    }
    at += length;
  }
  return orientation_of(exif, has_exif, xmp);
}

int png_orientation(const uint8_t* d, size_t n) {
  static const char kXmpKey[] = "XML:com.adobe.xmp";  // then NUL, flag, method, lang NUL, NUL
  std::string exif, xmp;
  bool has_exif = false;
  size_t at = 8;
  while (at + 12 <= n) {
    const size_t length = static_cast<size_t>(d[at]) << 24 | static_cast<size_t>(d[at + 1]) << 16 |
                          static_cast<size_t>(d[at + 2]) << 8 | d[at + 3];
    const uint8_t* type = d + at + 4;
    if (length > n - at - 12) break;
    const uint8_t* s = d + at + 8;
    if (std::memcmp(type, "eXIf", 4) == 0) {
      exif.assign("Exif\0\0", 6);  // chunk_eXIf prepends it; Exif.load strips up to two
      exif.append(reinterpret_cast<const char*>(s), length);
      has_exif = true;  // the last chunk wins
    } else if (std::memcmp(type, "iTXt", 4) == 0 && length > sizeof kXmpKey + 1 &&
               std::memcmp(s, kXmpKey, sizeof kXmpKey) == 0 && s[sizeof kXmpKey] == 0) {
      // Uncompressed XMP only (a compressed one is not read): skip language and translation.
      size_t p = sizeof kXmpKey + 2;
      for (int nul = 0; nul < 2 && p < length; ++p) nul += s[p] == 0;
      if (p <= length) xmp.assign(reinterpret_cast<const char*>(s) + p, length - p);
    } else if (std::memcmp(type, "IEND", 4) == 0) {
      break;
    }
    at += 12 + length;
  }
  return orientation_of(exif, has_exif, xmp);
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
      // As decode_rgb refuses it (a 1x0 IHDR: image_decode_fuzz,
      // tests/fuzz/corpus/image_decode/regress-png-height-0.png).
      check_not_empty_size(info);
      return info;
    }
    default:
      throw ImageError("unknown image format (not JPEG or PNG; " + std::to_string(size) +
                       " bytes)");
  }
}

RgbImage decode_rgb(const uint8_t* data, size_t size, const DecodeOptions& options) {
  check_not_empty(data, size);
  const int orientation = options.apply_orientation ? image_orientation(data, size) : 1;
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg:
      return apply_orientation(decode_jpeg(data, size, options), orientation);
    case ImageFormat::png: {
      ImageInfo info;
      return apply_orientation(decode_png_impl(data, size, options, /*header_only=*/false, info),
                               orientation);
    }
    default:
      throw ImageError("unknown image format (not JPEG or PNG; " + std::to_string(size) +
                       " bytes)");
  }
}

int image_orientation(const uint8_t* data, size_t size) {
  if (data == nullptr) return 1;
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg:
      return jpeg_orientation(data, size);
    case ImageFormat::png:
      return png_orientation(data, size);
    default:
      return 1;
  }
}

RgbImage apply_orientation(RgbImage in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int64_t w = in.width, h = in.height;
  const bool swap = orientation >= 5;
  RgbImage out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.rgb.resize(in.rgb.size());
  // For each output pixel (x, y), the input pixel PIL's Image.transpose takes
  // (libImaging/Geometry.c): ROTATE_90 is counter-clockwise, ROTATE_270 clockwise.
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x;
          sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y;
          sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y;
          sy = h - 1 - x;
          break;  // ROTATE_270
        case 7:
          sx = w - 1 - y;
          sy = h - 1 - x;
          break;  // TRANSVERSE
        default:
          sx = w - 1 - y;
          sy = x;
          break;  // 8: ROTATE_90
      }
      std::memcpy(&out.rgb[3 * (y * out.width + x)], &in.rgb[3 * (sy * w + sx)], 3);
    }
  }
  return out;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ImageError(path + ": cannot open file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw ImageError(path + ": read error");
  return bytes;
}

}  // namespace libreyolo::image

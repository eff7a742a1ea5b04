// libpng / TurboJPEG encoders (see encode.h).
#include "models/image/encode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace libreyolo::image {
namespace {

struct PngSink {
  std::vector<uint8_t>* out;
  char message[256];
};

void png_write_mem(png_structp png, png_bytep data, png_size_t length) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  sink->out->insert(sink->out->end(), data, data + length);
}
void png_flush_mem(png_structp) {}

void png_on_error(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->message, sizeof(sink->message), "%s", message ? message : "unknown error");
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

struct PngWriter {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngWriter() { png_destroy_write_struct(&png, info ? &info : nullptr); }
};

int png_color_type(PngSpec::ColorType t) {
  switch (t) {
    case PngSpec::ColorType::gray:
      return PNG_COLOR_TYPE_GRAY;
    case PngSpec::ColorType::gray_alpha:
      return PNG_COLOR_TYPE_GRAY_ALPHA;
    case PngSpec::ColorType::rgba:
      return PNG_COLOR_TYPE_RGB_ALPHA;
    case PngSpec::ColorType::palette:
      return PNG_COLOR_TYPE_PALETTE;
    default:
      return PNG_COLOR_TYPE_RGB;
  }
}

int channels(PngSpec::ColorType t) {
  switch (t) {
    case PngSpec::ColorType::gray_alpha:
      return 2;
    case PngSpec::ColorType::rgb:
      return 3;
    case PngSpec::ColorType::rgba:
      return 4;
    default:
      return 1;
  }
}

// All libpng calls that may longjmp; the frame owns nothing with a destructor.
bool png_write_run(PngWriter& w, PngSink& sink, const PngSpec& spec, std::vector<png_bytep>& rows,
                   std::vector<png_color>& palette) {
  if (setjmp(png_jmpbuf(w.png))) return false;
  png_set_write_fn(w.png, &sink, png_write_mem, png_flush_mem);
  png_set_IHDR(w.png, w.info, spec.width, spec.height, spec.bit_depth,
               png_color_type(spec.color_type),
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (spec.color_type == PngSpec::ColorType::palette) {
    png_set_PLTE(w.png, w.info, palette.data(), static_cast<int>(palette.size()));
    if (!spec.palette_alpha.empty()) {
      png_set_tRNS(w.png, w.info, spec.palette_alpha.data(),
                   static_cast<int>(spec.palette_alpha.size()), nullptr);
    }
  }
  png_write_info(w.png, w.info);
  png_write_image(w.png, rows.data());
  png_write_end(w.png, nullptr);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_png(const PngSpec& spec) {
  if (spec.width <= 0 || spec.height <= 0) throw std::runtime_error("encode_png: empty size");
  const size_t row_bits =
      static_cast<size_t>(spec.width) * channels(spec.color_type) * spec.bit_depth;
  const size_t row_bytes = (row_bits + 7) / 8;
  if (spec.samples.size() != row_bytes * spec.height) {
    throw std::runtime_error("encode_png: samples hold " + std::to_string(spec.samples.size()) +
                             " bytes, expected " + std::to_string(row_bytes * spec.height));
  }
  std::vector<uint8_t> out;
  PngSink sink{&out, {0}};
  PngWriter w;
  w.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, png_on_error, png_on_warning);
  if (!w.png) throw std::runtime_error("png_create_write_struct failed");
  w.info = png_create_info_struct(w.png);
  if (!w.info) throw std::runtime_error("png_create_info_struct failed");
  std::vector<png_bytep> rows(spec.height);
  for (int y = 0; y < spec.height; ++y)
    rows[y] = const_cast<png_bytep>(spec.samples.data() + y * row_bytes);
  std::vector<png_color> palette;
  for (size_t i = 0; i + 2 < spec.palette_rgb.size(); i += 3)
    palette.push_back({spec.palette_rgb[i], spec.palette_rgb[i + 1], spec.palette_rgb[i + 2]});
  if (!png_write_run(w, sink, spec, rows, palette))
    throw std::runtime_error(std::string("encode_png: ") + sink.message);
  return out;
}

std::vector<uint8_t> encode_jpeg(const JpegSpec& spec) {
  int pf = TJPF_RGB, bpp = 3, subsamp = spec.subsampling;
  if (spec.pixels == JpegSpec::Pixels::gray) {
    pf = TJPF_GRAY;
    bpp = 1;
    subsamp = TJSAMP_GRAY;
  } else if (spec.pixels == JpegSpec::Pixels::cmyk) {
    pf = TJPF_CMYK;
    bpp = 4;
  }
  if (spec.width <= 0 || spec.height <= 0 ||
      spec.data.size() != static_cast<size_t>(spec.width) * spec.height * bpp) {
    throw std::runtime_error("encode_jpeg: data size does not match width * height * channels");
  }
  tjhandle h = tjInitCompress();
  if (!h) throw std::runtime_error("tjInitCompress failed");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int flags = TJFLAG_ACCURATEDCT | (spec.progressive ? TJFLAG_PROGRESSIVE : 0);
  const int rc = tjCompress2(h, spec.data.data(), spec.width, 0, spec.height, pf, &buf, &size,
                             subsamp, spec.quality, flags);
  std::string error = rc != 0 ? tjGetErrorStr2(h) : "";
  std::vector<uint8_t> out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  if (rc != 0) throw std::runtime_error("encode_jpeg: " + error);
  return out;
}

}  // namespace libreyolo::image

// Decoder tests: every PNG color type / bit depth and JPEG layout the server may receive,
// generated here with libpng / TurboJPEG (models/image/encode.h), with exact pixel values, and
// every kind of bad input rejected with an ImageError naming the problem.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "models/image/decode.h"
#include "models/image/encode.h"
#include "models/image/processor.h"

namespace {

using libreyolo::image::decode_rgb;
using libreyolo::image::DecodeOptions;
using libreyolo::image::encode_jpeg;
using libreyolo::image::encode_png;
using libreyolo::image::ImageError;
using libreyolo::image::ImageFormat;
using libreyolo::image::JpegSpec;
using libreyolo::image::PngSpec;
using libreyolo::image::RgbImage;
using CT = PngSpec::ColorType;

RgbImage decode(const std::vector<uint8_t>& bytes, const DecodeOptions& o = {}) {
  return decode_rgb(bytes.data(), bytes.size(), o);
}

// The ImageError message of decoding `bytes` ("" when it decodes).
std::string error_of(const std::vector<uint8_t>& bytes, const DecodeOptions& o = {}) {
  try {
    decode(bytes, o);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "";
}

PngSpec png(CT type, int depth, int w, int h, std::vector<uint8_t> samples) {
  PngSpec s;
  s.color_type = type;
  s.bit_depth = depth;
  s.width = w;
  s.height = h;
  s.samples = std::move(samples);
  return s;
}

std::vector<uint8_t> rgb_of(const RgbImage& im) { return im.rgb; }

std::vector<uint8_t> gray_to_rgb(const std::vector<uint8_t>& g) {
  std::vector<uint8_t> out;
  for (uint8_t v : g) out.insert(out.end(), {v, v, v});
  return out;
}

TEST(ImageDecode, PngRgb8ExactAndSniffed) {
  const std::vector<uint8_t> px = {255, 0, 0, 0,   255, 0,   0, 0, 255,
                                   1,   2, 3, 250, 251, 252, 7, 8, 9};
  const auto bytes = encode_png(png(CT::rgb, 8, 3, 2, px));
  EXPECT_EQ(libreyolo::image::sniff_format(bytes.data(), bytes.size()), ImageFormat::png);
  const auto info = libreyolo::image::read_image_info(bytes.data(), bytes.size());
  EXPECT_EQ(info.width, 3);
  EXPECT_EQ(info.height, 2);
  const RgbImage im = decode(bytes);
  EXPECT_EQ(im.width, 3);
  EXPECT_EQ(im.height, 2);
  EXPECT_EQ(rgb_of(im), px);
}

TEST(ImageDecode, PngRgbaDropsAlphaLikePilConvertRgb) {
  const auto im = decode(encode_png(png(CT::rgba, 8, 2, 1, {10, 20, 30, 0, 40, 50, 60, 128})));
  EXPECT_EQ(rgb_of(im), (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
}

TEST(ImageDecode, PngGray8AndGrayAlphaReplicated) {
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::gray, 8, 3, 1, {0, 77, 255})))),
            gray_to_rgb({0, 77, 255}));
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::gray_alpha, 8, 2, 1, {5, 0, 200, 255})))),
            gray_to_rgb({5, 200}));
}

TEST(ImageDecode, PngLowBitGrayScaledTo8Bits) {
  // 1-bit: 0b10110000 -> 255 0 255 255 0 0 0 0; 4-bit 0xA, 0x3 -> 0xAA, 0x33.
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::gray, 1, 8, 1, {0xB0})))),
            gray_to_rgb({255, 0, 255, 255, 0, 0, 0, 0}));
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::gray, 4, 2, 1, {0xA3})))), gray_to_rgb({0xAA, 0x33}));
}

TEST(ImageDecode, PngPaletteWithTransparencyExpanded) {
  PngSpec s = png(CT::palette, 8, 3, 1, {2, 0, 1});
  s.palette_rgb = {10, 11, 12, 20, 21, 22, 30, 31, 32};
  s.palette_alpha = {0, 128, 255};
  EXPECT_EQ(rgb_of(decode(encode_png(s))),
            (std::vector<uint8_t>{30, 31, 32, 10, 11, 12, 20, 21, 22}));
  PngSpec s4 = png(CT::palette, 4, 2, 1, {0x10});
  s4.palette_rgb = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(rgb_of(decode(encode_png(s4))), (std::vector<uint8_t>{4, 5, 6, 1, 2, 3}));
}

TEST(ImageDecode, Png16BitKeepsHighByte) {
  // RGB16 big-endian samples 0x1234 0xABCD 0x00FF -> 0x12 0xAB 0x00.
  EXPECT_EQ(
      rgb_of(decode(encode_png(png(CT::rgb, 16, 1, 1, {0x12, 0x34, 0xAB, 0xCD, 0x00, 0xFF})))),
      (std::vector<uint8_t>{0x12, 0xAB, 0x00}));
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::gray, 16, 2, 1, {0xAB, 0xCD, 0xFF, 0xFF})))),
            gray_to_rgb({0xAB, 0xFF}));
  EXPECT_EQ(rgb_of(decode(encode_png(png(CT::rgba, 16, 1, 1, {1, 2, 3, 4, 5, 6, 7, 8})))),
            (std::vector<uint8_t>{1, 3, 5}));
}

TEST(ImageDecode, PngInterlacedEqualsSamples) {
  std::vector<uint8_t> px(9 * 7 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 37 % 251);
  PngSpec s = png(CT::rgb, 8, 9, 7, px);
  s.interlaced = true;
  EXPECT_EQ(rgb_of(decode(encode_png(s))), px);
}

JpegSpec jpeg(JpegSpec::Pixels p, int w, int h, std::vector<uint8_t> data, int quality = 100) {
  JpegSpec s;
  s.pixels = p;
  s.width = w;
  s.height = h;
  s.data = std::move(data);
  s.quality = quality;
  return s;
}

std::vector<uint8_t> gradient_rgb(int w, int h) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      px.insert(px.end(),
                {static_cast<uint8_t>(x * 255 / (w - 1)), static_cast<uint8_t>(y * 255 / (h - 1)),
                 static_cast<uint8_t>((x + y) * 255 / (w + h - 2))});
  return px;
}

int max_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(ImageDecode, JpegGrayscaleUniformIsExact) {
  const auto bytes =
      encode_jpeg(jpeg(JpegSpec::Pixels::gray, 16, 8, std::vector<uint8_t>(128, 77)));
  EXPECT_EQ(libreyolo::image::sniff_format(bytes.data(), bytes.size()), ImageFormat::jpeg);
  const RgbImage im = decode(bytes);
  EXPECT_EQ(im.width, 16);
  EXPECT_EQ(im.height, 8);
  EXPECT_EQ(im.rgb, std::vector<uint8_t>(16 * 8 * 3, 77));
}

TEST(ImageDecode, JpegRgbCloseAndProgressiveEqualsBaseline) {
  const auto px = gradient_rgb(33, 17);
  JpegSpec s = jpeg(JpegSpec::Pixels::rgb, 33, 17, px, 95);
  s.subsampling = 2;  // 4:2:0, odd sizes
  const RgbImage base = decode(encode_jpeg(s));
  s.progressive = true;
  const auto prog_bytes = encode_jpeg(s);
  const RgbImage prog = decode(prog_bytes);
  ASSERT_EQ(base.width, 33);
  ASSERT_EQ(base.height, 17);
  const int d = max_abs_diff(base.rgb, px);
  std::cout << "JPEG q95 4:2:0 gradient: max |decoded - source| " << d << "\n";
  EXPECT_LE(d, 12);
  // Same quantised coefficients, different entropy coding: identical pixels.
  EXPECT_EQ(prog.rgb, base.rgb);
}

TEST(ImageDecode, JpegCmykUsesPilInvertedConversion) {
  // Adobe-inverted samples (C, M, Y, K) = (255, 128, 0, 255) -> PIL RGB (255, 128, 0).
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 8 * 8; ++i) cmyk.insert(cmyk.end(), {255, 128, 0, 255});
  const RgbImage im = decode(encode_jpeg(jpeg(JpegSpec::Pixels::cmyk, 8, 8, cmyk)));
  std::vector<uint8_t> want;
  for (int i = 0; i < 8 * 8; ++i) want.insert(want.end(), {255, 128, 0});
  const int d = max_abs_diff(im.rgb, want);
  std::cout << "CMYK JPEG q100: max |RGB - expected| " << d << "\n";
  EXPECT_LE(d, 2);
  // K = 0 (inverted: full black ink) gives black whatever C, M, Y are.
  std::vector<uint8_t> black;
  for (int i = 0; i < 8 * 8; ++i) black.insert(black.end(), {200, 100, 50, 0});
  const RgbImage b = decode(encode_jpeg(jpeg(JpegSpec::Pixels::cmyk, 8, 8, black)));
  EXPECT_LE(max_abs_diff(b.rgb, std::vector<uint8_t>(8 * 8 * 3, 0)), 2);
}

TEST(ImageDecode, TensorIsChwUint8) {
  const std::vector<uint8_t> px = {1, 2, 3, 4, 5, 6};
  const auto bytes = encode_png(png(CT::rgb, 8, 2, 1, px));
  const at::Tensor t = libreyolo::image::decode_image(bytes.data(), bytes.size());
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_EQ(t[0][0][1].item<int>(), 4);
  EXPECT_EQ(t[2][0][0].item<int>(), 3);
}

// ---------------------------------------------------------------------------------------------
// Rejections

TEST(ImageDecode, ZeroBytesRejected) {
  EXPECT_EQ(error_of({}), "image data is empty (0 bytes)");
  EXPECT_THROW(decode_rgb(nullptr, 0), ImageError);
}

TEST(ImageDecode, UnknownFormatRejected) {
  const std::string gif = "GIF89a\x01\x00\x01\x00garbage";
  const std::vector<uint8_t> bytes(gif.begin(), gif.end());
  EXPECT_NE(error_of(bytes).find("unknown image format"), std::string::npos) << error_of(bytes);
  EXPECT_NE(error_of({0x00, 0x01, 0x02}).find("unknown image format"), std::string::npos);
}

TEST(ImageDecode, TruncatedJpegRejected) {
  const auto bytes = encode_jpeg(jpeg(JpegSpec::Pixels::rgb, 64, 64, gradient_rgb(64, 64), 90));
  for (size_t keep : {bytes.size() / 2, bytes.size() - 2, size_t{200}}) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + keep);
    const std::string e = error_of(cut);
    EXPECT_NE(e.find("JPEG"), std::string::npos) << keep << ": '" << e << "'";
  }
  const std::vector<uint8_t> header_only(bytes.begin(), bytes.begin() + 3);
  EXPECT_NE(error_of(header_only).find("corrupt JPEG header"), std::string::npos)
      << error_of(header_only);
}

TEST(ImageDecode, TruncatedJpegNamedTruncatedEvenWhenLenient) {
  const auto bytes = encode_jpeg(jpeg(JpegSpec::Pixels::rgb, 64, 64, gradient_rgb(64, 64), 90));
  const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() / 2);
  DecodeOptions lenient;
  lenient.strict_jpeg = false;
  EXPECT_EQ(error_of(cut, lenient), "truncated JPEG: Premature end of JPEG file");
  EXPECT_EQ(error_of(cut), "truncated JPEG: Premature end of JPEG file");
}

TEST(ImageDecode, RecoverableJpegWarningStrictVsLenient) {
  // Two stray bytes before the SOS marker: libjpeg warns and recovers (PIL accepts such files).
  const auto bytes = encode_jpeg(jpeg(JpegSpec::Pixels::rgb, 16, 16, gradient_rgb(16, 16), 90));
  std::vector<uint8_t> stray = bytes;
  size_t sos = 2;
  while (sos + 1 < stray.size() && !(stray[sos] == 0xFF && stray[sos + 1] == 0xDA)) ++sos;
  ASSERT_LT(sos + 1, stray.size());
  stray.insert(stray.begin() + sos, {0x00, 0x00});
  EXPECT_EQ(error_of(stray),
            "corrupt JPEG header: Corrupt JPEG data: 2 extraneous bytes before marker 0xda");
  DecodeOptions lenient;
  lenient.strict_jpeg = false;
  EXPECT_EQ(decode(stray, lenient).rgb, decode(bytes).rgb);
}

TEST(ImageDecode, CorruptJpegHeaderRejected) {
  std::vector<uint8_t> bytes = {0xFF, 0xD8, 0xFF};
  for (int i = 0; i < 100; ++i) bytes.push_back(static_cast<uint8_t>(i * 13));
  EXPECT_NE(error_of(bytes).find("corrupt JPEG header"), std::string::npos) << error_of(bytes);
}

// Fuzzing finding (image_decode_fuzz): a tables-only JPEG (SOI, DQT, no frame) had a 0x0 header
// that read_image_info returned as if it were an image.
TEST(ImageDecode, TablesOnlyJpegIsNoImage) {
  const std::vector<uint8_t> bytes =
      libreyolo::image::read_file_bytes(std::string(LIBREYOLO_SOURCE_DIR) +
                                        "/tests/fuzz/corpus/image_decode/regress-tables-only.jpg");
  const std::string expected = "corrupt JPEG header: no image (a tables-only JPEG datastream)";
  EXPECT_EQ(error_of(bytes), expected);
  try {
    libreyolo::image::read_image_info(bytes.data(), bytes.size());
    FAIL() << "read_image_info accepted it";
  } catch (const ImageError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(ImageDecode, TruncatedOrCorruptPngRejected) {
  std::vector<uint8_t> px(32 * 32 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7919 % 256);
  const auto bytes = encode_png(png(CT::rgb, 8, 32, 32, px));
  const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() / 2);
  EXPECT_NE(error_of(cut).find("corrupt or truncated PNG"), std::string::npos) << error_of(cut);
  const std::vector<uint8_t> sig_only(bytes.begin(), bytes.begin() + 8);
  EXPECT_NE(error_of(sig_only).find("corrupt or truncated PNG"), std::string::npos);
  std::vector<uint8_t> flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x5A;  // inside IDAT: CRC mismatch
  EXPECT_NE(error_of(flipped).find("PNG"), std::string::npos) << error_of(flipped);
}

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  v.insert(v.end(), {static_cast<uint8_t>(x >> 24), static_cast<uint8_t>(x >> 16),
                     static_cast<uint8_t>(x >> 8), static_cast<uint8_t>(x)});
}

TEST(ImageDecode, HugePngHeaderRejectedBeforeDecoding) {
  // Signature + a valid IHDR (60000 x 60000 RGB 8-bit, correct CRC) and no image data at all:
  // only a header check can produce the size message.
  std::vector<uint8_t> bytes = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  std::vector<uint8_t> chunk = {'I', 'H', 'D', 'R'};
  put_be32(chunk, 60000);
  put_be32(chunk, 60000);
  chunk.insert(chunk.end(), {8, 2, 0, 0, 0});
  put_be32(bytes, 13);
  bytes.insert(bytes.end(), chunk.begin(), chunk.end());
  put_be32(bytes, crc32(chunk.data(), chunk.size()));
  const auto info = libreyolo::image::read_image_info(bytes.data(), bytes.size());
  EXPECT_EQ(info.width, 60000);
  EXPECT_EQ(error_of(bytes),
            "PNG image is 60000x60000 = 3600000000 pixels, above the limit of 40000000 pixels");
}

// Fuzzing finding (preprocess_fuzz): width * height of a 2785018110x4294953472 PNG header
// overflowed int64 (undefined behaviour) in the limit check and in its message.
TEST(ImageDecode, PngHeaderSizeProductDoesNotOverflow) {
  const std::vector<uint8_t> bytes = libreyolo::image::read_file_bytes(
      std::string(LIBREYOLO_SOURCE_DIR) +
      "/tests/fuzz/corpus/image_decode/regress-png-size-overflow.png");
  EXPECT_EQ(error_of(bytes),
            "PNG image is 2785018110x4294953472 = 11961523201127377920 pixels, above the limit of "
            "40000000 pixels");
}

// Fuzzing finding (image_decode_fuzz): read_image_info returned a 1x0 PNG header that decode_rgb
// refuses.
TEST(ImageDecode, EmptyPngSizeIsRefusedByTheHeaderReaderToo) {
  const std::vector<uint8_t> bytes =
      libreyolo::image::read_file_bytes(std::string(LIBREYOLO_SOURCE_DIR) +
                                        "/tests/fuzz/corpus/image_decode/regress-png-height-0.png");
  try {
    libreyolo::image::read_image_info(bytes.data(), bytes.size());
    FAIL() << "read_image_info accepted it";
  } catch (const ImageError& e) {
    EXPECT_STREQ(e.what(), "corrupt PNG header: empty image size 1x0");
  }
}

TEST(ImageDecode, HugeJpegHeaderRejectedBeforeDecoding) {
  auto bytes = encode_jpeg(jpeg(JpegSpec::Pixels::gray, 16, 16, std::vector<uint8_t>(256, 9)));
  // Patch the SOF0 frame header: FF C0 len(2) precision(1) height(2) width(2).
  bool patched = false;
  for (size_t i = 2; i + 8 < bytes.size(); ++i) {
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
      bytes[i + 5] = 0xEA, bytes[i + 6] = 0x60;  // 60000
      bytes[i + 7] = 0xEA, bytes[i + 8] = 0x60;
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  EXPECT_EQ(error_of(bytes),
            "JPEG image is 60000x60000 = 3600000000 pixels, above the limit of 40000000 pixels");
}

TEST(ImageDecode, PixelLimitIsConfigurable) {
  const auto j = encode_jpeg(jpeg(JpegSpec::Pixels::rgb, 100, 100, gradient_rgb(100, 100), 80));
  const auto p = encode_png(png(CT::gray, 8, 100, 100, std::vector<uint8_t>(10000, 3)));
  DecodeOptions o;
  o.max_pixels = 10000;
  EXPECT_EQ(error_of(j, o), "");
  EXPECT_EQ(error_of(p, o), "");
  o.max_pixels = 9999;
  EXPECT_EQ(error_of(j, o), "JPEG image is 100x100 = 10000 pixels, above the limit of 9999 pixels");
  EXPECT_EQ(error_of(p, o), "PNG image is 100x100 = 10000 pixels, above the limit of 9999 pixels");
}

TEST(ImageDecode, MissingFileNamesPath) {
  try {
    libreyolo::image::decode_image_file("/nonexistent/x.jpg");
    FAIL() << "no exception";
  } catch (const ImageError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/x.jpg: cannot open file");
  }
}

}  // namespace

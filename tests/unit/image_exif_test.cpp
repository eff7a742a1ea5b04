// EXIF orientation: the decoder applies orientations 1-8 as PIL's ImageOps.exif_transpose does
// (what transformers' load_image calls), checked on files made by Pillow
// (tests/fixtures/images/exif/make_exif.py, expected.json: Pillow's sizes and pixel hashes), and
// malformed EXIF never fails a decode.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "models/image/decode.h"

namespace {

namespace image = libreyolo::image;
const std::string kDir = std::string(LIBREYOLO_TEST_FIXTURES) + "/images/exif/";

std::string fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

nlohmann::json expected() {
  std::ifstream f(kDir + "expected.json");
  return nlohmann::json::parse(f);
}

TEST(ImageExif, EveryOrientationAsPillowExifTranspose) {
  const auto files = expected().at("files");
  ASSERT_EQ(files.size(), 13u);
  for (const auto& [name, want] : files.items()) {
    const auto bytes = image::read_file_bytes(kDir + name);
    const int raw = want.at("orientation").get<int>();
    EXPECT_EQ(image::image_orientation(bytes.data(), bytes.size()), raw >= 1 && raw <= 8 ? raw : 1)
        << name;
    // The stored frame first: a decoder difference would show here, not as an orientation bug.
    image::DecodeOptions stored;
    stored.apply_orientation = false;
    const auto s = image::decode_rgb(bytes.data(), bytes.size(), stored);
    EXPECT_EQ(std::vector<int64_t>({s.width, s.height}),
              want.at("stored").get<std::vector<int64_t>>())
        << name;
    EXPECT_EQ(fnv1a64(s.rgb), want.at("stored_fnv1a64").get<std::string>()) << name;
    const auto d = image::decode_rgb(bytes.data(), bytes.size());
    EXPECT_EQ(std::vector<int64_t>({d.width, d.height}),
              want.at("displayed").get<std::vector<int64_t>>())
        << name;
    EXPECT_EQ(fnv1a64(d.rgb), want.at("displayed_fnv1a64").get<std::string>()) << name;
    ASSERT_GE(d.rgb.size(), 3u);
    EXPECT_EQ(std::vector<int>({d.rgb[0], d.rgb[1], d.rgb[2]}),
              want.at("displayed_top_left_rgb").get<std::vector<int>>())
        << name;
  }
}

TEST(ImageExif, TransposeMovesPixelsAsPil) {
  // 3 wide, 2 high; pixel value = 10 * row + column in every channel.
  image::RgbImage in;
  in.width = 3;
  in.height = 2;
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x) in.rgb.insert(in.rgb.end(), 3, static_cast<uint8_t>(10 * y + x));
  auto red = [](const image::RgbImage& im) {
    std::vector<int> v;
    for (std::size_t i = 0; i < im.rgb.size(); i += 3) v.push_back(im.rgb[i]);
    return v;
  };
  // PIL: ROTATE_270 (orientation 6) turns clockwise, ROTATE_90 (8) counter-clockwise.
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {1, {0, 1, 2, 10, 11, 12}}, {2, {2, 1, 0, 12, 11, 10}}, {3, {12, 11, 10, 2, 1, 0}},
      {4, {10, 11, 12, 0, 1, 2}}, {5, {0, 10, 1, 11, 2, 12}}, {6, {10, 0, 11, 1, 12, 2}},
      {7, {12, 2, 11, 1, 10, 0}}, {8, {2, 12, 1, 11, 0, 10}}, {9, {0, 1, 2, 10, 11, 12}}};
  for (const auto& [o, want] : cases) {
    const auto out = image::apply_orientation(in, o);
    EXPECT_EQ(red(out), want) << "orientation " << o;
    EXPECT_EQ(out.width, o >= 5 && o <= 8 ? 2 : 3) << o;
    EXPECT_EQ(out.height, o >= 5 && o <= 8 ? 3 : 2) << o;
  }
}

TEST(ImageExif, MalformedExifNeverFailsTheDecode) {
  // Every byte of the metadata of a phone-like file (APP1 with Make, Model, Orientation 6)
  // replaced in turn by 0x00 and 0xFF: the orientation read is 1-8 and never throws; whenever
  // the decode itself succeeds its size is the stored or the rotated one.
  const auto good = image::read_file_bytes(kDir + "orientation_6.jpg");
  ASSERT_GT(good.size(), 120u);
  int rotated = 0;
  for (std::size_t i = 2; i < 120; ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}}) {
      auto bytes = good;
      bytes[i] = v;
      int o = 0;
      ASSERT_NO_THROW(o = image::image_orientation(bytes.data(), bytes.size())) << i;
      EXPECT_TRUE(o >= 1 && o <= 8) << i << ": " << o;
      rotated += o == 6;
    }
  }
  EXPECT_GT(rotated, 0);
  // Cut anywhere: the APP1 segment (at 0x14, 0x54 bytes after its marker) is read only when it
  // is whole, i.e. from 0x6a bytes on.
  for (std::size_t n = 0; n < 0x80; ++n)
    EXPECT_EQ(image::image_orientation(good.data(), n), n >= 0x6a ? 6 : 1) << n;
  EXPECT_EQ(image::image_orientation(nullptr, 0), 1);
}

}  // namespace

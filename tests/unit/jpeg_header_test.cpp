// The host-side JPEG marker walk (kernels/image/jpeg_header.h) that decides the `nvjpeg`
// decoder's declines: every file of the committed JPEG set (tests/fixtures/images/jpeg_set,
// made by its make_jpeg_set.py) classified with its exact reason, frame sizes equal to
// libjpeg-turbo's header reader, coding processes and precisions patched into the frame marker,
// sampling factors patched to 4:1:1, a 30,000 x 30,000 header, every strict prefix of a file
// (truncation anywhere), stray bytes between segments, PNG and garbage.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/image/jpeg_header.h"
#include "models/image/decode.h"

namespace libreyolo::kernels::image {
namespace {

std::vector<uint8_t> read(const std::string& relative) {
  return libreyolo::image::read_file_bytes(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                           relative);
}

JpegHeader parse(const std::vector<uint8_t>& b) { return parse_jpeg_header(b.data(), b.size()); }

const char* reason(const std::vector<uint8_t>& b, int64_t max_pixels = 40'000'000,
                   bool s411 = false) {
  BaselineSupport s;
  s.max_pixels = max_pixels;
  s.s411_s410 = s411;
  return baseline_decline_reason(parse(b), s);
}

std::string text(const char* r) { return r ? r : "(decodable)"; }

/// The offset of the first `FF <marker>` (0 when absent).
size_t find_marker(const std::vector<uint8_t>& b, uint8_t marker) {
  for (size_t i = 2; i + 1 < b.size(); ++i)
    if (b[i] == 0xFF && b[i + 1] == marker) return i;
  return 0;
}

TEST(JpegHeader, CommittedSetIsClassifiedWithExactReasons) {
  struct Case {
    const char* file;
    ChromaSubsampling subsampling;
    JpegCoding coding;
    const char* reason;
  };
  using CS = ChromaSubsampling;
  using JC = JpegCoding;
  const Case cases[] = {
      {"q50_444_161x97.jpg", CS::s444, JC::baseline, nullptr},
      {"q90_444_161x97.jpg", CS::s444, JC::baseline, nullptr},
      {"q100_444_161x97.jpg", CS::s444, JC::baseline, nullptr},
      {"q50_422_161x97.jpg", CS::s422, JC::baseline, nullptr},
      {"q90_422_161x97.jpg", CS::s422, JC::baseline, nullptr},
      {"q100_422_161x97.jpg", CS::s422, JC::baseline, nullptr},
      {"q50_420_161x97.jpg", CS::s420, JC::baseline, nullptr},
      {"q90_420_161x97.jpg", CS::s420, JC::baseline, nullptr},
      {"q100_420_161x97.jpg", CS::s420, JC::baseline, nullptr},
      {"q90_444_48x32.jpg", CS::s444, JC::baseline, nullptr},
      {"q90_422_48x32.jpg", CS::s422, JC::baseline, nullptr},
      {"q90_420_48x32.jpg", CS::s420, JC::baseline, nullptr},
      {"q90_444_256x192.jpg", CS::s444, JC::baseline, nullptr},
      {"q90_422_256x192.jpg", CS::s422, JC::baseline, nullptr},
      {"q90_420_256x192.jpg", CS::s420, JC::baseline, nullptr},
      {"gray_q50_161x97.jpg", CS::gray, JC::baseline, nullptr},
      {"gray_q90_161x97.jpg", CS::gray, JC::baseline, nullptr},
      {"gray_q100_161x97.jpg", CS::gray, JC::baseline, nullptr},
      {"restart_q90_420_161x97.jpg", CS::s420, JC::baseline, nullptr},
      {"progressive_q90_420_161x97.jpg", CS::s420, JC::progressive, kDeclineProgressive},
      {"cmyk_q90_161x97.jpg", CS::unknown, JC::baseline, kDeclineCmyk},
      {"truncated_q90_420_161x97.jpg", CS::s420, JC::baseline, kDeclineTruncated},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const auto bytes = read(std::string("jpeg_set/") + c.file);
    const JpegHeader h = parse(bytes);
    EXPECT_TRUE(h.is_jpeg);
    EXPECT_EQ(h.subsampling, c.subsampling) << subsampling_name(h.subsampling);
    EXPECT_EQ(static_cast<int>(h.coding), static_cast<int>(c.coding));
    EXPECT_EQ(text(reason(bytes)), text(c.reason));
    // The frame size is the one libjpeg-turbo reads (names say W x H).
    const auto info = libreyolo::image::read_image_info(bytes.data(), bytes.size());
    EXPECT_EQ(h.width, info.width);
    EXPECT_EQ(h.height, info.height);
    EXPECT_EQ(std::string(c.file).find(std::to_string(h.width) + "x" + std::to_string(h.height)) !=
                  std::string::npos,
              true);
  }
}

TEST(JpegHeader, RestartMarkersAreSteppedOverInOneScan) {
  const JpegHeader h = parse(read("jpeg_set/restart_q90_420_161x97.jpg"));
  EXPECT_EQ(h.scans, 1);
  EXPECT_TRUE(h.interleaved);
  EXPECT_TRUE(h.eoi);
  EXPECT_EQ(h.problem, nullptr);
  EXPECT_GT(find_marker(read("jpeg_set/restart_q90_420_161x97.jpg"), 0xDD), 0u);  // a DRI
  const JpegHeader p = parse(read("jpeg_set/progressive_q90_420_161x97.jpg"));
  EXPECT_GT(p.scans, 1);  // spectral selection / successive approximation scans
  EXPECT_TRUE(p.eoi);
}

TEST(JpegHeader, FixturePhotographsAreCompleteAndSizedAsLibjpegReadsThem) {
  for (const char* f : {"astronaut.jpg", "chelsea.jpg", "coffee.jpg", "exif/orientation_6.jpg"}) {
    SCOPED_TRACE(f);
    const auto bytes = read(f);
    const JpegHeader h = parse(bytes);
    EXPECT_TRUE(h.eoi);
    EXPECT_EQ(h.problem, nullptr);
    const auto info = libreyolo::image::read_image_info(bytes.data(), bytes.size());
    EXPECT_EQ(h.width, info.width);
    EXPECT_EQ(h.height, info.height);
  }
}

TEST(JpegHeader, CodingProcessesAndPrecisionFromTheFrameMarker) {
  const auto base = read("jpeg_set/q90_420_161x97.jpg");
  const size_t sof = find_marker(base, 0xC0);
  ASSERT_GT(sof, 0u);
  const std::pair<uint8_t, const char*> patches[] = {
      {0xC1, nullptr},  // extended sequential, 8-bit: decodable
      {0xC2, kDeclineProgressive},
      {0xC3, kDeclineLossless},
      {0xC9, kDeclineArithmetic},
      {0xCA, kDeclineArithmetic},
      {0xCB, kDeclineArithmetic},
      {0xC5, kDeclineHierarchical},
      {0xC7, kDeclineHierarchical},
      {0xCD, kDeclineHierarchical},
      {0xCF, kDeclineHierarchical},
  };
  for (const auto& [marker, expected] : patches) {
    auto bytes = base;
    bytes[sof + 1] = marker;
    EXPECT_EQ(text(reason(bytes)), text(expected)) << std::hex << int(marker);
  }
  auto twelve = base;
  twelve[sof + 1] = 0xC1;
  twelve[sof + 4] = 12;  // P
  EXPECT_EQ(text(reason(twelve)), text(kDeclinePrecision));
}

TEST(JpegHeader, SubsamplingFromTheSamplingFactors) {
  auto bytes = read("jpeg_set/q90_420_161x97.jpg");
  const size_t sof = find_marker(bytes, 0xC0);
  ASSERT_GT(sof, 0u);
  // FF C0 len(2) P(1) Y(2) X(2) Nf(1), then per component: id, HV, Tq.
  const size_t y_hv = sof + 2 + 2 + 6 + 1;
  ASSERT_EQ(bytes[y_hv], 0x22);  // 4:2:0: Y 2x2
  const std::pair<uint8_t, ChromaSubsampling> factors[] = {
      {0x11, ChromaSubsampling::s444}, {0x21, ChromaSubsampling::s422},
      {0x12, ChromaSubsampling::s440}, {0x41, ChromaSubsampling::s411},
      {0x42, ChromaSubsampling::s410}, {0x31, ChromaSubsampling::other},
  };
  for (const auto& [hv, expected] : factors) {
    bytes[y_hv] = hv;
    EXPECT_EQ(parse(bytes).subsampling, expected) << std::hex << int(hv);
  }
  bytes[y_hv] = 0x41;
  EXPECT_EQ(text(reason(bytes)), text(kDeclineSubsampling));  // hardware backend: no 4:1:1
  EXPECT_EQ(reason(bytes, 40'000'000, /*s411=*/true), nullptr);
  bytes[y_hv] = 0x31;
  EXPECT_EQ(text(reason(bytes, 40'000'000, true)), text(kDeclineSubsampling));
  bytes[y_hv] = 0x51;  // factor 5: outside T.81's 1..4
  EXPECT_EQ(parse(bytes).problem, kProblemFrame);
  EXPECT_EQ(text(reason(bytes)), text(kDeclineCorrupt));
  bytes[y_hv] = 0x22;
  bytes[y_hv + 3] = 0x22;  // Cb 2x2 with Y 2x2
  EXPECT_EQ(parse(bytes).subsampling, ChromaSubsampling::other);
}

TEST(JpegHeader, HugeAndEmptyFrameSizesDecline) {
  auto bytes = read("jpeg_set/q90_420_161x97.jpg");
  const size_t sof = find_marker(bytes, 0xC0);
  bytes[sof + 5] = 30000 >> 8, bytes[sof + 6] = 30000 & 0xFF;  // height
  bytes[sof + 7] = 30000 >> 8, bytes[sof + 8] = 30000 & 0xFF;  // width
  const JpegHeader h = parse(bytes);
  EXPECT_EQ(h.width, 30000);
  EXPECT_EQ(h.height, 30000);
  EXPECT_EQ(text(reason(bytes)), text(kDeclineSize));
  EXPECT_EQ(reason(bytes, /*max_pixels=*/0), nullptr);  // no limit: the walk itself accepts it
  bytes[sof + 5] = bytes[sof + 6] = 0;                  // height 0 (a DNL-defined height)
  EXPECT_EQ(text(reason(bytes, 0)), text(kDeclineSize));
}

TEST(JpegHeader, EveryStrictPrefixDeclines) {
  for (const char* f : {"jpeg_set/q90_420_48x32.jpg", "jpeg_set/gray_q50_161x97.jpg"}) {
    const auto bytes = read(f);
    ASSERT_EQ(reason(bytes), nullptr) << f;
    for (size_t n = 0; n < bytes.size(); ++n) {
      const char* r = baseline_decline_reason(parse_jpeg_header(bytes.data(), n), {});
      ASSERT_NE(r, nullptr) << f << " cut at " << n;
      if (n >= 3)
        ASSERT_TRUE(r == kDeclineTruncated || r == kDeclineCorrupt) << f << " " << n << ": " << r;
    }
  }
}

TEST(JpegHeader, StrayBytesBetweenSegmentsAreCorrupt) {
  // libjpeg: "Corrupt JPEG data: 2 extraneous bytes before marker 0xda", an error for the
  // strict CPU path (tests/unit/image_decode_test.cpp RecoverableJpegWarningStrictVsLenient).
  auto bytes = read("jpeg_set/q90_444_48x32.jpg");
  const size_t sos = find_marker(bytes, 0xDA);
  ASSERT_GT(sos, 0u);
  bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(sos), {0x00, 0x00});
  EXPECT_EQ(parse(bytes).problem, kProblemCorrupt);
  EXPECT_EQ(text(reason(bytes)), text(kDeclineCorrupt));
}

TEST(JpegHeader, NotJpegInputs) {
  const auto png = read("exif/orientation_6.png");  // a PNG (the same holds renamed .jpg)
  EXPECT_EQ(text(reason(png)), text(kDeclineNotJpeg));
  EXPECT_EQ(text(reason({})), text(kDeclineNotJpeg));
  EXPECT_EQ(text(reason({0xFF, 0xD8})), text(kDeclineNotJpeg));
  EXPECT_EQ(text(reason({'G', 'I', 'F', '8', '9', 'a'})), text(kDeclineNotJpeg));
  EXPECT_EQ(parse_jpeg_header(nullptr, 10).is_jpeg, false);
  // SOI and then garbage: a JPEG whose structure is corrupt.
  std::vector<uint8_t> garbage = {0xFF, 0xD8, 0xFF};
  for (int i = 0; i < 100; ++i) garbage.push_back(static_cast<uint8_t>(i * 13));
  EXPECT_EQ(text(reason(garbage)), text(kDeclineCorrupt));
  // A tables-only datastream (the image_decode fuzz finding): no frame, no scan.
  const auto tables =
      libreyolo::image::read_file_bytes(std::string(LIBREYOLO_SOURCE_DIR) +
                                        "/tests/fuzz/corpus/image_decode/regress-tables-only.jpg");
  EXPECT_NE(reason(tables), nullptr);
  EXPECT_EQ(parse(tables).coding, JpegCoding::none);
}

TEST(JpegHeader, ColourTransformAndComponentCounts) {
  JpegHeader h;
  h.is_jpeg = true;
  h.eoi = true;
  h.coding = JpegCoding::baseline;
  h.precision = 8;
  h.width = 16;
  h.height = 16;
  h.components = 3;
  h.subsampling = ChromaSubsampling::s444;
  h.scans = 1;
  h.interleaved = true;
  h.id[0] = 'R', h.id[1] = 'G', h.id[2] = 'B';
  EXPECT_TRUE(rgb_components(h));  // no JFIF, no Adobe: libjpeg's 'R','G','B' rule
  EXPECT_EQ(text(baseline_decline_reason(h, {})), text(kDeclineRgb));
  h.jfif = true;
  EXPECT_FALSE(rgb_components(h));
  EXPECT_EQ(baseline_decline_reason(h, {}), nullptr);
  h.adobe = true;
  h.adobe_transform = 0;  // Adobe wins over JFIF
  EXPECT_EQ(text(baseline_decline_reason(h, {})), text(kDeclineRgb));
  h.adobe_transform = 1;
  EXPECT_EQ(baseline_decline_reason(h, {}), nullptr);
  h.scans = 3;  // non-interleaved: one scan per component
  h.interleaved = false;
  EXPECT_EQ(text(baseline_decline_reason(h, {})), text(kDeclineMultiScan));
  h.scans = 1;
  h.interleaved = true;
  h.components = 2;
  EXPECT_EQ(text(baseline_decline_reason(h, {})), text(kDeclineComponents));
  h.components = 4;
  EXPECT_EQ(text(baseline_decline_reason(h, {})), text(kDeclineCmyk));
}

}  // namespace
}  // namespace libreyolo::kernels::image

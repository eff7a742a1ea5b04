// The `nvjpeg` implementation of `image_decode` (kernels/image/cuda/nvjpeg_decode.cpp) on the
// GPU, through a registry binding as the server calls it (models/image/decode_slot.h):
//   - pixels against libjpeg-turbo (the reference) on the fixture photographs and the committed
//     JPEG set (tests/fixtures/images/jpeg_set: sizes 48x32 / 161x97 / 256x192, qualities
//     50 / 90 / 100, 4:4:4 / 4:2:2 / 4:2:0, grayscale, restart markers): max abs difference,
//     mean, and the share of differing values printed per file, with bounds (below);
//   - EXIF orientations 1-8 applied on the device as the CPU path applies them;
//   - declines with their exact reason strings (progressive, CMYK, truncated, PNG, a 30,000 x
//     30,000 header, garbage), each image then decoded (or refused with the CPU path's exact
//     ImageError text) by the reference;
//   - no device memory growth over repeated decodes of good and bad input, and the same pixels
//     from 8 threads at once.
// Skips without a GPU, in a build without CUDA, or when libnvjpeg cannot be opened (the
// provider's reason is printed).
//
// Bounds: nvJPEG and libjpeg-turbo implement the same standard with different arithmetic.
// Without chroma upsampling (grayscale, 4:4:4) they differ only by the IDCT's and the YCbCr ->
// RGB conversion's rounding (libjpeg's islow IDCT and 16-bit fixed-point colour tables): at most
// a few levels, so max <= 8 and mean <= 1. With 4:2:2 / 4:2:0 the chroma upsampling differs too
// (libjpeg-turbo's "fancy" triangle filter against nvJPEG's, whose filter is not documented):
// near sharp colour edges a value may differ by a good part of the chroma step, so the bound
// there is on the mean, <= 2 (torchvision's own test of its nvJPEG decode against libjpeg:
// test/test_image.py test_decode_jpeg_cuda, mean absolute difference < 2) and on the share of
// values off by more than 16 levels, <= 2 %.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/jpeg_header.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"
#include "models/image/processor.h"
#include "tests/gpu/nvjpeg_test_util.h"

namespace libreyolo::kernels {
namespace {

using nvjpeg_test::NvjpegSetup;

std::vector<uint8_t> read(const std::string& relative) {
  return nvjpeg_test::read_image_fixture(relative);
}

at::Tensor decode(const ImageDecodeHandle& h, const std::vector<uint8_t>& bytes) {
  return libreyolo::image::decode_image(h, bytes.data(), bytes.size(), {}, /*device_index=*/0);
}

at::Tensor reference(const std::vector<uint8_t>& bytes) {
  return libreyolo::image::decode_image(bytes.data(), bytes.size());
}

struct Diff {
  int max = 0;
  double mean = 0;
  double share_any = 0;   ///< values that differ at all
  double share_over = 0;  ///< values off by more than 16 levels
};

Diff diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = (a.cpu().to(at::kInt) - b.cpu().to(at::kInt)).abs();
  Diff r;
  r.max = d.max().item<int>();
  r.mean = d.to(at::kDouble).mean().item<double>();
  r.share_any = d.gt(0).to(at::kDouble).mean().item<double>();
  r.share_over = d.gt(16).to(at::kDouble).mean().item<double>();
  return r;
}

std::string name_of_subsampling(const std::vector<uint8_t>& bytes) {
  return image::subsampling_name(image::parse_jpeg_header(bytes.data(), bytes.size()).subsampling);
}

TEST(NvjpegDecode, PixelsAgainstLibjpegTurbo) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  const std::vector<std::string> files = {
      "astronaut.jpg",
      "chelsea.jpg",
      "coffee.jpg",
      "jpeg_set/q50_444_161x97.jpg",
      "jpeg_set/q90_444_161x97.jpg",
      "jpeg_set/q100_444_161x97.jpg",
      "jpeg_set/q50_422_161x97.jpg",
      "jpeg_set/q90_422_161x97.jpg",
      "jpeg_set/q100_422_161x97.jpg",
      "jpeg_set/q50_420_161x97.jpg",
      "jpeg_set/q90_420_161x97.jpg",
      "jpeg_set/q100_420_161x97.jpg",
      "jpeg_set/q90_444_48x32.jpg",
      "jpeg_set/q90_422_48x32.jpg",
      "jpeg_set/q90_420_48x32.jpg",
      "jpeg_set/q90_444_256x192.jpg",
      "jpeg_set/q90_422_256x192.jpg",
      "jpeg_set/q90_420_256x192.jpg",
      "jpeg_set/gray_q50_161x97.jpg",
      "jpeg_set/gray_q90_161x97.jpg",
      "jpeg_set/gray_q100_161x97.jpg",
      "jpeg_set/restart_q90_420_161x97.jpg",
  };
  std::uint64_t decoded = 0;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto bytes = read(f);
    const std::string sub = name_of_subsampling(bytes);
    const CandidateReport before = s.nvjpeg().value_or(CandidateReport{});
    const at::Tensor gpu = decode(s.handle, bytes);
    const CandidateReport after = s.nvjpeg().value_or(CandidateReport{});
    const bool by_nvjpeg = after.calls == before.calls + 1;
    std::string declined;  // the reason, when nvjpeg declined this file
    for (const auto& [why, n] : after.declined)
      if (n != (before.declined.count(why) ? before.declined.at(why) : 0)) declined = why;
    const at::Tensor cpu = reference(bytes);
    ASSERT_EQ(gpu.sizes(), cpu.sizes());
    ASSERT_EQ(gpu.scalar_type(), at::kByte);
    ASSERT_TRUE(gpu.is_contiguous());
    const Diff d = diff(gpu, cpu);
    std::printf(
        "nvjpeg vs libjpeg-turbo %-40s %-6s %s max %3d mean %.3f differing %5.2f%% >16: %.3f%%\n",
        f.c_str(), sub.c_str(), by_nvjpeg ? "nvjpeg   " : "reference", d.max, d.mean,
        100 * d.share_any, 100 * d.share_over);
    if (!by_nvjpeg) {
      // The reference decoded it, exactly. Expected for a progressive fixture photograph; in
      // the committed set only the hardware decoder's own refusal is acceptable.
      std::printf("    declined: %s\n", declined.c_str());
      EXPECT_FALSE(gpu.is_cuda());
      EXPECT_EQ(d.max, 0);
      if (f.rfind("jpeg_set/", 0) == 0)
        EXPECT_EQ(declined, "nvjpeg: not supported by the hardware decoder");
      continue;
    }
    ++decoded;
    EXPECT_TRUE(gpu.is_cuda());
    if (sub == "gray" || sub == "4:4:4") {
      EXPECT_LE(d.max, 8);
      EXPECT_LE(d.mean, 1.0);
    } else {
      EXPECT_LE(d.mean, 2.0);
      EXPECT_LE(d.share_over, 0.02);
    }
  }
  // The committed set is baseline JPEGs nvjpeg takes: most must have been compared.
  EXPECT_GE(decoded, files.size() / 2);
  std::printf("nvjpeg decoded %llu of %zu files\n", static_cast<unsigned long long>(decoded),
              files.size());
}

TEST(NvjpegDecode, ExifOrientationsAreAppliedOnTheDevice) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  for (int o = 1; o <= 8; ++o) {
    SCOPED_TRACE(o);
    const auto bytes = read("exif/orientation_" + std::to_string(o) + ".jpg");
    const at::Tensor gpu = decode(s.handle, bytes);
    const at::Tensor cpu = reference(bytes);
    ASSERT_TRUE(gpu.is_cuda());
    ASSERT_EQ(gpu.sizes(), cpu.sizes());
    // A wrong flip or transpose moves the whole (non-symmetric) pattern: mean differences of
    // tens of levels. A right one leaves the decoders' few levels.
    EXPECT_LE(diff(gpu, cpu).mean, 2.0);
  }
}

TEST(NvjpegDecode, DeclinesAreCountedWithTheirReasonsAndTheReferenceAnswers) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  auto huge = read("jpeg_set/q90_420_161x97.jpg");
  for (size_t i = 2; i + 8 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0) {
      huge[i + 5] = 30000 >> 8, huge[i + 6] = 30000 & 0xFF;
      huge[i + 7] = 30000 >> 8, huge[i + 8] = 30000 & 0xFF;
      break;
    }
  const std::vector<uint8_t> garbage = {'G', 'I', 'F', '8', '9', 'a', 0, 1, 2, 3};
  struct Case {
    std::vector<uint8_t> bytes;
    const char* reason;
    std::string error;  ///< the reference's ImageError ("" : decodes)
  };
  const std::vector<Case> cases = {
      {read("jpeg_set/progressive_q90_420_161x97.jpg"), image::kDeclineProgressive, ""},
      {read("jpeg_set/cmyk_q90_161x97.jpg"), image::kDeclineCmyk, ""},
      {read("jpeg_set/truncated_q90_420_161x97.jpg"), image::kDeclineTruncated,
       "truncated JPEG: Premature end of JPEG file"},
      {read("exif/orientation_6.png"), image::kDeclineNotJpeg, ""},
      {huge, image::kDeclineSize,
       "JPEG image is 30000x30000 = 900000000 pixels, above the limit of 40000000 pixels"},
      {garbage, image::kDeclineNotJpeg, "unknown image format (not JPEG or PNG; 10 bytes)"},
  };
  std::map<std::string, std::uint64_t> expected;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.reason);
    ++expected[c.reason];
    std::string error;
    at::Tensor px;
    try {
      px = decode(s.handle, c.bytes);
    } catch (const libreyolo::image::ImageError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, c.error);
    if (c.error.empty()) {
      ASSERT_TRUE(px.defined());
      EXPECT_FALSE(px.is_cuda());  // the reference's
      EXPECT_TRUE(at::equal(px, reference(c.bytes)));
    }
    EXPECT_EQ(s.nvjpeg().value_or(CandidateReport{}).declined, expected);
  }
  EXPECT_FALSE(s.nvjpeg().value_or(CandidateReport{}).disabled);
  EXPECT_EQ(s.nvjpeg().value_or(CandidateReport{}).calls, 0u);
  EXPECT_TRUE(s.reg.events().empty());
}

TEST(NvjpegDecode, NoDeviceMemoryGrowthOverRepeatedDecodes) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  std::vector<std::vector<uint8_t>> inputs;
  for (const char* f :
       {"chelsea.jpg", "jpeg_set/q90_420_256x192.jpg", "jpeg_set/q100_444_161x97.jpg",
        "jpeg_set/gray_q90_161x97.jpg", "jpeg_set/truncated_q90_420_161x97.jpg",
        "jpeg_set/progressive_q90_420_161x97.jpg"})
    inputs.push_back(read(f));
  auto round = [&] {
    for (const auto& b : inputs) {
      try {
        decode(s.handle, b);
      } catch (const libreyolo::image::ImageError&) {
      }
    }
    at::cuda::getCurrentCUDAStream().synchronize();
  };
  nvjpeg_test::expect_no_device_memory_growth(round, 30, "nvjpeg");
}

TEST(NvjpegDecode, ConcurrentCallersGetTheSamePixels) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  std::vector<std::vector<uint8_t>> inputs;
  for (const char* f : {"jpeg_set/q90_420_161x97.jpg", "jpeg_set/q90_422_256x192.jpg",
                        "jpeg_set/q100_444_161x97.jpg", "jpeg_set/gray_q50_161x97.jpg"})
    inputs.push_back(read(f));
  std::vector<at::Tensor> expected;
  for (const auto& b : inputs) expected.push_back(decode(s.handle, b).cpu());
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const size_t k = static_cast<size_t>(t + i) % inputs.size();
        if (!at::equal(decode(s.handle, inputs[k]).cpu(), expected[k])) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_FALSE(s.nvjpeg().value_or(CandidateReport{}).disabled);
}

TEST(NvjpegDecode, GpuPreprocessingMatchesTheCpuPathWithinTheDecodersDifference) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  // RTDetrImageProcessor's defaults (640x640 bilinear, rescale only), as the server runs it
  // with server.gpu_image_decode: the resize on the device (float32 then round) against the
  // CPU path (native uint8). Both differ from each other by the decoders' difference plus one
  // rounding level of the resize.
  libreyolo::image::ProcessorConfig cfg = libreyolo::image::ProcessorConfig::from_json(
      R"({"image_processor_type": "RTDetrImageProcessor"})", "test");
  libreyolo::image::ImageProcessor proc(cfg);
  const auto bytes = read("jpeg_set/q90_444_256x192.jpg");
  const at::Tensor gpu_img = decode(s.handle, bytes);
  ASSERT_TRUE(gpu_img.is_cuda());
  const auto gpu = proc.preprocess({gpu_img});
  const auto cpu = proc.preprocess({reference(bytes)});
  ASSERT_TRUE(gpu.pixel_values.is_cuda());
  ASSERT_EQ(gpu.pixel_values.sizes(), cpu.pixel_values.sizes());
  const double max = (gpu.pixel_values.cpu() - cpu.pixel_values).abs().max().item<double>();
  std::printf("nvjpeg + GPU resize vs libjpeg-turbo + CPU resize: max %.4f (x255 = %.1f levels)\n",
              max, max * 255);
  EXPECT_LE(max * 255, 8 + 1 + 1e-3);  // 4:4:4 decoders' max (8) + one resize rounding level
}

}  // namespace
}  // namespace libreyolo::kernels

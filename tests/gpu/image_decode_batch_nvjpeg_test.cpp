// The `nvjpeg` implementation of `image_decode_batch` (kernels/image/cuda/nvjpeg_decode.cpp:
// one nvjpegDecodeBatched call on the hardware backend) through image::decode_images
// (models/image/decode_slot.h), as the server decodes a request's images:
//   - the batch's pixels equal the single-image nvjpeg decode of the same files byte for byte
//     (the same decoder and output format: any difference is a wrong destination or size);
//   - EXIF orientations applied per image as the single-image decode applies them;
//   - a batch mixing good JPEGs with a progressive JPEG, a PNG and a truncated JPEG: the good ones
//     from nvJPEG, the others declined with their reasons (counted on image_decode's binding)
//     and answered by the reference: pixels, or the CPU path's exact ImageError text;
//   - no device memory growth over 100 repeated batches.
// Skips without a GPU, in a build without CUDA, when libnvjpeg cannot be opened, or when the
// GPU has no hardware JPEG decoder (the batch variant declines the hybrid backend).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/jpeg_header.h"
#include "kernels/registry.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"
#include "models/image/processor.h"
#include "tests/gpu/nvjpeg_test_util.h"

namespace libreyolo::kernels {
namespace {

using nvjpeg_test::NvjpegSetup;
using nvjpeg_test::read_image_fixture;

std::vector<EncodedImage> encoded(const std::vector<std::vector<uint8_t>>& files) {
  std::vector<EncodedImage> out;
  for (const auto& f : files) out.push_back({f.data(), f.size()});
  return out;
}

std::vector<DecodedImage> decode_batch(const NvjpegSetup& s,
                                       const std::vector<std::vector<uint8_t>>& files) {
  return libreyolo::image::decode_images(s.batch, s.handle, encoded(files), {}, /*device=*/0);
}

/// The batch variant declines the whole call without the hardware backend: skip then (the
/// single-image tests cover the hybrid backend).
bool batch_declines_everything(const NvjpegSetup& s) {
  const auto c = s.nvjpeg("image_decode_batch");
  return c && c->calls == 0 &&
         c->declined.count("nvjpeg: batched decode without the hardware backend");
}

/// The CPU path's ImageError text for `bytes` ("" when it decodes).
std::string cpu_error(const std::vector<uint8_t>& bytes) {
  try {
    libreyolo::image::decode_image(bytes.data(), bytes.size());
  } catch (const libreyolo::image::ImageError& e) {
    return e.what();
  }
  return "";
}

TEST(NvjpegDecodeBatch, EqualsTheSingleImageDecodeByteForByte) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  const std::vector<std::string> names = {
      "jpeg_set/q50_420_161x97.jpg",
      "jpeg_set/q90_420_161x97.jpg",
      "jpeg_set/q100_420_161x97.jpg",
      "jpeg_set/q90_422_161x97.jpg",
      "jpeg_set/q90_444_161x97.jpg",
      "jpeg_set/q90_420_48x32.jpg",
      "jpeg_set/q90_420_256x192.jpg",
      "jpeg_set/q90_422_256x192.jpg",
      "jpeg_set/q90_444_256x192.jpg",
      "jpeg_set/gray_q90_161x97.jpg",
      "jpeg_set/restart_q90_420_161x97.jpg",
      "astronaut.jpg",
      "chelsea.jpg",
      "coffee.jpg",
  };
  std::vector<std::vector<uint8_t>> files;
  for (const auto& n : names) files.push_back(read_image_fixture(n));
  const auto batch = decode_batch(s, files);
  if (batch_declines_everything(s)) GTEST_SKIP() << "no hardware JPEG decoder on this GPU";
  ASSERT_EQ(batch.size(), files.size());
  EXPECT_EQ(s.nvjpeg("image_decode_batch").value().calls, 1u);
  int on_device = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(batch[i].error.empty()) << batch[i].error;
    const at::Tensor single =
        libreyolo::image::decode_image(s.handle, files[i].data(), files[i].size(), {}, 0);
    ASSERT_TRUE(batch[i].pixels.defined());
    EXPECT_EQ(batch[i].pixels.is_cuda(), single.is_cuda());
    EXPECT_TRUE(batch[i].pixels.is_contiguous());
    ASSERT_EQ(batch[i].pixels.sizes(), single.sizes());
    EXPECT_TRUE(at::equal(batch[i].pixels.cpu(), single.cpu()));
    on_device += batch[i].pixels.is_cuda();
  }
  std::printf("nvjpeg batch: %d of %zu images decoded on the device in one call\n", on_device,
              files.size());
  // Every file is a baseline JPEG the H200's hardware decoder took one at a time (the GPU
  // suite of 2026-12-04: 22 of 22): the batch takes them all.
  EXPECT_EQ(on_device, static_cast<int>(files.size()));
}

TEST(NvjpegDecodeBatch, AppliesEachImagesExifOrientation) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  std::vector<std::vector<uint8_t>> files;
  for (int o = 1; o <= 8; ++o)
    files.push_back(read_image_fixture("exif/orientation_" + std::to_string(o) + ".jpg"));
  const auto batch = decode_batch(s, files);
  if (batch_declines_everything(s)) GTEST_SKIP() << "no hardware JPEG decoder on this GPU";
  for (int o = 1; o <= 8; ++o) {
    SCOPED_TRACE(o);
    const auto& bytes = files[o - 1];
    const at::Tensor single =
        libreyolo::image::decode_image(s.handle, bytes.data(), bytes.size(), {}, 0);
    ASSERT_TRUE(batch[o - 1].pixels.is_cuda());
    ASSERT_EQ(batch[o - 1].pixels.sizes(), single.sizes());
    EXPECT_TRUE(at::equal(batch[o - 1].pixels.cpu(), single.cpu()));
  }
}

TEST(NvjpegDecodeBatch, MixedBatchDecodesTheGoodOnesAndTheReferenceAnswersTheOthers) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  const std::vector<std::string> names = {
      "jpeg_set/q90_420_161x97.jpg",  "jpeg_set/progressive_q90_420_161x97.jpg",
      "exif/orientation_6.png",       "jpeg_set/truncated_q90_420_161x97.jpg",
      "jpeg_set/q90_444_256x192.jpg",
  };
  std::vector<std::vector<uint8_t>> files;
  for (const auto& n : names) files.push_back(read_image_fixture(n));
  const auto batch = decode_batch(s, files);
  if (batch_declines_everything(s)) GTEST_SKIP() << "no hardware JPEG decoder on this GPU";
  ASSERT_EQ(batch.size(), files.size());
  // The bindings' counters as the batch call left them (the single-image decodes below are
  // image_decode calls of their own).
  const CandidateReport b = s.nvjpeg("image_decode_batch").value();
  const CandidateReport one = s.nvjpeg("image_decode").value();
  for (std::size_t i : {std::size_t{0}, std::size_t{4}}) {  // nvJPEG's, as one at a time
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(batch[i].pixels.defined());
    EXPECT_TRUE(batch[i].pixels.is_cuda());
    const at::Tensor single =
        libreyolo::image::decode_image(s.handle, files[i].data(), files[i].size(), {}, 0);
    EXPECT_TRUE(at::equal(batch[i].pixels.cpu(), single.cpu()));
  }
  for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {  // the reference's pixels, exactly
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(batch[i].error.empty()) << batch[i].error;
    ASSERT_TRUE(batch[i].pixels.defined());
    EXPECT_FALSE(batch[i].pixels.is_cuda());
    EXPECT_TRUE(at::equal(batch[i].pixels,
                          libreyolo::image::decode_image(files[i].data(), files[i].size())));
  }
  EXPECT_FALSE(batch[3].pixels.defined());
  EXPECT_EQ(batch[3].error, "truncated JPEG: Premature end of JPEG file");
  EXPECT_EQ(batch[3].error, cpu_error(files[3]));
  // One batch call; each declined image counted once, on image_decode's binding, with its
  // reason; nothing disabled.
  EXPECT_EQ(b.calls, 1u);
  EXPECT_TRUE(b.declined.empty());
  const std::map<std::string, std::uint64_t> expected = {
      {image::kDeclineProgressive, 1}, {image::kDeclineNotJpeg, 1}, {image::kDeclineTruncated, 1}};
  EXPECT_EQ(one.declined, expected);
  EXPECT_EQ(one.calls, 0u);
  EXPECT_FALSE(b.disabled);
  EXPECT_FALSE(one.disabled);
  EXPECT_TRUE(s.reg.events().empty());
}

TEST(NvjpegDecodeBatch, NoDeviceMemoryGrowthOver100Batches) {
  NvjpegSetup s;
  REQUIRE_NVJPEG(s);
  std::vector<std::vector<uint8_t>> files;
  for (const char* f : {"jpeg_set/q90_420_256x192.jpg", "jpeg_set/q100_444_161x97.jpg",
                        "jpeg_set/gray_q90_161x97.jpg", "jpeg_set/truncated_q90_420_161x97.jpg",
                        "jpeg_set/progressive_q90_420_161x97.jpg", "jpeg_set/q50_422_161x97.jpg"})
    files.push_back(read_image_fixture(f));
  // Batches of two sizes in turn (the state pool prefers a state initialised for the size).
  const std::vector<std::vector<uint8_t>> pair = {files[0], files[1]};
  auto round = [&] {
    decode_batch(s, files);
    decode_batch(s, pair);
    at::cuda::getCurrentCUDAStream().synchronize();
  };
  round();
  if (batch_declines_everything(s)) GTEST_SKIP() << "no hardware JPEG decoder on this GPU";
  nvjpeg_test::expect_no_device_memory_growth(round, 100, "nvjpeg batch");
  EXPECT_EQ(s.nvjpeg("image_decode_batch").value().calls, 2u * 103);  // 103 rounds
  EXPECT_FALSE(s.nvjpeg("image_decode_batch").value().disabled);
}

}  // namespace
}  // namespace libreyolo::kernels

// The `image_decode` slot without a GPU (kernels/image/image_decode.h, models/image/decode_slot.h):
// the process registry resolves it to the libjpeg-turbo/libpng reference and lists the nvjpeg
// provider as unavailable with its reason (or disabled by LIBREYOLO_KERNELS=off); through the
// entry point, bad input gets exactly the CPU path's ImageError texts and never disables the
// reference; an accelerated implementation that declines (here a stand-in that declines what
// the real nvjpeg's header check declines) sends the image to the reference, counted per
// reason in the binding and process-wide, with the reference's pixels.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/jpeg_header.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"
#include "models/image/processor.h"

namespace libreyolo::kernels {
namespace {

std::vector<uint8_t> read(const std::string& relative) {
  return libreyolo::image::read_file_bytes(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                           relative);
}

/// The ImageError text of decoding `bytes` through `handle` ("" when it decodes).
std::string error_of(const ImageDecodeHandle& handle, const std::vector<uint8_t>& bytes,
                     const libreyolo::image::DecodeOptions& o = {}) {
  try {
    libreyolo::image::decode_image(handle, bytes.data(), bytes.size(), o, -1);
  } catch (const libreyolo::image::ImageError& e) {
    return e.what();
  }
  return "";
}

/// The CPU path's text (processor.h decode_image, no slot).
std::string cpu_error_of(const std::vector<uint8_t>& bytes,
                         const libreyolo::image::DecodeOptions& o = {}) {
  try {
    libreyolo::image::decode_image(bytes.data(), bytes.size(), o);
  } catch (const libreyolo::image::ImageError& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> with_frame_size(std::vector<uint8_t> bytes, int w, int h) {
  for (size_t i = 2; i + 8 < bytes.size(); ++i) {
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
      bytes[i + 5] = static_cast<uint8_t>(h >> 8), bytes[i + 6] = static_cast<uint8_t>(h);
      bytes[i + 7] = static_cast<uint8_t>(w >> 8), bytes[i + 8] = static_cast<uint8_t>(w);
      return bytes;
    }
  }
  ADD_FAILURE() << "no SOF0";
  return bytes;
}

const CandidateReport* candidate(const std::vector<BindingReport>& reports,
                                 const std::string& model, const std::string& impl) {
  for (const auto& b : reports)
    if (b.model == model && b.slot == kImageDecode.name)
      for (const auto& c : b.candidates)
        if (c.name == impl) return &c;
  return nullptr;
}

TEST(ImageDecodeSlot, ProcessRegistryResolvesToTheReferenceWithoutAGpu) {
  auto& reg = Registry::process_default();
  reg.resolve();
  const auto active = reg.active();
  ASSERT_EQ(active.count("image_decode"), 1u);
  if (at::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present (tests/gpu covers it)";
  EXPECT_EQ(active.at("image_decode"), kReference);
  bool listed = false;
  for (const auto& p : reg.providers()) {
    if (p.name != "nvjpeg") continue;
    listed = true;
    EXPECT_EQ(p.state, "unavailable");
    EXPECT_EQ(p.detail, "no usable CUDA device");
  }
  EXPECT_EQ(listed, built_with_cuda()) << "the nvjpeg provider exists in CUDA builds only";
}

TEST(ImageDecodeSlot, KernelsOffDisablesTheNvjpegProvider) {
  auto provider = make_nvjpeg_provider();
  if (!provider) GTEST_SKIP() << "built without CUDA: no nvjpeg provider";
  Registry reg;
  register_builtin_slots(reg);
  libreyolo::image::register_image_decode_reference(reg);
  reg.add_provider(provider);
  Filter off;
  off.mode = Filter::Mode::reference_only;  // LIBREYOLO_KERNELS=off
  reg.set_filter(off);
  reg.resolve();
  ASSERT_EQ(reg.providers().size(), 1u);
  EXPECT_EQ(reg.providers()[0].state, "disabled by policy");
  EXPECT_EQ(reg.resolve("image_decode"), std::optional<std::string>(kReference));
  EXPECT_EQ(reg.known_names().count("nvjpeg"), 1u);  // LIBREYOLO_KERNELS=nvjpeg is a known name
}

TEST(ImageDecodeSlot, BadInputGetsTheCpuPathsExactErrorsAndNeverDisablesTheReference) {
  Registry reg;
  register_builtin_slots(reg);
  libreyolo::image::register_image_decode_reference(reg);
  BindContext ctx;
  ctx.model = "m";
  const auto handle = reg.bind(kImageDecode, ctx);
  ASSERT_FALSE(handle.empty());
  const auto good = read("jpeg_set/q90_420_161x97.jpg");
  const auto truncated = read("jpeg_set/truncated_q90_420_161x97.jpg");
  const auto huge = with_frame_size(good, 30000, 30000);
  std::vector<uint8_t> garbage = {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'};
  const std::vector<std::pair<std::vector<uint8_t>, std::string>> cases = {
      {truncated, "truncated JPEG: Premature end of JPEG file"},
      {huge, "JPEG image is 30000x30000 = 900000000 pixels, above the limit of 40000000 pixels"},
      {garbage, "unknown image format (not JPEG or PNG; 12 bytes)"},
      {{}, "image data is empty (0 bytes)"},
  };
  for (int round = 0; round < 2; ++round) {
    for (const auto& [bytes, expected] : cases) {
      EXPECT_EQ(error_of(handle, bytes), expected);
      EXPECT_EQ(cpu_error_of(bytes), expected);
    }
  }
  // A PNG named .jpg is a PNG: sniffed by its bytes, decoded.
  const auto png = read("exif/orientation_6.png");
  EXPECT_EQ(error_of(handle, png), "");
  const auto* ref = candidate(reg.bindings(), "m", kReference);
  ASSERT_NE(ref, nullptr);
  EXPECT_FALSE(ref->disabled);
  EXPECT_TRUE(reg.events().empty());
  // The reference is still the handle's: a good image decodes through it.
  const at::Tensor px =
      libreyolo::image::decode_image(handle, good.data(), good.size(), {}, /*device_index=*/-1);
  EXPECT_TRUE(at::equal(px, libreyolo::image::decode_image(good.data(), good.size())));
  // 2 rounds of 4 bad inputs (errors are results, not failures), the PNG, the good JPEG.
  EXPECT_EQ(candidate(reg.bindings(), "m", kReference)->calls, 2 * 4u + 1 + 1);
}

TEST(ImageDecodeSlot, OrientationIsAppliedOnTheSlotPathAsOnTheCpuPath) {
  Registry reg;
  register_builtin_slots(reg);
  libreyolo::image::register_image_decode_reference(reg);
  const auto handle = reg.bind(kImageDecode, BindContext{});
  for (int o = 1; o <= 8; ++o) {
    const auto bytes = read("exif/orientation_" + std::to_string(o) + ".jpg");
    const at::Tensor slot =
        libreyolo::image::decode_image(handle, bytes.data(), bytes.size(), {}, -1);
    const at::Tensor cpu = libreyolo::image::decode_image(bytes.data(), bytes.size());
    EXPECT_TRUE(at::equal(slot, cpu)) << "orientation " << o;
    EXPECT_EQ(slot.size(1), o >= 5 ? 37 : 23) << "orientation " << o;
  }
}

/// A stand-in for `nvjpeg` on a CPU machine: declines exactly what the real one's header check
/// declines (kernels/image/jpeg_header.h) and "decodes" the rest with the reference, tagged.
Outcome<DecodedImage> header_checked(const EncodedImage& in, const ImageDecodeOptions& o) {
  image::BaselineSupport support;
  support.max_pixels = o.max_pixels;
  if (const char* why =
          image::baseline_decline_reason(image::parse_jpeg_header(in.data, in.size), support))
    return Decline{why};
  libreyolo::image::DecodeOptions d;
  d.max_pixels = o.max_pixels;
  d.apply_orientation = false;
  DecodedImage out;
  out.pixels = libreyolo::image::to_chw_tensor(libreyolo::image::apply_orientation(
      libreyolo::image::decode_rgb(in.data, in.size, d), o.orientation));
  return out;
}

TEST(ImageDecodeSlot, DeclinesFallBackToTheReferenceCountedPerReason) {
  Registry reg;
  register_builtin_slots(reg);
  libreyolo::image::register_image_decode_reference(reg);
  reg.register_impl(kImageDecode, "nvjpeg", ImageDecodeImpl(&header_checked));
  BindContext ctx;
  ctx.model = "m";
  const auto handle = reg.bind(kImageDecode, ctx);
  const std::map<std::string, const char*> inputs = {
      {"jpeg_set/q90_420_161x97.jpg", nullptr},
      {"jpeg_set/progressive_q90_420_161x97.jpg", image::kDeclineProgressive},
      {"jpeg_set/cmyk_q90_161x97.jpg", image::kDeclineCmyk},
      {"jpeg_set/truncated_q90_420_161x97.jpg", image::kDeclineTruncated},
      {"exif/orientation_6.png", image::kDeclineNotJpeg},
  };
  for (const auto& [file, why] : inputs) {
    const auto bytes = read(file);
    const std::string cpu = cpu_error_of(bytes);
    EXPECT_EQ(error_of(handle, bytes), cpu) << file;
    if (cpu.empty()) {
      const at::Tensor a =
          libreyolo::image::decode_image(handle, bytes.data(), bytes.size(), {}, -1);
      EXPECT_TRUE(at::equal(a, libreyolo::image::decode_image(bytes.data(), bytes.size()))) << file;
    }
  }
  const auto huge = with_frame_size(read("jpeg_set/q90_420_161x97.jpg"), 30000, 30000);
  EXPECT_EQ(error_of(handle, huge), cpu_error_of(huge));
  const auto bindings = reg.bindings();
  const auto* nv = candidate(bindings, "m", "nvjpeg");
  ASSERT_NE(nv, nullptr);
  EXPECT_EQ(nv->calls, 2u);  // the baseline file, twice (error_of, then decode_image)
  const std::map<std::string, std::uint64_t> expected = {
      {image::kDeclineProgressive, 2}, {image::kDeclineCmyk, 2}, {image::kDeclineTruncated, 1},
      {image::kDeclineNotJpeg, 2},     {image::kDeclineSize, 1},
  };
  EXPECT_EQ(nv->declined, expected);
  // Process-wide counters (what /metrics' libreyolo_kernel_declined_total reads) agree.
  for (const auto& s : reg.report()) {
    if (s.slot != "image_decode") continue;
    for (const auto& c : s.candidates)
      if (c.name == "nvjpeg") EXPECT_EQ(c.declined, expected);
  }
  EXPECT_FALSE(nv->disabled);
}

/// A stand-in for `nvjpeg`'s batch variant: header_checked on each image, what it would decline
/// left empty (for image_decode), counted per call.
int batch_calls = 0;
Outcome<std::vector<DecodedImage>> header_checked_batch(const std::vector<EncodedImage>& in,
                                                        const std::vector<int>& orientations,
                                                        const ImageDecodeOptions& o) {
  ++batch_calls;
  std::vector<DecodedImage> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    ImageDecodeOptions one = o;
    one.orientation = orientations.at(i);
    if (auto r = header_checked(in[i], one); std::holds_alternative<DecodedImage>(r))
      out[i] = std::get<DecodedImage>(std::move(r));
  }
  return out;
}

Outcome<std::vector<DecodedImage>> declines_every_batch(const std::vector<EncodedImage>&,
                                                        const std::vector<int>&,
                                                        const ImageDecodeOptions&) {
  return Decline{"test: batch declined"};
}

TEST(ImageDecodeSlot, BatchEntryPointSendsWhatTheBatchLeavesThroughImageDecode) {
  // What the server's request of several images runs (server/core/infer_pipeline.cpp): one
  // image_decode_batch call, then image_decode for each image it left; each image answers as
  // decode_image answers it alone (pixels, or the CPU path's exact text in `error`).
  const std::vector<std::string> names = {
      "jpeg_set/q90_420_161x97.jpg", "jpeg_set/progressive_q90_420_161x97.jpg",
      "exif/orientation_6.png",      "jpeg_set/truncated_q90_420_161x97.jpg",
      "exif/orientation_6.jpg",
  };
  std::vector<std::vector<uint8_t>> files;
  std::vector<EncodedImage> encoded;
  for (const auto& n : names) files.push_back(read(n));
  for (const auto& f : files) encoded.push_back({f.data(), f.size()});
  for (const char* variant : {"takes", "declines", "unbound"}) {
    SCOPED_TRACE(variant);
    Registry reg;
    register_builtin_slots(reg);
    libreyolo::image::register_image_decode_reference(reg);
    reg.register_impl(kImageDecode, "nvjpeg", ImageDecodeImpl(&header_checked));
    if (std::string(variant) == "takes")
      reg.register_impl(kImageDecodeBatch, "nvjpeg", ImageDecodeBatchImpl(&header_checked_batch));
    if (std::string(variant) == "declines")
      reg.register_impl(kImageDecodeBatch, "nvjpeg", ImageDecodeBatchImpl(&declines_every_batch));
    BindContext ctx;
    ctx.model = "m";
    const auto single = reg.bind(kImageDecode, ctx);
    const auto batch = reg.bind(kImageDecodeBatch, ctx);
    EXPECT_EQ(batch.empty(), std::string(variant) == "unbound");
    batch_calls = 0;
    const auto out = libreyolo::image::decode_images(batch, single, encoded, {}, -1);
    ASSERT_EQ(out.size(), files.size());
    for (std::size_t i = 0; i < files.size(); ++i) {
      SCOPED_TRACE(names[i]);
      EXPECT_EQ(out[i].error, cpu_error_of(files[i]));
      if (out[i].error.empty())
        EXPECT_TRUE(at::equal(out[i].pixels,
                              libreyolo::image::decode_image(files[i].data(), files[i].size())));
      else
        EXPECT_FALSE(out[i].pixels.defined());
    }
    EXPECT_EQ(out[3].error, "truncated JPEG: Premature end of JPEG file");
    // The batch took the two baseline JPEGs (EXIF orientation 6 applied); image_decode counted
    // the three others' declines, once each. A declined or unbound batch: image_decode took all.
    const bool takes = std::string(variant) == "takes";
    EXPECT_EQ(batch_calls, takes ? 1 : 0);
    const auto bindings = reg.bindings();
    const auto* nv = candidate(bindings, "m", "nvjpeg");
    ASSERT_NE(nv, nullptr);
    EXPECT_EQ(nv->calls, takes ? 0u : 2u);
    const std::map<std::string, std::uint64_t> expected = {{image::kDeclineProgressive, 1},
                                                           {image::kDeclineNotJpeg, 1},
                                                           {image::kDeclineTruncated, 1}};
    EXPECT_EQ(nv->declined, expected);
    for (const auto& b : bindings) {
      if (b.slot != kImageDecodeBatch.name || b.candidates.empty()) continue;
      EXPECT_EQ(b.candidates[0].calls, takes ? 1u : 0u);
      if (!takes)
        EXPECT_EQ(b.candidates[0].declined,
                  (std::map<std::string, std::uint64_t>{{"test: batch declined", 1}}));
    }
  }
}

}  // namespace
}  // namespace libreyolo::kernels

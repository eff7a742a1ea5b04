// Swin (swin_tiny fixture, transformers 5.17 SwinForImageClassification: 224 px, window 7,
// shifted windows, two patch merges) against the stored reference logits: `logits` (SDPA) and
// `logits_eager`, with both of our attention paths; plus the window helpers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <iostream>
#include <memory>

#include "models/model.h"
#include "models/registry/family.h"
#include "models/swin/windows.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

/// The family's registered Family::fused_attention_default.
bool fused_default() {
  return models::FamilyRegistry::builtin().find("swin")->fused_attention_default;
}

TEST(SwinParity, LogitsMatchTransformersWithBothAttentionPaths) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("swin_tiny");
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "swin");
  EXPECT_EQ(model->id2label().size(), 5u);
  const auto pixels = test::normalized_pixels(dir);
  const auto sdpa_ref = test::expected_tensor(dir, "logits");
  const auto eager_ref = test::expected_tensor(dir, "logits_eager");
  test::expect_logits_match_both_paths(*model, pixels, sdpa_ref, eager_ref, "swin_tiny");
}

TEST(SwinParity, OddSizeMatchesTransformers) {
  // 107x123 random pixels -> patch padding to 108x124, 27x31 map padded to the window, odd patch
  // merging (27x31 -> 14x16 -> 7x8), last stage at min(h, w) == window: no shift.
  test::expect_extra_expected_match("swin_tiny", {2, 3, 107, 123}, "swin_tiny 107x123");
}

TEST(SwinParity, SetFusedAttentionCountsChangedModules) {
  // depths [1, 2, 1]: four window-attention modules.
  test::expect_fused_attention_toggles("swin_tiny", fused_default(), 4);
}

TEST(SwinParity, SmallMapsRunBothPaths) {
  // 64x64 pixels: the last stage's map (4x4) is smaller than the window (7): window 4, no shift,
  // bias read from the 7-window table at the 4-window offsets. transformers 5.17 fails here (shape
  // error), so there is no reference: both attention paths must agree and batching must not
  // change the result.
  c10::InferenceMode inference_mode;
  auto model = models::load_model(test::model_fixture("swin_tiny"));
  for (auto size : {std::array<int64_t, 2>{64, 64}, std::array<int64_t, 2>{50, 37}}) {
    const auto x = at::rand({2, 3, size[0], size[1]});
    model->set_fused_attention(false);
    const auto manual = model->forward(x).logits;
    model->set_fused_attention(true);
    const auto fused = model->forward(x).logits;
    ASSERT_EQ(manual.sizes(), (at::IntArrayRef{2, 5}));
    EXPECT_TRUE(manual.isfinite().all().item<bool>());
    const double d = test::max_abs_diff(manual, fused);
    std::cout << "[swin_tiny " << size[0] << "x" << size[1] << "] max|manual - sdpa| = " << d
              << "\n";
    EXPECT_LE(d, 1e-4);
    // Batch independence: image 1 alone gives the same logits.
    const auto single = model->forward(x.slice(0, 1, 2)).logits;
    EXPECT_LE(test::max_abs_diff(single, fused.slice(0, 1, 2)), 1e-5);
  }
}

TEST(SwinParity, BiasKeptPerBlockFollowsBatchAndMapSize) {
  // Each block keeps its attention bias for the last (map size, dtype, path) and slices it for
  // fewer images: batches of 1, 2, 1, 3, another map size, then 1 again, on one model, with
  // both attention paths, must all match the reference (CUDA: tests/gpu/classifier_cuda_test).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("swin_tiny");
  auto model = models::load_model(dir);
  // The fixture holds two images; the first one, repeated, makes the batches.
  const auto pixels = test::normalized_pixels(dir).slice(0, 0, 1);
  const auto ref = test::expected_tensor(dir, "logits").slice(0, 0, 1);
  const auto extra = models::core::SafetensorsFile::open(dir + "/extra_expected.safetensors");
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    for (int64_t images : {1, 2, 1, 3}) {
      const auto out = model->forward(pixels.expand({images, -1, -1, -1}).contiguous()).logits;
      for (int64_t i = 0; i < images; ++i)
        EXPECT_LE(test::max_abs_diff(out.slice(0, i, i + 1), ref), 1e-4)
            << "fused " << fused << ", " << images << " images, image " << i;
    }
    const auto odd = model->forward(extra->view("pixel_values").clone()).logits;
    EXPECT_LE(test::max_abs_diff(odd, extra->view("logits")), 1e-4) << "fused " << fused;
    EXPECT_LE(test::max_abs_diff(model->forward(pixels).logits, ref), 1e-4) << "fused " << fused;
  }
}

TEST(SwinWindows, PartitionReverseRoundTripAndMask) {
  const auto x = at::arange(2 * 6 * 9 * 3, at::kFloat).view({2, 6, 9, 3});
  const auto w = models::swin::window_partition(x, 3);
  EXPECT_EQ(w.sizes(), (at::IntArrayRef{12, 3, 3, 3}));
  // Window 1 of image 0 is rows 0..2, columns 3..5.
  EXPECT_TRUE(at::equal(w[1], x[0].slice(0, 0, 3).slice(1, 3, 6)));
  EXPECT_TRUE(at::equal(models::swin::window_reverse(w, 3, 6, 9), x));
  EXPECT_THROW(models::swin::window_partition(x, 4), c10::Error);

  // 4x4 map, window 2, shift 1: regions [0,2) [2,3) [3,4) per axis.
  const auto mask = models::swin::shifted_window_mask(4, 4, 2, 1, at::kFloat, at::kCPU);
  EXPECT_EQ(mask.sizes(), (at::IntArrayRef{4, 4, 4}));
  EXPECT_EQ(mask[0].abs().sum().item<float>(), 0.0f);  // top-left window: one region
  // Last window (rows 2..3, cols 2..3): 4 different regions -> only the diagonal is 0.
  EXPECT_TRUE(at::equal(mask[3], (1 - at::eye(4)) * -100.0f));
}

TEST(SwinWindows, RelativePositionIndexMatchesTransformers) {
  // transformers SwinRelativePositionBias._create_relative_position_index for window 2.
  const auto idx = models::swin::relative_position_index(2, 2);
  const auto expected =
      at::tensor({4, 3, 1, 0, 5, 4, 2, 1, 7, 6, 4, 3, 8, 7, 5, 4}, at::kLong).view({4, 4});
  EXPECT_TRUE(at::equal(idx, expected));
  // A 1x1 window inside a table for window 7 reads the centre row (dy = dx = 0).
  EXPECT_EQ(models::swin::relative_position_index(1, 7).item<int64_t>(), 6 * 13 + 6);
  EXPECT_THROW(models::swin::relative_position_index(8, 7), c10::Error);
}

TEST(SwinParity, HalfPrecisionLoadsAndStaysClose) {
  test::expect_half_precision_close("swin_tiny", 0.1);
}

}  // namespace
}  // namespace libreyolo

// ViT, DeiT and Swin on CUDA against the transformers CPU fixtures, with both attention paths
// (parity on CUDA; the fused path on CUDA runs the attention_path() policy: SDPA for ViT,
// the memory-efficient kernel for Swin's biased windows). Skips without a GPU. TF32 off: the
// reference is float32 without it.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "models/core/safetensors.h"
#include "models/model.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

class ClassifierCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(ClassifierCuda, LogitsMatchTransformersWithBothAttentionPaths) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  auto model = models::load_model(dir, options);
  const auto pixels = test::normalized_pixels(dir).to(options.device);
  test::expect_logits_match_both_paths(*model, pixels, test::expected_tensor(dir, "logits"),
                                       test::expected_tensor(dir, "logits_eager"),
                                       GetParam() + " cuda");
}

TEST(SwinCuda, BiasKeptPerBlockFollowsBatchAndMapSize) {
  // Swin keeps each block's prepared attention bias for the last (map size, dtype, path) and
  // slices it for fewer images: batches of 2, 1, 3, another map size, then 1 again must all
  // match the references (memory-efficient path on CUDA).
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("swin_tiny");
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  auto model = models::load_model(dir, options);
  model->set_fused_attention(true);
  // The fixture holds two images; the first one, repeated, makes the batches.
  const auto pixels = test::normalized_pixels(dir).slice(0, 0, 1).to(options.device);
  const auto ref = test::expected_tensor(dir, "logits").slice(0, 0, 1);
  const auto first = model->forward(pixels).logits;
  EXPECT_LE(test::max_abs_diff(first, ref), 1e-4);
  for (int64_t images : {2, 1, 3}) {
    const auto out = model->forward(pixels.expand({images, -1, -1, -1}).contiguous()).logits;
    for (int64_t i = 0; i < images; ++i) {
      const double d = test::max_abs_diff(out.slice(0, i, i + 1), ref);
      std::cout << "[swin_tiny cuda, " << images << " images] image " << i
                << ": max|logits - logits| = " << d << "\n";
      EXPECT_LE(d, 1e-4) << images << " images, image " << i;
    }
  }
  const auto extra = models::core::SafetensorsFile::open(dir + "/extra_expected.safetensors");
  const auto odd = model->forward(extra->view("pixel_values").clone().to(options.device)).logits;
  const double d_odd = test::max_abs_diff(odd, extra->view("logits"));
  std::cout << "[swin_tiny cuda 107x123] max|logits - logits| = " << d_odd << "\n";
  EXPECT_LE(d_odd, 1e-4);
  // Back to the first map size: the bias is rebuilt, the result is bit-identical.
  EXPECT_TRUE(at::equal(model->forward(pixels).logits, first));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ClassifierCuda,
                         ::testing::Values("vit_tiny", "deit_tiny", "deit_tiny_distilled",
                                           "swin_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace libreyolo

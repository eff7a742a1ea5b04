// ViT and Swin on CUDA against the transformers CPU fixtures, with both attention paths (issue 5:
// parity on CUDA; the fused path on CUDA runs the attention_path() policy: SDPA for ViT, the
// memory-efficient kernel for Swin's biased windows). Skips without a GPU. TF32 off: the
// reference is float32 without it.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <string>

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

INSTANTIATE_TEST_SUITE_P(Fixtures, ClassifierCuda, ::testing::Values("vit_tiny", "swin_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace libreyolo

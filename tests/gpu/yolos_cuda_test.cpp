// YOLOS (YolosForObjectDetection: ViT encoder layers, no pixel_mask) on CUDA: the fixtures'
// padded batch equals the transformers CPU fixture (TF32 off), with the manual and the SDPA
// attention path, and a CUDA graph of the forward replays what eager computes. Skips without a
// GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "models/model.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

class YolosCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(YolosCuda, PaddedBatchEqualsFixtureAndGraphReplayEqualsEager) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  using models::CudaGraphRunner;
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto pixels = test::normalized_pixels(dir).cuda();
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(pixels);
    const double dl = test::max_abs_diff(out.logits, test::expected_tensor(dir, "logits"));
    const double db = test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "pred_boxes"));
    std::cout << "[gpu] " << GetParam() << (fused ? " sdpa" : " manual")
              << " cuda vs transformers CPU: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
  }
  model->set_fused_attention(false);

  ASSERT_TRUE(CudaGraphRunner::supported());
  const int64_t height = 64, width = 96;
  CudaGraphRunner runner(*model, {1, 2}, height, width, at::kFloat, options.device);
  const auto x = at::rand({2, 3, height, width}, at::TensorOptions().device(options.device));
  const auto eager = model->forward(x);
  const auto replay = runner.run(x);
  const double gl = test::max_abs_diff(replay.logits, eager.logits);
  const double gb = test::max_abs_diff(replay.pred_boxes, eager.pred_boxes);
  std::cout << "[gpu] " << GetParam() << " graph(2) vs eager: max|logits diff| = " << gl
            << ", max|pred_boxes diff| = " << gb << "\n";
  EXPECT_LE(gl, 1e-4);
  EXPECT_LE(gb, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, YolosCuda, ::testing::Values("yolos_tiny", "yolos_tiny_mid"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo

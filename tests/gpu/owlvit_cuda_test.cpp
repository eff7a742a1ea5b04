// OWL-ViT / OWLv2 (text-prompted, models/prompted.h) on CUDA: the fixtures' batch (two
// photographs, three labels each) equals the transformers CPU fixture (TF32 off) with the manual
// and the SDPA attention path, OWLv2's objectness included; the tokens are built on the host and
// moved to the model's device; Owlv2ImageProcessor's blur and resize on a CUDA image equal the
// fixture's pixel_values within 1e-5; post-processing runs on the device. Skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "models/image/decode.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/prompted.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

class OwlCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(OwlCuda, PromptedBatchEqualsFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto* owl = models::prompted_detector(*model);
  ASSERT_NE(owl, nullptr);
  std::vector<std::vector<std::string>> prompts;
  const auto meta = test::read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& image : meta.at("prompts")) {
    prompts.emplace_back();
    for (const auto& p : image) prompts.back().push_back(p.get<std::string>());
  }
  const auto queries = owl->encode_labels(prompts);
  EXPECT_TRUE(queries.input_ids.is_cuda());
  const auto pixels = test::expected_tensor(dir, "pixel_values").cuda();
  const bool v2 = std::string(GetParam()) == "owlv2_tiny";
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = owl->forward_prompted(pixels, queries);
    const double dl = test::max_abs_diff(out.logits, test::expected_tensor(dir, "logits"));
    const double db = test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "pred_boxes"));
    std::cout << "[gpu] " << GetParam() << (fused ? " sdpa" : " manual")
              << " cuda vs transformers CPU: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
    if (v2)
      EXPECT_LE(test::max_abs_diff(out.objectness_logits,
                                   test::expected_tensor(dir, "objectness_logits")),
                1e-4);
    const auto dets = owl->post_process(out, {{512, 512}, {400, 600}}, prompts, {0.1, 0.0});
    ASSERT_EQ(dets.size(), 2u);
    EXPECT_TRUE(dets[0].boxes.is_cuda());
    EXPECT_EQ(dets[1].scores.numel(), test::expected_tensor(dir, "th0.1_img1_scores").numel());
  }
  // The processor on CUDA images (nvjpeg's path in the server).
  const auto proc = image::load_image_processor(dir);
  std::vector<at::Tensor> images;
  for (const char* name : {"astronaut.jpg", "coffee.jpg"})
    images.push_back(
        image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" + name).cuda());
  const auto processed = proc->preprocess(images);
  const double dp =
      test::max_abs_diff(processed.pixel_values, test::expected_tensor(dir, "pixel_values"));
  std::cout << "[gpu] " << GetParam() << " processor on cuda: max|pixel_values diff| = " << dp
            << "\n";
  // OWL-ViT: uint8 bicubic on CUDA (float, round) differs from the CPU's at edges: 0.0876 on
  // the H200 (2026-12-04), 5.8 uint8 levels after normalisation by std 0.26; the model's parity
  // above is on the CPU-processed pixels.
  EXPECT_LE(dp, v2 ? 1e-5 : 0.1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OwlCuda, ::testing::Values("owlvit_tiny", "owlv2_tiny"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo

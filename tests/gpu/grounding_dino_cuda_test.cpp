// Grounding DINO / MM Grounding DINO on CUDA: both fixture cases (a padded batch of two images
// with different prompts; one image with a merged label list) equal the transformers CPU
// fixture with TF32 off (logits <= 1e-4 over the prompt's tokens, -inf elsewhere, boxes
// <= 1e-5), and post-processing on the device outputs keeps the fixture's phrases. Skips without
// a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "models/grounding_dino/grounding_dino.h"
#include "models/grounding_dino/postprocess.h"
#include "models/model.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

class GroundingDinoCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(GroundingDinoCuda, CasesEqualTransformersCpuFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto* tm = dynamic_cast<const models::grounding_dino::TextConditioned*>(model.get());
  ASSERT_NE(tm, nullptr);
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : {"batch", "labels"}) {
    const auto u8 = test::expected_tensor(dir, c + "_pixel_u8");
    const auto mask = test::expected_tensor(dir, c + "_pixel_mask").to(at::kLong);
    const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
    const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
    const auto pixels = ((u8.to(at::kFloat) - m) / s).masked_fill(mask.unsqueeze(1) == 0, 0.0f);
    const models::grounding_dino::TextTensors text{
        test::expected_tensor(dir, c + "_input_ids"),
        test::expected_tensor(dir, c + "_attention_mask"),
        test::expected_tensor(dir, c + "_token_type_ids")};
    const auto out = tm->forward_text(pixels.cuda(), mask.cuda(), text);
    ASSERT_TRUE(out.logits.is_cuda());
    const auto logits = out.logits.cpu(), ref = test::expected_tensor(dir, c + "_logits");
    const auto finite = at::isfinite(ref);
    EXPECT_TRUE(at::equal(at::isfinite(logits), finite)) << c;
    const double dl =
        (logits.masked_select(finite) - ref.masked_select(finite)).abs().max().item<double>();
    const double db =
        test::max_abs_diff(out.pred_boxes.cpu(), test::expected_tensor(dir, c + "_pred_boxes"));
    std::cout << "[gpu] " << GetParam() << " " << c
              << " cuda vs transformers CPU: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-4) << c;
    EXPECT_LE(db, 1e-5) << c;
    const auto& cm = meta.at("cases").at(c);
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const auto& hw : cm.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    const auto dets = models::grounding_dino::post_process_grounded_object_detection(
        out.logits, out.pred_boxes, text.input_ids, cm.at("box_threshold"), cm.at("text_threshold"),
        sizes, tm->tokenizer());
    for (size_t i = 0; i < dets.size(); ++i)
      EXPECT_EQ(dets[i].phrases,
                cm.at("results")[i].at("text_labels").get<std::vector<std::string>>())
          << c << " image " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GroundingDinoCuda,
                         ::testing::Values("grounding_dino_tiny", "mm_grounding_dino_tiny"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo

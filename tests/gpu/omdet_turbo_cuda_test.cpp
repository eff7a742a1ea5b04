// OmDet-Turbo on CUDA: both fixture cases ("batch": two images, 3 and 4 classes, default tasks;
// "task": one image with a task of its own) equal the transformers CPU fixture with TF32 off
// (logits <= 1e-4, boxes <= 1e-5), and post-processing of the device outputs keeps the fixture's
// labels; with transformers' SwinBackbone (omdet_turbo_tiny) and timm's Swin
// (omdet_turbo_timm_tiny). Skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "models/omdet_turbo/omdet_turbo.h"
#include "models/omdet_turbo/postprocess.h"
#include "models/prompted.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

void expect_cases_equal_cpu_fixture(const std::string& fixture) {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(fixture);
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto* tm = dynamic_cast<const models::omdet_turbo::TaskConditioned*>(model.get());
  ASSERT_NE(tm, nullptr);
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : {"batch", "task"}) {
    const auto u8 = test::expected_tensor(dir, c + "_pixel_u8");
    const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
    const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
    const auto pixels = (u8.to(at::kFloat) - m) / s;
    const models::omdet_turbo::TextInputs text{
        test::expected_tensor(dir, c + "_classes_input_ids"),
        test::expected_tensor(dir, c + "_classes_structure"),
        test::expected_tensor(dir, c + "_tasks_input_ids"),
        test::expected_tensor(dir, c + "_tasks_attention_mask")};
    const auto out = tm->forward_text(pixels.cuda(), text);
    ASSERT_TRUE(out.logits.is_cuda());
    const double dl =
        test::max_abs_diff(out.logits.cpu(), test::expected_tensor(dir, c + "_logits"));
    const double db =
        test::max_abs_diff(out.pred_boxes.cpu(), test::expected_tensor(dir, c + "_pred_boxes"));
    std::cout << "[gpu] " << fixture << " " << c
              << " cuda vs transformers CPU: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-4) << c;
    EXPECT_LE(db, 1e-5) << c;
    const auto& cm = meta.at("cases").at(c);
    std::vector<std::pair<int64_t, int64_t>> sizes;
    std::vector<int64_t> counts;
    for (const auto& hw : cm.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    for (const auto& l : cm.at("classes")) counts.push_back(static_cast<int64_t>(l.size()));
    const auto dets = models::omdet_turbo::post_process_grounded_object_detection(
        out.logits, out.pred_boxes, counts, sizes, cm.at("threshold"), meta.at("nms_threshold"));
    for (size_t i = 0; i < dets.size(); ++i)
      EXPECT_TRUE(at::equal(dets[i].labels,
                            test::expected_tensor(dir, c + "_img" + std::to_string(i) + "_labels")))
          << c << " image " << i;
  }
}

TEST(OmDetTurboCuda, CasesEqualTransformersCpuFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  expect_cases_equal_cpu_fixture("omdet_turbo_tiny");
}

TEST(OmDetTurboCuda, TimmSwinCasesEqualTransformersCpuFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  expect_cases_equal_cpu_fixture("omdet_turbo_timm_tiny");
}

// Case "mixed" through the PromptedDetector path the server batches requests with: the default
// task on one row and a task of its own on the other (encode_with_tasks), on CUDA against the
// transformers CPU batch; each row post-processed at its own threshold and nms_threshold keeps
// the fixture's labels.
TEST(OmDetTurboCuda, PerRowTasksEqualTransformersCpuFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("omdet_turbo_tiny");
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto* p = models::prompted_detector(*model);
  ASSERT_NE(p, nullptr);
  const auto meta = test::read_json(dir + "/meta.json");
  const auto& cm = meta.at("cases").at("mixed");
  const auto classes = cm.at("classes").get<std::vector<std::vector<std::string>>>();
  const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
  const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
  const auto u8 = at::cat({test::expected_tensor(dir, "batch_pixel_u8").slice(0, 0, 1),
                           test::expected_tensor(dir, "task_pixel_u8")});
  const auto pixels = ((u8.to(at::kFloat) - m) / s).cuda();
  const std::vector<std::string> tasks = {"", cm.at("tasks")[1].get<std::string>()};
  const auto out = p->forward_prompted(pixels, p->encode_with_tasks(classes, tasks));
  ASSERT_TRUE(out.logits.is_cuda());
  const double dl =
      test::max_abs_diff(out.logits.cpu(), test::expected_tensor(dir, "mixed_logits"));
  const double db =
      test::max_abs_diff(out.pred_boxes.cpu(), test::expected_tensor(dir, "mixed_pred_boxes"));
  std::cout << "[gpu] omdet_turbo_tiny mixed cuda vs transformers CPU: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
  for (int64_t i = 0; i < 2; ++i) {
    models::PromptedOutput row;
    row.logits = out.logits.slice(0, i, i + 1);
    row.pred_boxes = out.pred_boxes.slice(0, i, i + 1);
    const auto& hw = cm.at("target_sizes_hw")[i];
    auto t = p->default_thresholds();
    t.box_threshold = cm.at("thresholds")[i];
    t.nms_threshold = cm.at("nms_thresholds")[i];
    const auto dets = p->post_process(row, {{hw[0], hw[1]}}, {classes[i]}, t);
    EXPECT_TRUE(at::equal(dets[0].labels.cpu(),
                          test::expected_tensor(dir, "mixed_img" + std::to_string(i) + "_labels")))
        << "image " << i;
  }
  // The prompt cache's path on the device (each image's pieces encoded apart, padded again by
  // forward_encoded) against the uncached CUDA forward: bit-equal on the CPU; here within 1e-5
  // and 1e-6 (cuBLAS may pick other algorithms for the text side's other shapes).
  std::vector<std::vector<models::EncodedText>> pieces;
  for (const auto& keys : p->text_keys_with_tasks(classes, tasks))
    pieces.push_back(p->encode_text(keys));
  ASSERT_TRUE(pieces[1].back().tensors[0].is_cuda());
  const auto cached = p->forward_encoded(pixels, at::Tensor(), pieces);
  const double cl = test::max_abs_diff(cached.logits.cpu(), out.logits.cpu());
  const double cb = test::max_abs_diff(cached.pred_boxes.cpu(), out.pred_boxes.cpu());
  std::cout << "[gpu] omdet_turbo_tiny mixed encoded vs prompted: max|logits diff| = " << cl
            << ", max|pred_boxes diff| = " << cb << "\n";
  EXPECT_LE(cl, 1e-5);
  EXPECT_LE(cb, 1e-6);
}

}  // namespace
}  // namespace libreyolo

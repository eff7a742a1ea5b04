// OmDet-Turbo (transformers 5.17 OmDetTurboForObjectDetection) against the fixture of
// tests/fixtures/models/omdet_turbo_tiny/make_fixtures.py: cases "batch" (astronaut.jpg +
// coffee.jpg, 3 and 4 classes, the processor's default tasks) and "task" (chelsea.jpg, 2 classes,
// a task of its own; also post-processed at nms_threshold 0.05) and "mixed" (one image of each
// in one batch, the default task and the other, each row post-processed at its own threshold and
// nms_threshold: the server's per-request `task` and `nms_threshold` batched together). Inputs
// are the stored pixels recovered exactly and the processor's token tensors; post-processing at
// the fixture's thresholds and nms_threshold 0.5 unless said.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
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

namespace od = models::omdet_turbo;

const char* const kCases[] = {"batch", "task"};

std::string fixture() { return test::model_fixture("omdet_turbo_tiny"); }

/// The case's pixel_values, rebuilt bit-exactly from pixel_u8 (ImageNet mean/std).
at::Tensor case_pixels(const std::string& dir, const std::string& c) {
  const auto u8 = test::expected_tensor(dir, c + "_pixel_u8");
  const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
  const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
  return (u8.to(at::kFloat) - m) / s;
}

od::TextInputs case_text(const std::string& dir, const std::string& c) {
  return {test::expected_tensor(dir, c + "_classes_input_ids"),
          test::expected_tensor(dir, c + "_classes_structure"),
          test::expected_tensor(dir, c + "_tasks_input_ids"),
          test::expected_tensor(dir, c + "_tasks_attention_mask")};
}

const od::TaskConditioned& task_model(const models::Model& model) {
  const auto* t = dynamic_cast<const od::TaskConditioned*>(&model);
  if (t == nullptr) throw std::runtime_error(model.model_type() + " is not task-conditioned");
  return *t;
}

struct Case {
  std::vector<std::vector<std::string>> classes;
  std::vector<std::string> tasks;  ///< "" = the default task
  std::vector<std::pair<int64_t, int64_t>> sizes;
  double threshold;
};

Case read_case(const nlohmann::json& meta, const std::string& c) {
  const auto& cm = meta.at("cases").at(c);
  Case k;
  k.classes = cm.at("classes").get<std::vector<std::vector<std::string>>>();
  for (size_t i = 0; i < k.classes.size(); ++i)
    k.tasks.push_back(cm.at("task").is_null() ? "" : cm.at("task").get<std::string>());
  for (const auto& hw : cm.at("target_sizes_hw")) k.sizes.emplace_back(hw[0], hw[1]);
  k.threshold = cm.at("threshold");
  return k;
}

TEST(OmDetTurboParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "omdet-turbo");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  const auto& tm = task_model(*model);
  for (const std::string c : kCases) {
    const auto out = tm.forward_text(case_pixels(dir, c), case_text(dir, c));
    const auto logits_ref = test::expected_tensor(dir, c + "_logits");
    const auto boxes_ref = test::expected_tensor(dir, c + "_pred_boxes");
    ASSERT_EQ(out.logits.sizes(), logits_ref.sizes()) << c;
    ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes()) << c;
    const double dl = test::max_abs_diff(out.logits, logits_ref);
    const double db = test::max_abs_diff(out.pred_boxes, boxes_ref);
    std::cout << "[omdet_turbo_tiny " << c << "] max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-4) << c;
    EXPECT_LE(db, 1e-5) << c;
  }
  EXPECT_THROW(model->forward(case_pixels(dir, "task"), at::Tensor()), std::invalid_argument);
}

TEST(OmDetTurboParity, TextTokenizesAsTheProcessor) {
  // OmDetTurboProcessor: every class and task padded / truncated to 77 tokens; the default task
  // "Detect a, b."; classes_structure the per-image counts.
  const auto dir = fixture();
  auto model = models::load_model(dir);
  const auto& tm = task_model(*model);
  EXPECT_EQ(od::default_task({"cat", "remote control"}), "Detect cat, remote control.");
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : kCases) {
    const auto k = read_case(meta, c);
    const auto t = tm.encode(k.classes, k.tasks);
    const auto ref = case_text(dir, c);
    EXPECT_TRUE(at::equal(t.classes_input_ids, ref.classes_input_ids)) << c;
    EXPECT_TRUE(at::equal(t.classes_structure, ref.classes_structure)) << c;
    EXPECT_TRUE(at::equal(t.tasks_input_ids, ref.tasks_input_ids)) << c;
    EXPECT_TRUE(at::equal(t.tasks_attention_mask, ref.tasks_attention_mask)) << c;
  }
  try {
    tm.encode({{"cat", std::string("\xff\xfe")}}, {""});
    FAIL() << "a class that is not UTF-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "labels[0][1]: text: invalid UTF-8 at byte 0");
  }
  try {
    tm.encode({{"cat"}}, {"Detect \xc3"});
    FAIL() << "a task that is not UTF-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "tasks[0]: text: invalid UTF-8 at byte 7");
  }
  EXPECT_THROW(tm.encode({{}}, {""}), std::invalid_argument);
  EXPECT_THROW(tm.encode({{"cat"}}, {}), std::invalid_argument);
}

TEST(OmDetTurboParity, PostProcessingMatchesTransformers) {
  // post_process_grounded_object_detection at the fixture's threshold and nms_threshold 0.5: of
  // transformers' outputs, equal scores and labels and boxes to 1e-4 px; of ours, the same
  // labels, scores to 1e-5 and boxes to 1e-2 px.
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  auto model = models::load_model(dir);
  const auto& tm = task_model(*model);
  const auto meta = test::read_json(dir + "/meta.json");
  const double nms = meta.at("nms_threshold");
  for (const std::string c : kCases) {
    const auto k = read_case(meta, c);
    std::vector<int64_t> counts;
    for (const auto& l : k.classes) counts.push_back(static_cast<int64_t>(l.size()));
    const auto ours = tm.forward_text(case_pixels(dir, c), case_text(dir, c));
    const auto from_ref = od::post_process_grounded_object_detection(
        test::expected_tensor(dir, c + "_logits"), test::expected_tensor(dir, c + "_pred_boxes"),
        counts, k.sizes, k.threshold, nms);
    const auto from_ours = od::post_process_grounded_object_detection(
        ours.logits, ours.pred_boxes, counts, k.sizes, k.threshold, nms);
    ASSERT_EQ(from_ref.size(), k.sizes.size());
    for (size_t i = 0; i < k.sizes.size(); ++i) {
      const std::string key = c + "_img" + std::to_string(i);
      const auto scores = test::expected_tensor(dir, key + "_scores");
      const auto labels = test::expected_tensor(dir, key + "_labels");
      const auto boxes = test::expected_tensor(dir, key + "_boxes");
      ASSERT_GT(scores.numel(), 0) << key;
      EXPECT_TRUE(at::equal(from_ref[i].scores, scores)) << key;
      EXPECT_TRUE(at::equal(from_ref[i].labels, labels)) << key;
      EXPECT_LE(test::max_abs_diff(from_ref[i].boxes, boxes), 1e-4) << key;
      ASSERT_EQ(from_ours[i].scores.sizes(), scores.sizes()) << key;
      EXPECT_TRUE(at::equal(from_ours[i].labels, labels)) << key;
      EXPECT_LE(test::max_abs_diff(from_ours[i].scores, scores), 1e-5) << key;
      EXPECT_LE(test::max_abs_diff(from_ours[i].boxes, boxes), 1e-2) << key;
      std::cout << "[omdet_turbo_tiny " << key << "] " << scores.numel() << " boxes\n";
    }
  }
  // The "task" case at its other nms_threshold (0.05: two boxes of IoU 0.1 go).
  const auto& other = meta.at("cases").at("task").at("nms_results");
  const auto k = read_case(meta, "task");
  const auto out = tm.forward_text(case_pixels(dir, "task"), case_text(dir, "task"));
  const auto dets = od::post_process_grounded_object_detection(
      out.logits, out.pred_boxes, {2}, k.sizes, k.threshold, other.at("nms_threshold"));
  const auto scores = test::expected_tensor(dir, "task_nms_img0_scores");
  ASSERT_EQ(scores.numel(), 16);
  ASSERT_EQ(dets[0].scores.sizes(), scores.sizes());
  EXPECT_TRUE(at::equal(dets[0].labels, test::expected_tensor(dir, "task_nms_img0_labels")));
  EXPECT_LE(test::max_abs_diff(dets[0].scores, scores), 1e-5);
  EXPECT_LE(test::max_abs_diff(dets[0].boxes, test::expected_tensor(dir, "task_nms_img0_boxes")),
            1e-2);
}

TEST(OmDetTurboParity, PerRowTasksAndThresholdsMatchTransformers) {
  // Case "mixed": the PromptedDetector path the server batches requests through, with the
  // default task ("") on one row and the "task" case's on the other; each row post-processed at
  // its own threshold and nms_threshold.
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  auto model = models::load_model(dir);
  const auto* p = models::prompted_detector(*model);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->uses_task());
  EXPECT_TRUE(p->uses_nms_threshold());
  EXPECT_EQ(p->default_thresholds().nms_threshold, 0.5);
  const auto meta = test::read_json(dir + "/meta.json");
  const auto& cm = meta.at("cases").at("mixed");
  const auto classes = cm.at("classes").get<std::vector<std::vector<std::string>>>();
  const std::vector<std::string> tasks = {"", cm.at("tasks")[1].get<std::string>()};
  const auto q = p->encode_with_tasks(classes, tasks);
  // Row 0 of input_ids is the task, then the classes (the family's TextQueries layout).
  EXPECT_TRUE(
      at::equal(q.input_ids.select(1, 0), test::expected_tensor(dir, "mixed_tasks_input_ids")));
  EXPECT_TRUE(at::equal(q.attention_mask.select(1, 0),
                        test::expected_tensor(dir, "mixed_tasks_attention_mask")));
  const auto pixels = at::cat({case_pixels(dir, "batch").slice(0, 0, 1), case_pixels(dir, "task")});
  const auto out = p->forward_prompted(pixels, q);
  const double dl = test::max_abs_diff(out.logits, test::expected_tensor(dir, "mixed_logits"));
  const double db =
      test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "mixed_pred_boxes"));
  std::cout << "[omdet_turbo_tiny mixed] max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
  for (int64_t i = 0; i < 2; ++i) {
    const auto key = "mixed_img" + std::to_string(i);
    models::PromptedOutput row;
    row.logits = out.logits.slice(0, i, i + 1);
    row.pred_boxes = out.pred_boxes.slice(0, i, i + 1);
    const auto& hw = cm.at("target_sizes_hw")[i];
    models::PromptThresholds t = p->default_thresholds();
    t.box_threshold = cm.at("thresholds")[i];
    t.nms_threshold = cm.at("nms_thresholds")[i];
    const auto dets = p->post_process(row, {{hw[0], hw[1]}}, {classes[i]}, t);
    const auto scores = test::expected_tensor(dir, key + "_scores");
    ASSERT_EQ(dets[0].scores.sizes(), scores.sizes()) << key;
    EXPECT_EQ(dets[0].phrases,
              cm.at("results")[i].at("text_labels").get<std::vector<std::string>>())
        << key;
    EXPECT_LE(test::max_abs_diff(dets[0].scores, scores), 1e-5) << key;
    EXPECT_LE(test::max_abs_diff(dets[0].boxes, test::expected_tensor(dir, key + "_boxes")), 1e-2)
        << key;
  }
  // A task is cut past 75 tokens as the processor truncates it; one that is not UTF-8 is named.
  std::string long_task = "Detect";
  for (int i = 0; i < 80; ++i) long_task += " cat";
  EXPECT_TRUE(p->task_truncated(long_task));
  EXPECT_FALSE(p->task_truncated(tasks[1]));
  try {
    p->task_truncated("Find \xff");
    FAIL() << "a task that is not UTF-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "task: text: invalid UTF-8 at byte 5");
  }
  EXPECT_THROW(p->encode_with_tasks(classes, {""}), std::invalid_argument);
}

TEST(OmDetTurboParity, EncodedTextEqualsThePromptedForward) {
  // The server's prompt-cache path on case "mixed" (3 and 2 classes, tasks of 12 and 10 tokens):
  // a key per class and per task, every piece encoded in one call, then padded again by
  // forward_encoded; equal to the uncached forward bit for bit.
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  auto model = models::load_model(dir);
  const auto* p = models::prompted_detector(*model);
  ASSERT_TRUE(p->caches_text());
  const auto meta = test::read_json(dir + "/meta.json");
  const auto& cm = meta.at("cases").at("mixed");
  const auto classes = cm.at("classes").get<std::vector<std::vector<std::string>>>();
  const std::vector<std::string> tasks = {"", cm.at("tasks")[1].get<std::string>()};
  const auto keys = p->text_keys_with_tasks(classes, tasks);
  EXPECT_EQ(keys, (std::vector<std::vector<std::string>>{{"person", "flag", "cup",
                                                          "\xff"
                                                          "Detect person, flag, cup."},
                                                         {"cat", "remote control",
                                                          "\xff"
                                                          "Find the cat and the remote."}}));
  EXPECT_EQ(p->text_keys(classes)[1].back(),
            "\xff"
            "Detect cat, remote control.");
  std::vector<std::string> all;
  for (const auto& image : keys) all.insert(all.end(), image.begin(), image.end());
  const auto encoded = p->encode_text(all);
  ASSERT_EQ(encoded.size(), 7u);
  EXPECT_EQ(encoded[0].tensors[0].sizes(), (at::IntArrayRef{24}));      // class_embed_dim
  EXPECT_EQ(encoded[3].tensors[0].sizes(), (at::IntArrayRef{12, 24}));  // the task's tokens
  EXPECT_EQ(encoded[6].tensors[0].sizes(), (at::IntArrayRef{10, 24}));
  EXPECT_EQ(encoded[6].bytes(), 10 * 24 * 4);
  const std::vector<std::vector<models::EncodedText>> pieces = {
      {encoded.begin(), encoded.begin() + 4}, {encoded.begin() + 4, encoded.end()}};
  const auto pixels = at::cat({case_pixels(dir, "batch").slice(0, 0, 1), case_pixels(dir, "task")});
  const auto cached = p->forward_encoded(pixels, at::Tensor(), pieces);
  const auto direct = p->forward_prompted(pixels, p->encode_with_tasks(classes, tasks));
  const double dl = test::max_abs_diff(cached.logits, direct.logits);
  const double db = test::max_abs_diff(cached.pred_boxes, direct.pred_boxes);
  std::cout << "[omdet_turbo_tiny mixed] encoded vs prompted: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "\n";
  EXPECT_EQ(dl, 0.0);
  EXPECT_EQ(db, 0.0);
  EXPECT_LE(test::max_abs_diff(cached.logits, test::expected_tensor(dir, "mixed_logits")), 1e-4);
  // Wrong pieces are named; a key that is not UTF-8 too.
  try {
    p->forward_encoded(pixels, at::Tensor(), {pieces[0]});
    FAIL() << "one image's pieces for two images";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "omdet-turbo: 1 encoded prompts for 2 images");
  }
  try {
    p->forward_encoded(pixels, at::Tensor(), {pieces[0], {encoded[4], encoded[5]}});
    FAIL() << "an image without its task";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "omdet-turbo: pieces[1] must be class embeddings (24) then one task (T, 24), from "
              "encode_text of text_keys' keys");
  }
  try {
    p->encode_text({"cat",
                    "\xff"
                    "Find \xff"});
    FAIL() << "a task key that is not UTF-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "omdet-turbo: keys[1]: text: invalid UTF-8 at byte 5");
  }
}

TEST(OmDetTurboParity, BatchedNmsAsTorchvision) {
  // Two overlapping boxes of one label (IoU 0.6): the lower one suppressed at 0.5, kept at 0.7;
  // the same boxes under different labels never suppress each other.
  const auto boxes =
      at::tensor({0.f, 0.f, 10.f, 10.f, 0.f, 0.f, 10.f, 6.f, 20.f, 20.f, 30.f, 30.f}).view({3, 4});
  const auto scores = at::tensor({0.5f, 0.9f, 0.7f});
  const auto same = at::tensor({1, 1, 1}, at::kLong);
  EXPECT_TRUE(at::equal(od::batched_nms(boxes, scores, same, 0.5), at::tensor({1, 2}, at::kLong)));
  EXPECT_TRUE(
      at::equal(od::batched_nms(boxes, scores, same, 0.7), at::tensor({1, 2, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(od::batched_nms(boxes, scores, at::tensor({0, 1, 0}, at::kLong), 0.5),
                        at::tensor({1, 2, 0}, at::kLong)));
  EXPECT_EQ(
      od::batched_nms(at::empty({0, 4}), at::empty({0}), at::empty({0}, at::kLong), 0.5).numel(),
      0);
}

TEST(OmDetTurboParity, PromptedDetectorMatchesTransformers) {
  // The open-vocabulary contract (models/prompted.h) as the server drives it: per-image label
  // lists as classes, the default task, threshold as box_threshold, labels as class indices.
  c10::InferenceMode inference_mode;
  const auto dir = fixture();
  auto model = models::load_model(dir);
  const auto* p = models::prompted_detector(*model);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(model->description().head, image::DetectionHead::prompted);
  EXPECT_FALSE(p->uses_text_threshold());
  EXPECT_EQ(p->default_thresholds().box_threshold, 0.3);
  EXPECT_EQ(p->max_text_length(), 77);
  EXPECT_EQ(p->max_labels(), 256);
  const auto meta = test::read_json(dir + "/meta.json");
  const auto k = read_case(meta, "batch");
  const auto q = p->encode_labels(k.classes);
  const auto out = p->forward_prompted(case_pixels(dir, "batch"), q);
  EXPECT_LE(test::max_abs_diff(out.logits, test::expected_tensor(dir, "batch_logits")), 1e-4);
  EXPECT_LE(test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "batch_pred_boxes")),
            1e-5);
  const auto dets = p->post_process(out, k.sizes, k.classes, {k.threshold, 0.0});
  ASSERT_EQ(dets.size(), 2u);
  for (size_t i = 0; i < dets.size(); ++i) {
    const auto key = "batch_img" + std::to_string(i);
    EXPECT_EQ(dets[i].phrases, meta.at("cases")
                                   .at("batch")
                                   .at("results")[i]
                                   .at("text_labels")
                                   .get<std::vector<std::string>>())
        << key;
    EXPECT_TRUE(at::equal(dets[i].labels, test::expected_tensor(dir, key + "_labels"))) << key;
    EXPECT_LE(test::max_abs_diff(dets[i].scores, test::expected_tensor(dir, key + "_scores")), 1e-5)
        << key;
  }
  // A label is cut past 75 tokens (77 with the start and end tokens).
  std::string long_label;
  for (int i = 0; i < 80; ++i) long_label += "cat ";
  EXPECT_EQ(p->truncation({{"a dog", long_label}}),
            (std::vector<std::vector<bool>>{{false, true}}));
  try {
    p->truncation({{"cat", std::string("a\xc3(")}});
    FAIL() << "a label that is not UTF-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "labels[0][1]: text: invalid UTF-8 at byte 1");
  }
}

}  // namespace
}  // namespace libreyolo

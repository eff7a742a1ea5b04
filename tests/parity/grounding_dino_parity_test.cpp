// Grounding DINO / MM Grounding DINO (transformers 5.17 GroundingDinoForObjectDetection,
// MMGroundingDinoForObjectDetection) against the fixtures of
// tests/fixtures/models/grounding_dino_tiny/make_fixtures.py: per fixture two cases, "batch"
// (astronaut.jpg + coffee.jpg, two different prompts padded to the longest) and "labels"
// (chelsea.jpg, a candidate-label list merged by the processor). Inputs are the stored pixels
// recovered exactly and the processor's token tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "models/core/safetensors.h"
#include "models/grounding_dino/grounding_dino.h"
#include "models/grounding_dino/postprocess.h"
#include "models/grounding_dino/text_inputs.h"
#include "models/image/decode.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/prompted.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

namespace gd = models::grounding_dino;

struct Fixture {
  const char* name;
  const char* model_type;
};
const Fixture kFixtures[] = {{"grounding_dino_tiny", "grounding-dino"},
                             {"mm_grounding_dino_tiny", "mm-grounding-dino"}};
const char* const kCases[] = {"batch", "labels"};

/// The case's pixel_values, rebuilt bit-exactly from pixel_u8 (ImageNet mean/std) and pixel_mask.
std::pair<at::Tensor, at::Tensor> case_pixels(const std::string& dir, const std::string& c) {
  const auto u8 = test::expected_tensor(dir, c + "_pixel_u8");
  const auto mask = test::expected_tensor(dir, c + "_pixel_mask").to(at::kLong);
  const auto m = at::tensor({0.485f, 0.456f, 0.406f}).view({1, -1, 1, 1}) * 255.0f;
  const auto s = at::tensor({0.229f, 0.224f, 0.225f}).view({1, -1, 1, 1}) * 255.0f;
  const auto pixels = ((u8.to(at::kFloat) - m) / s).masked_fill(mask.unsqueeze(1) == 0, 0.0f);
  return {pixels, mask};
}

gd::TextTensors case_text(const std::string& dir, const std::string& c) {
  return {test::expected_tensor(dir, c + "_input_ids"),
          test::expected_tensor(dir, c + "_attention_mask"),
          test::expected_tensor(dir, c + "_token_type_ids")};
}

const gd::TextConditioned& text_model(const models::Model& model) {
  const auto* t = dynamic_cast<const gd::TextConditioned*>(&model);
  if (t == nullptr) throw std::runtime_error(model.model_type() + " is not text-conditioned");
  return *t;
}

/// max |a - b| over the finite entries of `b`; `a` must be -inf exactly where `b` is.
double finite_diff(const at::Tensor& a, const at::Tensor& b, const std::string& label) {
  const auto finite = at::isfinite(b);
  EXPECT_TRUE(at::equal(at::isfinite(a), finite)) << label;
  EXPECT_TRUE(
      at::equal(a.masked_select(finite.logical_not()), b.masked_select(finite.logical_not())))
      << label;
  return (a.masked_select(finite) - b.masked_select(finite)).abs().max().item<double>();
}

class GroundingDinoParity : public ::testing::TestWithParam<Fixture> {};

TEST_P(GroundingDinoParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), GetParam().model_type);
  EXPECT_EQ(model->task(), models::Task::object_detection);
  const auto& tm = text_model(*model);
  EXPECT_EQ(tm.max_text_len(), 256);
  for (const std::string c : kCases) {
    const auto [pixels, mask] = case_pixels(dir, c);
    const auto out = tm.forward_text(pixels, mask, case_text(dir, c));
    const auto logits_ref = test::expected_tensor(dir, c + "_logits");
    const auto boxes_ref = test::expected_tensor(dir, c + "_pred_boxes");
    ASSERT_EQ(out.logits.sizes(), logits_ref.sizes()) << c;
    ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes()) << c;
    const std::string label = std::string(GetParam().name) + " " + c;
    const double dl = finite_diff(out.logits, logits_ref, label);
    const double db = test::max_abs_diff(out.pred_boxes, boxes_ref);
    std::cout << "[" << label << "] max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
              << "\n";
    EXPECT_LE(dl, 1e-4) << label;
    EXPECT_LE(db, 1e-5) << label;
  }
}

TEST_P(GroundingDinoParity, PromptsTokenizeAsTheProcessor) {
  // GroundingDinoProcessor: one prompt per image padded to the longest; a label list merged into
  // "a cat. a dog. remote control." (strip, lower-case, ". "-joined, final '.').
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto& tok = text_model(*model).tokenizer();
  EXPECT_EQ(gd::merge_labels({"a cat", " A Dog ", "remote control"}),
            "a cat. a dog. remote control.");
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : kCases) {
    std::vector<std::string> prompts;
    for (const auto& p : meta.at("cases").at(c).at("prompts"))
      prompts.push_back(p.is_array() ? gd::merge_labels(p.get<std::vector<std::string>>())
                                     : p.get<std::string>());
    const auto t = gd::encode_prompts(tok, prompts);
    const auto ref = case_text(dir, c);
    EXPECT_TRUE(at::equal(t.input_ids, ref.input_ids)) << c << "\n" << t.input_ids;
    EXPECT_TRUE(at::equal(t.attention_mask, ref.attention_mask)) << c;
    EXPECT_TRUE(at::equal(t.token_type_ids, ref.token_type_ids)) << c;
  }
  // transformers' decode (WordPiece decoder, '##' glued but at the start, " ." -> "."), the
  // phrase labels' text; ids of the fixture's vocabulary.
  EXPECT_EQ(tok.decode({1037, 1005, 1055, 1073, 1012, 1074, 1029, 1089}), "a ' s cat. dog?s");
  EXPECT_EQ(tok.decode({1089, 1037, 1090}), "##s aing");
  EXPECT_EQ(tok.decode({102, 1037, 1012, 0}), "[SEP] a. [PAD]");
  // [CLS] a person . a flag . [SEP]: phrases "a person" (positions 0, 1) and "a flag".
  const auto [mask, positions] =
      gd::phrase_masks(at::tensor({101, 1099, 1100, 1012, 1099, 1101, 1012, 102}).view({1, -1}));
  EXPECT_TRUE(at::equal(positions, at::tensor({0, 0, 1, 0, 0, 1, 0, 0}).view({1, -1})));
  EXPECT_TRUE(mask[0][1][2].item<bool>());
  EXPECT_FALSE(mask[0][1][4].item<bool>());
  EXPECT_TRUE(mask[0][3][3].item<bool>());
  EXPECT_FALSE(mask[0][0][1].item<bool>());
}

TEST_P(GroundingDinoParity, PostProcessingMatchesTransformers) {
  // post_process_grounded_object_detection at the fixture's box/text thresholds: of
  // transformers' outputs, equal scores and phrases and boxes to 1e-4 px; of ours, the same
  // counts and phrases, scores to 1e-5 and boxes to 1e-2 px.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto& tm = text_model(*model);
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : kCases) {
    const auto& cm = meta.at("cases").at(c);
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const auto& hw : cm.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    const auto text = case_text(dir, c);
    const auto [pixels, mask] = case_pixels(dir, c);
    const auto ours = tm.forward_text(pixels, mask, text);
    const double box_th = cm.at("box_threshold"), text_th = cm.at("text_threshold");
    const auto from_ref = gd::post_process_grounded_object_detection(
        test::expected_tensor(dir, c + "_logits"), test::expected_tensor(dir, c + "_pred_boxes"),
        text.input_ids, box_th, text_th, sizes, tm.tokenizer());
    const auto from_ours = gd::post_process_grounded_object_detection(
        ours.logits, ours.pred_boxes, text.input_ids, box_th, text_th, sizes, tm.tokenizer());
    ASSERT_EQ(from_ref.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string key = c + "_img" + std::to_string(i);
      const auto scores = test::expected_tensor(dir, key + "_scores");
      const auto boxes = test::expected_tensor(dir, key + "_boxes");
      const auto phrases = cm.at("results")[i].at("text_labels").get<std::vector<std::string>>();
      ASSERT_GT(phrases.size(), 0u) << key;
      EXPECT_EQ(from_ref[i].phrases, phrases) << key;
      EXPECT_TRUE(at::equal(from_ref[i].scores, scores)) << key;
      EXPECT_LE(test::max_abs_diff(from_ref[i].boxes, boxes), 1e-4) << key;
      EXPECT_EQ(from_ours[i].phrases, phrases) << key;
      ASSERT_EQ(from_ours[i].scores.sizes(), scores.sizes()) << key;
      EXPECT_LE(test::max_abs_diff(from_ours[i].scores, scores), 1e-5) << key;
      EXPECT_LE(test::max_abs_diff(from_ours[i].boxes, boxes), 1e-2) << key;
      std::cout << "[" << GetParam().name << " " << key << "] " << phrases.size()
                << " boxes, first phrase '" << phrases[0] << "'\n";
    }
  }
}

TEST_P(GroundingDinoParity, PromptedDetectorMatchesTransformers) {
  // The open-vocabulary contract (models/prompted.h) as the server drives it: per-image label
  // lists merged into captions, the padded batch's pixel_mask, the phrases as label texts.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* p = models::prompted_detector(*model);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(model->description().head, image::DetectionHead::prompted);
  EXPECT_TRUE(p->uses_text_threshold());
  EXPECT_EQ(p->default_thresholds().box_threshold, 0.25);
  EXPECT_EQ(p->default_thresholds().text_threshold, 0.25);
  EXPECT_EQ(p->max_text_length(), 256);
  const auto meta = test::read_json(dir + "/meta.json");
  const std::vector<std::vector<std::vector<std::string>>> labels = {
      {{"a person", "a flag"}, {"a coffee cup", "a spoon? table"}},
      {{"a cat", "A Dog", "remote control"}}};
  for (size_t k = 0; k < 2; ++k) {
    const std::string c = kCases[k];
    const auto& cm = meta.at("cases").at(c);
    const auto q = p->encode_labels(labels[k]);
    EXPECT_TRUE(at::equal(q.input_ids, case_text(dir, c).input_ids)) << c;
    const auto [pixels, mask] = case_pixels(dir, c);
    const auto out = p->forward_prompted_masked(pixels, mask, q);
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const auto& hw : cm.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    const auto dets =
        p->post_process(out, sizes, labels[k], {cm.at("box_threshold"), cm.at("text_threshold")});
    for (size_t i = 0; i < dets.size(); ++i) {
      const auto key = c + "_img" + std::to_string(i) + "_scores";
      EXPECT_EQ(dets[i].phrases,
                cm.at("results")[i].at("text_labels").get<std::vector<std::string>>())
          << key;
      EXPECT_LE(test::max_abs_diff(dets[i].scores, test::expected_tensor(dir, key)), 1e-5) << key;
      EXPECT_TRUE(at::equal(dets[i].labels, at::full({dets[i].scores.numel()}, -1, at::kLong)));
    }
  }
  // The caption holds max_text_len tokens: a label past it is cut; a label with '.' refused.
  std::string long_label;
  for (int i = 0; i < 300; ++i) long_label += "cat ";
  EXPECT_EQ(p->truncation({{"a dog", long_label, "a cat"}}),
            (std::vector<std::vector<bool>>{{false, true, true}}));
  // 130 labels "cat": [CLS] then "cat ." pairs; label j's '.' at 2 (j + 1), past 255 from 127 on.
  const auto cut = p->truncation({std::vector<std::string>(130, "cat")});
  EXPECT_EQ(std::find(cut[0].begin(), cut[0].end(), true) - cut[0].begin(), 127);
  EXPECT_TRUE(cut[0].back());
  try {
    p->truncation({{"st. bernard"}});
    FAIL() << "a label with '.'";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "labels[0][0]: text: label 'st. bernard' contains '.' (send one prompt \"a. b.\" "
              "instead)");
  }
}

TEST_P(GroundingDinoParity, EncodedCaptionsEqualThePromptedForward) {
  // The server's prompt-cache path (text_keys, encode_text once, forward_encoded): one key per
  // image, its caption's exact ids; a single caption gives the uncached forward's bytes, two
  // captions of 8 and 11 tokens encoded apart and padded again give the padded batch's outputs.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* p = models::prompted_detector(*model);
  ASSERT_TRUE(p->caches_text());
  const std::vector<std::vector<std::string>> batch = {{"a person", "a flag"},
                                                       {"a coffee cup", "a spoon? table"}};
  const auto keys = p->text_keys(batch);
  ASSERT_EQ(keys.size(), 2u);
  const auto ids = case_text(dir, "batch").input_ids;
  for (int64_t b = 0; b < 2; ++b) {
    ASSERT_EQ(keys[b].size(), 1u);
    const auto n = static_cast<int64_t>(keys[b][0].size() / sizeof(int64_t));
    EXPECT_EQ(n, b == 0 ? 8 : 11);
    const auto key_ids = at::from_blob(const_cast<char*>(keys[b][0].data()), {n}, at::kLong);
    EXPECT_TRUE(at::equal(key_ids, ids[b].slice(0, 0, n))) << b;
  }
  // Encoded in one call (padded to 11 inside), each piece keeps its own 8 or 11 tokens.
  const auto both = p->encode_text({keys[0][0], keys[1][0]});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].tensors[0].sizes(), (at::IntArrayRef{8, 32}));
  EXPECT_EQ(both[1].tensors[1].sizes(), (at::IntArrayRef{11, 11}));
  EXPECT_EQ(both[0].bytes(), 8 * 32 * 4 + 8 * 8 + 8 * 8 + 8);
  {
    const auto [pixels, mask] = case_pixels(dir, "batch");
    const auto encoded = p->forward_encoded(pixels, mask, {{both[0]}, {both[1]}});
    const auto direct = p->forward_prompted_masked(pixels, mask, p->encode_labels(batch));
    const std::string label = std::string(GetParam().name) + " batch";
    const double dl = finite_diff(encoded.logits, direct.logits, label);
    const double db = test::max_abs_diff(encoded.pred_boxes, direct.pred_boxes);
    std::cout << "[" << label << "] encoded vs prompted: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << "\n";
    EXPECT_LE(dl, 1e-5);
    EXPECT_LE(db, 1e-6);
    EXPECT_LE(finite_diff(encoded.logits, test::expected_tensor(dir, "batch_logits"), label), 1e-4);
  }
  {
    const std::vector<std::vector<std::string>> one = {{"a cat", "A Dog", "remote control"}};
    const auto [pixels, mask] = case_pixels(dir, "labels");
    const auto encoded = p->forward_encoded(pixels, mask, {p->encode_text(p->text_keys(one)[0])});
    const auto direct = p->forward_prompted_masked(pixels, mask, p->encode_labels(one));
    EXPECT_TRUE(at::equal(encoded.logits, direct.logits));
    EXPECT_TRUE(at::equal(encoded.pred_boxes, direct.pred_boxes));
    try {
      p->forward_encoded(pixels, mask, {{both[0]}, {both[1]}});
      FAIL() << "two captions for one image";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(GetParam().model_type) + ": 2 encoded captions for 1 images");
    }
  }
  // 130 labels: 262 ids, the piece cut at max_text_len as the model cuts them.
  const auto cut = p->text_keys({std::vector<std::string>(130, "cat")});
  EXPECT_EQ(cut[0][0].size(), 262 * sizeof(int64_t));
  EXPECT_EQ(p->encode_text(cut[0])[0].tensors[0].sizes(), (at::IntArrayRef{256, 32}));
  try {
    p->encode_text({"abc"});
    FAIL() << "a key of 3 bytes";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string(GetParam().model_type) + ": a caption key of 3 bytes is not token ids");
  }
}

TEST_P(GroundingDinoParity, ProcessorMatchesTransformersPixels) {
  // GroundingDinoImageProcessor is DETR's (shortest/longest edge 96/160 here, bilinear,
  // normalised, zero-padded bottom/right with a pixel mask): the uint8 pixels and masks equal.
  const auto dir = test::model_fixture(GetParam().name);
  const auto proc = image::load_image_processor(dir);
  EXPECT_EQ(proc->config().image_processor_type, "GroundingDinoImageProcessor");
  const auto meta = test::read_json(dir + "/meta.json");
  for (const std::string c : kCases) {
    std::vector<at::Tensor> images;
    for (const auto& name : meta.at("cases").at(c).at("images"))
      images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                                name.get<std::string>()));
    const auto out = proc->preprocess(images);
    const auto ref_u8 = test::expected_tensor(dir, c + "_pixel_u8");
    ASSERT_EQ(out.pixel_u8.sizes(), ref_u8.sizes()) << c;
    EXPECT_TRUE(at::equal(out.pixel_u8, ref_u8)) << c;
    EXPECT_TRUE(
        at::equal(out.pixel_mask.to(at::kByte), test::expected_tensor(dir, c + "_pixel_mask")))
        << c;
    EXPECT_LE(test::max_abs_diff(out.pixel_values, case_pixels(dir, c).first), 1e-6) << c;
  }
}

TEST_P(GroundingDinoParity, BadInputsAreClearErrors) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto& tm = text_model(*model);
  const auto [pixels, mask] = case_pixels(dir, "labels");
  const std::string type = GetParam().model_type;
  try {
    model->forward(pixels, mask);
    FAIL() << "forward without text";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), type + ": needs a text prompt (input_ids)");
  }
  auto text = case_text(dir, "labels");
  gd::TextTensors two{text.input_ids.repeat({2, 1}), at::Tensor(), at::Tensor()};
  try {
    tm.forward_text(pixels, mask, two);
    FAIL() << "batch mismatch";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(type + ": input_ids must be (1, L >= 1) int64"),
              std::string::npos)
        << e.what();
  }
  gd::TextTensors big{text.input_ids.clone(), at::Tensor(), at::Tensor()};
  big.input_ids[0][1] = 5000;  // past the fixture's 1,099-entry vocabulary
  try {
    tm.forward_text(pixels, mask, big);
    FAIL() << "id past the vocabulary";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "bert: input_ids must be in [0, 1099), got [101, 5000]");
  }
  EXPECT_THROW(gd::merge_labels({"a. b"}), std::invalid_argument);
  EXPECT_THROW(gd::encode_prompts(tm.tokenizer(), {"\xff"}), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GroundingDinoParity, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace libreyolo

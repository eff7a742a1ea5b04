// OWL-ViT and OWLv2 (transformers 5.17 OwlViTForObjectDetection, Owlv2ForObjectDetection)
// against two fixtures (tests/fixtures/models/owlvit_tiny/make_fixtures.py): owlvit_tiny and
// owlv2_tiny, each a batch of two photographs with three text queries per image, the tiny CLIP
// tokenizer of tests/fixtures/tokenizers/clip_tiny (OWL-ViT's pad token "!"), image processors
// to 64x64 (OWLv2: padded to a square, blurred, bilinear). Token ids, pixel values, logits,
// boxes, objectness and post_process_grounded_object_detection compared.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/image/decode.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/prompted.h"
#include "tests/parity/checkpoint_copy.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

struct Fixture {
  const char* name;
  const char* model_type;
  bool v2;
};
const Fixture kFixtures[] = {{"owlvit_tiny", "owlvit", false}, {"owlv2_tiny", "owlv2", true}};

std::vector<std::vector<std::string>> fixture_prompts(const std::string& dir) {
  std::vector<std::vector<std::string>> prompts;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& image : meta.at("prompts")) {
    prompts.emplace_back();
    for (const auto& p : image) prompts.back().push_back(p.get<std::string>());
  }
  return prompts;
}

std::vector<at::Tensor> fixture_images(const std::string& dir) {
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  return images;
}

const char* const kTokenizerFiles[] = {"tokenizer.json", "vocab.json", "merges.txt",
                                       "tokenizer_config.json"};

class OwlParity : public ::testing::TestWithParam<Fixture> {};

TEST_P(OwlParity, TokenIdsMatchTheProcessor) {
  // OwlViTProcessor: each label <|startoftext|> ... <|endoftext|>, padded to max_length 16 with
  // the tokenizer's pad token ("!" = id 0 for OWL-ViT, <|endoftext|> for OWLv2).
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* owl = models::prompted_detector(*model);
  ASSERT_NE(owl, nullptr);
  EXPECT_EQ(owl->max_text_length(), 16);
  const auto q = owl->encode_labels(fixture_prompts(dir));
  ASSERT_EQ(q.input_ids.sizes(), (at::IntArrayRef{2, 3, 16}));
  EXPECT_TRUE(at::equal(q.input_ids.reshape({6, 16}), test::expected_tensor(dir, "input_ids")));
  EXPECT_TRUE(
      at::equal(q.attention_mask.reshape({6, 16}), test::expected_tensor(dir, "attention_mask")));
  for (const auto& image : q.truncated)
    for (bool cut : image) EXPECT_FALSE(cut);
}

TEST_P(OwlParity, LogitsBoxesAndObjectnessMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), GetParam().model_type);
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->description().head, image::DetectionHead::prompted);
  const auto* owl = models::prompted_detector(*model);
  ASSERT_NE(owl, nullptr);
  const auto pixels = test::expected_tensor(dir, "pixel_values");
  const auto queries = owl->encode_labels(fixture_prompts(dir));
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = owl->forward_prompted(pixels, queries);
    // (B, 16 patches, 3 labels) and (B, 16, 4).
    ASSERT_EQ(out.logits.sizes(), (at::IntArrayRef{2, 16, 3}));
    const std::string label = std::string(GetParam().name) + (fused ? " sdpa" : " manual");
    test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                        test::expected_tensor(dir, "pred_boxes"), label);
    if (GetParam().v2) {
      const double d = test::max_abs_diff(out.objectness_logits,
                                          test::expected_tensor(dir, "objectness_logits"));
      std::cout << "[" << label << "] max|objectness diff| = " << d << "\n";
      EXPECT_LE(d, 1e-4);
    } else {
      EXPECT_FALSE(out.objectness_logits.defined());
    }
  }
  // Without text the model cannot run: a clear error, not a crash.
  try {
    model->forward(pixels);
    ADD_FAILURE() << "forward without text ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), std::string(GetParam().model_type) +
                                         ": a text-prompted detector: its forward needs text "
                                         "queries");
  }
}

TEST_P(OwlParity, PostProcessingMatchesTransformers) {
  // post_process_grounded_object_detection at thresholds 0 and 0.1 with the photographs' sizes:
  // scores 1e-5, boxes 1e-3 px, labels and their text equal.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* owl = models::prompted_detector(*model);
  const auto prompts = fixture_prompts(dir);
  const auto out = owl->forward_prompted(test::expected_tensor(dir, "pixel_values"),
                                         owl->encode_labels(prompts));
  const auto meta = test::read_json(dir + "/meta.json");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  for (double th : {0.0, 0.1}) {
    models::PromptThresholds t;
    t.box_threshold = th;
    const auto dets = owl->post_process(out, sizes, prompts, t);
    ASSERT_EQ(dets.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const std::string key =
          "th" + std::string(th == 0.0 ? "0.0" : "0.1") + "_img" + std::to_string(i);
      const auto scores = test::expected_tensor(dir, key + "_scores");
      ASSERT_EQ(dets[i].scores.numel(), scores.numel()) << key;
      EXPECT_LE(test::max_abs_diff(dets[i].scores, scores), 1e-5) << key;
      EXPECT_TRUE(at::equal(dets[i].labels, test::expected_tensor(dir, key + "_labels"))) << key;
      EXPECT_LE(test::max_abs_diff(dets[i].boxes, test::expected_tensor(dir, key + "_boxes")), 1e-3)
          << key;
      const auto& text = meta.at("postprocess").at(key).at("text_labels");
      ASSERT_EQ(dets[i].phrases.size(), text.size()) << key;
      for (size_t k = 0; k < text.size(); ++k) EXPECT_EQ(dets[i].phrases[k], text[k]) << key;
    }
  }
  EXPECT_EQ(test::expected_tensor(dir, "th0.0_img0_scores").numel(), 16);
}

TEST_P(OwlParity, ProcessorMatchesTransformersPixelValues) {
  // OwlViTImageProcessor: bicubic (antialiased) uint8 resize to 64x64 then the fused
  // rescale/normalise. Owlv2ImageProcessor: rescale, pad to a square, Gaussian blur, bilinear
  // resize, normalise, on float32.
  const auto dir = test::model_fixture(GetParam().name);
  const auto proc = image::load_image_processor(dir);
  EXPECT_EQ(proc->config().owlv2, GetParam().v2);
  const auto out = proc->preprocess(fixture_images(dir));
  const auto ref = test::expected_tensor(dir, "pixel_values");
  ASSERT_EQ(out.pixel_values.sizes(), ref.sizes());
  EXPECT_FALSE(out.pixel_mask.defined());
  const double dv = test::max_abs_diff(out.pixel_values, ref);
  std::cout << "[" << GetParam().name << "] pixel_values max |diff| " << dv << "\n";
  EXPECT_LE(dv, 1e-5);
  EXPECT_EQ(out.original_sizes, (std::vector<std::pair<int64_t, int64_t>>{{512, 512}, {400, 600}}));
}

TEST_P(OwlParity, BadLabelsAreRefusedNamingTheLabel) {
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* owl = models::prompted_detector(*model);
  auto message = [&](const std::vector<std::vector<std::string>>& labels) -> std::string {
    try {
      owl->encode_labels(labels);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(encoded)";
  };
  EXPECT_EQ(message({{"a cat"}, {}}), "labels[1]: an image needs at least one label");
  EXPECT_EQ(message({{"a cat", std::string("a \xff dog")}}),
            "labels[0][1]: text: invalid UTF-8 at byte 2");
  EXPECT_EQ(message({std::vector<std::string>(10000, "a cat")}),
            "labels[0]: 10000 labels, more than the 256 one image may have");
  // A label past 14 tokens is cut to them, its end token kept, and reported.
  std::string long_label;
  for (int i = 0; i < 40; ++i) long_label += "cat ";
  const auto q = owl->encode_labels({{"a dog", long_label}});
  EXPECT_FALSE(q.truncated[0][0]);
  EXPECT_TRUE(q.truncated[0][1]);
  EXPECT_EQ(q.input_ids[0][1][15].item<int64_t>(), 2109);  // <|endoftext|>
  EXPECT_EQ(q.attention_mask[0][1].sum().item<int64_t>(), 16);
}

TEST_P(OwlParity, ImagesWithDifferentLabelCountsBatchTogether) {
  // A batch whose images carry 3 and 1 labels: the padding query of image 1 is masked (its
  // logits are float32's lowest) and image 1's own logit equals its logit when run alone.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* owl = models::prompted_detector(*model);
  const auto pixels = test::expected_tensor(dir, "pixel_values");
  const auto prompts = fixture_prompts(dir);
  const auto both = owl->forward_prompted(pixels, owl->encode_labels({prompts[0], {"a spoon"}}));
  ASSERT_EQ(both.logits.sizes(), (at::IntArrayRef{2, 16, 3}));
  EXPECT_TRUE(
      both.logits[1].slice(1, 1).eq(std::numeric_limits<float>::lowest()).all().item<bool>());
  const auto alone = owl->forward_prompted(pixels.slice(0, 1), owl->encode_labels({{"a spoon"}}));
  EXPECT_LE(test::max_abs_diff(both.logits[1].slice(1, 0, 1), alone.logits[0]), 1e-5);
  EXPECT_LE(test::max_abs_diff(both.logits[0], test::expected_tensor(dir, "logits")[0]), 1e-4);
  std::vector<std::pair<int64_t, int64_t>> sizes{{512, 512}, {400, 600}};
  const auto dets = owl->post_process(both, sizes, {prompts[0], {"a spoon"}}, {0.0, 0.0});
  for (const auto& p : dets[1].phrases) EXPECT_EQ(p, "a spoon");
}

TEST_P(OwlParity, EncodedLabelsEqualThePromptedForward) {
  // text_keys + encode_text + forward_encoded (the server's prompt cache path) against
  // forward_prompted: the keys are the labels, the labels embedded in another grouping (one call
  // for all six) and stacked per image give the same logits and the same boxes.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam().name);
  auto model = models::load_model(dir);
  const auto* owl = models::prompted_detector(*model);
  ASSERT_TRUE(owl->caches_text());
  const auto pixels = test::expected_tensor(dir, "pixel_values");
  const auto prompts = fixture_prompts(dir);
  EXPECT_EQ(owl->text_keys(prompts), prompts);
  auto all = prompts[0];
  all.insert(all.end(), prompts[1].begin(), prompts[1].end());
  const auto pieces = owl->encode_text(all);
  ASSERT_EQ(pieces.size(), 6u);
  ASSERT_EQ(pieces[0].tensors.size(), 1u);
  EXPECT_EQ(pieces[0].tensors[0].sizes(), (at::IntArrayRef{32}));
  EXPECT_EQ(pieces[0].bytes(), 32 * 4);
  const std::vector<std::vector<models::EncodedText>> per_image = {
      {pieces.begin(), pieces.begin() + 3}, {pieces.begin() + 3, pieces.end()}};
  const auto encoded = owl->forward_encoded(pixels, at::Tensor(), per_image);
  const auto direct = owl->forward_prompted(pixels, owl->encode_labels(prompts));
  const double dl = test::max_abs_diff(encoded.logits, direct.logits);
  std::cout << "[" << GetParam().name << "] encoded vs prompted: max|logits diff| = " << dl << "\n";
  EXPECT_LE(dl, 1e-5);
  EXPECT_TRUE(at::equal(encoded.pred_boxes, direct.pred_boxes));
  EXPECT_LE(test::max_abs_diff(encoded.logits, test::expected_tensor(dir, "logits")), 1e-4);
  // Images with fewer labels: padded with masked queries (float32's lowest).
  const auto fewer = owl->forward_encoded(pixels, at::Tensor(), {per_image[0], {pieces[5]}});
  EXPECT_LE(test::max_abs_diff(fewer.logits[0], encoded.logits[0]), 1e-6);
  EXPECT_TRUE(
      fewer.logits[1].slice(1, 1).eq(std::numeric_limits<float>::lowest()).all().item<bool>());
  // More distinct labels than one image may carry (a batch's, for the server's cache): encoded
  // all the same, piece i the embedding of label i.
  std::vector<std::string> many(300, "a flag");
  many[299] = prompts[0][0];
  const auto more = owl->encode_text(many);
  ASSERT_EQ(more.size(), 300u);
  EXPECT_LE(test::max_abs_diff(more[299].tensors[0], pieces[0].tensors[0]), 1e-6);
  EXPECT_LE(test::max_abs_diff(more[0].tensors[0], pieces[1].tensors[0]), 1e-6);
  try {
    owl->forward_encoded(pixels, at::Tensor(), {per_image[0]});
    ADD_FAILURE() << "one image's labels for two images ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string(GetParam().model_type) +
                  ": embeddings must be (B, Q, 32) with B = 2 and query_mask (B, Q), got [1, 3, "
                  "32] and [1, 3]");
  }
}

TEST_P(OwlParity, StrictLoadingNamesTheKeyAndTheTokenizer) {
  const auto src = test::model_fixture(GetParam().name);
  const std::string base = GetParam().v2 ? "owlv2" : "owlvit";
  // A copy without the tokenizer files: the loader names the one it needs (vocab.json when
  // there is no tokenizer.json).
  const auto dir = test::corrupted_copy(
      src, [](const std::string&, const at::Tensor& t) { return std::optional<at::Tensor>(t); });
  EXPECT_EQ(test::load_error(dir), dir + "/vocab.json: cannot open");
  test::remove_copy(dir);
  // With the tokenizer, a missing tensor is named.
  const auto missing = test::corrupted_copy(src, [&](const std::string& k, const at::Tensor& t) {
    return k == "box_head.dense2.bias" ? std::nullopt : std::optional<at::Tensor>(t);
  });
  for (const char* f : kTokenizerFiles) {
    std::ifstream in(src + "/" + f, std::ios::binary);
    if (!in) continue;  // owlvit_tiny has tokenizer.json, owlv2_tiny vocab.json + merges.txt
    std::ofstream out(missing + "/" + f, std::ios::binary);
    out << in.rdbuf();
  }
  EXPECT_EQ(test::load_error(missing), missing +
                                           "/model.safetensors: checkpoint does not match the "
                                           "model: missing keys (1): box_head.dense2.bias");
  for (const char* f : kTokenizerFiles) std::remove((missing + "/" + f).c_str());
  test::remove_copy(missing);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OwlParity, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace libreyolo

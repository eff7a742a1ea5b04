// image::reading_order and image::post_process_document_layout on hand-made tensors
// (PPDocLayoutV3ImageProcessor._get_order_seqs / post_process_object_detection, transformers 5.17;
// the fixture parity is tests/parity/pp_doclayout_v3_parity_test.cpp), and the
// PPDocLayoutV3ImageProcessor class defaults.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "models/image/document_layout.h"
#include "models/image/processor.h"

namespace libreyolo::image {
namespace {

/// Order logits whose pointer says "i before j" (logit +10 at [i, j], i < j) for the order
/// `ranks` (query q is read at position ranks[q]); -1e4 below the diagonal as the model fills it.
at::Tensor order_logits_for(const std::vector<int64_t>& ranks) {
  const int64_t q = static_cast<int64_t>(ranks.size());
  at::Tensor l = at::full({1, q, q}, -1e4);
  for (int64_t i = 0; i < q; ++i)
    for (int64_t j = i + 1; j < q; ++j) l[0][i][j] = ranks[i] < ranks[j] ? 10.0 : -10.0;
  return l;
}

TEST(DocumentLayout, ReadingOrderRanksTheQueriesAsThePointerSays) {
  // votes_j = sum_{i<j} sigmoid(l_ij) + sum_{i>j} (1 - sigmoid(l_ji)): how many read before j.
  EXPECT_TRUE(at::equal(reading_order(order_logits_for({2, 0, 3, 1})),
                        at::tensor({2, 0, 3, 1}, at::kLong).view({1, 4})));
  EXPECT_TRUE(at::equal(reading_order(order_logits_for({0, 1, 2})),
                        at::tensor({0, 1, 2}, at::kLong).view({1, 3})));
  try {
    reading_order(at::zeros({1, 3, 4}));
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "reading_order: expected order_logits (B, Q, Q), got [1, 3, 4]");
  }
}

TEST(DocumentLayout, KeptDetectionsComeInReadingOrderWithTheirMasks) {
  // 3 queries, 2 classes. Query 0: class 1 at 0.9; query 1: class 0 at 0.8; query 2: 0.2.
  const auto logit = [](double p) { return std::log(p / (1 - p)); };
  at::Tensor logits = at::full({1, 3, 2}, logit(0.1));
  logits[0][0][1] = logit(0.9);
  logits[0][1][0] = logit(0.8);
  logits[0][2][0] = logit(0.2);
  const at::Tensor boxes =
      at::tensor({0.5, 0.5, 0.2, 0.4, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0}, at::kFloat)
          .view({1, 3, 4});
  at::Tensor masks = at::full({1, 3, 2, 2}, -5.0);
  masks[0][0][0][0] = 5.0;  // query 0: top-left pixel
  masks[0][1][1][1] = 5.0;  // query 1: bottom-right pixel
  // Reading order: query 1 first, then query 2, then query 0.
  const auto pages = post_process_document_layout(logits, boxes, order_logits_for({2, 0, 1}), masks,
                                                  {{100, 200}}, 0.5);
  ASSERT_EQ(pages.size(), 1u);
  const auto& p = pages[0];
  // Kept: scores >= 0.5 (0.9 and 0.8), sorted by rank: query 1 (rank 0), query 0 (rank 2).
  EXPECT_TRUE(at::equal(p.order, at::tensor({0, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(p.detections.labels, at::tensor({0, 1}, at::kLong)));
  EXPECT_TRUE(at::allclose(p.detections.scores, at::tensor({0.8f, 0.9f})));
  // (cx, cy, w, h) -> corners x (W=200, H=100).
  EXPECT_TRUE(at::allclose(
      p.detections.boxes,
      at::tensor({0.0f, 0.0f, 100.0f, 50.0f, 80.0f, 30.0f, 120.0f, 70.0f}).view({2, 4})));
  ASSERT_EQ(p.masks.sizes(), (at::IntArrayRef{2, 2, 2}));
  EXPECT_TRUE(p.masks[0][1][1].item<bool>());
  EXPECT_EQ(p.masks[0].sum().item<int64_t>(), 1);
  EXPECT_TRUE(p.masks[1][0][0].item<bool>());
  EXPECT_EQ(p.masks[1].sum().item<int64_t>(), 1);
  // score >= threshold keeps a score equal to it (upstream's >=).
  const auto at_score =
      post_process_document_layout(logits, boxes, order_logits_for({2, 0, 1}), at::Tensor(), {},
                                   at::sigmoid(logits[0][1][0]).item<float>());
  EXPECT_EQ(at_score[0].detections.scores.numel(), 2);
  EXPECT_FALSE(at_score[0].masks.defined());
}

TEST(DocumentLayout, ShapeErrorsNameTheTensor) {
  const at::Tensor logits = at::zeros({1, 3, 2}), boxes = at::zeros({1, 3, 4});
  try {
    post_process_document_layout(logits, boxes, at::zeros({1, 2, 2}), at::Tensor(), {});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "post_process_document_layout: expected order_logits (1, 3, 3), got [1, 2, 2]");
  }
  try {
    post_process_document_layout(logits, boxes, at::zeros({1, 3, 3}), at::Tensor(),
                                 {{1, 1}, {2, 2}});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "post_process_document_layout: 2 target sizes for a batch of 1");
  }
}

TEST(DocumentLayout, ProcessorClassDefaults) {
  const auto c = ProcessorConfig::from_json(
      R"({"image_processor_type": "PPDocLayoutV3ImageProcessor"})", "preprocessor_config.json");
  EXPECT_EQ(c.height, 800);
  EXPECT_EQ(c.width, 800);
  EXPECT_EQ(c.resample, 3);
  EXPECT_FALSE(c.antialias);
  EXPECT_TRUE(c.do_normalize);
  EXPECT_EQ(c.image_mean, (std::array<float, 3>{0.f, 0.f, 0.f}));
  EXPECT_EQ(c.image_std, (std::array<float, 3>{1.f, 1.f, 1.f}));
  EXPECT_FALSE(ProcessorConfig::from_json(
                   R"({"image_processor_type": "PPDocLayoutV2ImageProcessor"})", "p.json")
                   .antialias);
  EXPECT_TRUE(
      ProcessorConfig::from_json(R"({"image_processor_type": "RTDetrImageProcessor"})", "p.json")
          .antialias);
}

}  // namespace
}  // namespace libreyolo::image

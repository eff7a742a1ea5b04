// image::post_process_object_detection's selection above the threshold on the CPU
// (image::detections_above, models/image/query_selection.h) against transformers' formula
// written out in ATen here (RTDetrImageProcessor.post_process_object_detection: topk over
// sigmoid(logits) of the whole batch flattened to Q * C per image, boxes center_to_corners then
// * (w, h, w, h), kept where score > threshold): the same values bit for bit and the same order,
// with each case shown to take the selection or to fall back to the full top-k.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"
#include "models/image/query_selection.h"

namespace {

namespace image = libreyolo::image;

struct Outputs {
  at::Tensor logits;  // (B, Q, C)
  at::Tensor boxes;   // (B, Q, 4)
};

/// transformers' post-processing of image i of a batch, in ATen ops; `size` empty: normalised
/// boxes.
image::Detections reference(const Outputs& o, int64_t i, int64_t k, double threshold,
                            std::optional<std::pair<int64_t, int64_t>> size) {
  const int64_t c = o.logits.size(-1);
  const at::Tensor prob = at::sigmoid(o.logits)[i];  // the whole batch's sigmoid, as upstream
  auto [scores, index] = at::topk(prob.reshape({-1}), k);
  const at::Tensor labels = at::remainder(index, c);
  const at::Tensor query = at::div(index, c, "floor");
  auto u = o.boxes[i].unbind(-1);
  at::Tensor corners =
      at::stack({u[0] - 0.5 * u[2], u[1] - 0.5 * u[3], u[0] + 0.5 * u[2], u[1] + 0.5 * u[3]}, -1);
  corners = corners.index_select(0, query);
  if (size) {
    const auto h = static_cast<float>(size->first), w = static_cast<float>(size->second);
    corners = corners * at::tensor({w, h, w, h});
  }
  const at::Tensor keep = scores.gt(threshold);
  return {scores.index({keep}), labels.index({keep}), corners.index({keep})};
}

void expect_same(const image::Detections& got, const image::Detections& want) {
  ASSERT_EQ(got.scores.sizes(), want.scores.sizes());
  EXPECT_EQ(got.scores.scalar_type(), at::kFloat);
  EXPECT_EQ(got.labels.scalar_type(), at::kLong);
  EXPECT_EQ(got.boxes.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(got.scores, want.scores));
  EXPECT_TRUE(at::equal(got.labels, want.labels));
  EXPECT_TRUE(at::equal(got.boxes, want.boxes));
}

/// A confident detector's outputs: N(-6, 1.5) logits with `planted` scores of 1.0, 1.1, ... at
/// query 7 j, class j.
Outputs confident(int64_t planted, uint64_t seed = 1, int64_t classes = 80) {
  at::manual_seed(seed);
  Outputs o{at::randn({1, 300, classes}) * 1.5 - 6, at::rand({1, 300, 4})};
  for (int64_t j = 0; j < planted; ++j)
    o.logits[0][j * 7 % 300][j % classes] = 1.0 + 0.1 * static_cast<double>(j);
  return o;
}

/// Whether image i takes the selection (detections_above answers) at this k and threshold.
bool selected(const Outputs& o, int64_t i, int64_t k, double threshold) {
  const at::Tensor prob = at::sigmoid(o.logits).contiguous();
  const at::Tensor boxes = o.boxes.contiguous();
  const int64_t q = o.logits.size(1), c = o.logits.size(2);
  return image::detections_above(prob.data_ptr<float>() + i * q * c, q, c, k,
                                 static_cast<float>(threshold), boxes.data_ptr<float>() + i * q * 4,
                                 nullptr)
      .has_value();
}

std::vector<image::Detections> run(const Outputs& o, double threshold, int64_t top_k = 0,
                                   image::DetectionHead head = image::DetectionHead::rt_detr,
                                   bool sized = true) {
  image::PostProcessOptions options;
  options.threshold = threshold;
  options.top_k = top_k;
  std::vector<std::pair<int64_t, int64_t>> sizes;
  if (sized) sizes.assign(o.logits.size(0), {480, 640});
  return image::post_process_object_detection(o.logits, o.boxes, sizes, head, options);
}

TEST(PostProcess, SelectionAboveTheThresholdIsTheTopK) {
  const Outputs o = confident(20);
  ASSERT_TRUE(selected(o, 0, 300, 0.5));
  const auto d = run(o, 0.5);
  ASSERT_EQ(d.size(), 1u);
  ASSERT_EQ(d[0].scores.size(0), 20);
  expect_same(d[0], reference(o, 0, 300, 0.5, std::make_pair(480, 640)));
  // The best is the last planted logit, 2.9, at query 133, class 19.
  EXPECT_EQ(d[0].labels[0].item<int64_t>(), 19);
  EXPECT_FLOAT_EQ(d[0].scores[0].item<float>(), 1.f / (1.f + std::exp(-2.9f)));
  // Without target sizes the boxes stay normalised.
  expect_same(run(o, 0.5, 0, image::DetectionHead::rt_detr, false)[0],
              reference(o, 0, 300, 0.5, std::nullopt));
}

TEST(PostProcess, DeformableDetrKeepsItsHundred) {
  const Outputs o = confident(20);
  ASSERT_TRUE(selected(o, 0, 100, 0.3));
  expect_same(run(o, 0.3, 0, image::DetectionHead::deformable_detr)[0],
              reference(o, 0, 100, 0.3, std::make_pair(480, 640)));
  // 150 scores above the threshold: its top 100 only, by the full top-k.
  const Outputs many = confident(150);
  ASSERT_FALSE(selected(many, 0, 100, 0.5));
  const auto d = run(many, 0.5, 0, image::DetectionHead::deformable_detr);
  EXPECT_EQ(d[0].scores.size(0), 100);
  expect_same(d[0], reference(many, 0, 100, 0.5, std::make_pair(480, 640)));
}

TEST(PostProcess, MoreScoresAboveTheThresholdThanTopKRunTheTopK) {
  const Outputs o = confident(20);
  ASSERT_FALSE(selected(o, 0, 5, 0.5));
  const auto d = run(o, 0.5, /*top_k=*/5);
  ASSERT_EQ(d[0].scores.size(0), 5);
  expect_same(d[0], reference(o, 0, 5, 0.5, std::make_pair(480, 640)));
  // Threshold 0: every one of the 24,000 scores is above it, the top 300 are kept.
  ASSERT_FALSE(selected(o, 0, 300, 0.0));
  const auto all = run(o, 0.0);
  ASSERT_EQ(all[0].scores.size(0), 300);
  expect_same(all[0], reference(o, 0, 300, 0.0, std::make_pair(480, 640)));
}

TEST(PostProcess, TiedScoresRunTheTopK) {
  Outputs o = confident(20);
  o.logits[0][3][5] = 30.0;  // sigmoid saturates: 1.0f, like 40.0
  o.logits[0][9][2] = 40.0;
  ASSERT_FALSE(selected(o, 0, 300, 0.5));
  const auto d = run(o, 0.5);
  ASSERT_EQ(d[0].scores.size(0), 22);
  EXPECT_EQ(d[0].scores[0].item<float>(), 1.f);
  EXPECT_EQ(d[0].scores[1].item<float>(), 1.f);
  expect_same(d[0], reference(o, 0, 300, 0.5, std::make_pair(480, 640)));
}

TEST(PostProcess, NaNScoresTakeTopKPlacesAsTorchRanksThem) {
  Outputs o = confident(4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  o.logits[0][1][1] = nan;
  o.logits[0][2][2] = nan;
  // top_k 4: two NaN rank first, so only the two best of the four planted scores are candidates.
  ASSERT_FALSE(selected(o, 0, 4, 0.5));
  const auto d = run(o, 0.5, 4);
  ASSERT_EQ(d[0].scores.size(0), 2);
  expect_same(d[0], reference(o, 0, 4, 0.5, std::make_pair(480, 640)));
  // top_k 6: the two NaN and all four fit, and the selection keeps the four.
  ASSERT_TRUE(selected(o, 0, 6, 0.5));
  const auto six = run(o, 0.5, 6);
  ASSERT_EQ(six[0].scores.size(0), 4);
  expect_same(six[0], reference(o, 0, 6, 0.5, std::make_pair(480, 640)));
}

// Each image on its own path, and the fallback image's scores from the whole batch's sigmoid:
// 91 classes (Q * C = 27,300, not a multiple of ATen's vector width) and two images, so that
// ATen's sigmoid of one image alone would split its vectorised and scalar elements elsewhere.
TEST(PostProcess, EachImageOfABatchOnItsOwnPath) {
  const Outputs a = confident(20, 1, 91), b = confident(3, 2, 91);
  Outputs both{at::cat({a.logits, b.logits}), at::cat({a.boxes, b.boxes})};
  both.logits[0][4][4] = 50.0;
  both.logits[0][5][5] = 50.0;  // image 0 tied: the full top-k
  ASSERT_FALSE(selected(both, 0, 300, 0.5));
  ASSERT_TRUE(selected(both, 1, 300, 0.5));
  const auto d = run(both, 0.5);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].scores.size(0), 22);
  EXPECT_EQ(d[1].scores.size(0), 3);
  expect_same(d[0], reference(both, 0, 300, 0.5, std::make_pair(480, 640)));
  expect_same(d[1], reference(both, 1, 300, 0.5, std::make_pair(480, 640)));
}

TEST(PostProcess, NothingAboveTheThreshold) {
  const Outputs o = confident(0);
  ASSERT_TRUE(selected(o, 0, 300, 0.5));
  const auto d = run(o, 0.5);
  EXPECT_EQ(d[0].scores.size(0), 0);
  EXPECT_EQ(d[0].boxes.sizes(), (at::IntArrayRef{0, 4}));
  EXPECT_EQ(d[0].labels.scalar_type(), at::kLong);
}

}  // namespace

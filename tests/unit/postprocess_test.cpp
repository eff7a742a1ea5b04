// image::post_process_object_detection's selection above the threshold on the CPU
// (models/image/postprocess.cpp detections_above) against transformers' formula written out in
// ATen here (RTDetrImageProcessor.post_process_object_detection: topk over sigmoid(logits)
// flattened to Q * C, boxes center_to_corners then * (w, h, w, h), kept where score >
// threshold): the same values bit for bit, and the same order, in each case that takes the
// selection and each that falls back to the full top-k.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"

namespace {

namespace image = libreyolo::image;

/// transformers' post-processing of one image, in ATen ops.
image::Detections reference(const at::Tensor& logits, const at::Tensor& boxes, int64_t k,
                            double threshold, std::pair<int64_t, int64_t> size) {
  const int64_t c = logits.size(-1);
  auto [scores, index] = at::topk(at::sigmoid(logits).reshape({-1}), k);
  const at::Tensor labels = at::remainder(index, c);
  const at::Tensor query = at::div(index, c, "floor");
  auto u = boxes.unbind(-1);
  at::Tensor corners =
      at::stack({u[0] - 0.5 * u[2], u[1] - 0.5 * u[3], u[0] + 0.5 * u[2], u[1] + 0.5 * u[3]}, -1);
  const auto h = static_cast<float>(size.first), w = static_cast<float>(size.second);
  corners = corners.index_select(0, query) * at::tensor({w, h, w, h});
  const at::Tensor keep = scores.gt(threshold);
  return {scores.index({keep}), labels.index({keep}), corners.index({keep})};
}

void expect_same(const image::Detections& got, const image::Detections& want) {
  ASSERT_EQ(got.scores.sizes(), want.scores.sizes());
  EXPECT_TRUE(at::equal(got.scores, want.scores));
  EXPECT_TRUE(at::equal(got.labels, want.labels));
  EXPECT_TRUE(at::equal(got.boxes, want.boxes));
}

struct Outputs {
  at::Tensor logits;  // (1, 300, 80)
  at::Tensor boxes;   // (1, 300, 4)
};

/// A confident detector's outputs: N(-6, 1.5) logits with `planted` scores of 1.0, 1.1, ...
Outputs confident(int64_t planted, uint64_t seed = 1) {
  at::manual_seed(seed);
  Outputs o{at::randn({1, 300, 80}) * 1.5 - 6, at::rand({1, 300, 4})};
  for (int64_t j = 0; j < planted; ++j)
    o.logits[0][j * 7 % 300][j % 80] = 1.0 + 0.1 * static_cast<double>(j);
  return o;
}

std::vector<image::Detections> run(const Outputs& o, double threshold, int64_t top_k = 0,
                                   image::DetectionHead head = image::DetectionHead::rt_detr) {
  image::PostProcessOptions options;
  options.threshold = threshold;
  options.top_k = top_k;
  std::vector<std::pair<int64_t, int64_t>> sizes(o.logits.size(0), {480, 640});
  return image::post_process_object_detection(o.logits, o.boxes, sizes, head, options);
}

TEST(PostProcess, SelectionAboveTheThresholdIsTheTopK) {
  const Outputs o = confident(20);
  const auto d = run(o, 0.5);
  ASSERT_EQ(d.size(), 1u);
  ASSERT_EQ(d[0].scores.size(0), 20);
  expect_same(d[0], reference(o.logits[0], o.boxes[0], 300, 0.5, {480, 640}));
  // The best is the last planted logit, 2.9, at query 133, class 19.
  EXPECT_EQ(d[0].labels[0].item<int64_t>(), 19);
  EXPECT_FLOAT_EQ(d[0].scores[0].item<float>(), 1.f / (1.f + std::exp(-2.9f)));
}

TEST(PostProcess, DeformableDetrKeepsItsHundred) {
  const Outputs o = confident(20);
  const auto d = run(o, 0.3, 0, image::DetectionHead::deformable_detr);
  expect_same(d[0], reference(o.logits[0], o.boxes[0], 100, 0.3, {480, 640}));
}

TEST(PostProcess, MoreScoresAboveTheThresholdThanTopKRunTheTopK) {
  const Outputs o = confident(20);
  const auto d = run(o, 0.5, /*top_k=*/5);
  ASSERT_EQ(d[0].scores.size(0), 5);
  expect_same(d[0], reference(o.logits[0], o.boxes[0], 5, 0.5, {480, 640}));
  // Threshold 0: every one of the 24,000 scores is above it, the top 300 are kept.
  const auto all = run(o, 0.0);
  ASSERT_EQ(all[0].scores.size(0), 300);
  expect_same(all[0], reference(o.logits[0], o.boxes[0], 300, 0.0, {480, 640}));
}

TEST(PostProcess, TiedScoresRunTheTopK) {
  Outputs o = confident(20);
  o.logits[0][3][5] = 30.0;  // sigmoid saturates: 1.0f, like 40.0
  o.logits[0][9][2] = 40.0;
  const auto d = run(o, 0.5);
  ASSERT_EQ(d[0].scores.size(0), 22);
  EXPECT_EQ(d[0].scores[0].item<float>(), 1.f);
  EXPECT_EQ(d[0].scores[1].item<float>(), 1.f);
  expect_same(d[0], reference(o.logits[0], o.boxes[0], 300, 0.5, {480, 640}));
}

TEST(PostProcess, NaNScoresTakeTopKPlacesAsTorchRanksThem) {
  Outputs o = confident(4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  o.logits[0][1][1] = nan;
  o.logits[0][2][2] = nan;
  // top_k 4: two NaN rank first, so only the two best of the four planted scores are candidates.
  const auto d = run(o, 0.5, 4);
  ASSERT_EQ(d[0].scores.size(0), 2);
  expect_same(d[0], reference(o.logits[0], o.boxes[0], 4, 0.5, {480, 640}));
  // top_k 6: all four, as the selection finds them.
  const auto six = run(o, 0.5, 6);
  ASSERT_EQ(six[0].scores.size(0), 4);
  expect_same(six[0], reference(o.logits[0], o.boxes[0], 6, 0.5, {480, 640}));
}

TEST(PostProcess, EachImageOfABatchOnItsOwnPath) {
  const Outputs a = confident(20, 1), b = confident(3, 2);
  Outputs both{at::cat({a.logits, b.logits}), at::cat({a.boxes, b.boxes})};
  both.logits[0][4][4] = 50.0;
  both.logits[0][5][5] = 50.0;  // image 0 tied: the full top-k
  const auto d = run(both, 0.5);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].scores.size(0), 22);
  EXPECT_EQ(d[1].scores.size(0), 3);
  expect_same(d[0], reference(both.logits[0], both.boxes[0], 300, 0.5, {480, 640}));
  expect_same(d[1], reference(both.logits[1], both.boxes[1], 300, 0.5, {480, 640}));
}

TEST(PostProcess, NothingAboveTheThreshold) {
  const Outputs o = confident(0);
  const auto d = run(o, 0.5);
  EXPECT_EQ(d[0].scores.size(0), 0);
  EXPECT_EQ(d[0].boxes.sizes(), (at::IntArrayRef{0, 4}));
  EXPECT_EQ(d[0].labels.scalar_type(), at::kLong);
}

}  // namespace

// Instance segmentation post-processing against transformers 5.17
// (RfDetrImageProcessor.post_process_instance_segmentation, return_binary_maps=True, and the
// boxes of post_process_object_detection): tests/fixtures/ops/instance_segmentation.safetensors,
// written by tests/fixtures/ops/make_instance_segmentation.py. COCO RLE against the generator's
// column-major encoding.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/core/safetensors.h"
#include "models/image/instance_segmentation.h"

namespace {

namespace fs = std::filesystem;
using libreyolo::image::InstanceSegmentationOptions;
using libreyolo::models::core::SafetensorsFile;

const fs::path kFixture =
    fs::path(LIBREYOLO_TEST_FIXTURES) / "ops" / "instance_segmentation.safetensors";

struct Case {
  double threshold, mask_threshold;
  int64_t top_k;
  bool sized;
};
// tests/fixtures/ops/make_instance_segmentation.py CASES.
const Case kCases[] = {{0.3, 0.0, 0, true}, {0.5, 0.5, 0, false}, {0.0, 0.0, 5, true}};

TEST(InstanceSegmentationParity, MasksScoresLabelsBoxesAndRleEqualTransformers) {
  auto f = SafetensorsFile::open(kFixture.string());
  const at::Tensor sizes_t = f->view("target_sizes");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (int64_t i = 0; i < sizes_t.size(0); ++i)
    sizes.emplace_back(sizes_t[i][0].item<int64_t>(), sizes_t[i][1].item<int64_t>());
  int64_t instances = 0;
  for (std::size_t c = 0; c < std::size(kCases); ++c) {
    InstanceSegmentationOptions o;
    o.threshold = kCases[c].threshold;
    o.mask_threshold = kCases[c].mask_threshold;
    o.top_k = kCases[c].top_k;
    const auto out = libreyolo::image::post_process_instance_segmentation(
        f->view("logits"), f->view("pred_boxes"), f->view("pred_masks"),
        kCases[c].sized ? sizes : std::vector<std::pair<int64_t, int64_t>>{}, o);
    ASSERT_EQ(out.size(), 2u);
    for (int64_t i = 0; i < 2; ++i) {
      const std::string p = "c" + std::to_string(c) + "_img" + std::to_string(i) + "_";
      SCOPED_TRACE(p);
      const auto& r = out[i];
      const at::Tensor masks = f->view(p + "masks");
      ASSERT_EQ(r.masks.sizes(), masks.sizes());
      EXPECT_TRUE(at::equal(r.masks.to(at::kByte), masks)) << "masks differ";
      EXPECT_TRUE(at::equal(r.detections.labels, f->view(p + "labels")));
      EXPECT_LE((r.detections.scores - f->view(p + "scores")).abs().max().item<float>(), 0.0f);
      EXPECT_LE((r.detections.boxes - f->view(p + "boxes")).abs().max().item<float>(), 1e-5f);
      // COCO RLE of every mask.
      const at::Tensor counts = f->view(p + "rle_counts");
      const at::Tensor lengths = f->view(p + "rle_lengths");
      int64_t at = 0;
      for (int64_t k = 0; k < r.masks.size(0); ++k) {
        const auto ours = libreyolo::image::coco_rle_counts(r.masks[k]);
        const int64_t n = lengths[k].item<int64_t>();
        ASSERT_EQ(static_cast<int64_t>(ours.size()), n) << "mask " << k;
        for (int64_t j = 0; j < n; ++j) EXPECT_EQ(ours[j], counts[at + j].item<int64_t>());
        at += n;
      }
      instances += r.masks.size(0);
    }
  }
  // 10 + 10, 10 + 10, 3 + 3 instances (the generator's printout); some detections dropped for
  // an empty mask in every case.
  EXPECT_EQ(instances, 46);
}

TEST(InstanceSegmentationParity, CocoRleOfLargeMasksEqualsThePixelByPixelRuns) {
  // The memchr run search against the definition, pixel by pixel, on masks with runs of every
  // length (random) and on the fuzzer's tall 8388615 x 5 shape (oip_request_fuzz), one run
  // starting with a set pixel, and an empty mask.
  const auto reference = [](const at::Tensor& mask) {
    const at::Tensor t = mask.ne(0).t().contiguous().to(at::kByte);
    const auto* p = t.data_ptr<uint8_t>();
    std::vector<int64_t> counts;
    uint8_t value = 0;
    int64_t run = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (p[i] != value) {
        counts.push_back(run);
        value = p[i];
        run = 0;
      }
      ++run;
    }
    counts.push_back(run);
    return counts;
  };
  at::manual_seed(7);
  const at::Tensor random = at::rand({480, 640}).gt(0.5);
  const auto counts = libreyolo::image::coco_rle_counts(random);
  EXPECT_EQ(counts, reference(random));
  EXPECT_GT(counts.size(), 100000u);
  at::Tensor tall = at::zeros({8388615, 5}, at::kBool);
  tall.narrow(0, 1000, 3).fill_(true);
  tall[8388614][4] = true;
  const auto tall_counts = libreyolo::image::coco_rle_counts(tall);
  EXPECT_EQ(tall_counts, reference(tall));
  // Six runs of ones (rows 1000-1002 of each column, the last pixel), each after a zero run.
  EXPECT_EQ(tall_counts.size(), 12u);
  EXPECT_EQ(libreyolo::image::coco_rle_counts(at::zeros({0, 4}, at::kBool)),
            (std::vector<int64_t>{0}));
}

TEST(InstanceSegmentationParity, CocoRleIsColumnMajorStartingWithZeros) {
  // [[1, 0, 0],
  //  [1, 1, 0]]  column-major: 1 1 | 0 1 | 0 0 -> runs 0, 2, 1, 1, 2 (row-major would give
  //  0, 1, 2, 2, 1).
  const at::Tensor m = at::tensor({1, 0, 0, 1, 1, 0}, at::kByte).view({2, 3});
  EXPECT_EQ(libreyolo::image::coco_rle_counts(m), (std::vector<int64_t>{0, 2, 1, 1, 2}));
  EXPECT_EQ(libreyolo::image::coco_rle_counts(at::zeros({2, 2}, at::kBool)),
            (std::vector<int64_t>{4}));
  EXPECT_EQ(libreyolo::image::coco_rle_counts(at::ones({1, 3}, at::kBool)),
            (std::vector<int64_t>{0, 3}));
  try {
    libreyolo::image::coco_rle_counts(at::zeros({2}, at::kBool));
    FAIL() << "a 1-D mask was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "coco_rle_counts: expected a (H, W) mask, got [2]");
  }
}

TEST(InstanceSegmentationParity, ShapeErrorsNameTheTensors) {
  try {
    libreyolo::image::post_process_instance_segmentation(at::zeros({1, 3, 2}), at::zeros({1, 3, 4}),
                                                         at::zeros({1, 2, 4, 4}), {});
    FAIL() << "mismatched query counts were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "post_process_instance_segmentation: expected logits (B, Q, C), pred_boxes "
                 "(B, Q, 4) and pred_masks (B, Q, h, w), got [1, 3, 2], [1, 3, 4] and "
                 "[1, 2, 4, 4]");
  }
  try {
    libreyolo::image::post_process_instance_segmentation(at::zeros({1, 3, 2}), at::zeros({1, 3, 4}),
                                                         at::zeros({1, 3, 4, 4}), {{4, 4}, {5, 5}});
    FAIL() << "two target sizes for one image were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "post_process_instance_segmentation: 2 target sizes for a batch of 1");
  }
}

TEST(InstanceSegmentationParity, MaskBudgetNamesAnyPixelCount) {
  // Regression (oip_request_fuzz, docs/FUZZING.md): 3 instances at 4e18 x 4e18 make 4.8e37 mask
  // pixels; the budget's message cast that double to an integer (UB). Below 2^63 the count is
  // exact.
  libreyolo::image::InstanceSegmentationOptions o;
  o.threshold = 0.0;
  o.max_mask_pixels = 1000;
  const auto logits = at::full({1, 3, 1}, 5.0);  // every query kept
  for (const auto& [side, count] : std::vector<std::pair<int64_t, std::string>>{
           {int64_t{4} * 1000000000000000000, "4.8e+37"}, {100, "30000"}}) {
    try {
      libreyolo::image::post_process_instance_segmentation(
          logits, at::full({1, 3, 4}, 0.5), at::zeros({1, 3, 4, 4}), {{side, side}}, o);
      FAIL() << "the budget was not applied";
    } catch (const std::length_error& e) {
      EXPECT_EQ(std::string(e.what()), "post_process_instance_segmentation: 3 instances make " +
                                           count + " mask pixels, above the limit of 1000");
    }
  }
}

}  // namespace

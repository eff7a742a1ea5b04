// What a loaded model says about itself (models::ModelDescription, read from config.json once
// by load_model) and the one input rule of every family (models::check_pixel_values).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "models/model.h"

namespace libreyolo::models {
namespace {

std::string fixture(const std::string& name) {
  return std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + name;
}

TEST(ModelDescription, DetectorsReadQueriesLabelsAndHeadFromConfigJson) {
  const auto rtdetr = load_model(fixture("rtdetr_tiny"));
  const auto& d = rtdetr->description();
  EXPECT_EQ(d.model_type, "rt_detr");
  EXPECT_EQ(d.task, Task::object_detection);
  EXPECT_EQ(d.num_queries, 30);  // config.json num_queries
  EXPECT_EQ(d.num_labels, 10);   // config.json id2label
  EXPECT_EQ(d.head, image::DetectionHead::rt_detr);
  EXPECT_TRUE(d.use_focal_loss);

  const auto deformable = load_model(fixture("deformable_detr_tiny"));
  EXPECT_EQ(deformable->description().num_queries, 12);
  EXPECT_EQ(deformable->description().head, image::DetectionHead::deformable_detr);
}

TEST(ModelDescription, ClassifiersHaveLabelsAndNoQueries) {
  const auto vit = load_model(fixture("vit_tiny"));
  const auto& d = vit->description();
  EXPECT_EQ(d.model_type, "vit");
  EXPECT_EQ(d.task, Task::image_classification);
  EXPECT_EQ(d.num_labels, 5);
  EXPECT_EQ(d.num_queries, -1);
}

void expect_invalid(const at::Tensor& t, int64_t min_size, int64_t multiple,
                    const std::string& message) {
  try {
    check_pixel_values("rt_detr", t, 3, min_size, multiple);
    ADD_FAILURE() << "no throw for " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(CheckPixelValues, OneRuleWithExactMessages) {
  check_pixel_values("rt_detr", at::zeros({2, 3, 64, 96}), 3, 32, 32);
  check_pixel_values("rt_detr", at::zeros({1, 3, 64, 64}, at::kBFloat16), 3, 32, 32);
  expect_invalid(at::zeros({1, 3, 100, 64}), 32, 32,
                 "rt_detr: pixel_values must be (B, 3, H, W) with B >= 1 and H, W >= 32 and "
                 "multiples of 32, got [1, 3, 100, 64]");
  expect_invalid(at::zeros({3, 64, 64}), 1, 1,
                 "rt_detr: pixel_values must be (B, 3, H, W) with B >= 1 and H, W >= 1, got "
                 "[3, 64, 64]");
  expect_invalid(at::Tensor(), 1, 1,
                 "rt_detr: pixel_values must be (B, 3, H, W) with B >= 1 and H, W >= 1, got []");
  expect_invalid(at::zeros({1, 3, 64, 64}, at::kDouble), 32, 32,
                 "rt_detr: pixel_values must be float32, float16 or bfloat16, got Double");
}

}  // namespace
}  // namespace libreyolo::models

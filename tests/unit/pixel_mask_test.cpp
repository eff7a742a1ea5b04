// models/core/pixel_mask.h: the pixel_mask rule Deformable DETR and LW-DETR share.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <stdexcept>

#include "models/core/pixel_mask.h"

namespace {

using libreyolo::models::core::checked_pixel_mask;

TEST(PixelMask, AbsentIsOnesGivenIsCheckedAndKept) {
  const at::Tensor pv = at::zeros({2, 3, 4, 5});
  const at::Tensor ones = checked_pixel_mask("lw_detr", pv, at::Tensor(), at::kCPU);
  EXPECT_EQ(ones.sizes(), (at::IntArrayRef{2, 4, 5}));
  EXPECT_EQ(ones.scalar_type(), at::kLong);
  EXPECT_EQ(ones.sum().item<int64_t>(), 40);
  const at::Tensor m = at::zeros({2, 4, 5}, at::kBool);
  EXPECT_EQ(checked_pixel_mask("lw_detr", pv, m, at::kCPU).scalar_type(), at::kBool);
  try {
    checked_pixel_mask("lw_detr", pv, at::zeros({2, 4, 4}, at::kLong), at::kCPU);
    FAIL() << "a (2, 4, 4) mask was accepted for (2, 3, 4, 5) pixels";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "lw_detr: pixel_mask must be (B, H, W) = (2, 4, 5), got [2, 4, 4]");
  }
  try {
    checked_pixel_mask("deformable_detr", pv, at::zeros({2, 4, 5}), at::kCPU);
    FAIL() << "a float mask was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "deformable_detr: pixel_mask must be an integer or bool tensor, got Float");
  }
}

}  // namespace

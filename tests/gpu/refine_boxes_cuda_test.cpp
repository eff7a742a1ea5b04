// The `cuda` refine_boxes (kernels/box/cuda/refine_boxes_cuda.h) against upstream's ATen
// expression on the same device, bit for bit (NaN where it is NaN), in float32 / float16 /
// bfloat16, on boxes inside, at and beyond [0, 1], below eps and within eps of 1, at batch 1 and
// 32 of RT-DETR's 300 queries. Declines (autograd, CPU tensors, non-contiguous operands) run
// nothing. Called through a registry binding, as models call it. Skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/box/refine_boxes.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

at::Tensor upstream(const at::Tensor& delta, const at::Tensor& ref, double eps) {
  const auto c = ref.clamp(0, 1);
  return at::sigmoid(delta + at::log(c.clamp_min(eps) / (1 - c).clamp_min(eps)));
}

TEST(RefineBoxesCuda, EqualsUpstreamExpressionBitForBit) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kRefineBoxes, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(9);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t B : {1, 32}) {
      for (double eps : {1e-5, 1e-3}) {
        auto ref = at::rand({B, 300, 4}) * 1.4 - 0.2;
        auto flat = ref.view(-1);
        const float specials[] = {0.0f, 1.0f, 1e-7f, 1.0f - 1e-7f, 2e-5f, -3.0f, 4.0f, NAN};
        for (int i = 0; i < 8; ++i) flat[i] = specials[i];
        const auto r = ref.to(at::kCUDA).to(dtype);
        const auto delta = (at::randn({B, 300, 4}) * 3).to(at::kCUDA).to(dtype);
        const std::string what = c10::str(dtype, " B=", B, " eps=", eps);
        const auto got = handle(delta, r, eps);
        ASSERT_TRUE(got.has_value()) << "declined: " << what;
        const auto expected = upstream(delta, r, eps);
        EXPECT_EQ(test::bit_mismatches(got->to(at::kFloat), expected.to(at::kFloat)), 0)
            << what << " max |diff| " << test::max_abs_diff(*got, expected);
        EXPECT_EQ(at::isnan(*got).sum().item<int64_t>(), 1) << what;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12);
  test::expect_calls_and_declines(reg, kRefineBoxes.name, "cuda", 12, {});
}

TEST(RefineBoxesCuda, DeclinesWhatItDoesNotHandle) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kRefineBoxes, test::cuda_context());
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const auto a = at::rand({2, 5, 4}, opts);
  EXPECT_FALSE(handle(a.cpu(), a.cpu(), 1e-5).has_value());
  EXPECT_FALSE(handle(a.transpose(0, 1), a.transpose(0, 1), 1e-5).has_value());
  {
    const auto g = a.clone().requires_grad_(true);
    EXPECT_FALSE(handle(g, a, 1e-5).has_value());
  }
  EXPECT_FALSE(handle(a.to(at::kDouble), a.to(at::kDouble), 1e-5).has_value());
  test::expect_calls_and_declines(reg, kRefineBoxes.name, "cuda", 0,
                                  {{"cuda: not a CUDA tensor", 1},
                                   {"cuda: delta or reference not contiguous", 1},
                                   {"cuda: autograd (no backward)", 1},
                                   {"cuda: dtype (float32, float16, bfloat16 only)", 1}});
}

}  // namespace
}  // namespace libreyolo::kernels

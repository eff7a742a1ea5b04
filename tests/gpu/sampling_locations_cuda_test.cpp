// The `cuda` sampling_locations (kernels/attention/cuda/sampling_locations_cuda.h) against
// upstream's ATen expression on the same device, bit for bit (at::equal): RT-DETR v1's
// `offsets / P` (P = 4, and P = 3 whose float32 reciprocal rounds), D-FINE's per-point scales
// with offset_scale 0.5 and 0.3, in float32 / float16 / bfloat16, on reference boxes handed over
// as a strided slice, as one level of LW-DETR's expanded (B, Q, L, 4) boxes and expanded over the
// batch, directly and through the entry point's (B, Q, 1, 4) form, at batch 1 and 32. Declines
// (autograd, CPU tensors, non-contiguous offsets) run nothing. Called through a registry binding,
// as models call it. Skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/attention/sampling_locations.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

// Upstream's expressions (modeling_rt_detr.py v1, modeling_d_fine.py) on (B, Q, 4) boxes.
at::Tensor upstream(const at::Tensor& offsets, const at::Tensor& boxes, const PointScale& scale,
                    double factor) {
  const auto r = boxes.unsqueeze(2).unsqueeze(3);  // (B, Q, 1, 1, 4)
  const auto scaled = scale.per_point.defined() ? offsets * scale.per_point.unsqueeze(-1)
                                                : offsets / static_cast<int64_t>(scale.divisor);
  return r.slice(-1, 0, 2) + scaled * r.slice(-1, 2, 4) * factor;
}

TEST(SamplingLocationsCuda, EqualsUpstreamExpressionBitForBit) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kSamplingLocations, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(7);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    std::vector<float> dfine;
    for (int64_t p : {3, 6, 3})
      for (int64_t i = 0; i < p; ++i) dfine.push_back(1.0f / static_cast<float>(p));
    const auto nps = at::tensor(dfine).to(opts);
    struct Form {
      PointScale scale;
      int64_t n;
      double factor;
      const char* name;
    };
    const std::vector<Form> forms{{PointScale::divide_by(4), 3 * 4, 0.5, "/4"},
                                  {PointScale::divide_by(3), 4 * 3, 0.5, "/3"},
                                  {PointScale::multiply_by(nps), 12, 0.5, "dfine 0.5"},
                                  {PointScale::multiply_by(nps), 12, 0.3, "dfine 0.3"}};
    for (const auto& form : forms) {
      for (int64_t B : {1, 32}) {
        const int64_t Q = 300, H = 8, L = 3;
        const auto offsets = at::randn({B, Q, H, form.n, 2}, opts) * 3;
        // A strided slice of a wider tensor, level 0 of an expanded (B, Q, L, 4) (LW-DETR's
        // hand-over), and one image's boxes expanded over the batch (batch stride 0).
        const auto sliced = (at::rand({B, Q, 6}, opts)).slice(-1, 1, 5);
        const auto expanded = at::rand({B, Q, 4}, opts).unsqueeze(2).expand({-1, -1, L, -1});
        const auto shared = at::rand({1, Q, 4}, opts).expand({B, -1, -1});
        for (const auto& boxes : {sliced, expanded.select(2, 0), shared}) {
          const std::string what = c10::str(dtype, " ", form.name, " B=", B);
          auto got = handle(offsets, boxes, form.scale.per_point, form.scale.divisor, form.factor);
          ASSERT_TRUE(got.has_value()) << "declined: " << what;
          const auto expected = upstream(offsets, boxes, form.scale, form.factor);
          EXPECT_TRUE(at::equal(*got, expected))
              << what << " max |diff| " << test::max_abs_diff(*got, expected) << " bits differing "
              << test::bit_mismatches(got->to(at::kFloat), expected.to(at::kFloat));
          // The entry point with the handle and the (B, Q, 1, 4) form, the same values.
          EXPECT_TRUE(at::equal(
              sampling_locations(handle, offsets, boxes.unsqueeze(2), form.scale, form.factor),
              expected))
              << what;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 2 * 3);
  test::expect_calls_and_declines(reg, "sampling_locations", "cuda", 2 * checked, {});
}

TEST(SamplingLocationsCuda, DeclinesWhatItDoesNotCompute) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kSamplingLocations, test::cuda_context());
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const auto boxes = at::rand({1, 5, 4}, opts);
  // Offsets that require grad (autograd on), CPU tensors, offsets not contiguous.
  EXPECT_FALSE(
      handle(at::zeros({1, 5, 2, 3, 2}, opts).requires_grad_(), boxes, {}, 3.0, 0.5).has_value());
  EXPECT_FALSE(handle(at::zeros({1, 5, 2, 3, 2}), boxes.cpu(), {}, 3.0, 0.5).has_value());
  EXPECT_FALSE(
      handle(at::zeros({1, 5, 3, 2, 2}, opts).transpose(2, 3), boxes, {}, 3.0, 0.5).has_value());
  test::expect_calls_and_declines(
      reg, "sampling_locations", "cuda", 0,
      {{"cuda: autograd (no backward)", 1},
       {"cuda: not a CUDA tensor", 1},
       {"cuda: offsets or per_point not contiguous, or boxes' last dimension strided", 1}});
}

}  // namespace
}  // namespace libreyolo::kernels

// fake_quant_fp8: bit-exact against the fixture (per-tensor scales 1, 0.5, 0 and per-channel),
// straight-through gradient, NaN/inf behaviour, errors, and the slot's resolution.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>

#include "kernels/kernels.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "kernels/registry.h"
#include "ops_safetensors_util.h"

namespace libreyolo::kernels {
namespace {

using test::fixture_path;
using test::load_safetensors;

/// Number of elements whose float32 bit patterns differ (NaN payloads included).
int64_t bit_mismatches(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_EQ(b.scalar_type(), at::kFloat);
  return a.contiguous().view(at::kInt).ne(b.contiguous().view(at::kInt)).sum().item<int64_t>();
}

/// What the process registry selects for fake_quant_fp8 on this machine.
std::string expected_selection() {
  return built_with_cuda() && at::hasCUDA() ? "cuda" : kReference;
}

class OpsFakeQuantFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = load_safetensors(fixture_path("ops/fake_quant_fp8.safetensors"));
  }
  /// fake_quant_fp8 through a handle bound from the process registry for `device`.
  static at::Tensor fake_quant_fp8(const at::Tensor& x, const at::Tensor& scale) {
    BindContext c;
    c.device = x.is_cuda() ? BindContext::Device::cuda : BindContext::Device::cpu;
    return kernels::fake_quant_fp8(Registry::process_default().bind(kFakeQuantFp8, c), x, scale);
  }

  std::map<std::string, at::Tensor> fixture_;
};

TEST_F(OpsFakeQuantFp8, PerTensorIsBitExact) {
  const auto& x = fixture_.at("x");
  int scales = 0;
  for (const auto& [key, expected] : fixture_) {
    if (key.rfind("expected_", 0) != 0) continue;
    const std::string suffix = key.substr(std::string("expected_").size());
    const auto& scale = fixture_.at("scale_" + suffix);
    const int64_t slot = bit_mismatches(fake_quant_fp8(x, scale), expected);
    const int64_t ref = bit_mismatches(fake_quant_fp8_reference(x, scale), expected);
    std::cout << "[fake_quant_fp8 scale " << scale.item<float>() << "] bit mismatches: slot "
              << slot << ", reference " << ref << " of " << x.numel() << "\n";
    EXPECT_EQ(slot, 0) << key;
    EXPECT_EQ(ref, 0) << key;
    ++scales;
  }
  EXPECT_EQ(scales, 3);  // s1, s0p5, s_tiny (0 clamped to 1e-12)
}

TEST_F(OpsFakeQuantFp8, PerChannelIsBitExact) {
  const auto& w = fixture_.at("w");
  auto scale = fixture_.at("w_scale").view({w.size(0), 1});
  const int64_t n = bit_mismatches(fake_quant_fp8(w, scale), fixture_.at("w_expected"));
  std::cout << "[fake_quant_fp8 per-channel] bit mismatches: " << n << " of " << w.numel() << "\n";
  EXPECT_EQ(n, 0);
}

TEST_F(OpsFakeQuantFp8, TrueDivisionAndTiesToEven) {
  // The fixture's scales are powers of two or per-channel values for which x / s and
  // x * (1 / s) agree; these two inputs (found by search) tell them apart, at E4M3 ties.
  auto from_bits = [](int32_t bits) { return at::tensor({bits}).view(at::kFloat); };
  // 56.999996f / 3 = 18.999998f -> 18 (below the 17..19 tie); 56.999996f * (1/3.f) = 19.0f, a
  // tie between 18 and 20 that goes to the even mantissa, 20.
  auto a = fake_quant_fp8(from_bits(1113849855), at::tensor({3.0f}));
  EXPECT_EQ(a.item<float>(), 18.0f * 3.0f);
  // 20.9f / 1.1f = 19.0f exactly: tie -> 20 (even); the reciprocal product 18.999998f -> 18.
  auto b = fake_quant_fp8(from_bits(1101476659), at::tensor({1.1f}));
  EXPECT_EQ(b.item<float>(), 20.0f * 1.1f);
}

TEST_F(OpsFakeQuantFp8, GradientIsStraightThrough) {
  auto x = fixture_.at("x").clone().requires_grad_(true);
  auto scale = fixture_.at("scale_s0p5").clone().requires_grad_(true);
  auto q = fake_quant_fp8(x, scale);
  // Forward value through the autograd function is still the exact reference.
  EXPECT_EQ(bit_mismatches(q.detach(), fixture_.at("expected_s0p5")), 0);
  // With scale 0.5, |x| > 224 saturates: the gradient is 1 there too.
  const int64_t saturated = (x.detach().abs() > 224).sum().item<int64_t>();
  EXPECT_GT(saturated, 0);
  q.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::equal(x.grad(), at::ones_like(x)));
  EXPECT_FALSE(scale.grad().defined());
  // A non-uniform incoming gradient passes unchanged.
  auto x2 = fixture_.at("w").clone().requires_grad_(true);
  auto g = at::randn_like(x2);
  fake_quant_fp8(x2, fixture_.at("w_scale").view({8, 1})).backward(g);
  EXPECT_TRUE(at::equal(x2.grad(), g));
}

TEST_F(OpsFakeQuantFp8, NanAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto x = at::tensor({nan, inf, -inf, 500.0f, 1e-30f, -0.0f});
  auto q = fake_quant_fp8(x, at::tensor({1.0f}));
  // NaN stays NaN; +-inf and beyond-range values saturate to +-448 * s; underflow keeps the sign.
  EXPECT_TRUE(std::isnan(q[0].item<float>()));
  EXPECT_EQ(q[1].item<float>(), 448.0f);
  EXPECT_EQ(q[2].item<float>(), -448.0f);
  EXPECT_EQ(q[3].item<float>(), 448.0f);
  EXPECT_EQ(q[4].item<float>(), 0.0f);
  EXPECT_TRUE(std::signbit(q[5].item<float>()));
  // Infinite x keeps a finite forward value through the straight-through function.
  auto xg = x.clone().requires_grad_(true);
  auto qg = fake_quant_fp8(xg, at::tensor({1.0f}));
  EXPECT_EQ(qg[1].item<float>(), 448.0f);
  // A NaN scale poisons everything; an infinite scale gives 0 * inf = NaN.
  EXPECT_TRUE(at::isnan(fake_quant_fp8(at::tensor({1.0f}), at::tensor({nan}))).all().item<bool>());
  EXPECT_TRUE(at::isnan(fake_quant_fp8(at::tensor({1.0f}), at::tensor({inf}))).all().item<bool>());
  // A negative scale is clamped to 1e-12 like zero.
  EXPECT_EQ(fake_quant_fp8(at::tensor({1.0f}), at::tensor({-3.0f})).item<float>(), 448.0f * 1e-12f);
}

TEST_F(OpsFakeQuantFp8, RejectsBadDtypesAndScaleShapes) {
  auto x = at::ones({4, 3});
  EXPECT_THROW(fake_quant_fp8(x.to(at::kDouble), at::ones({1})), c10::Error);
  EXPECT_THROW(fake_quant_fp8(x, at::ones({1}, at::kDouble)), c10::Error);
  EXPECT_THROW(fake_quant_fp8(x, at::ones({3})), c10::Error);        // not (C, 1)
  EXPECT_THROW(fake_quant_fp8(x, at::ones({4, 3})), c10::Error);     // full tensor
  EXPECT_THROW(fake_quant_fp8(x, at::ones({1, 1, 1})), c10::Error);  // would broadcast up
  EXPECT_NO_THROW(fake_quant_fp8(x, at::ones({4, 1})));
  EXPECT_NO_THROW(fake_quant_fp8(x, at::ones({})));
  // Bad input is the caller's error: the selection stays as it was and enabled.
  EXPECT_EQ(Registry::process_default().resolve(kFakeQuantFp8.name),
            std::optional<std::string>(expected_selection()));
  EXPECT_TRUE(Registry::process_default().events().empty() ||
              Registry::process_default().events().back().slot != kFakeQuantFp8.name);
}

TEST_F(OpsFakeQuantFp8, ResolvesToReferenceWithoutAGpu) {
  // Without a CUDA device (CI) the reference is selected; on the GPU machine the `cuda`
  // implementation is, and it declines CPU tensors (so every CPU test above ran the reference).
  EXPECT_EQ(Registry::process_default().resolve(kFakeQuantFp8.name),
            std::optional<std::string>(expected_selection()));
  EXPECT_EQ(Registry::process_default().active().at(kFakeQuantFp8.name), expected_selection());
  const auto impls = Registry::process_default().iter_impls(kFakeQuantFp8.name);
  ASSERT_FALSE(impls.empty());
  EXPECT_EQ(impls.back(), kReference);
}

}  // namespace
}  // namespace libreyolo::kernels

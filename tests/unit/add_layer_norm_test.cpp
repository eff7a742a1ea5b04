// The add_layer_norm slot on the CPU: the portable path equals the unfused ops bit for bit,
// inputs are validated before any implementation (exact messages), a declining implementation
// falls back to the portable path, layers::LayerNorm receives its handle from bind_kernels and
// its forward_add / PendingResidual::sum keep the unfused roundings; and the device rule of the
// fused-attention default.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "kernels/kernels.h"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/registry.h"
#include "models/layers/attention.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/layers.h"
#include "tests/unit/error_message.h"

namespace libreyolo::kernels {
namespace {

using test::message_of;

TEST(AddLayerNorm, PortableIsTheUnfusedOpsBitForBit) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dtype);
    const auto x = at::randn({2, 5, 16}, o), delta = at::randn({2, 5, 16}, o);
    const auto scale = at::rand({16}, o), w = at::rand({16}, o), b = at::randn({16}, o);
    const auto [sum, norm] = add_layer_norm_portable(x, delta, scale, w, b, 1e-6);
    const auto expected_sum = x + delta * scale;  // the modules' order: layer scale, then add
    EXPECT_TRUE(at::equal(sum, expected_sum));
    EXPECT_TRUE(at::equal(add_scaled(x, delta, scale), expected_sum));
    EXPECT_TRUE(at::equal(add_scaled(x, delta, {}), x + delta));
    EXPECT_TRUE(add_scaled(x, {}, {}).is_same(x));
    EXPECT_TRUE(at::equal(norm, at::layer_norm(expected_sum, {16}, w, b, 1e-6)));
    const auto plain = add_layer_norm_portable(x, at::Tensor(), at::Tensor(), w, b, 1e-6);
    EXPECT_TRUE(plain.first.is_same(x));
    EXPECT_TRUE(at::equal(plain.second, at::layer_norm(x, {16}, w, b, 1e-6)));
  }
}

TEST(AddLayerNorm, InputsAreCheckedBeforeAnyImplementation) {
  Registry r;
  r.declare(kAddLayerNorm);
  int calls = 0;
  r.register_impl(kAddLayerNorm, "counting",
                  [&calls](const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, double, const at::Tensor&,
                           const at::Tensor&) -> Outcome<SumAndNorm> {
                    ++calls;
                    return Decline{"never"};
                  });
  const auto h = r.bind(kAddLayerNorm, BindContext{});
  const auto x = at::randn({3, 8}), w = at::ones({8}), b = at::zeros({8});
  EXPECT_EQ(message_of([&] {
              add_layer_norm(h, x, at::randn({3, 7}), {}, w, b, 1e-5);
            }),
            "add_layer_norm: delta [3, 7] must have x's shape [3, 8]");
  EXPECT_EQ(message_of([&] { add_layer_norm(h, x, x, at::ones({7}), w, b, 1e-5); }),
            "add_layer_norm: scale must be (8), got [7]");
  EXPECT_EQ(message_of([&] {
              add_layer_norm(h, x, {}, {}, at::ones({2, 4}), b, 1e-5);
            }),
            "add_layer_norm: weight must be (8), got [2, 4]");
  EXPECT_EQ(message_of([&] { add_layer_norm(h, x, {}, at::ones({8}), w, b, 1e-5); }),
            "add_layer_norm: scale without delta");
  EXPECT_EQ(message_of([&] { add_layer_norm(h, at::Tensor(), {}, {}, w, b, 1e-5); }),
            "add_layer_norm: x must be (..., D), got an undefined tensor");
  EXPECT_EQ(calls, 0);
  // A declining implementation: the portable ops run.
  const auto delta = at::randn({3, 8});
  const auto out = add_layer_norm(h, x, delta, {}, w, b, 1e-5);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::equal(out.first, x + delta));
  EXPECT_TRUE(at::equal(out.second, at::layer_norm(x + delta, {8}, w, b, 1e-5)));
}

TEST(AddLayerNorm, LayerNormModuleCallsItsBoundHandle) {
  Registry r;
  register_builtin_slots(r);
  int calls = 0;
  r.register_impl(
      kAddLayerNorm, "counting",
      [&calls](const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale,
               const at::Tensor& w, const at::Tensor& b, double eps, const at::Tensor& norm_rows,
               const at::Tensor& delta_rows) -> Outcome<SumAndNorm> {
        ++calls;
        return add_layer_norm_portable(x, delta, scale, w, b, eps, norm_rows, delta_rows);
      });
  auto norm = std::make_shared<models::layers::LayerNormImpl>(8, 1e-6);
  norm->weight.data().uniform_(0.5, 1.5);
  norm->bias.data().uniform_(-0.1, 0.1);
  models::layers::bind_kernels(*norm, r, BindContext{}, Filter{});
  at::NoGradGuard no_grad;
  const auto x = at::randn({2, 3, 8}), delta = at::randn({2, 3, 8}), scale = at::rand({8});
  EXPECT_TRUE(at::equal(norm->forward(x), at::layer_norm(x, {8}, norm->weight, norm->bias, 1e-6)));
  const auto [sum, normed] = norm->forward_add(x, delta, scale);
  EXPECT_EQ(calls, 2);
  const models::layers::PendingResidual pending{x, delta, scale};
  EXPECT_TRUE(at::equal(sum, pending.sum()));
  EXPECT_TRUE(at::equal(sum, x + delta * scale));
  EXPECT_TRUE(at::equal(normed, at::layer_norm(sum, {8}, norm->weight, norm->bias, 1e-6)));
  EXPECT_TRUE(models::layers::PendingResidual{x}.sum().is_same(x));
}

TEST(FusedAttentionDefault, OnForSixteenBitCudaModelsOnly) {
  using models::layers::fused_attention_by_default;
  EXPECT_TRUE(fused_attention_by_default(at::Device("cuda:0"), at::kBFloat16));
  EXPECT_TRUE(fused_attention_by_default(at::Device("cuda:1"), at::kHalf));
  EXPECT_FALSE(fused_attention_by_default(at::Device("cuda:0"), at::kFloat));
  // 16-bit CPU models too (SDPA's flash kernel; docs/BENCHMARKS.md); float32 keeps the family's.
  EXPECT_TRUE(fused_attention_by_default(at::Device(at::kCPU), at::kBFloat16));
  EXPECT_TRUE(fused_attention_by_default(at::Device(at::kCPU), at::kHalf));
  EXPECT_FALSE(fused_attention_by_default(at::Device(at::kCPU), at::kFloat));
}

}  // namespace
}  // namespace libreyolo::kernels

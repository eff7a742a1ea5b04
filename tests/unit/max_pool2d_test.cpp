// The max_pool2d slot: the output-size formula against at::max_pool2d's own shapes, inputs
// validated before any implementation (exact messages), a declining implementation falls back
// to the portable path, and layers::MaxPool2d receives its handle from bind_kernels.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "kernels/kernels.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/registry.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/max_pool.h"
#include "tests/unit/error_message.h"

namespace libreyolo::kernels {
namespace {

using test::message_of;

TEST(MaxPool2d, OutputSizeIsAtensForEveryGeometry) {
  int checked = 0;
  for (int64_t in = 1; in <= 12; ++in)
    for (int64_t k = 1; k <= 4; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t d = 1; d <= 2; ++d)
          for (int64_t p = 0; p <= k / 2; ++p)
            for (bool ceil : {false, true}) {
              const int64_t ours = max_pool2d_output_size(in, k, p, s, d, ceil);
              at::Tensor y;
              try {
                y = at::max_pool2d(at::zeros({1, 1, in, 1}), {k, 1}, {s, 1}, {p, 0}, {d, 1}, ceil);
              } catch (const c10::Error&) {  // "Output size is too small": ours refuses too
                EXPECT_LE(ours, 0) << in << " " << k << " " << p << " " << s << " " << d;
                continue;
              }
              EXPECT_EQ(ours, y.size(2)) << "in " << in << " k " << k << " p " << p << " s " << s
                                         << " d " << d << " ceil " << ceil;
              ++checked;
            }
  EXPECT_GT(checked, 1000);
  // The backbones' two poolings: the ResNet stem and HGNetV2's padded stem.
  EXPECT_EQ(max_pool2d_output_size(320, 3, 1, 2, 1, false), 160);
  EXPECT_EQ(max_pool2d_output_size(321, 2, 0, 1, 1, true), 320);
}

TEST(MaxPool2d, InputsAreCheckedBeforeAnyImplementation) {
  Registry r;
  r.declare(kMaxPool2d);
  int calls = 0;
  r.register_impl(kMaxPool2d, "counting",
                  [&calls](const at::Tensor&, const PoolGeometry&) -> Outcome<at::Tensor> {
                    ++calls;
                    return Decline{"never"};
                  });
  const auto h = r.bind(kMaxPool2d, BindContext{});
  PoolGeometry g;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  const auto x = at::randn({2, 3, 9, 8});
  EXPECT_EQ(message_of([&] { max_pool2d(h, x[0], g); }),
            "max_pool2d: input must be (B, C, H, W), got [3, 9, 8]");
  EXPECT_EQ(message_of([&] {
              max_pool2d(h, at::randn({2, 3, 0, 8}), g);
            }),
            "max_pool2d: input must have non-zero C, H and W, got [2, 3, 0, 8]");
  EXPECT_EQ(max_pool2d(h, at::randn({0, 3, 9, 8}), g).sizes(),  // an empty batch is allowed
            (std::vector<int64_t>{0, 3, 5, 4}));
  PoolGeometry wide = g;
  wide.pad_w = 2;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, wide); }),
            "max_pool2d: padding must be >= 0 and at most half the kernel size");
  PoolGeometry zero = g;
  zero.stride_h = 0;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, zero); }),
            "max_pool2d: kernel, stride and dilation must be >= 1");
  PoolGeometry big = g;
  big.kernel_h = 13;
  big.pad_h = 1;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, big); }),
            "max_pool2d: the input [2, 3, 9, 8] is smaller than one pooling window");
  EXPECT_EQ(calls, 1);  // the empty batch above
  // A declining implementation is called and counted, then at::max_pool2d answers.
  const auto out = max_pool2d(h, x, g);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(at::equal(out, at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1})));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 5, 4}));
  EXPECT_EQ(r.bindings().at(0).candidates.at(0).declined.at("never"), 2u);
}

TEST(MaxPool2d, TheLayerCallsTheHandleBindKernelsGaveIt) {
  Registry r;
  register_builtin_slots(r);
  int calls = 0;
  r.register_impl(kMaxPool2d, "counting",
                  [&calls](const at::Tensor& x, const PoolGeometry& g) -> Outcome<at::Tensor> {
                    ++calls;
                    return max_pool2d_portable(x, g) + 1;  // recognisable
                  });
  torch::nn::Module root;
  auto pool = root.register_module("pool", std::make_shared<models::layers::MaxPool2dImpl>(
                                               models::layers::square_pool(2, 1, 0, true)));
  const auto x = at::randn({1, 4, 5, 5});
  const auto ref = at::max_pool2d(x, {2, 2}, {1, 1}, {0, 0}, {1, 1}, true);
  EXPECT_TRUE(at::equal(pool->forward(x), ref));  // unbound: the portable path
  EXPECT_EQ(calls, 0);
  models::layers::bind_kernels(root, r, BindContext{}, Filter{});
  EXPECT_TRUE(at::equal(pool->forward(x), ref + 1));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace libreyolo::kernels

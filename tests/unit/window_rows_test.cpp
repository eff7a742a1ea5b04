// Windowing without copies (issue 27): swin::window_rows equals the unfused pad / roll /
// window_partition and window_reverse / roll / crop ops on features (transformers' order and
// timm's, with and without padding and shift), and the add_layer_norm slot's portable row orders
// equal the Swin block's unfused LayerNorm + pad + roll + partition and reverse + roll + crop +
// residual add + LayerNorm bit for bit (what keeps the CPU parity of Swin, Grounding DINO and
// OmDet-Turbo byte-identical); the index checks' messages.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/norm/add_layer_norm.h"
#include "models/swin/windows.h"
#include "tests/unit/error_message.h"

namespace libreyolo::models::swin {
namespace {

struct Geometry {
  int64_t height, width, window, shift;
  bool timm;
};

// Swin-T stage 1 of an 800x1333 input is 200x334 (both padded for window 7); these keep the
// cases small: padding on one axis, on both, none, a shift with and without padding, timm's order.
const Geometry kGeometries[] = {{14, 14, 7, 0, false}, {14, 14, 7, 3, false}, {10, 13, 7, 3, false},
                                {10, 13, 7, 3, true},  {9, 16, 4, 2, false},  {9, 16, 4, 2, true},
                                {5, 9, 4, 0, true},    {20, 20, 7, 3, true}};

std::string name(const Geometry& g) {
  return c10::str(g.height, "x", g.width, " window ", g.window, " shift ", g.shift,
                  g.timm ? " timm" : " transformers");
}

/// BlockImpl's unfused forward before the attention: (B, h*w, C) -> (B*nW, ws*ws, C).
at::Tensor partition_ops(const at::Tensor& x, const Geometry& g) {
  const int64_t B = x.size(0), C = x.size(2), ws = g.window, s = g.shift;
  auto h = x.view({B, g.height, g.width, C});
  const int64_t pad_r = (ws - g.width % ws) % ws, pad_b = (ws - g.height % ws) % ws;
  if (s > 0 && g.timm) h = at::roll(h, {-s, -s}, {1, 2});
  h = at::constant_pad_nd(h, {0, 0, 0, pad_r, 0, pad_b});
  if (s > 0 && !g.timm) h = at::roll(h, {-s, -s}, {1, 2});
  return window_partition(h, ws).view({-1, ws * ws, C});
}

/// ... and after it: (B*nW, ws*ws, C) -> (B, h*w, C).
at::Tensor reverse_ops(const at::Tensor& a, int64_t B, const Geometry& g) {
  const int64_t C = a.size(-1), ws = g.window, s = g.shift;
  const int64_t hp = g.height + (ws - g.height % ws) % ws, wp = g.width + (ws - g.width % ws) % ws;
  auto r = window_reverse(a.view({-1, ws, ws, C}), ws, hp, wp);
  if (s > 0 && !g.timm) r = at::roll(r, {s, s}, {1, 2});
  r = r.slice(1, 0, g.height).slice(2, 0, g.width).contiguous();
  if (s > 0 && g.timm) r = at::roll(r, {s, s}, {1, 2});
  return r.view({B, g.height * g.width, C});
}

TEST(WindowRows, GathersEqualThePartitionAndReverseOps) {
  at::manual_seed(11);
  for (const auto& g : kGeometries) {
    const int64_t B = 2, C = 5;
    const auto x = at::randn({B, g.height * g.width, C});
    const auto order = window_rows(g.height, g.width, g.window, g.shift, g.timm, at::kCPU);
    const auto expected = partition_ops(x, g);
    ASSERT_EQ(B * order.rows.numel(), expected.size(0) * expected.size(1)) << name(g);
    auto gathered = x.index_select(1, order.rows.clamp_min(0));
    gathered.masked_fill_((order.rows < 0).unsqueeze(1), 0);
    EXPECT_TRUE(at::equal(gathered.view(expected.sizes()), expected)) << name(g);
    const auto a = at::randn(expected.sizes());
    EXPECT_TRUE(at::equal(a.view({B, -1, C}).index_select(1, order.inverse), reverse_ops(a, B, g)))
        << name(g);
    // Every map row appears once in the window order; the rest are padding.
    const int64_t padded = (order.rows < 0).sum().item<int64_t>();
    EXPECT_EQ(order.rows.numel() - padded, g.height * g.width) << name(g);
    EXPECT_TRUE(at::equal(order.rows.index_select(0, order.inverse),
                          at::arange(g.height * g.width, at::kLong)))
        << name(g);
  }
  // Swin-T stage 1 at 800x1333: 200x334 -> 203x336, 29 x 48 windows.
  const auto big = window_rows(200, 334, 7, 3, false, at::kCPU);
  EXPECT_EQ(big.rows.numel(), 29 * 48 * 49);
  EXPECT_EQ((big.rows < 0).sum().item<int64_t>(), 203 * 336 - 200 * 334);
}

TEST(WindowRows, SlotRowOrdersAreTheUnfusedBlockOpsBitForBit) {
  at::manual_seed(12);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dtype);
    for (const auto& g : kGeometries) {
      const int64_t B = 2, C = 16;
      const auto x = at::randn({B, g.height * g.width, C}, o);
      const auto w = at::rand({C}, o) + 0.5, b = at::randn({C}, o);
      const auto order = window_rows(g.height, g.width, g.window, g.shift, g.timm, at::kCPU);
      // LayerNorm, then pad / roll / partition.
      const auto windows =
          kernels::add_layer_norm({}, x, {}, {}, w, b, 1e-5, order.rows, {}).second;
      const auto expected = partition_ops(at::layer_norm(x, {C}, w, b, 1e-5), g);
      EXPECT_TRUE(at::equal(windows.view(expected.sizes()), expected)) << name(g) << dtype;
      // Reverse / roll / crop, residual add, LayerNorm.
      const auto a = at::randn({B, order.rows.numel(), C}, o);
      const auto [sum, norm] = kernels::add_layer_norm({}, x, a, {}, w, b, 1e-5, {}, order.inverse);
      const auto y = x + reverse_ops(a.view(expected.sizes()), B, g);
      EXPECT_TRUE(at::equal(sum, y)) << name(g) << dtype;
      EXPECT_TRUE(at::equal(norm, at::layer_norm(y, {C}, w, b, 1e-5))) << name(g) << dtype;
    }
  }
}

TEST(WindowRows, SlotChecksTheIndices) {
  const auto x = at::randn({2, 6, 8}), w = at::ones({8}), b = at::zeros({8});
  const auto rows = at::arange(6, at::kLong);
  using kernels::add_layer_norm;
  using test::message_of;
  EXPECT_EQ(message_of([&] { add_layer_norm({}, x, {}, {}, w, b, 1e-5, rows.to(at::kInt), {}); }),
            "add_layer_norm: norm_rows must be int64 (R) on x's device, got Int[6] on cpu");
  EXPECT_EQ(message_of([&] {
              add_layer_norm({}, x, at::randn({2, 9, 8}), {}, w, b, 1e-5, {}, rows.slice(0, 1));
            }),
            "add_layer_norm: delta_rows must be int64 (6) on x's device, got Long[5] on cpu");
  EXPECT_EQ(message_of([&] { add_layer_norm({}, x, {}, {}, w, b, 1e-5, {}, rows); }),
            "add_layer_norm: delta_rows needs delta (..., M, 8) with x's leading dims [2, 6, 8], "
            "got none");
  EXPECT_EQ(message_of([&] {
              add_layer_norm({}, x, at::randn({3, 9, 8}), {}, w, b, 1e-5, {}, rows);
            }),
            "add_layer_norm: delta_rows needs delta (..., M, 8) with x's leading dims [2, 6, 8], "
            "got [3, 9, 8]");
  EXPECT_EQ(message_of([&] { add_layer_norm({}, at::randn({8}), {}, {}, w, b, 1e-5, rows, {}); }),
            "add_layer_norm: row orders need x (..., N, D), got [8]");
  // delta (..., M, D) in another order: M need not be x's row count; per image.
  const auto delta = at::randn({2, 9, 8});
  const auto out = add_layer_norm({}, x, delta, {}, w, b, 1e-5, {}, rows + 3);
  EXPECT_TRUE(at::equal(out.first, x + delta.slice(1, 3)));
  // Reversed rows with a padding row: (2, 7, 8), the last row of each image zeros.
  const auto back = add_layer_norm({}, x, {}, {}, w, b, 1e-5,
                                   at::cat({rows.flip(0), -rows.slice(0, 0, 1) - 1}), {});
  ASSERT_EQ(back.second.sizes(), (at::IntArrayRef{2, 7, 8}));
  EXPECT_TRUE(at::equal(back.second.slice(1, 0, 6), at::layer_norm(x, {8}, w, b, 1e-5).flip(1)));
  EXPECT_TRUE(at::equal(back.second.select(1, 6), at::zeros({2, 8})));
}

}  // namespace
}  // namespace libreyolo::models::swin

// The `cuda` add_layer_norm (kernels/norm/cuda/add_layer_norm_cuda.h) against the portable ATen
// ops on the same device: the sum bit for bit (the same roundings), the normalised rows within
// float32 rounding (float32: 2e-6 absolute on O(1) rows; 16-bit: at most one unit in the last
// place of the output, and at least 99% of the elements bit-identical), for the ViT widths
// (384, 768, 1024), a DETR width (256), the smallest (8), with and without delta and scale, and
// more rows than one grid launch covers. Row orders (Swin's windows, issue 27): the gathered
// norm and the gathered residual equal the unpermuted kernel's rows bit for bit, and the portable
// ops within the same bounds, on Swin-T stage-1 maps (padded, shifted, both orders). Declines (a
// width off the 16-byte vectors, wider than 1,024, a non-contiguous x, CPU tensors) run nothing.
// Called through a registry binding, as models call it. Skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>

#include "kernels/norm/add_layer_norm.h"
#include "models/swin/windows.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

/// One unit in the last place at 1.0 for the dtype (the output rounding of an O(1) value).
double unit(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 0.0;
}

TEST(AddLayerNormCuda, MatchesTheUnfusedOps) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kAddLayerNorm, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(5);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    for (int64_t d : {8, 256, 384, 768, 1024}) {
      for (int64_t rows : {1, 7, 4099}) {
        for (int with : {0, 1, 2}) {  // no delta; delta; delta and scale
          const auto x = at::randn({rows, d}, opts) * 3 + 1;
          const auto delta = with > 0 ? at::randn({rows, d}, opts) : at::Tensor();
          const auto scale = with > 1 ? at::rand({d}, opts) * 2 - 0.5 : at::Tensor();
          const auto w = at::rand({d}, opts) + 0.5, b = at::randn({d}, opts) * 0.1;
          auto got = handle(x, delta, scale, w, b, 1e-6, {}, {});
          ASSERT_TRUE(got.has_value()) << "declined d=" << d;
          const auto ref = add_layer_norm_portable(x, delta, scale, w, b, 1e-6);
          const std::string what = c10::str(dtype, " d=", d, " rows=", rows, " with=", with);
          EXPECT_EQ(test::bit_mismatches(got->first.to(at::kFloat), ref.first.to(at::kFloat)), 0)
              << what;
          if (with == 0) EXPECT_TRUE(got->first.is_same(x)) << what;
          const double diff = test::max_abs_diff(got->second, ref.second);
          const double ref_max = ref.second.abs().max().item<double>();
          if (dtype == at::kFloat) {
            EXPECT_LE(diff, 2e-6 * std::max(1.0, ref_max)) << what;
          } else {
            // |ref| <= ref_max: one ulp there is unit * 2^ceil(log2 ref_max).
            EXPECT_LE(diff, unit(dtype) * std::exp2(std::ceil(std::log2(std::max(1.0, ref_max)))))
                << what;
            const auto same = rows * d - test::bit_mismatches(got->second.to(at::kFloat),
                                                              ref.second.to(at::kFloat));
            EXPECT_GE(static_cast<double>(same), 0.99 * rows * d) << what;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 5 * 3 * 3);
}

TEST(AddLayerNormCuda, ThreeDimensionalRowsAndManyBlocks) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kAddLayerNorm, test::cuda_context());
  // (B * windows, tokens, C) as the backbones call it: 32 images of 4 windows of 401 tokens,
  // more than 2^20 blocks' worth of rows would need a grid-stride loop: 4,194,400 rows here.
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::manual_seed(6);
  for (int64_t rows : {int64_t{128 * 401}, int64_t{4194400}}) {
    const auto x = at::randn({rows / 401, 401, 8}, opts);
    const auto delta = at::randn({rows / 401, 401, 8}, opts);
    const auto scale = at::rand({8}, opts), w = at::rand({8}, opts), b = at::rand({8}, opts);
    auto got = handle(x, delta, scale, w, b, 1e-5, {}, {});
    ASSERT_TRUE(got.has_value());
    const auto ref = add_layer_norm_portable(x, delta, scale, w, b, 1e-5);
    EXPECT_EQ(test::bit_mismatches(got->first.to(at::kFloat), ref.first.to(at::kFloat)), 0);
    // One bfloat16 ulp at the largest |norm| (about sqrt(7) for rows of 8: 2^-6).
    const double ref_max = ref.second.abs().max().item<double>();
    EXPECT_LE(test::max_abs_diff(got->second, ref.second),
              unit(at::kBFloat16) * std::exp2(std::ceil(std::log2(std::max(1.0, ref_max)))))
        << rows;
    EXPECT_EQ(got->second.sizes(), x.sizes());
  }
}

/// norm's rows (B, N, D) gathered into a window order as the portable path gathers them (-1:
/// zeros).
at::Tensor gather_rows(const at::Tensor& norm, const at::Tensor& rows) {
  auto out = norm.index_select(1, rows.clamp_min(0));
  return out.masked_fill_((rows < 0).unsqueeze(1), 0);
}

TEST(AddLayerNormCuda, RowOrdersEqualTheUnpermutedKernel) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kAddLayerNorm, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(7);
  struct Case {
    int64_t images, height, width, channels, window, shift;
    bool timm;
  };
  // Swin-T stage 1 of 800x1333 (200x334, 96 channels, padded to 203x336), shifted in both
  // orders; stage 3 (50x84, 384); a map that needs no padding; OmDet-Turbo's 160x160 (timm).
  const Case cases[] = {{2, 200, 334, 96, 7, 0, false}, {2, 200, 334, 96, 7, 3, false},
                        {2, 200, 334, 96, 7, 3, true},  {3, 50, 84, 384, 7, 3, false},
                        {2, 56, 56, 96, 7, 3, false},   {1, 160, 160, 96, 7, 3, true}};
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    for (const auto& c : cases) {
      const std::string what = c10::str(dtype, " ", c.height, "x", c.width, "x", c.channels,
                                        " shift ", c.shift, c.timm ? " timm" : "");
      const auto order = models::swin::window_rows(c.height, c.width, c.window, c.shift, c.timm,
                                                   at::Device(at::kCUDA));
      const auto x = at::randn({c.images, c.height * c.width, c.channels}, opts) * 2 + 0.5;
      const auto w = at::rand({c.channels}, opts) + 0.5, b = at::randn({c.channels}, opts) * 0.1;
      // (1) LayerNorm into the window order (no delta: the Swin block's layernorm_before).
      const auto plain = handle(x, {}, {}, w, b, 1e-5, {}, {});
      const auto windowed = handle(x, {}, {}, w, b, 1e-5, order.rows, {});
      ASSERT_TRUE(plain.has_value() && windowed.has_value()) << what;
      EXPECT_EQ(windowed->second.sizes(),
                (at::IntArrayRef{c.images, order.rows.numel(), c.channels}));
      EXPECT_EQ(test::bit_mismatches(windowed->second.to(at::kFloat),
                                     gather_rows(plain->second, order.rows).to(at::kFloat)),
                0)
          << what;
      const auto ref = add_layer_norm_portable(x, {}, {}, w, b, 1e-5, order.rows, {});
      const double bound = dtype == at::kFloat ? 2e-5 : unit(dtype) * 8;  // |norm| < 8 here
      EXPECT_LE(test::max_abs_diff(windowed->second, ref.second), bound) << what;
      // (2) The attention output back from the window order, added, normalised.
      const auto a = at::randn({c.images, order.rows.numel(), c.channels}, opts);
      const auto aligned = a.index_select(1, order.inverse);
      const auto unpermuted = handle(x, aligned, {}, w, b, 1e-5, {}, {});
      const auto back = handle(x, a, {}, w, b, 1e-5, {}, order.inverse);
      ASSERT_TRUE(unpermuted.has_value() && back.has_value()) << what;
      EXPECT_EQ(test::bit_mismatches(back->first.to(at::kFloat), (x + aligned).to(at::kFloat)), 0)
          << what;
      EXPECT_EQ(
          test::bit_mismatches(back->second.to(at::kFloat), unpermuted->second.to(at::kFloat)), 0)
          << what;
      // (1) with a pending residual and a layer scale: the sum in the image order.
      const auto delta = at::randn(x.sizes(), opts), scale = at::rand({c.channels}, opts);
      const auto both = handle(x, delta, scale, w, b, 1e-5, order.rows, {});
      const auto flat = handle(x, delta, scale, w, b, 1e-5, {}, {});
      ASSERT_TRUE(both.has_value() && flat.has_value()) << what;
      EXPECT_EQ(test::bit_mismatches(both->first.to(at::kFloat), flat->first.to(at::kFloat)), 0)
          << what;
      EXPECT_EQ(test::bit_mismatches(both->second.to(at::kFloat),
                                     gather_rows(flat->second, order.rows).to(at::kFloat)),
                0)
          << what;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(AddLayerNormCuda, DeclinesWhatItDoesNotTake) {
  REQUIRE_CUDA();
  kernels::Registry reg;
  test::declare_with_cuda_only(reg);
  const auto h = reg.bind(kAddLayerNorm, test::cuda_context());
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  auto call = [&](const at::Tensor& x) {
    const int64_t d = x.size(-1);
    const auto w = at::ones({d}, x.options()), b = at::zeros({d}, x.options());
    return h(x, at::Tensor(), at::Tensor(), w, b, 1e-5, {}, {});
  };
  EXPECT_FALSE(call(at::randn({4, 12}, opts)).has_value());      // 12 bf16: not whole vectors
  EXPECT_FALSE(call(at::randn({4, 1032}, opts)).has_value());    // wider than 1024
  EXPECT_FALSE(call(at::randn({16, 4}, opts).t()).has_value());  // not contiguous
  EXPECT_FALSE(call(at::randn({4, 16}, at::TensorOptions().dtype(at::kBFloat16))).has_value());
  EXPECT_FALSE(call(at::randn({4, 16}, opts.dtype(at::kDouble))).has_value());
  EXPECT_TRUE(call(at::randn({4, 16}, opts)).has_value());
  // The entry point runs the portable ops for a declined call: the same numbers as ATen.
  const auto x = at::randn({4, 12}, opts);
  const auto w = at::ones({12}, opts), b = at::zeros({12}, opts);
  const auto out = add_layer_norm(h, x, at::Tensor(), at::Tensor(), w, b, 1e-5);
  EXPECT_TRUE(at::equal(out.second, at::layer_norm(x, {12}, w, b, 1e-5)));
  const auto report = reg.report();
  for (const auto& s : report) {
    if (s.slot != "add_layer_norm") continue;
    int declined = 0;
    for (const auto& c : s.candidates)
      for (const auto& [why, n] : c.declined) declined += static_cast<int>(n);
    EXPECT_EQ(declined, 6);
  }
}

}  // namespace
}  // namespace libreyolo::kernels

// The host-side rules of the `cuda_depthwise` conv2d_bias_act
// (kernels/conv/cuda/depthwise_conv2d_cuda.h), on CPU tensors: which calls the kernel takes and
// the reason it gives for each one it declines (the device check comes before these rules in
// the implementation; the GPU test covers it), which geometries take the tiled path, and the
// weight transpose the kernel reads. No GPU needed.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/conv/cuda/depthwise_conv2d_cuda.h"

namespace libreyolo::kernels {
namespace {

struct Call {
  at::Tensor x, w, b, r;
  ConvGeometry g;
};

/// An eligible call: bf16 (2, 16, 10, 12) channels_last, 3x3 depthwise, stride 2, padding 1.
Call eligible() {
  Call c;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  c.x = at::randn({2, 16, 10, 12}, bf16).contiguous(at::MemoryFormat::ChannelsLast);
  c.w = at::randn({16, 1, 3, 3}, bf16);
  c.b = at::randn({16}, bf16);
  c.g.stride_h = c.g.stride_w = 2;
  c.g.pad_h = c.g.pad_w = 1;
  c.g.groups = 16;
  c.r = at::randn({2, 16, 5, 6}, bf16);
  return c;
}

std::string why(const Call& c) {
  const char* r = cuda::depthwise_conv2d_decline(c.x, c.w, c.b, c.r, c.g);
  return r ? r : "";
}

TEST(DepthwiseConvRules, TakesDepthwiseChannelsLastCalls) {
  auto c = eligible();
  EXPECT_EQ(why(c), "");
  for (auto dtype : {at::kFloat, at::kHalf}) {
    auto d = c;
    d.x = c.x.to(dtype), d.w = c.w.to(dtype), d.b = c.b.to(dtype), d.r = c.r.to(dtype);
    EXPECT_EQ(why(d), "") << dtype;
  }
  // Without bias and residual; every kernel size 1..7 (square or not), strides 1 and 2 on each
  // axis, dilation 2, large padding; an empty batch; odd channel counts.
  c.b = c.r = at::Tensor();
  EXPECT_EQ(why(c), "");
  for (int64_t kh = 1; kh <= 7; ++kh)
    for (int64_t kw = 1; kw <= 7; kw += 3) {
      auto d = c;
      d.w = at::randn({16, 1, kh, kw}, c.w.options());
      d.g.pad_h = kh / 2, d.g.pad_w = kw / 2;
      EXPECT_EQ(why(d), "") << kh << "x" << kw;
    }
  auto d = c;
  d.g.stride_h = 1, d.g.dilation_w = 2, d.g.pad_h = d.g.pad_w = 5;
  EXPECT_EQ(why(d), "");
  d = c;
  d.x = at::empty({0, 16, 10, 12}, c.x.options().memory_format(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(why(d), "");
  d = c;
  d.x = at::randn({1, 13, 5, 5}, c.x.options()).contiguous(at::MemoryFormat::ChannelsLast);
  d.w = at::randn({13, 1, 3, 3}, c.w.options());
  d.g.groups = 13;
  EXPECT_EQ(why(d), "");
}

TEST(DepthwiseConvRules, DeclinesEverythingElseWithItsReason) {
  const auto base = eligible();
  auto c = base;
  c.x = base.x.to(at::kDouble), c.w = base.w.to(at::kDouble);
  c.b = base.b.to(at::kDouble), c.r = base.r.to(at::kDouble);
  EXPECT_EQ(why(c), "cuda_depthwise: dtype (float32, float16, bfloat16 only)");

  c = base;
  c.x = base.x.contiguous();  // NCHW
  EXPECT_EQ(why(c), "cuda_depthwise: input not channels_last");

  c = base;
  c.g.groups = 8;  // grouped: weight (16, 2, 3, 3)
  c.w = at::randn({16, 2, 3, 3}, base.w.options());
  EXPECT_EQ(why(c), "cuda_depthwise: not depthwise (groups == C_in == C_out only)");
  c = base;
  c.w = at::randn({32, 1, 3, 3}, base.w.options());  // depth multiplier 2
  EXPECT_EQ(why(c), "cuda_depthwise: not depthwise (groups == C_in == C_out only)");
  c = base;
  c.g.groups = 1;  // a dense convolution
  c.w = at::randn({16, 16, 3, 3}, base.w.options());
  EXPECT_EQ(why(c), "cuda_depthwise: not depthwise (groups == C_in == C_out only)");

  c = base;
  c.w = at::randn({16, 1, 9, 9}, base.w.options());
  c.g.pad_h = c.g.pad_w = 4;
  c.r = at::Tensor();
  EXPECT_EQ(why(c), "cuda_depthwise: kernel larger than 7x7");
  c.w = at::randn({16, 1, 3, 8}, base.w.options());
  EXPECT_EQ(why(c), "cuda_depthwise: kernel larger than 7x7");

  for (auto [sh, sw] : {std::pair<int64_t, int64_t>{3, 1}, {1, 3}, {0, 1}, {4, 4}}) {
    c = base;
    c.r = at::Tensor();
    c.g.stride_h = sh, c.g.stride_w = sw;
    EXPECT_EQ(why(c), "cuda_depthwise: stride other than 1 or 2") << sh << "," << sw;
  }
  c = base;
  c.g.dilation_h = 0;
  EXPECT_EQ(why(c), "cuda_depthwise: negative padding or dilation < 1");
  c = base;
  c.g.pad_w = -1;
  EXPECT_EQ(why(c), "cuda_depthwise: negative padding or dilation < 1");

  c = base;
  c.x = at::randn({2, 16, 2, 2}, base.x.options()).contiguous(at::MemoryFormat::ChannelsLast);
  c.w = at::randn({16, 1, 7, 7}, base.w.options());
  c.g.pad_h = c.g.pad_w = 0;
  c.r = at::Tensor();
  EXPECT_EQ(why(c), "cuda_depthwise: input smaller than the kernel");
  // One short with stride 2: (2 - 3) / 2 truncates to 0 in C++; still declined.
  c.w = at::randn({16, 1, 3, 3}, base.w.options());
  EXPECT_EQ(why(c), "cuda_depthwise: input smaller than the kernel");

  c = base;
  c.b = base.b.to(at::kFloat);
  EXPECT_EQ(why(c), "cuda_depthwise: bias dtype or device differs");
  c = base;
  c.r = base.r.to(at::kFloat);
  EXPECT_EQ(why(c), "cuda_depthwise: residual dtype or device differs");
  c = base;
  c.r = at::randn({2, 16, 10, 12}, base.r.options());  // the input's size, not the output's
  EXPECT_EQ(why(c), "cuda_depthwise: residual shape is not the output's");
  c.r = at::randn({1, 16, 5, 6}, base.r.options());  // would broadcast in the portable path
  EXPECT_EQ(why(c), "cuda_depthwise: residual shape is not the output's");
}

TEST(DepthwiseConvRules, TiledPathForKernelWidths357AtEqualStridesWithoutDilation) {
  ConvGeometry g;
  for (int64_t kw : {3, 5, 7}) {
    for (int64_t s : {1, 2}) {
      g.stride_h = g.stride_w = s;
      EXPECT_TRUE(cuda::depthwise_conv2d_tiled(kw, g)) << kw << " stride " << s;
    }
  }
  g.stride_h = g.stride_w = 1;
  for (int64_t kw : {1, 2, 4, 6}) EXPECT_FALSE(cuda::depthwise_conv2d_tiled(kw, g)) << kw;
  g.stride_h = 2;
  EXPECT_FALSE(cuda::depthwise_conv2d_tiled(3, g));
  g.stride_h = 1;
  g.dilation_w = 2;
  EXPECT_FALSE(cuda::depthwise_conv2d_tiled(3, g));
}

TEST(DepthwiseConvRules, WeightTransposeAndOutputSize) {
  const auto w = at::randn({5, 1, 3, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto t = cuda::depthwise_weight_khwc(w);
  ASSERT_EQ(t.sizes(), (at::IntArrayRef{12, 5}));
  EXPECT_TRUE(t.is_contiguous());
  for (int64_t c = 0; c < 5; ++c)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t s = 0; s < 4; ++s)
        EXPECT_EQ(t[r * 4 + s][c].item<float>(), w[c][0][r][s].item<float>());
  // at::conv2d's sizes.
  for (int64_t k : {1, 2, 3, 5, 7})
    for (int64_t s : {1, 2})
      for (int64_t p : {0, 1, 3})
        for (int64_t d : {1, 2}) {
          const int64_t want = cuda::conv_output_size(11, k, p, s, d);
          if (want < 1) continue;
          const auto y = at::conv2d(at::zeros({1, 1, 11, 11}), at::zeros({1, 1, k, k}), {}, {s, s},
                                    {p, p}, {d, d});
          EXPECT_EQ(y.size(2), want) << k << " " << s << " " << p << " " << d;
        }
}

}  // namespace
}  // namespace libreyolo::kernels

// The `winograd` implementation of conv2d_bias_act (kernels/conv/cpu/
// conv2d_bias_act_winograd.cpp): bound first for CPU float32 models; its F(4x4, 3x3) results
// within a bounded multiple of ATen's direct float32 convolution's error against float64 (partial
// tiles, channel counts off the vector width, padding 0 to 2, several blocks, residual and every
// activation, 16 channels and up); the transform's rounding shown on small integers, where a
// direct convolution is exact; the transformed weight made again after the weight is written in
// place; and declines that leave `onednn` to answer.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "tests/unit/binding_report_util.h"

namespace libreyolo::kernels {
namespace {

/// The process registry's binding for a CPU model named `model`, `winograd` alone when `only`.
Conv2dBiasActHandle bind_cpu(const std::string& model, bool only,
                             const std::string& dtype = "float32") {
  BindContext c;
  c.model = model;
  c.dtype = dtype;
  Filter filter;
  filter.allow[kConv2dBiasAct.name] = {"winograd"};
  return Registry::process_default().bind(kConv2dBiasAct, c, only ? &filter : nullptr);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(Conv2dBiasActWinograd, BoundBeforeOnednnForCpuFloat32Models) {
  const auto h = bind_cpu("winograd_order", false);
  ASSERT_FALSE(h.empty());
  const auto report = binding_of("winograd_order");
  EXPECT_EQ(report.selected, "winograd");
  ASSERT_GE(report.candidates.size(), 2u);
  EXPECT_EQ(report.candidates.at(0).name, "winograd");
  EXPECT_EQ(report.candidates.at(1).name, "onednn");
  const auto fp16 = bind_cpu("winograd_float16_model", false, "float16");
  int listed = 0;
  for (const auto& c : binding_of("winograd_float16_model").candidates) {
    if (c.name != "winograd") continue;
    ++listed;
    EXPECT_EQ(c.reason, "the model is not float32");
  }
  BindContext cuda;
  cuda.device = BindContext::Device::cuda;
  cuda.model = "winograd_cuda_model";
  const auto on_cuda = Registry::process_default().bind(kConv2dBiasAct, cuda);
  for (const auto& c : binding_of("winograd_cuda_model").candidates) {
    if (c.name != "winograd") continue;
    ++listed;
    EXPECT_EQ(c.reason, "the model is not on the CPU");
  }
  EXPECT_EQ(listed, 2);  // listed with its reason, not silently absent
}

struct Case {
  const char* name;
  int64_t batch, c_in, c_out, h, w, pad;
  bool residual;
  Activation act;
  bool bias = true;
};

// Odd sizes leave partial tiles at the bottom and right; 36, 68 and 100 channels leave a tail
// after the 8-wide vectors (with a residual, ReLU and no bias in the last cases); padding 0 and 2
// move the tile grid; 32 -> 64 and 48 -> 48 are RT-DETR's stem and D-FINE's HGNetV2 stage 1, 16 ->
// 20 the smallest counts it takes (a GEMM panel of 16 columns and one of 4).
const Case kCases[] = {
    {"c16_to_20_relu_residual", 1, 16, 20, 11, 9, 1, true, Activation::relu},
    {"c32_relu_residual", 2, 32, 64, 13, 11, 1, true, Activation::relu},
    {"c48_silu", 1, 48, 48, 20, 20, 1, false, Activation::silu},
    {"c36_tails_no_bias", 1, 36, 72, 9, 7, 1, true, Activation::relu, false},
    {"relu_residual", 2, 64, 64, 13, 11, 1, true, Activation::relu},
    {"none_channel_tails", 1, 68, 100, 9, 7, 1, false, Activation::none},
    {"silu_pad0", 1, 64, 96, 6, 5, 0, false, Activation::silu},
    {"gelu_pad2_residual", 2, 72, 64, 8, 8, 2, true, Activation::gelu},
    {"tanh_large", 1, 64, 64, 40, 40, 1, false, Activation::tanh},
    {"relu_one_tile", 1, 128, 64, 2, 2, 1, false, Activation::relu},
    {"relu_residual_tails_no_bias", 1, 68, 100, 7, 9, 1, true, Activation::relu, false},
    {"wide_relu_residual", 2, 96, 128, 13, 11, 1, true, Activation::relu},
    {"wide_none_channel_tails", 1, 100, 104, 9, 7, 1, false, Activation::none},
    {"wide_silu_pad0", 1, 96, 96, 6, 5, 0, false, Activation::silu},
    {"wide_gelu_pad2_residual", 2, 128, 96, 8, 8, 2, true, Activation::gelu},
    {"wide_tanh_large", 1, 128, 128, 40, 40, 1, false, Activation::tanh},
    {"wide_relu_one_tile", 1, 128, 128, 2, 2, 1, false, Activation::relu},
    {"wide_relu_residual_tails_no_bias", 1, 100, 100, 7, 9, 1, true, Activation::relu, false},
    {"wide_several_blocks", 2, 96, 96, 40, 40, 1, true, Activation::relu},  // 200 tiles
};

// The bounds. F(4x4, 3x3)'s transforms multiply by up to 8 (input), 25 (B^T d B) and 1/6
// (weights, rounded once), so its error is several times the direct float32 convolution's (ATen's
// at::conv2d; 2.5-19x measured here, printed per case; Barabasz et al., ACM TOMS 2020: the same
// order for F(4, 3)): up to 50x (a margin over CPUs whose sgemm and FMA contraction differ) and
// 1e-4 absolute allowed, a relative error near 1e-5 of outputs of order one.
TEST(Conv2dBiasActWinograd, AsCloseToFloat64AsTheDirectConvolution) {
  const auto h = bind_cpu("winograd_accuracy", true);
  ASSERT_FALSE(h.empty());
  at::manual_seed(11);
  const at::NoGradGuard no_grad;
  // One thread runs the blocks in order; two split a single block by stage (few tiles) and
  // several blocks between them.
  struct RestoreThreads {
    int count = at::get_num_threads();
    ~RestoreThreads() { at::set_num_threads(count); }
  } restore;
  for (const int threads : {1, 2})
    for (const auto& k : kCases) {
      at::set_num_threads(threads);
      SCOPED_TRACE(testing::Message() << k.name << ", " << threads << " thread(s)");
      const auto x = at::randn({k.batch, k.c_in, k.h, k.w});
      const auto w = at::randn({k.c_out, k.c_in, 3, 3}) * (1.0 / std::sqrt(9.0 * k.c_in));
      const auto b = k.bias ? at::randn({k.c_out}) : at::Tensor();
      ConvGeometry g;
      g.pad_h = g.pad_w = k.pad;
      auto exact = at::conv2d(x.to(at::kDouble), w.to(at::kDouble),
                              k.bias ? b.to(at::kDouble) : at::Tensor(), 1, k.pad);
      auto direct = at::conv2d(x, w, b, 1, k.pad);
      const auto residual = k.residual ? at::randn(direct.sizes()) : at::Tensor();
      if (residual.defined()) {
        exact = exact + residual.to(at::kDouble);
        direct = direct + residual;
      }
      exact = apply_activation(k.act, exact);
      direct = apply_activation(k.act, direct);
      const auto y = conv2d_bias_act(h, x, w, b, residual, g, k.act);
      ASSERT_EQ(y.sizes(), direct.sizes());
      EXPECT_EQ(y.scalar_type(), at::kFloat);
      EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
      const double ours = max_diff(y, exact), theirs = max_diff(direct, exact);
      std::printf("[%s] max |diff| against float64: winograd F(4x4, 3x3) %.3g, direct %.3g\n",
                  k.name, ours, theirs);
      EXPECT_LE(ours, 50 * theirs + 1e-7) << "direct " << theirs;
      EXPECT_LE(ours, 1e-4);
    }
  const auto report = binding_of("winograd_accuracy");
  ASSERT_EQ(report.candidates.at(0).name, "winograd");
  EXPECT_EQ(report.candidates.at(0).calls, 2 * std::size(kCases));
  EXPECT_TRUE(report.candidates.at(0).declined.empty());
}

// Winograd's arithmetic, not a direct convolution's, shown on small integers: a direct
// convolution of them is exact in float32 (every sum stays far below 2^24), F(4x4, 3x3)'s weight
// transform rounds (1/6, 1/24), so its outputs differ from the exact ones, by little.
TEST(Conv2dBiasActWinograd, SmallIntegersShowTheTransformsRounding) {
  const auto h = bind_cpu("winograd_tile", true);
  at::manual_seed(13);
  const at::NoGradGuard no_grad;
  for (const int64_t c : {48, 64, 96}) {
    SCOPED_TRACE(c);
    const auto x = at::randint(-3, 4, {1, c, 12, 12}, at::kFloat);
    const auto w = at::randint(-2, 3, {c, c, 3, 3}, at::kFloat);
    const auto b = at::randint(-8, 9, {c}, at::kFloat);
    ConvGeometry g;
    g.pad_h = g.pad_w = 1;
    const auto y = conv2d_bias_act(h, x, w, b, {}, g, Activation::none);
    const auto exact = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), 1, 1);
    EXPECT_TRUE(at::equal(at::conv2d(x, w, b, 1, 1).to(at::kDouble), exact));
    const double diff = max_diff(y, exact), peak = exact.abs().max().item<double>();
    std::printf("[%ld channels] max |diff| %.3g of outputs up to %.3g\n", static_cast<long>(c),
                diff, peak);
    EXPECT_GT(diff, 0.0);
    EXPECT_LE(diff, 3e-5 * peak);  // 6.7e-6 measured at 96 channels
  }
  EXPECT_EQ(binding_of("winograd_tile").candidates.at(0).calls, 3u);
}

// A weight written in place after its first call (a layout applied after a warm-up forward) is
// transformed again: the second call sees the new values.
TEST(Conv2dBiasActWinograd, WeightWrittenInPlaceIsTransformedAgain) {
  const auto h = bind_cpu("winograd_retransform", true);
  at::manual_seed(12);
  const at::NoGradGuard no_grad;
  for (const int64_t c : {48, 96}) {
    SCOPED_TRACE(c);
    const double bar = 2e-4;
    const auto x = at::randn({1, c, 8, 8});
    auto w = at::randn({c, c, 3, 3}) * 0.05;
    const auto b = at::randn({c});
    ConvGeometry g;
    g.pad_h = g.pad_w = 1;
    const auto before = conv2d_bias_act(h, x, w, b, {}, g, Activation::none);
    EXPECT_LE(max_diff(before, at::conv2d(x, w, b, 1, 1)), bar);
    w.mul_(2);
    const auto after = conv2d_bias_act(h, x, w, b, {}, g, Activation::none);
    EXPECT_LE(max_diff(after, at::conv2d(x, w, b, 1, 1)), bar);
  }
  const auto report = binding_of("winograd_retransform");
  EXPECT_EQ(report.candidates.at(0).calls, 4u);  // served by winograd, not the portable path
  EXPECT_TRUE(report.candidates.at(0).declined.empty());
  EXPECT_FALSE(report.candidates.at(0).disabled);
}

// What `winograd` does not compute is declined with its reason counted, and the next candidate
// (here the portable path, `winograd` being the only one bound) answers with its own values.
TEST(Conv2dBiasActWinograd, DeclinesWhatItDoesNotCompute) {
  const char* const kTooFew = "winograd: too few channels for the transforms to pay off";
  const auto h = bind_cpu("winograd_declines", true);
  at::manual_seed(13);
  const at::NoGradGuard no_grad;
  struct Decline {
    const char* reason;
    int64_t c_in, c_out, kernel, stride, dilation, groups, pad;
    at::ScalarType dtype;
  };
  const Decline declines[] = {
      {"winograd: not an ungrouped 3x3 convolution of stride 1", 64, 64, 3, 2, 1, 1, 1, at::kFloat},
      {"winograd: not an ungrouped 3x3 convolution of stride 1", 64, 64, 1, 1, 1, 1, 0, at::kFloat},
      {"winograd: not an ungrouped 3x3 convolution of stride 1", 64, 64, 3, 1, 2, 1, 2, at::kFloat},
      {"winograd: not an ungrouped 3x3 convolution of stride 1", 64, 64, 3, 1, 1, 2, 1, at::kFloat},
      {kTooFew, 15, 64, 3, 1, 1, 1, 1, at::kFloat},
      {kTooFew, 64, 8, 3, 1, 1, 1, 1, at::kFloat},
      {"winograd: padding outside [0, 2]", 64, 64, 3, 1, 1, 1, 3, at::kFloat},
      {"winograd: not float32", 64, 64, 3, 1, 1, 1, 1, at::kDouble},
  };
  for (const auto& d : declines) {
    SCOPED_TRACE(d.reason);
    const auto x = at::randn({1, d.c_in, 9, 9}, at::TensorOptions().dtype(d.dtype));
    const auto w = at::randn({d.c_out, d.c_in / d.groups, d.kernel, d.kernel}, x.options()) * 0.1;
    ConvGeometry g;
    g.stride_h = g.stride_w = d.stride;
    g.dilation_h = g.dilation_w = d.dilation;
    g.groups = d.groups;
    g.pad_h = g.pad_w = d.pad;
    const auto y = conv2d_bias_act(h, x, w, {}, {}, g, Activation::relu);
    EXPECT_TRUE(at::equal(y, conv2d_bias_act_portable(x, w, {}, {}, g, Activation::relu)));
  }
  // An empty batch (no tile to compute): ATen's empty answer. A map smaller than the kernel:
  // ATen's error reaches the caller.
  const auto w64 = at::randn({64, 64, 3, 3}) * 0.1;
  const auto empty = at::randn({0, 64, 9, 9});
  EXPECT_TRUE(at::equal(conv2d_bias_act(h, empty, w64, {}, {}, ConvGeometry{}, Activation::none),
                        at::conv2d(empty, w64)));
  EXPECT_THROW(
      conv2d_bias_act(h, at::randn({1, 64, 1, 2}), w64, {}, {}, ConvGeometry{}, Activation::none),
      c10::Error);
  const auto report = binding_of("winograd_declines");
  const auto& declined = report.candidates.at(0).declined;
  EXPECT_EQ(declined.at("winograd: not an ungrouped 3x3 convolution of stride 1"), 4u);
  EXPECT_EQ(declined.at(kTooFew), 2u);
  EXPECT_EQ(declined.at("winograd: padding outside [0, 2]"), 1u);
  EXPECT_EQ(declined.at("winograd: not float32"), 1u);
  EXPECT_EQ(declined.at("winograd: an empty batch"), 1u);
  EXPECT_EQ(declined.at("winograd: the map is smaller than the kernel"), 1u);
  EXPECT_EQ(report.candidates.at(0).calls, 0u);
}

}  // namespace
}  // namespace libreyolo::kernels

// The `onednn` implementation of conv2d_bias_act (kernels/conv/cpu/conv2d_bias_act_onednn.cpp):
// bound for CPU float32 models, and bfloat16 models where the CPU has AVX-512 BF16 or AMX, equal
// to ATen's convolution + epilogue (bit for bit where
// the post-op is exact), channels_last output, the packed weight made again after the weight is
// written in place, and declines that leave the portable path to answer.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "tests/unit/binding_report_util.h"

namespace libreyolo::kernels {
namespace {

/// The process registry's binding for a CPU model named `model` with `dtype`, `onednn` alone
/// (`winograd`, tried before it for 3x3 stride-1 convolutions, has its own test:
/// conv2d_bias_act_winograd_test.cpp).
Conv2dBiasActHandle bind_cpu(const std::string& model, const std::string& dtype = "float32") {
  BindContext c;
  c.model = model;
  c.dtype = dtype;
  Filter only;
  only.allow[kConv2dBiasAct.name] = {"onednn"};
  return Registry::process_default().bind(kConv2dBiasAct, c, &only);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

struct Case {
  const char* name;
  int64_t c_in, c_out, groups, stride, pad, dilation, kernel;
  bool residual;
  Activation act;
  double tol;  ///< 0: bit for bit with ATen's ops on the channels_last input
};

// Ungrouped with a residual and ReLU or none: the fused binary post-op (exact). Grouped with a
// residual, or SiLU after the add: convolution, then the add and activation in ATen. SiLU, GELU
// and tanh as oneDNN post-ops: within a few float32 ulps of ATen's (|y| < 20 here).
const Case kCases[] = {
    {"relu_residual", 8, 16, 1, 1, 1, 1, 3, true, Activation::relu, 0},
    {"none_residual_stride2", 8, 16, 1, 2, 1, 1, 3, true, Activation::none, 0},
    {"relu_1x1", 8, 16, 1, 1, 0, 1, 1, false, Activation::relu, 0},
    {"silu", 8, 16, 1, 1, 1, 1, 3, false, Activation::silu, 1e-5},
    {"gelu_dilated", 8, 16, 1, 1, 2, 2, 3, false, Activation::gelu, 1e-5},
    {"tanh_stride2", 8, 16, 1, 2, 1, 1, 3, false, Activation::tanh, 1e-6},
    {"silu_grouped_residual", 8, 16, 2, 1, 1, 1, 3, true, Activation::silu, 1e-5},
    {"depthwise_relu", 16, 16, 16, 2, 2, 1, 5, false, Activation::relu, 0},
    {"silu_residual", 8, 16, 1, 1, 1, 1, 3, true, Activation::silu, 1e-5},
};

TEST(Conv2dBiasActOnednn, EqualsAtenConvolutionAndEpilogue) {
  const auto h = bind_cpu("onednn_equals_aten");
  ASSERT_FALSE(h.empty());
  EXPECT_EQ(binding_of("onednn_equals_aten").selected, "onednn");
  at::manual_seed(5);
  const at::NoGradGuard no_grad;
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.name);
    const auto x = at::randn({2, k.c_in, 13, 11});
    const auto w = at::randn({k.c_out, k.c_in / k.groups, k.kernel, k.kernel}) * 0.3;
    const auto b = at::randn({k.c_out});
    ConvGeometry g;
    g.stride_h = g.stride_w = k.stride;
    g.pad_h = g.pad_w = k.pad;
    g.dilation_h = g.dilation_w = k.dilation;
    g.groups = k.groups;
    const auto xl = x.contiguous(at::MemoryFormat::ChannelsLast);
    auto ref = at::conv2d(xl, w.contiguous(at::MemoryFormat::ChannelsLast), b, {k.stride, k.stride},
                          {k.pad, k.pad}, {k.dilation, k.dilation}, k.groups);
    const auto residual = k.residual ? at::randn_like(ref).contiguous() : at::Tensor();
    if (residual.defined()) ref = ref + residual;
    ref = apply_activation(k.act, ref);
    const auto y = conv2d_bias_act(h, x, w, b, residual, g, k.act);  // NCHW input
    ASSERT_EQ(y.sizes(), ref.sizes());
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
    if (k.tol == 0)
      EXPECT_TRUE(at::equal(y, ref)) << "max |diff| " << max_diff(y, ref);
    else
      EXPECT_LE(max_diff(y, ref), k.tol);
    // The portable path on the NCHW input: ATen's other (nchw) kernels, a summation order apart.
    const auto portable = conv2d_bias_act_portable(x, w, b, residual, g, k.act);
    EXPECT_LE(max_diff(y, portable), 1e-4);
  }
  const auto report = binding_of("onednn_equals_aten");
  ASSERT_FALSE(report.candidates.empty());
  EXPECT_EQ(report.candidates.at(0).name, "onednn");
  EXPECT_EQ(report.candidates.at(0).calls, std::size(kCases));
  EXPECT_TRUE(report.candidates.at(0).declined.empty());
}

// bfloat16 on a CPU with native bfloat16 (AMX or AVX-512 BF16; skipped elsewhere): oneDNN's
// kernels accumulate in float32 and round once after the fused post-ops (the grouped residual
// case adds and activates in ATen: two more roundings), where ATen's bfloat16 path rounds the
// convolution's output and then each epilogue step. Both are compared with the float32 result of
// the same bfloat16 inputs, relative to its largest value: ours within a few bfloat16 roundings
// (2^-9 each), ATen's portable path within 0.02.
TEST(Conv2dBiasActOnednn, Bfloat16OnANativeBfloat16Cpu) {
  if (!cpu_has_native_bfloat16()) GTEST_SKIP() << "this CPU has no avx512_bf16 or amx_bf16";
  const auto h = bind_cpu("onednn_bfloat16", "bfloat16");
  ASSERT_FALSE(h.empty());
  EXPECT_EQ(binding_of("onednn_bfloat16").selected, "onednn");
  at::manual_seed(8);
  const at::NoGradGuard no_grad;
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.name);
    const auto x = at::randn({2, k.c_in, 13, 11}).to(at::kBFloat16);
    const auto w =
        (at::randn({k.c_out, k.c_in / k.groups, k.kernel, k.kernel}) * 0.3).to(at::kBFloat16);
    const auto b = at::randn({k.c_out}).to(at::kBFloat16);
    ConvGeometry g;
    g.stride_h = g.stride_w = k.stride;
    g.pad_h = g.pad_w = k.pad;
    g.dilation_h = g.dilation_w = k.dilation;
    g.groups = k.groups;
    auto exact =
        at::conv2d(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat), {k.stride, k.stride},
                   {k.pad, k.pad}, {k.dilation, k.dilation}, k.groups);
    const auto residual = k.residual ? at::randn_like(exact).to(at::kBFloat16) : at::Tensor();
    if (residual.defined()) exact = exact + residual.to(at::kFloat);
    exact = apply_activation(k.act, exact);
    const auto y = conv2d_bias_act(h, x, w, b, residual, g, k.act);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
    const double scale = exact.abs().max().item<double>();
    EXPECT_LE(max_diff(y.to(at::kFloat), exact), scale * 0.008);
    const auto portable = conv2d_bias_act_portable(x, w, b, residual, g, k.act);
    EXPECT_LE(max_diff(portable.to(at::kFloat), exact), scale * 0.02);
  }
  const auto report = binding_of("onednn_bfloat16");
  ASSERT_FALSE(report.candidates.empty());
  EXPECT_EQ(report.candidates.at(0).calls, std::size(kCases));
  EXPECT_TRUE(report.candidates.at(0).declined.empty());
}

// The residual's memory (kernels/conv/conv2d_bias_act.h): conv2d_bias_act never writes into the
// caller's residual; conv2d_bias_act_consuming writes the output into it when the caller moved
// its last reference in (oneDNN's in-place sum post-op), and not when another tensor still
// holds it (a second handle or a view). The values are the same in every case.
TEST(Conv2dBiasActOnednn, HandedOverResidualHoldsTheOutput) {
  const auto h = bind_cpu("onednn_handed_over");
  at::manual_seed(9);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({1, 8, 10, 10}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = at::randn({16, 8, 3, 3}) * 0.3;
  const auto b = at::randn({16});
  ConvGeometry g;
  g.pad_h = g.pad_w = 1;
  const auto original = at::randn({1, 16, 10, 10}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto expected = at::relu(at::conv2d(x, w, b, 1, 1) + original);

  auto kept = original.clone();
  const auto y = conv2d_bias_act(h, x, w, b, kept, g, Activation::relu);
  EXPECT_TRUE(at::equal(kept, original));
  EXPECT_NE(y.data_ptr(), kept.data_ptr());
  EXPECT_LE(max_diff(y, expected), 1e-5);

  auto moved = original.clone();
  const void* memory = moved.data_ptr();
  const auto into = conv2d_bias_act_consuming(h, x, w, b, std::move(moved), g, Activation::relu);
  EXPECT_EQ(into.data_ptr(), memory);
  EXPECT_TRUE(at::equal(into, y));

  auto shared = original.clone();
  const auto view = shared.view({16, 10, 10});  // shares the memory: not handed over
  const auto not_into =
      conv2d_bias_act_consuming(h, x, w, b, std::move(shared), g, Activation::relu);
  EXPECT_TRUE(at::equal(view.view({1, 16, 10, 10}), original));
  EXPECT_TRUE(at::equal(not_into, y));

  // An NCHW residual is converted to a channels_last copy of our own, which then holds the
  // output; the caller's tensor is untouched.
  const auto nchw = original.contiguous();
  const auto from_nchw = conv2d_bias_act(h, x, w, b, nchw, g, Activation::relu);
  EXPECT_TRUE(at::equal(nchw, original));
  EXPECT_TRUE(at::equal(from_nchw, y));
  EXPECT_EQ(binding_of("onednn_handed_over").candidates.at(0).calls, 4u);
}

// A weight written in place after its first call (a layout applied after a warm-up forward)
// is packed again: the second call sees the new values.
TEST(Conv2dBiasActOnednn, WeightWrittenInPlaceIsPackedAgain) {
  const auto h = bind_cpu("onednn_repack");
  at::manual_seed(6);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({1, 4, 8, 8});
  auto w = at::randn({6, 4, 3, 3});
  const auto b = at::randn({6});
  ConvGeometry g;
  g.pad_h = g.pad_w = 1;
  const auto before = conv2d_bias_act(h, x, w, b, {}, g, Activation::none);
  w.mul_(2);
  const auto after = conv2d_bias_act(h, x, w, b, {}, g, Activation::none);
  EXPECT_LE(max_diff(after - b.view({1, 6, 1, 1}), 2 * (before - b.view({1, 6, 1, 1}))), 1e-5);
  // A new tensor with other values (the address of a freed one may be reused) is its own entry.
  const auto w2 = at::randn({6, 4, 3, 3});
  const auto y2 = conv2d_bias_act(h, x, w2, b, {}, g, Activation::none);
  EXPECT_LE(max_diff(y2, conv2d_bias_act_portable(x, w2, b, {}, g, Activation::none)), 1e-4);
}

// A residual of 1x1 maps (a small request at the end of a backbone): oneDNN's binary post-op
// refuses its strides, so the add runs in ATen; the implementation serves the call and stays
// enabled.
TEST(Conv2dBiasActOnednn, OneByOneMapResidual) {
  const auto h = bind_cpu("onednn_1x1_residual");
  at::manual_seed(7);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({2, 8, 2, 2});
  const auto w = at::randn({16, 8, 3, 3});
  const auto b = at::randn({16});
  const auto residual = at::randn({2, 16, 1, 1});
  ConvGeometry g;
  g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  const auto y = conv2d_bias_act(h, x, w, b, residual, g, Activation::relu);
  const auto ref =
      at::relu(at::conv2d(x.contiguous(at::MemoryFormat::ChannelsLast), w, b, 2, 1) + residual);
  EXPECT_LE(max_diff(y, ref), 1e-5);
  const auto report = binding_of("onednn_1x1_residual");
  EXPECT_EQ(report.candidates.at(0).calls, 1u);
  EXPECT_TRUE(report.candidates.at(0).declined.empty());
  EXPECT_FALSE(report.candidates.at(0).disabled);
}

// Not float32 (nor bfloat16 on a native-bfloat16 CPU): declined with the reason counted, and the
// portable path answers. Models on another device or in another dtype do not bind it at all.
TEST(Conv2dBiasActOnednn, DeclinesAndBindRules) {
  const auto h = bind_cpu("onednn_declines");
  const at::NoGradGuard no_grad;
  const auto x = at::randn({1, 4, 6, 6}, at::kDouble);
  const auto w = at::randn({5, 4, 3, 3}, at::kDouble);
  const auto y = conv2d_bias_act(h, x, w, {}, {}, ConvGeometry{}, Activation::relu);
  EXPECT_TRUE(at::equal(y, at::relu(at::conv2d(x, w))));
  const auto report = binding_of("onednn_declines");
  EXPECT_EQ(report.candidates.at(0).declined.at(
                "onednn: dtype (float32, or bfloat16 on a CPU with avx512_bf16 or "
                "amx_bf16)"),
            1u);

  // Bindings are listed while their handle lives.
  const auto fp16 = bind_cpu("onednn_float16_model", "float16");
  EXPECT_TRUE(fp16.empty());
  for (const auto& c : binding_of("onednn_float16_model").candidates)
    if (c.name == "onednn") EXPECT_EQ(c.reason, "the model is not float32 or bfloat16");
  const auto bf16 = bind_cpu("onednn_bfloat16_model", "bfloat16");
  EXPECT_EQ(bf16.empty(), !cpu_has_native_bfloat16());
  for (const auto& c : binding_of("onednn_bfloat16_model").candidates)
    if (c.name == "onednn")
      EXPECT_EQ(c.reason, cpu_has_native_bfloat16()
                              ? ""
                              : "bfloat16 on a CPU without avx512_bf16 or amx_bf16");
  BindContext cuda;
  cuda.device = BindContext::Device::cuda;
  cuda.model = "onednn_cuda_model";
  const auto on_cuda = Registry::process_default().bind(kConv2dBiasAct, cuda);
  for (const auto& c : binding_of("onednn_cuda_model").candidates)
    if (c.name == "onednn") EXPECT_EQ(c.reason, "the model is not on the CPU");
}

}  // namespace
}  // namespace libreyolo::kernels

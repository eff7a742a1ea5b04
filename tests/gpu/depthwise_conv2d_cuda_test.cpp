// The `cuda_depthwise` conv2d_bias_act (kernels/conv/cuda/depthwise_conv2d_cuda.h), called
// through a registry binding as models call it, against the portable path.
//
// What is asserted, per output element (ref: the portable path in float64 on the same, already
// rounded, inputs; terms: the same convolution of |x| and |w| plus |bias| + |residual|, the scale
// of float32 accumulation error):
//   float32:            |y - ref| <= 1e-5 * terms
//   float16 / bfloat16: |y - ref| <= ulp(ref) + 1e-5 * terms
// with ulp(v) the dtype's spacing at |v| (2^(floor(log2 |v|) - 10) for float16, - 7 for
// bfloat16; at least the smallest subnormal spacing): the kernel sums in float32 and rounds
// once (half an ulp). Against the portable path in the same dtype (ATen rounds after the
// convolution, the bias, the residual and the activation): float32 (TF32 off) within 1e-5 *
// terms, 16-bit within 4 ulps of terms (2^(2-p) * terms); the largest difference is printed.
//
// Covered: kernel 1x1 .. 7x7 (odd, even, non-square), strides 1 and 2 (and mixed), padding 0 ..
// 3, dilation 2, float32 / float16 / bfloat16, C with the 16-byte path (64) and without it (20:
// 16-bit per element, float32 vector; 13: per element), every activation with and without
// bias and residual, an empty batch, storage not 16-byte aligned, HGNetV2-B4 / SCDown shapes,
// a batch-32 map; and declines: NCHW, grouped (groups != C), depth multiplier 2, 9x9, stride
// 3, float64, CPU, autograd, each counted under its reason, the call answered by `cuda` with
// the same numbers. Skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <iterator>
#include <map>
#include <string>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/depthwise_conv2d_cuda.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

constexpr const char* kImpl = "cuda_depthwise";

/// The binding of conv2d_bias_act to cuda_depthwise alone: a decline returns std::nullopt.
Conv2dBiasActHandle depthwise_only() {
  Filter f;
  f.allow[kConv2dBiasAct.name] = {kImpl};
  return test::cuda_only().bind(kConv2dBiasAct, test::cuda_context(), &f);
}

/// cuda_depthwise's decline reasons so far in test::cuda_only(), for failure messages (a
/// failed self-check shows here: "kernel failed its check against ATen on this device").
std::string declines() {
  std::string out;
  for (const auto& slot : test::cuda_only().report())
    if (slot.slot == kConv2dBiasAct.name)
      for (const auto& c : slot.candidates)
        if (c.name == kImpl)
          for (const auto& [why, n] : c.declined)
            out += "[" + why + "] x" + std::to_string(n) + " ";
  return out.empty() ? "(no declines recorded)" : out;
}

struct Geometry {
  const char* name;
  int64_t kh, kw, sh, sw, ph, pw, dilation;
};

ConvGeometry geometry(const Geometry& s, int64_t C) {
  ConvGeometry g;
  g.stride_h = s.sh, g.stride_w = s.sw;
  g.pad_h = s.ph, g.pad_w = s.pw;
  g.dilation_h = g.dilation_w = s.dilation;
  g.groups = C;
  return g;
}

/// One depthwise convolution's operands (channels_last input), of dtype on the GPU.
struct Operands {
  at::Tensor x, w, b, r;
};

Operands make(at::ScalarType dtype, int64_t B, int64_t C, int64_t H, int64_t W, int64_t kh,
              int64_t kw, const ConvGeometry& g, bool bias, bool residual) {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  Operands o;
  o.x = at::randn({B, C, H, W}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  o.w = (at::randn({C, 1, kh, kw}, opts) / static_cast<double>(kh * kw))
            .contiguous(at::MemoryFormat::ChannelsLast);
  if (bias) o.b = at::randn({C}, opts);
  if (residual) {
    const int64_t oh = cuda::conv_output_size(H, kh, g.pad_h, g.stride_h, g.dilation_h);
    const int64_t ow = cuda::conv_output_size(W, kw, g.pad_w, g.stride_w, g.dilation_w);
    o.r = at::randn({B, C, oh, ow}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  }
  return o;
}

at::Tensor f64(const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; }
at::Tensor abs64(const at::Tensor& t) { return t.defined() ? t.to(at::kDouble).abs() : t; }

/// The dtype's spacing at |v| (float64 tensor in, float64 tensor out); 0 for float32 (its
/// bound is the accumulation term alone).
at::Tensor ulp(const at::Tensor& v, at::ScalarType dtype) {
  if (dtype == at::kFloat) return at::zeros_like(v);
  const int p = dtype == at::kHalf ? 10 : 7;
  const double emin = dtype == at::kHalf ? -14 : -126;
  const auto e = at::floor(at::log2(v.abs())).clamp_min(emin);  // log2(0) = -inf -> emin
  return at::exp2(e - p);
}

struct Check {
  bool ok = true;
  double worst_ulps = 0;   ///< max |y - ref| / (ulp(ref) + 1e-5 terms): <= 1 passes
  double vs_portable = 0;  ///< max |y - portable same dtype| / terms
  std::string detail;
};

/// y against the float64 reference and the same-dtype portable path (see the file comment).
Check check(const at::Tensor& y, const Operands& o, const ConvGeometry& g, Activation act) {
  const auto dtype = o.x.scalar_type();
  const auto ref = conv2d_bias_act_portable(f64(o.x), f64(o.w), f64(o.b), f64(o.r), g, act);
  const auto terms =
      conv2d_bias_act_portable(abs64(o.x), abs64(o.w), abs64(o.b), abs64(o.r), g, Activation::none);
  Check c;
  if (y.sizes() != ref.sizes()) {
    c.ok = false;
    c.detail = "sizes " + c10::str(y.sizes()) + " vs " + c10::str(ref.sizes());
    return c;
  }
  // channels_last in, channels_last out (an NCHW input is `cuda`'s, whose output follows it).
  const bool cl = o.x.is_contiguous(at::MemoryFormat::ChannelsLast);
  if ((cl && !y.is_contiguous(at::MemoryFormat::ChannelsLast)) || y.scalar_type() != dtype) {
    c.ok = false;
    c.detail = "not channels_last or wrong dtype; ";
  }
  if (y.numel() == 0) return c;
  const auto err = (y.to(at::kDouble) - ref).abs();
  const auto bound = ulp(ref, dtype) + terms * 1e-5;
  c.worst_ulps = (err / (bound + 1e-300)).max().item<double>();
  c.ok = c.ok && err.le(bound).all().item<bool>();
  // The portable path in y's dtype (float32 without TF32).
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  const auto same = conv2d_bias_act_portable(o.x, o.w, o.b, o.r, g, act);
  at::globalContext().setAllowTF32CuDNN(tf32);
  const double scale = dtype == at::kFloat ? 1e-5 : std::ldexp(1.0, dtype == at::kHalf ? -8 : -5);
  const auto diff = (y.to(at::kDouble) - same.to(at::kDouble)).abs();
  c.vs_portable = (diff / (terms + 1e-300)).max().item<double>();
  if (!diff.le(terms * scale + (dtype == at::kHalf ? 0x1p-24 : 0.0)).all().item<bool>()) {
    c.ok = false;
    c.detail += "differs from the same-dtype portable path by " + std::to_string(c.vs_portable) +
                " x terms; ";
  }
  if (!c.ok)
    c.detail += "max error " + std::to_string(c.worst_ulps) + " x bound (max |diff| " +
                std::to_string(err.max().item<double>()) + ")";
  return c;
}

std::string dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kHalf ? "float16" : "bfloat16";
}

/// Calls and declines of an implementation of conv2d_bias_act in `reg`'s report.
struct Counts {
  uint64_t calls = 0;
  std::map<std::string, uint64_t> declined;
};
Counts counts(Registry& reg, const std::string& impl) {
  Counts c;
  for (const auto& slot : reg.report())
    if (slot.slot == kConv2dBiasAct.name)
      for (const auto& cand : slot.candidates)
        if (cand.name == impl) c.calls = cand.calls, c.declined = cand.declined;
  return c;
}

const Geometry kGeometries[] = {
    {"3x3 s1 p1", 3, 3, 1, 1, 1, 1, 1},
    {"3x3 s2 p1 (HGNetV2 downsample, SCDown)", 3, 3, 2, 2, 1, 1, 1},
    {"5x5 s1 p2 (HGNetV2 light block)", 5, 5, 1, 1, 2, 2, 1},
    {"5x5 s2 p2", 5, 5, 2, 2, 2, 2, 1},
    {"7x7 s1 p3", 7, 7, 1, 1, 3, 3, 1},
    {"7x7 s2 p3", 7, 7, 2, 2, 3, 3, 1},
    {"3x3 s1 p0", 3, 3, 1, 1, 0, 0, 1},
    {"3x3 s2 p0", 3, 3, 2, 2, 0, 0, 1},
    {"5x3 s1 p(2,1) (tiled, kh != kw)", 5, 3, 1, 1, 2, 1, 1},
    {"3x5 s2 p(1,2)", 3, 5, 2, 2, 1, 2, 1},
    {"1x1 s1 (generic)", 1, 1, 1, 1, 0, 0, 1},
    {"1x1 s2 (generic)", 1, 1, 2, 2, 0, 0, 1},
    {"2x2 s2 p0 (generic, even)", 2, 2, 2, 2, 0, 0, 1},
    {"4x4 s1 p1 (generic, even)", 4, 4, 1, 1, 1, 1, 1},
    {"6x6 s2 p3 (generic, even)", 6, 6, 2, 2, 3, 3, 1},
    {"3x3 s(2,1) p1 (generic, mixed strides)", 3, 3, 2, 1, 1, 1, 1},
    {"3x3 s1 p2 dilation 2 (generic)", 3, 3, 1, 1, 2, 2, 2},
    {"7x7 s2 p0 (one output row on 8-high maps)", 7, 7, 2, 2, 0, 0, 1},
    {"3x3 s1 p2 (tiled, windows of padding only)", 3, 3, 1, 1, 2, 2, 1},
};

constexpr Activation kActs[] = {Activation::none, Activation::relu, Activation::silu,
                                Activation::gelu, Activation::tanh};

// Every geometry x dtype x channel count (16-byte path or not) on two map sizes; the
// activation and the bias / residual combination rotate over the cases (every one appears for
// every dtype; the next test crosses them all).
TEST(DepthwiseConvCuda, EveryGeometryDtypeAndChannelCountWithinOneUlp) {
  REQUIRE_CUDA();
  const auto handle = depthwise_only();
  ASSERT_FALSE(handle.empty()) << "cuda_depthwise is not bound";
  at::manual_seed(21);
  int checked = 0, index = 0;
  double worst = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t C : {64, 20, 13}) {
      for (auto hw : {std::pair<int64_t, int64_t>{11, 13}, {8, 21}}) {
        for (const auto& s : kGeometries) {
          const auto act = kActs[index % 5];
          const bool bias = index % 2 == 0, residual = (index / 2) % 2 == 0;
          ++index;
          const auto g = geometry(s, C);
          const auto o = make(dtype, 2, C, hw.first, hw.second, s.kh, s.kw, g, bias, residual);
          const auto y = handle(o.x, o.w, o.b, o.r, g, act);
          ASSERT_TRUE(y.has_value()) << s.name << ": cuda_depthwise declined: " << declines();
          const auto c = check(*y, o, g, act);
          EXPECT_TRUE(c.ok) << dtype_name(dtype) << " C " << C << " " << hw.first << "x"
                            << hw.second << " " << s.name << " act " << activation_name(act)
                            << " bias " << bias << " residual " << residual << ": " << c.detail;
          worst = std::max(worst, c.worst_ulps);
          ++checked;
        }
      }
    }
  }
  std::cout << "[gpu] cuda_depthwise: " << checked
            << " geometry cases within bound; worst error / bound = " << worst << "\n";
  EXPECT_EQ(checked, 3 * 3 * 2 * static_cast<int>(std::size(kGeometries)));
}

TEST(DepthwiseConvCuda, EveryActivationWithAndWithoutBiasAndResidual) {
  REQUIRE_CUDA();
  const auto handle = depthwise_only();
  at::manual_seed(22);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const Geometry& s : {kGeometries[1], kGeometries[2], kGeometries[13]}) {
      for (int64_t C : {32, 12}) {
        for (auto act : kActs) {
          for (int with = 0; with < 4; ++with) {
            const auto g = geometry(s, C);
            const auto o = make(dtype, 3, C, 10, 9, s.kh, s.kw, g, with & 1, with & 2);
            const auto y = handle(o.x, o.w, o.b, o.r, g, act);
            ASSERT_TRUE(y.has_value()) << "declined: " << declines();
            const auto c = check(*y, o, g, act);
            EXPECT_TRUE(c.ok) << dtype_name(dtype) << " " << s.name << " C " << C << " act "
                              << activation_name(act) << " bias " << (with & 1) << " residual "
                              << ((with & 2) != 0) << ": " << c.detail;
            ++checked;
          }
        }
      }
    }
  }
  std::cout << "[gpu] cuda_depthwise: " << checked << " activation x bias x residual cases\n";
  EXPECT_EQ(checked, 3 * 3 * 2 * 5 * 4);
}

// The depthwise convolutions of D-FINE L's HGNetV2-B4 and hybrid encoder at 640 (batch 2), and
// one batch-32 map (a grid of many blocks, the benchmark's shape).
TEST(DepthwiseConvCuda, HGNetV2AndSCDownShapes) {
  REQUIRE_CUDA();
  const auto handle = depthwise_only();
  at::manual_seed(23);
  struct Shape {
    const char* name;
    int64_t B, C, H, k, stride;
    Activation act;
  };
  const Shape shapes[] = {
      {"stage1 downsample 128x160x160 3x3 s2", 2, 128, 160, 3, 2, Activation::none},
      {"stage2 downsample 512x80x80 3x3 s2", 2, 512, 80, 3, 2, Activation::none},
      {"stage3 downsample 1024x40x40 3x3 s2", 2, 1024, 40, 3, 2, Activation::none},
      {"stage2 light 192x40x40 5x5 s1", 2, 192, 40, 5, 1, Activation::relu},
      {"stage3 light 384x20x20 5x5 s1", 2, 384, 20, 5, 1, Activation::relu},
      {"SCDown 256x80x80 3x3 s2", 2, 256, 80, 3, 2, Activation::none},
      {"batch 32 512x40x40 5x5 s1", 32, 512, 40, 5, 1, Activation::relu},
  };
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const auto& s : shapes) {
      const Geometry geo{s.name, s.k, s.k, s.stride, s.stride, s.k / 2, s.k / 2, 1};
      const auto g = geometry(geo, s.C);
      const auto o = make(dtype, s.B, s.C, s.H, s.H, s.k, s.k, g, true, false);
      const auto y = handle(o.x, o.w, o.b, o.r, g, s.act);
      ASSERT_TRUE(y.has_value()) << s.name << ": declined: " << declines();
      const auto c = check(*y, o, g, s.act);
      EXPECT_TRUE(c.ok) << dtype_name(dtype) << " " << s.name << ": " << c.detail;
      std::cout << "[gpu] cuda_depthwise " << dtype_name(dtype) << " " << s.name
                << ": error / bound " << c.worst_ulps << ", vs same-dtype portable "
                << c.vs_portable << " x terms\n";
    }
  }
}

TEST(DepthwiseConvCuda, EmptyBatchAndUnalignedStorage) {
  REQUIRE_CUDA();
  const auto handle = depthwise_only();
  at::manual_seed(24);
  const auto g = geometry(kGeometries[2], 16);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    // Empty batch: an empty channels_last output of the right shape.
    const auto empty = at::empty({0, 16, 9, 9}, opts.memory_format(at::MemoryFormat::ChannelsLast));
    const auto w = at::randn({16, 1, 5, 5}, opts);
    const auto y0 = handle(empty, w, at::randn({16}, opts), at::Tensor(), g, Activation::silu);
    ASSERT_TRUE(y0.has_value()) << "declined: " << declines();
    EXPECT_EQ(y0->sizes(), (at::IntArrayRef{0, 16, 9, 9}));
    // A channels_last view one element into its storage: no 16-byte path, the same numbers.
    const int64_t B = 2, C = 16, H = 12, W = 10;
    const auto buffer = at::randn({B * C * H * W + 1}, opts);
    Operands o;
    o.x = buffer.narrow(0, 1, B * C * H * W).view({B, H, W, C}).permute({0, 3, 1, 2});
    ASSERT_TRUE(o.x.is_contiguous(at::MemoryFormat::ChannelsLast));
    o.w = w;
    o.b = at::randn({C}, opts);
    // A residual in NCHW (the kernel makes it channels_last).
    o.r = at::randn({B, C, H, W}, opts);
    const auto y = handle(o.x, o.w, o.b, o.r, g, Activation::gelu);
    ASSERT_TRUE(y.has_value()) << "declined: " << declines();
    const auto c = check(*y, o, g, Activation::gelu);
    EXPECT_TRUE(c.ok) << dtype_name(dtype) << " unaligned: " << c.detail;
  }
}

// With both implementations bound (the daemon's order: cuda_depthwise first), eligible calls
// run cuda_depthwise and everything it declines is counted under its reason and answered by
// `cuda` (or, for CPU / float64, by nothing: std::nullopt, the caller's portable path) with
// the portable path's numbers.
TEST(DepthwiseConvCuda, DeclinesFallThroughToCudaWithTheSameNumbers) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto impls = reg.iter_impls(kConv2dBiasAct.name);
  ASSERT_GE(impls.size(), 2u);
  EXPECT_EQ(impls.at(0), kImpl) << "cuda_depthwise must be tried before cuda";
  EXPECT_EQ(impls.back(), "cuda");  // cudnn_graph, when built, sits between the two
  // The fall-through from cuda_depthwise to `cuda` alone: cudnn_graph's own tuned choice
  // (tests/gpu/conv2d_bias_act_cudnn_graph_test.cpp) would otherwise answer some calls.
  Filter without_cudnn_graph;
  without_cudnn_graph.allow[kConv2dBiasAct.name] = {kImpl, "cuda"};
  const auto h = reg.bind(kConv2dBiasAct, test::cuda_context(), &without_cudnn_graph);
  at::manual_seed(25);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const auto cl = at::MemoryFormat::ChannelsLast;
  const int64_t C = 16;
  const auto g = geometry(kGeometries[1], C);
  const auto x = at::randn({2, C, 12, 12}, opts).contiguous(cl);
  const auto w = at::randn({C, 1, 3, 3}, opts);
  const auto b = at::randn({C}, opts);

  // Eligible: cuda_depthwise.
  ASSERT_TRUE(h(x, w, b, at::Tensor(), g, Activation::silu).has_value());
  EXPECT_EQ(counts(reg, kImpl).calls, 1u);
  EXPECT_EQ(counts(reg, "cuda").calls, 0u);

  auto expect_cuda_answers = [&](const char* what, const Operands& o, const ConvGeometry& geo) {
    const uint64_t before = counts(reg, "cuda").calls;
    const auto y = h(o.x, o.w, o.b, o.r, geo, Activation::silu);
    ASSERT_TRUE(y.has_value()) << what << ": nobody answered";
    EXPECT_EQ(counts(reg, "cuda").calls, before + 1) << what << ": `cuda` did not answer";
    const auto c = check(*y, o, geo, Activation::silu);
    // cuDNN in bf16 rounds its convolution before the epilogue: compare with the same-dtype
    // portable bound only (check's second criterion), not the one-ulp one.
    EXPECT_LE(c.vs_portable, 0x1p-5) << what << ": " << c.detail;
  };
  // NCHW.
  expect_cuda_answers("NCHW", Operands{x.contiguous(), w, b, {}}, g);
  // Grouped, not depthwise: groups = C / 2, weight (C, 2, 3, 3).
  {
    auto gg = g;
    gg.groups = C / 2;
    expect_cuda_answers("groups = C / 2", Operands{x, at::randn({C, 2, 3, 3}, opts), b, {}}, gg);
  }
  // Depth multiplier 2: groups = C, C_out = 2 C.
  expect_cuda_answers("multiplier 2",
                      Operands{x, at::randn({2 * C, 1, 3, 3}, opts), at::randn({2 * C}, opts), {}},
                      g);
  // 9x9 kernel.
  {
    auto g9 = g;
    g9.pad_h = g9.pad_w = 4;
    expect_cuda_answers("9x9", Operands{x, at::randn({C, 1, 9, 9}, opts), b, {}}, g9);
  }
  // Stride 3.
  {
    auto g3 = g;
    g3.stride_h = g3.stride_w = 3;
    expect_cuda_answers("stride 3", Operands{x, w, b, {}}, g3);
  }
  // Autograd.
  {
    const auto wg = w.clone().requires_grad_();
    const uint64_t before = counts(reg, "cuda").calls;
    const auto y = h(x, wg, b, at::Tensor(), g, Activation::silu);
    // `cuda` declines autograd too: the portable path (nullopt) computes it.
    EXPECT_FALSE(y.has_value());
    EXPECT_EQ(counts(reg, "cuda").calls, before);
  }
  // float64 and CPU: nobody here (the portable path).
  EXPECT_FALSE(
      h(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), at::Tensor(), g, Activation::silu)
          .has_value());
  EXPECT_FALSE(h(x.cpu(), w.cpu(), b.cpu(), at::Tensor(), g, Activation::silu).has_value());

  const auto mine = counts(reg, kImpl);
  EXPECT_EQ(mine.calls, 1u);
  const std::map<std::string, uint64_t> expected = {
      {"cuda_depthwise: input not channels_last", 1},
      {"cuda_depthwise: not depthwise (groups == C_in == C_out only)", 2},
      {"cuda_depthwise: kernel larger than 7x7", 1},
      {"cuda_depthwise: stride other than 1 or 2", 1},
      {"cuda_depthwise: autograd (no backward)", 1},
      {"cuda_depthwise: dtype (float32, float16, bfloat16 only)", 1},
      {"cuda_depthwise: not a CUDA tensor", 1},
  };
  EXPECT_EQ(mine.declined, expected);
  for (const auto& [why, n] : mine.declined)
    std::cout << "[gpu] cuda_depthwise declined[" << why << "] = " << n << "\n";
}

// The cached (kh * kw, C) weight follows the weight tensor: an in-place change of the weight
// (a new version) and a new weight tensor at the same address both give new numbers.
TEST(DepthwiseConvCuda, CachedWeightFollowsInPlaceChanges) {
  REQUIRE_CUDA();
  const auto handle = depthwise_only();
  at::manual_seed(26);
  const auto g = geometry(kGeometries[2], 32);
  auto o = make(at::kFloat, 2, 32, 9, 9, 5, 5, g, true, false);
  const auto first = handle(o.x, o.w, o.b, o.r, g, Activation::none);
  ASSERT_TRUE(first.has_value()) << "declined: " << declines();
  ASSERT_TRUE(check(*first, o, g, Activation::none).ok);
  o.w.mul_(-2.0);  // same tensor, same storage, new version
  const auto c = check(*handle(o.x, o.w, o.b, o.r, g, Activation::none), o, g, Activation::none);
  EXPECT_TRUE(c.ok) << "after an in-place change of the weight: " << c.detail;
  for (int i = 0; i < 3; ++i) {  // fresh weight tensors (the allocator may reuse the address)
    o.w = at::randn_like(o.w);
    const auto ci = check(*handle(o.x, o.w, o.b, o.r, g, Activation::none), o, g, Activation::none);
    EXPECT_TRUE(ci.ok) << "new weight tensor " << i << ": " << ci.detail;
  }
}

}  // namespace
}  // namespace libreyolo::kernels

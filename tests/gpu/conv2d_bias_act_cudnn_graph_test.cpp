// The `cudnn_graph` conv2d_bias_act (kernels/conv/cuda/conv2d_bias_act_cudnn_graph.h): the fused
// cuDNN graph against the float32 convolution with TF32 off, within one rounding of the output
// dtype (the graph keeps the convolution's sum in float32 up to the output), for RT-DETR's and
// HGNetV2's convolution shapes (1x1, 3x3, 3x3 stride 2) with bias, residual and every activation
// it fuses, in bfloat16 and float16; the binding's tuned choice (fused, or declined with one of
// its reasons) gives the same numbers and is kept per geometry; what it does not fuse declines
// with its exact reason. Skips without a GPU or without cudnn-frontend's headers.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/conv2d_bias_act_cudnn_graph.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

constexpr const char* kImpl = "cudnn_graph";

#define REQUIRE_CUDNN_GRAPH() \
  REQUIRE_CUDA();             \
  if (!cuda::cudnn_graph_built()) GTEST_SKIP() << "built without cudnn-frontend's headers"

/// TF32 off for the float32 reference while alive (CUDA parity runs without TF32).
struct NoTf32 {
  bool before = at::globalContext().allowTF32CuDNN();
  NoTf32() { at::globalContext().setAllowTF32CuDNN(false); }
  ~NoTf32() { at::globalContext().setAllowTF32CuDNN(before); }
};

/// conv2d_bias_act bound to cudnn_graph alone in `reg` (declared with the cuda
/// implementations): a decline returns std::nullopt.
Conv2dBiasActHandle cudnn_graph_only(Registry& reg) {
  test::declare_with_cuda_only(reg);
  Filter f;
  f.allow[kConv2dBiasAct.name] = {kImpl};
  return reg.bind(kConv2dBiasAct, test::cuda_context(), &f);
}

struct Case {
  const char* name;
  int64_t c_in, c_out, k, stride, B, H;
};

// RT-DETR-R18's encoder (1x1 256 -> 256, 3x3 RepVGG 128), its stride-2 downsampling, and an
// HGNetV2 stem-like 3x3 at 32 channels.
const std::vector<Case> kCases{{"1x1 256->256", 256, 256, 1, 1, 1, 20},
                               {"3x3 128->128", 128, 128, 3, 1, 1, 40},
                               {"3x3 s2 256->256", 256, 256, 3, 2, 2, 20},
                               {"3x3 32->48", 32, 48, 3, 1, 4, 32}};

struct Operands {
  at::Tensor x, w, b, r;
  ConvGeometry g;
};

Operands operands(const Case& c, at::ScalarType dtype, bool bias, bool residual) {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  const auto cl = at::MemoryFormat::ChannelsLast;
  Operands o;
  o.g.stride_h = o.g.stride_w = c.stride;
  o.g.pad_h = o.g.pad_w = c.k / 2;
  o.x = at::randn({c.B, c.c_in, c.H, c.H}, opts).contiguous(cl);
  // Weights scaled as a trained layer's (fan-in), so that sums stay near 1.
  o.w = (at::randn({c.c_out, c.c_in, c.k, c.k}, opts) / std::sqrt(double(c.c_in * c.k * c.k)))
            .to(dtype)
            .contiguous(cl);
  if (bias) o.b = at::randn({c.c_out}, opts) * 0.5;
  const int64_t Ho = (c.H + 2 * (c.k / 2) - c.k) / c.stride + 1;
  if (residual) o.r = at::randn({c.B, c.c_out, Ho, Ho}, opts).contiguous(cl);
  return o;
}

/// act(conv2d(x, w) + b + r) in float32 with TF32 off.
at::Tensor reference(const Operands& o, Activation act) {
  const NoTf32 no_tf32;
  auto y = at::conv2d(o.x.to(at::kFloat), o.w.to(at::kFloat), {}, {o.g.stride_h, o.g.stride_w},
                      {o.g.pad_h, o.g.pad_w});
  if (o.b.defined()) y = y + o.b.to(at::kFloat).view({1, -1, 1, 1});
  if (o.r.defined()) y = y + o.r.to(at::kFloat);
  return apply_activation(act, y);
}

/// Elementwise |got - ref| <= rel |ref| + 1e-3: one rounding of the dtype (rel: a full ulp, twice
/// half an ulp) plus float32 summation-order noise.
void expect_within_one_rounding(const at::Tensor& got, const at::Tensor& ref, at::ScalarType dtype,
                                const std::string& what) {
  const double rel = dtype == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
  const auto diff = (got.to(at::kFloat) - ref).abs();
  EXPECT_TRUE((diff <= ref.abs() * rel + 1e-3).all().item<bool>())
      << what << ": max |diff| " << diff.max().item<double>() << " at max |ref| "
      << ref.abs().max().item<double>();
}

TEST(CudnnGraphConvCuda, FusedGraphIsTheFloat32ConvolutionWithinOneRounding) {
  REQUIRE_CUDNN_GRAPH();
  at::manual_seed(11);
  int fused = 0, checked = 0, silu_bias = 0;
  for (auto dtype : {at::kBFloat16, at::kHalf})
    for (const auto& c : kCases)
      for (auto act : {Activation::silu, Activation::none, Activation::gelu, Activation::tanh})
        for (int with = 1; with < 4; ++with) {  // bias, residual, both
          // GELU and tanh once per dtype (each graph is compiled at run time: seconds in all).
          if ((act == Activation::gelu || act == Activation::tanh) &&
              (&c != &kCases[1] || with != 1))
            continue;
          const bool bias = with & 1, residual = with & 2;
          const auto o = operands(c, dtype, bias, residual);
          const std::string what =
              c10::str(c10::toString(dtype), " ", c.name, " B", c.B, " ", activation_name(act),
                       " bias ", bias, " residual ", residual);
          const auto got = cuda::conv2d_bias_act_cudnn_graph_untimed(o.x, o.w, o.b, o.r, o.g, act);
          ++checked;
          if (std::holds_alternative<Decline>(got)) {
            // Only "no engine" may decline here: the graph was valid input.
            EXPECT_STREQ(std::get<Decline>(got).reason,
                         "cudnn_graph: cuDNN has no engine for this graph")
                << what;
            continue;
          }
          ++fused;
          silu_bias += act == Activation::silu && bias;
          const auto& y = std::get<at::Tensor>(got);
          EXPECT_EQ(y.sizes(), reference(o, act).sizes()) << what;
          EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
          expect_within_one_rounding(y, reference(o, act), dtype, what);
        }
  std::cout << "[gpu] cudnn_graph untimed: " << fused << " of " << checked
            << " graphs fused by cuDNN\n";
  EXPECT_EQ(checked, 2 * (4 * 2 * 3 + 2));
  // Conv + bias + SiLU in channels_last 16-bit is what runtime fusion exists for (Ampere and
  // later): every such case (2 dtypes x 4 shapes x bias with and without residual) must have had
  // an engine.
  EXPECT_EQ(silu_bias, 2 * 4 * 2);
}

TEST(CudnnGraphConvCuda, BindingKeepsOneChoicePerGeometryAndMatches) {
  REQUIRE_CUDNN_GRAPH();
  Registry reg;
  const auto handle = cudnn_graph_only(reg);
  ASSERT_FALSE(handle.empty());
  // These geometries have engines (the untimed test) whose plans agree with `cuda`: tuning may
  // only decline a geometry for being slower.
  const std::set<std::string> tuning_reasons{"cudnn_graph: slower than `cuda` on this geometry"};
  at::manual_seed(12);
  int served = 0, calls = 0;
  for (const auto& c : kCases) {
    const auto o = operands(c, at::kBFloat16, true, c.k == 3 && c.stride == 1);
    const auto first = handle(o.x, o.w, o.b, o.r, o.g, Activation::silu);
    const auto second = handle(o.x, o.w, o.b, o.r, o.g, Activation::silu);
    calls += 2;
    // One choice per geometry: both calls served, or both declined.
    ASSERT_EQ(first.has_value(), second.has_value()) << c.name;
    if (first) {
      ++served;
      EXPECT_TRUE(at::equal(*first, *second)) << c.name << ": the kept plan is deterministic";
      expect_within_one_rounding(*first, reference(o, Activation::silu), at::kBFloat16, c.name);
    }
  }
  const auto record = test::candidate_report(reg, kConv2dBiasAct.name, kImpl);
  EXPECT_EQ(record.calls, static_cast<uint64_t>(2 * served));  // served calls count
  uint64_t declines = 0;
  for (const auto& [why, n] : record.declined) {
    EXPECT_TRUE(tuning_reasons.count(why)) << "unexpected decline: " << why;
    declines += n;
  }
  EXPECT_EQ(declines, static_cast<uint64_t>(calls - 2 * served));
  const auto tuned = cuda::cudnn_graph_tuned();
  std::cout << "[gpu] cudnn_graph tuned: " << served << " of " << kCases.size()
            << " geometries fused (process: " << tuned.fused << " of " << tuned.geometries << ")\n";
  EXPECT_GE(tuned.geometries, kCases.size());
}

TEST(CudnnGraphConvCuda, DeclinesWhatItDoesNotFuseWithItsReason) {
  REQUIRE_CUDNN_GRAPH();
  Registry reg;
  const auto handle = cudnn_graph_only(reg);
  const auto o = operands(kCases[0], at::kBFloat16, true, false);
  const auto o32 = operands(kCases[0], at::kFloat, true, false);
  EXPECT_FALSE(handle(o32.x, o32.w, o32.b, o32.r, o32.g, Activation::silu).has_value());
  EXPECT_FALSE(handle(o.x, o.w, o.b, o.r, o.g, Activation::relu).has_value());
  EXPECT_FALSE(handle(o.x, o.w, at::Tensor(), at::Tensor(), o.g, Activation::none).has_value());
  EXPECT_FALSE(
      handle(o.x.cpu(), o.w.cpu(), o.b.cpu(), at::Tensor(), o.g, Activation::silu).has_value());
  // A residual that would broadcast (the portable path accepts it) is not read as a full map.
  EXPECT_FALSE(handle(o.x, o.w, o.b, at::zeros({1, kCases[0].c_out, 1, 1}, o.x.options()), o.g,
                      Activation::silu)
                   .has_value());
  test::expect_calls_and_declines(
      reg, kConv2dBiasAct.name, kImpl, 0,
      {{"cudnn_graph: float16 / bfloat16 only (float32 runs `cuda`)", 1},
       {"cudnn_graph: ReLU (`cuda` fuses it through cudnn_convolution_relu)", 1},
       {"cudnn_graph: nothing to fuse (no bias, residual or activation)", 1},
       {"cudnn_graph: not a CUDA tensor", 1},
       {"cudnn_graph: residual not of the output's shape", 1}});
}

}  // namespace
}  // namespace libreyolo::kernels

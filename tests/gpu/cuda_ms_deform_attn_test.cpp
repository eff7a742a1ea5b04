// The `cuda` implementation of `ms_deform_attn` (kernels/attention/cuda/): parity with the float64
// fixtures (tests/fixtures/ops) and with the portable path, 16-bit dtypes, determinism, CUDA graph
// capture, declines, 64-bit indexing. Skips without a CUDA device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention/cuda/ms_deform_attn_cuda.h"
#include "kernels/attention/dot_product_attention.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/kernels.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "kernels/registry.h"
#include "tests/gpu/cuda_test_util.h"

// The CUDA-only entry points are declared weak: without nvcc (CI) libreyolo_kernels lacks them,
// test_gpu still links, and every test skips (no device, or built_with_cuda() false).
namespace libreyolo::kernels {
void register_cuda_kernels(Registry& registry)  // kernels/attention/cuda/register_cuda_kernels.cpp
    __attribute__((weak));
namespace cuda {
at::Tensor ms_deform_attn_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                  const at::Tensor& level_start_index,
                                  const at::Tensor& sampling_locations,
                                  const at::Tensor& attention_weights) __attribute__((weak));
std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward(
    const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
    const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    const at::Tensor& grad_output) __attribute__((weak));
void set_forward_variant(int variant) __attribute__((weak));
}  // namespace cuda
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

using test::max_abs_diff;
using test::max_rel_diff;

/// A registry holding only the `cuda` implementations (no policy, no references).
using test::cuda_context;
using test::cuda_only;
using test::declare_with_cuda_only;

struct Inputs {
  SpatialShapes levels;
  at::Tensor value, shapes, starts, loc, attn;  // on the device
};

/// Random inputs: value ~ N(0,1), locations uniform in [-0.1, 1.1] (some points off the map),
/// weights softmax-ed over L*P. Generated in float64 on the CPU, then cast (so references can use
/// exactly the same rounded numbers).
Inputs make_inputs(int64_t B, int64_t Q, int64_t H, int64_t C, const SpatialShapes& levels,
                   int64_t P, at::ScalarType value_type, at::ScalarType loc_type, uint64_t seed) {
  at::manual_seed(seed);
  int64_t S = 0;
  for (const auto& l : levels) S += l[0] * l[1];
  const int64_t L = static_cast<int64_t>(levels.size());
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto dev = at::Device(at::kCUDA, 0);
  Inputs in;
  in.levels = levels;
  in.value = at::randn({B, S, H, C}, f64).to(dev, value_type);
  in.loc = (at::rand({B, Q, H, L, P, 2}, f64) * 1.2 - 0.1).to(dev, loc_type);
  in.attn =
      at::softmax(at::randn({B, Q, H, L * P}, f64), -1).view({B, Q, H, L, P}).to(dev, loc_type);
  in.shapes = spatial_shapes_tensor(levels, dev);
  in.starts = level_start_index(levels, dev);
  return in;
}

at::Tensor run_cuda(const Inputs& in) {
  auto out = cuda_only().bind(kMsDeformAttn, cuda_context())(in.value, in.shapes, in.starts, in.loc,
                                                             in.attn);
  EXPECT_TRUE(out.has_value()) << "the cuda implementation declined";
  return out ? *out : at::Tensor();
}

/// Forward and the three gradients of the portable path on the CPU in float64.
struct Reference {
  at::Tensor out, grad_value, grad_loc, grad_attn;
};
Reference reference_f64(const Inputs& in, const at::Tensor& grad_out) {
  auto v = in.value.detach().to(at::kCPU, at::kDouble).requires_grad_();
  auto l = in.loc.detach().to(at::kCPU, at::kDouble).requires_grad_();
  auto a = in.attn.detach().to(at::kCPU, at::kDouble).requires_grad_();
  auto out = ms_deform_attn_portable(v, in.levels, l, a);
  out.backward(grad_out.detach().to(at::kCPU, at::kDouble));
  return {out.detach(), v.grad(), l.grad(), a.grad()};
}

/// Forward through the cuda implementation with autograd, then backward with grad_out.
Reference cuda_with_grads(const Inputs& in, const at::Tensor& grad_out) {
  Inputs g = in;
  g.value = in.value.detach().clone().requires_grad_();
  g.loc = in.loc.detach().clone().requires_grad_();
  g.attn = in.attn.detach().clone().requires_grad_();
  auto out = run_cuda(g);
  out.backward(grad_out.to(out.scalar_type()));
  return {out.detach(), g.value.grad(), g.loc.grad(), g.attn.grad()};
}

TEST(CudaMsDeformAttn, MatchesFloat64FixturesForwardAndBackward) {
  REQUIRE_CUDA();
  for (const std::string name : {"ms_deform_attn_canonical", "ms_deform_attn_rtdetr_like"}) {
    const auto f = test::load_safetensors(test::fixture("ops/" + name + ".safetensors"));
    const auto dev = at::Device(at::kCUDA, 0);
    Inputs in;
    const auto shapes_cpu = f.at("spatial_shapes");
    for (int64_t l = 0; l < shapes_cpu.size(0); ++l)
      in.levels.push_back({shapes_cpu[l][0].item<int64_t>(), shapes_cpu[l][1].item<int64_t>()});
    in.value = f.at("value").to(dev);
    in.loc = f.at("sampling_locations").to(dev);
    in.attn = f.at("attention_weights").to(dev);
    in.shapes = shapes_cpu.to(dev);
    in.starts = f.at("level_start_index").to(dev);
    const auto r = cuda_with_grads(in, f.at("grad_output_f32").to(dev));
    const double fwd = max_abs_diff(r.out, f.at("output_f64"));
    const double gv = max_rel_diff(r.grad_value, f.at("grad_value_f64"));
    const double gl = max_rel_diff(r.grad_loc, f.at("grad_sampling_locations_f64"));
    const double ga = max_rel_diff(r.grad_attn, f.at("grad_attention_weights_f64"));
    std::cout << name << ": forward max abs diff " << fwd << ", grad rel diff value " << gv
              << " loc " << gl << " attn " << ga << "\n";
    EXPECT_LE(fwd, 1e-5) << name;
    EXPECT_LE(gv, 1e-4) << name;
    EXPECT_LE(gl, 1e-4) << name;
    EXPECT_LE(ga, 1e-4) << name;
  }
}

TEST(CudaMsDeformAttn, MatchesPortablePathOverShapes) {
  REQUIRE_CUDA();
  struct Shape {
    int64_t B, Q, H, C, P;
    SpatialShapes levels;
  };
  const std::vector<Shape> shapes = {
      {1, 7, 2, 4, 2, {{4, 6}, {2, 3}}},                             // generic kernel
      {2, 13, 8, 16, 1, {{9, 11}}},                                  // 1 level, 1 point
      {3, 21, 8, 32, 4, {{20, 34}, {10, 17}, {5, 9}, {3, 5}}},       // Deformable DETR-like
      {2, 9, 4, 64, 8, {{16, 16}, {8, 8}, {4, 4}, {2, 2}, {1, 1}}},  // 5 levels, 8 points
      {1, 5, 2, 128, 3, {{12, 7}, {6, 4}, {3, 2}}},                  // one row per warp
      {2, 6, 3, 48, 2, {{8, 8}, {4, 4}}},                            // generic, C > 32
  };
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const auto in = make_inputs(s.B, s.Q, s.H, s.C, s.levels, s.P, at::kFloat, at::kFloat, seed++);
    const auto grad_out = at::randn({s.B, s.Q, s.H * s.C}, in.value.options());
    const auto ref = reference_f64(in, grad_out);
    const auto got = cuda_with_grads(in, grad_out);
    // The portable path on the same device and dtype, the one the slot falls back to.
    const auto portable = ms_deform_attn_portable(in.value, in.levels, in.loc, in.attn);
    const double fwd = max_abs_diff(got.out, ref.out);
    const double fwd_portable = max_abs_diff(got.out, portable);
    cuda::set_forward_variant(1);  // the first forward kernel, kept as a fallback variant
    const double fwd_v1 = max_abs_diff(run_cuda(in), ref.out);
    cuda::set_forward_variant(0);
    EXPECT_LE(fwd_v1, 1e-5);
    const double gv = max_rel_diff(got.grad_value, ref.grad_value);
    const double gl = max_rel_diff(got.grad_loc, ref.grad_loc);
    const double ga = max_rel_diff(got.grad_attn, ref.grad_attn);
    std::cout << "B" << s.B << " Q" << s.Q << " H" << s.H << " C" << s.C << " L" << s.levels.size()
              << " P" << s.P << ": fwd vs f64 " << fwd << ", vs portable fp32 " << fwd_portable
              << ", variant 1 vs f64 " << fwd_v1 << ", grads rel " << gv << " " << gl << " " << ga
              << "\n";
    EXPECT_LE(fwd, 1e-5);
    EXPECT_LE(fwd_portable, 1e-5);
    EXPECT_LE(gv, 1e-4);
    EXPECT_LE(gl, 1e-4);
    EXPECT_LE(ga, 1e-4);
  }
}

TEST(CudaMsDeformAttn, HalfAndBFloat16WithinTolerance) {
  REQUIRE_CUDA();
  const SpatialShapes levels = {{20, 34}, {10, 17}, {5, 9}, {3, 5}};
  for (const auto vt : {at::kHalf, at::kBFloat16}) {
    for (const auto lt : {vt, at::kFloat}) {
      for (const int64_t C : {32, 16, 8}) {
        const auto in = make_inputs(2, 17, 4, C, levels, 4, vt, lt, 11);
        const auto grad_out = at::randn({2, 17, 4 * C}, in.value.options());
        const auto ref = reference_f64(in, grad_out);  // same rounded inputs, float64 math
        const auto got = cuda_with_grads(in, grad_out);
        EXPECT_EQ(got.out.scalar_type(), vt);
        EXPECT_EQ(got.grad_value.scalar_type(), vt);
        EXPECT_EQ(got.grad_loc.scalar_type(), lt);
        const double fwd = max_rel_diff(got.out, ref.out);
        const double gv = max_rel_diff(got.grad_value, ref.grad_value);
        const double gl = max_rel_diff(got.grad_loc, ref.grad_loc);
        const double ga = max_rel_diff(got.grad_attn, ref.grad_attn);
        // Every output element is a float32 sum rounded once to the 16-bit dtype: its error is
        // at most half an ulp, i.e. 2^-11 (float16) or 2^-8 (bfloat16) of its magnitude.
        const double half_ulp = vt == at::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
        const auto ref_out = ref.out.to(at::kDouble);
        const double rounding = ((got.out.detach().to(at::kCPU, at::kDouble) - ref_out).abs() /
                                 (ref_out.abs() * half_ulp + 1e-6))
                                    .max()
                                    .item<double>();
        std::cout << vt << " value, " << lt << " locations, C" << C << ": fwd rel " << fwd
                  << " (error / half ulp " << rounding << "), grads rel " << gv << " " << gl << " "
                  << ga << "\n";
        EXPECT_LE(rounding, 1.01);
        cuda::set_forward_variant(1);
        const double fwd_v1 = max_rel_diff(run_cuda(in), ref.out);
        cuda::set_forward_variant(0);
        EXPECT_LE(fwd_v1, vt == at::kHalf ? 2e-3 : 5e-3);
        // Relative to the largest value: 2e-3 for float16; bfloat16's own rounding is 2^-8.
        const double tol = vt == at::kHalf ? 2e-3 : 5e-3;
        EXPECT_LE(fwd, tol);
        EXPECT_LE(gv, tol);
        EXPECT_LE(gl, tol);
        EXPECT_LE(ga, tol);
      }
    }
  }
}

TEST(CudaMsDeformAttn, ForwardIsBitwiseDeterministic) {
  REQUIRE_CUDA();
  const auto in = make_inputs(4, 300, 8, 32, {{100, 167}, {50, 84}, {25, 42}, {13, 21}}, 4,
                              at::kFloat, at::kFloat, 3);
  const auto first = run_cuda(in);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(first, run_cuda(in))) << "repeat " << i;
  // Backward: grad_loc and grad_attn are written once per point (deterministic).
  const auto grad_out = at::randn_like(first);
  const auto a =
      cuda::ms_deform_attn_backward(in.value, in.shapes, in.starts, in.loc, in.attn, grad_out);
  const auto b =
      cuda::ms_deform_attn_backward(in.value, in.shapes, in.starts, in.loc, in.attn, grad_out);
  EXPECT_TRUE(at::equal(std::get<1>(a), std::get<1>(b)));
  EXPECT_TRUE(at::equal(std::get<2>(a), std::get<2>(b)));
  const double gv = max_rel_diff(std::get<0>(a), std::get<0>(b));
  std::cout << "grad_value run-to-run rel diff (float32 atomics) " << gv << "\n";
  EXPECT_LE(gv, 1e-6);
}

TEST(CudaMsDeformAttn, CudaGraphReplayEqualsEager) {
  REQUIRE_CUDA();
  const auto in =
      make_inputs(2, 50, 8, 32, {{40, 60}, {20, 30}, {10, 15}}, 4, at::kBFloat16, at::kFloat, 5);
  const auto eager = run_cuda(in);
  const auto grad_out = at::randn_like(eager);
  const auto eager_bwd =
      cuda::ms_deform_attn_backward(in.value, in.shapes, in.starts, in.loc, in.attn, grad_out);
  at::cuda::CUDAGraph graph;
  at::Tensor out;
  std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd;
  auto stream = at::cuda::getStreamFromPool();
  {
    const c10::cuda::CUDAStreamGuard guard(stream);
    run_cuda(in);  // warm-up on the capture stream
    graph.capture_begin();
    out = run_cuda(in);
    bwd = cuda::ms_deform_attn_backward(in.value, in.shapes, in.starts, in.loc, in.attn, grad_out);
    graph.capture_end();
  }
  for (int i = 0; i < 2; ++i) graph.replay();
  at::cuda::getCurrentCUDAStream().synchronize();
  stream.synchronize();
  EXPECT_TRUE(at::equal(out, eager));
  EXPECT_TRUE(at::equal(std::get<1>(bwd), std::get<1>(eager_bwd)));
  EXPECT_TRUE(at::equal(std::get<2>(bwd), std::get<2>(eager_bwd)));
  const double gv = max_rel_diff(std::get<0>(bwd), std::get<0>(eager_bwd));
  std::cout << "graph replay: grad_value rel diff vs eager " << gv << "\n";
  EXPECT_LE(gv, 1e-2);  // bfloat16 grad_value: one rounding of a float32 sum
}

TEST(CudaMsDeformAttn, DeclinesAreCountedNotThrown) {
  REQUIRE_CUDA();
  Registry reg;
  declare_with_cuda_only(reg);
  const auto in = make_inputs(1, 4, 2, 16, {{4, 6}, {2, 3}}, 2, at::kFloat, at::kFloat, 7);
  auto call = [&](const at::Tensor& v, const at::Tensor& shapes, const at::Tensor& starts,
                  const at::Tensor& loc, const at::Tensor& attn) {
    return reg.bind(kMsDeformAttn, cuda_context())(v, shapes, starts, loc, attn);
  };
  EXPECT_FALSE(call(in.value.cpu(), in.shapes.cpu(), in.starts.cpu(), in.loc.cpu(), in.attn.cpu()));
  EXPECT_FALSE(call(in.value.to(at::kDouble), in.shapes, in.starts, in.loc.to(at::kDouble),
                    in.attn.to(at::kDouble)));
  EXPECT_FALSE(call(in.value, in.shapes, in.starts, in.loc.to(at::kHalf), in.attn.to(at::kHalf)));
  EXPECT_FALSE(call(in.value, in.shapes, in.starts, in.loc.narrow(1, 0, 2), in.attn));
  const auto bad_shapes = spatial_shapes_tensor({{4, 6}, {2, 4}}, in.value.device());
  EXPECT_FALSE(call(in.value, bad_shapes, in.starts, in.loc, in.attn));
  const auto bad_starts = level_start_index({{4, 7}, {2, 3}}, in.value.device());
  EXPECT_FALSE(call(in.value, in.shapes, bad_starts, in.loc, in.attn));
  EXPECT_TRUE(call(in.value, in.shapes, in.starts, in.loc, in.attn));
  test::expect_calls_and_declines(reg, kMsDeformAttn.name, "cuda", 1,
                                  {{"cpu tensor", 1},
                                   {"unsupported dtype", 2},
                                   {"shape mismatch", 1},
                                   {"malformed spatial metadata", 2}});
  EXPECT_TRUE(reg.events().empty());  // declines never disable
}

TEST(CudaMsDeformAttn, SlotEntryUsesCudaAndIsDifferentiable) {
  REQUIRE_CUDA();
  auto& reg = Registry::process_default();
  const auto names = reg.iter_impls(kMsDeformAttn.name);
  if (std::find(names.begin(), names.end(), "cuda") == names.end())
    GTEST_SKIP() << "cuda not selected by the policy (LIBREYOLO_KERNELS?)";
  auto calls = [&] { return test::candidate_report(reg, kMsDeformAttn.name, "cuda").calls; };
  const auto in = make_inputs(2, 10, 4, 32, {{8, 12}, {4, 6}}, 3, at::kFloat, at::kFloat, 9);
  auto v = in.value.clone().requires_grad_();
  auto l = in.loc.clone().requires_grad_();
  auto a = in.attn.clone().requires_grad_();
  const auto before = calls();
  auto out = ms_deform_attn(Registry::process_default().bind(kMsDeformAttn, cuda_context()), v,
                            in.levels, l, a);
  EXPECT_EQ(calls(), before + 1);
  ASSERT_TRUE(out.requires_grad());
  const auto grad_out = at::randn_like(out);
  out.backward(grad_out);
  const auto ref = reference_f64(in, grad_out);
  EXPECT_LE(max_abs_diff(out, ref.out), 1e-5);
  EXPECT_LE(max_rel_diff(v.grad(), ref.grad_value), 1e-4);
  EXPECT_LE(max_rel_diff(l.grad(), ref.grad_loc), 1e-4);
  EXPECT_LE(max_rel_diff(a.grad(), ref.grad_attn), 1e-4);
}

// The daemon runs under at::InferenceMode: inference tensors have no version counter and cannot
// be saved for backward. The slot must run `cuda` there (no fallback), and equal the eager result.
TEST(CudaMsDeformAttn, SlotEntryRunsCudaUnderInferenceMode) {
  REQUIRE_CUDA();
  auto& reg = Registry::process_default();
  const auto names = reg.iter_impls(kMsDeformAttn.name);
  if (std::find(names.begin(), names.end(), "cuda") == names.end())
    GTEST_SKIP() << "cuda not selected by the policy (LIBREYOLO_KERNELS?)";
  auto state = [&] {
    const auto c = test::candidate_report(reg, kMsDeformAttn.name, "cuda");
    return std::make_pair(c.calls, c.disabled);
  };
  const auto in = make_inputs(2, 10, 4, 32, {{8, 12}, {4, 6}}, 3, at::kFloat, at::kFloat, 11);
  const auto eager = ms_deform_attn(Registry::process_default().bind(kMsDeformAttn, cuda_context()),
                                    in.value, in.levels, in.loc, in.attn);
  const auto before = state();
  at::Tensor out;
  {
    at::InferenceMode guard;
    out = ms_deform_attn(Registry::process_default().bind(kMsDeformAttn, cuda_context()),
                         in.value.clone(), in.levels, in.loc.clone(), in.attn.clone());
    out = ms_deform_attn(Registry::process_default().bind(kMsDeformAttn, cuda_context()),
                         in.value.clone(), in.levels, in.loc.clone(), in.attn.clone());
  }
  const auto after = state();
  EXPECT_FALSE(after.second) << "cuda was disabled by a failure under InferenceMode";
  EXPECT_EQ(after.first, before.first + 2);
  EXPECT_EQ(max_abs_diff(out, eager), 0.0);
}

TEST(CudaMsDeformAttn, EmptyBatchAndQueries) {
  REQUIRE_CUDA();
  const auto in = make_inputs(2, 0, 2, 16, {{4, 6}}, 2, at::kFloat, at::kFloat, 13);
  const auto out = run_cuda(in);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 0, 32}));
}

// value has more than 2^31 elements: a 32-bit element offset would wrap and read zeros.
TEST(CudaMsDeformAttn, IndexesBeyondTwoToThe31) {
  REQUIRE_CUDA();
  const int64_t Hl = 4100, Wl = 4100, C = 128;  // S * C = 2.15e9 > 2^31
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  if (free_bytes < (size_t{24} << 30)) GTEST_SKIP() << "needs 24 GiB of free device memory";
  const auto dev = at::Device(at::kCUDA, 0);
  auto value = at::zeros({1, Hl * Wl, 1, C}, at::TensorOptions().dtype(at::kBFloat16).device(dev));
  value.narrow(1, (Hl - 2) * Wl, 2 * Wl).fill_(1.0);  // the last two rows are ones
  // One query sampling between rows 4098 and 4099, columns 4000 and 4001.
  auto loc = at::empty({1, 1, 1, 1, 1, 2}, at::TensorOptions().dtype(at::kFloat));
  loc[0][0][0][0][0][0] = 4001.0 / Wl;
  loc[0][0][0][0][0][1] = 4099.0 / Hl;
  loc = loc.to(dev);
  const auto attn = at::ones({1, 1, 1, 1, 1}, loc.options());
  const SpatialShapes levels = {{Hl, Wl}};
  const auto shapes = spatial_shapes_tensor(levels, dev);
  const auto starts = level_start_index(levels, dev);
  const auto out = cuda::ms_deform_attn_forward(value, shapes, starts, loc, attn);
  EXPECT_EQ(out.to(at::kFloat).min().item<float>(), 1.0f);
  EXPECT_EQ(out.to(at::kFloat).max().item<float>(), 1.0f);
  auto grads = cuda::ms_deform_attn_backward(value, shapes, starts, loc, attn, at::ones_like(out));
  value.reset();
  const auto& gv = std::get<0>(grads);
  const int64_t corner = (Hl - 2) * Wl + 4000;  // (y0, x0) = (4098, 4000)
  const double near = gv.narrow(1, corner, 2).sum(at::kFloat).item<double>() +
                      gv.narrow(1, corner + Wl, 2).sum(at::kFloat).item<double>();
  EXPECT_NEAR(near, static_cast<double>(C), 1e-2);  // the 4 corner weights sum to 1, per channel
  EXPECT_NEAR(gv.sum(at::kFloat).item<double>(), static_cast<double>(C), 1e-2);
}

}  // namespace
}  // namespace libreyolo::kernels

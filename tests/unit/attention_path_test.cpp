// The fused-attention policy of models/layers/attention (DESIGN.md "Fused attention (SDPA)"): the
// attention_path() table per shape class, and every formulation against the manual math on the CPU
// (the same checks on CUDA: tests/gpu/attention_path_test.cpp). The numbers behind the table:
// docs/bench/attention.md.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/registry.h"

#include <cmath>
#include <iostream>

#include "models/layers/attention.h"
#include "models/swin/windows.h"

namespace libreyolo::models::layers {
namespace {

using P = AttentionPath;
constexpr auto kCuda = c10::DeviceType::CUDA;
constexpr auto kCpu = c10::DeviceType::CPU;

TEST(AttentionPathPolicy, NamesAreStable) {
  EXPECT_STREQ(attention_path_name(P::kManual), "manual");
  EXPECT_STREQ(attention_path_name(P::kSdpa), "sdpa");
  EXPECT_STREQ(attention_path_name(P::kSdpaPaddedMask), "sdpa_padded_mask");
  EXPECT_STREQ(attention_path_name(P::kSdpaWindowBatch), "sdpa_window_batch");
  EXPECT_STREQ(attention_path_name(P::kMemEfficient), "mem_efficient");
}

TEST(AttentionPathPolicy, CpuRunsSdpaEverywhere) {
  // The CPU parity fixtures (tests/parity) are measured with plain SDPA for fused_attn = true.
  for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16})
    for (auto b : {BiasKind::kNone, BiasKind::kDense, BiasKind::kWindow}) {
      EXPECT_EQ(attention_path(kCpu, dt, b, 197, 64), P::kSdpa);
      EXPECT_EQ(attention_path(kCpu, dt, b, 49, 33), P::kSdpa);
    }
}

TEST(AttentionPathPolicy, CudaTableOfTheShapeClasses) {
  for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // ViT-B (197 tokens, d 64) and RT-DETR AIFI (400 tokens, d 32): no bias -> SDPA.
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kNone, 197, 64), P::kSdpa);
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kNone, 400, 32), P::kSdpa);
    // Swin shifted windows (49 tokens, d 32, bias + shift mask) and unshifted windows (one
    // (1, H, 49, 49) bias broadcast): the memory-efficient kernel on an aligned mask.
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kWindow, 49, 32), P::kMemEfficient);
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kDense, 49, 32), P::kMemEfficient);
    // head_dim outside the fused kernels' range: SDPA would run its math backend.
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kNone, 197, 36), P::kManual);
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kNone, 197, 512), P::kManual);
    EXPECT_EQ(attention_path(kCuda, dt, BiasKind::kWindow, 49, 36), P::kManual);
  }
  // Other dtypes (float64) have no fused kernel on CUDA.
  EXPECT_EQ(attention_path(kCuda, at::kDouble, BiasKind::kNone, 197, 64), P::kManual);
}

struct Inputs {
  at::Tensor q, k, v, window_bias, expanded_bias;
  int64_t windows;
};

/// Shifted Swin windows: 2 images x 4 windows (14x14 map, window 7, shift 3), 3 heads, d 32;
/// q/k/v as AttentionImpl builds them (views of a (B*nW, L, H*d) projection).
Inputs swin_inputs(at::ScalarType dt) {
  at::manual_seed(0);
  const int64_t B = 2, nW = 4, H = 3, L = 49, d = 32;
  auto proj = [&] {
    return at::randn({B * nW, L, H * d}).to(dt).view({B * nW, L, H, d}).transpose(1, 2);
  };
  Inputs in;
  in.q = proj();
  in.k = proj();
  in.v = proj();
  const auto mask = swin::shifted_window_mask(14, 14, 7, 3, at::kFloat, at::kCPU);
  in.window_bias = (at::randn({1, H, L, L}) * 2.0 + mask.unsqueeze(1)).to(dt);
  in.expanded_bias =
      in.window_bias.unsqueeze(0).expand({B, nW, H, L, L}).reshape({B * nW, H, L, L});
  in.windows = nW;
  return in;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(AttentionPathNumerics, WindowBiasManualIsByteIdenticalToTheExpandedBias) {
  c10::InferenceMode guard;
  const auto in = swin_inputs(at::kFloat);
  const double scale = 1.0 / std::sqrt(32.0);
  const auto expanded =
      dot_product_attention(in.q, in.k, in.v, in.expanded_bias, scale, P::kManual);
  const auto windowed =
      dot_product_attention(in.q, in.k, in.v, in.window_bias, scale, P::kManual, false, 4);
  EXPECT_TRUE(at::equal(expanded, windowed));
  EXPECT_EQ(windowed.sizes(), (std::vector<int64_t>{8, 3, 49, 32}));
  // fused = false is the manual path whatever the device and the handle.
  const auto handle =
      kernels::Registry::process_default().bind(kernels::kAttention, kernels::BindContext{});
  EXPECT_TRUE(at::equal(
      kernels::attention(handle, false, in.q, in.k, in.v, in.window_bias, {scale, false, 4}),
      windowed));
}

TEST(AttentionSlot, FusedCallsGoThroughTheBoundHandleAndAreCounted) {
  // The `attention` slot on a CPU model: mem_efficient is not a candidate (CUDA models only),
  // sdpa takes the call (attention_path on the CPU is SDPA), the reference is last.
  kernels::Registry r;
  kernels::register_builtin_slots(r);
  kernels::BindContext cpu;
  cpu.model = "m";
  const auto handle = r.bind(kernels::kAttention, cpu);
  ASSERT_EQ(handle.binding()->candidates.size(), 2u);
  EXPECT_EQ(r.bindings().at(0).selected, "sdpa");
  const auto q = at::randn({2, 3, 5, 8}), k = at::randn({2, 3, 7, 8}), v = at::randn({2, 3, 7, 8});
  const auto fused = kernels::attention(handle, true, q, k, v, at::Tensor(), {0.5, false, 0});
  const auto manual = dot_product_attention(q, k, v, at::Tensor(), 0.5, P::kManual);
  EXPECT_LE((fused - manual).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(at::equal(
      fused, dot_product_attention(q, k, v, at::Tensor(), 0.5, P::kSdpa)));  // what sdpa runs
  const auto report = r.bindings().at(0);
  EXPECT_EQ(report.candidates[0].name, "sdpa");
  EXPECT_EQ(report.candidates[0].calls, 1u);
  EXPECT_EQ(report.candidates[2].name, "mem_efficient");
  EXPECT_EQ(report.candidates[2].reason, "the model is not on a CUDA device");
  // A model whose policy allows only the reference computes the manual math, even fused.
  const auto only_ref = r.filter().overridden({{"attention", {"reference"}}});
  const auto ref_handle = r.bind(kernels::kAttention, cpu, &only_ref);
  EXPECT_TRUE(at::equal(
      kernels::attention(ref_handle, true, q, k, v, at::Tensor(), {0.5, false, 0}), manual));
}

TEST(AttentionPathNumerics, EveryFormulationMatchesManualInFloat32) {
  c10::InferenceMode guard;
  const auto in = swin_inputs(at::kFloat);
  const double scale = 1.0 / std::sqrt(32.0);
  const auto reference =
      dot_product_attention(in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble),
                            in.expanded_bias.to(at::kDouble), scale, P::kManual);
  const auto manual =
      dot_product_attention(in.q, in.k, in.v, in.window_bias, scale, P::kManual, false, 4);
  for (auto path : {P::kSdpa, P::kSdpaPaddedMask, P::kSdpaWindowBatch}) {
    const auto out = dot_product_attention(in.q, in.k, in.v, in.window_bias, scale, path, false, 4);
    ASSERT_EQ(out.sizes(), manual.sizes()) << attention_path_name(path);
    const double d = max_diff(out, manual), dr = max_diff(out, reference);
    std::cout << "[attention cpu fp32] " << attention_path_name(path)
              << ": max|out - manual| = " << d << ", max|out - fp64| = " << dr << "\n";
    EXPECT_LE(d, 1e-5) << attention_path_name(path);
    EXPECT_LE(dr, 1e-5) << attention_path_name(path);
  }
  // Dense bias (unshifted windows: (1, H, L, L) broadcast): plain and padded SDPA.
  const auto dense = in.window_bias.slice(0, 0, 1);
  const auto manual_dense = dot_product_attention(in.q, in.k, in.v, dense, scale, P::kManual);
  for (auto path : {P::kSdpa, P::kSdpaPaddedMask}) {
    const double d =
        max_diff(dot_product_attention(in.q, in.k, in.v, dense, scale, path), manual_dense);
    std::cout << "[attention cpu fp32] dense bias " << attention_path_name(path)
              << ": max|out - manual| = " << d << "\n";
    EXPECT_LE(d, 1e-5) << attention_path_name(path);
  }
}

TEST(AttentionPathNumerics, ModuleForwardWithWindowBiasEqualsExpandedBias) {
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  AttentionOptions o;
  o.embed_dim = 96;
  o.num_heads = 3;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "";
  AttentionImpl attention(o);
  for (auto& p : attention.parameters()) p.normal_(0.0, 0.1);  // LinearImpl leaves them empty
  const auto x = at::randn({8, 49, 96});
  const auto mask = swin::shifted_window_mask(14, 14, 7, 3, at::kFloat, at::kCPU);
  const auto bias = at::randn({1, 3, 49, 49}) + mask.unsqueeze(1);  // (4, 3, 49, 49)
  const auto expanded = bias.unsqueeze(0).expand({2, 4, 3, 49, 49}).reshape({8, 3, 49, 49});
  for (bool fused : {false, true}) {
    attention.fused_attn = fused;
    const auto a = attention.forward(x, x, x, bias, 4);
    const auto b = attention.forward(x, x, x, expanded);
    // CPU: both run the same formulation on the same values.
    EXPECT_TRUE(at::equal(a, b)) << "fused " << fused << ": " << max_diff(a, b);
  }
}

TEST(AttentionPathNumerics, PreparedBiasIsReadInPlaceAndSlicesPerImage) {
  // Swin keeps prepare_attention_bias()'s result per block; calls with fewer images pass a
  // leading slice of it. The prepared bias must give the same output as the per-call one.
  c10::InferenceMode guard;
  const auto in = swin_inputs(at::kFloat);  // 2 images x 4 windows
  const double scale = 1.0 / std::sqrt(32.0);
  // Paths that read the bias without a per-call copy get it back unchanged.
  for (auto path : {P::kManual, P::kSdpa, P::kSdpaWindowBatch})
    EXPECT_TRUE(prepare_attention_bias(in.window_bias, 8, at::kFloat, path).is_same(in.window_bias))
        << attention_path_name(path);
  // The aligned paths: 16-aligned rows (49 -> 64 elements), replicated image-major, 3 images.
  const auto prepared = prepare_attention_bias(in.window_bias, 12, at::kFloat, P::kSdpaPaddedMask);
  EXPECT_EQ(prepared.sizes(), (std::vector<int64_t>{12, 3, 49, 49}));
  EXPECT_EQ(prepared.strides(), (std::vector<int64_t>{3 * 49 * 64, 49 * 64, 64, 1}));
  EXPECT_TRUE(at::equal(prepared.slice(0, 0, 8), in.expanded_bias));
  const auto per_call =
      dot_product_attention(in.q, in.k, in.v, in.window_bias, scale, P::kSdpaPaddedMask, false, 4);
  const auto reused = dot_product_attention(in.q, in.k, in.v, prepared.slice(0, 0, 8), scale,
                                            P::kSdpaPaddedMask, false, 8);
  EXPECT_TRUE(at::equal(per_call, reused)) << max_diff(per_call, reused);
  // A dense (1, H, L, L) bias is aligned, not replicated.
  const auto dense =
      prepare_attention_bias(in.window_bias.slice(0, 0, 1), 0, at::kHalf, P::kMemEfficient);
  EXPECT_EQ(dense.sizes(), (std::vector<int64_t>{1, 3, 49, 49}));
  EXPECT_EQ(dense.stride(2), 64);
  EXPECT_EQ(dense.scalar_type(), at::kHalf);
  EXPECT_THROW(prepare_attention_bias(in.window_bias, 6, at::kFloat, P::kMemEfficient),
               c10::Error);  // 6 is not a multiple of the 4 windows
}

TEST(AttentionPathNumerics, BadWindowArgumentsThrow) {
  const auto in = swin_inputs(at::kFloat);
  EXPECT_THROW(dot_product_attention(in.q, in.k, in.v, in.window_bias, 1.0, P::kManual, false, 3),
               c10::Error);  // 8 windows are not a multiple of 3
  EXPECT_THROW(dot_product_attention(in.q, in.k, in.v, in.expanded_bias, 1.0, P::kSdpaWindowBatch),
               c10::Error);  // no window bias
  EXPECT_THROW(dot_product_attention(in.q, in.k, in.v, in.window_bias, 1.0, P::kManual, false, 2),
               c10::Error);  // bias has 4 windows, not 2
  EXPECT_THROW(
      dot_product_attention(in.q, in.k, in.v, in.window_bias, 1.0, P::kMemEfficient, false, 4),
      c10::Error);  // CUDA only
}

}  // namespace
}  // namespace libreyolo::models::layers

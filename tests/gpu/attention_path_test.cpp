// The attention formulations of models/layers/attention on CUDA: each one, and the
// one attention_path() picks for fused_attn = true, against the manual math at the shape
// classes of docs/bench/attention.md (ViT-B, Swin-T shifted and plain windows, RT-DETR AIFI).
// float32 (TF32 off): within 1e-4 of the manual path; float16/bfloat16: error against a float64
// reference no larger than twice the manual path's own (+ one half-precision ulp at 1).
// Skips without a CUDA device.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "models/layers/attention.h"
#include "models/swin/windows.h"

namespace libreyolo::models::layers {
namespace {

using P = AttentionPath;

struct ShapeClass {
  std::string name;
  int64_t batch, heads, tokens, dim, windows;  // windows per image (0: no window bias)
  bool shift, plain_bias;
};

class AttentionPathCuda : public ::testing::TestWithParam<ShapeClass> {};

TEST_P(AttentionPathCuda, FormulationsMatchManual) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  c10::InferenceMode guard;
  const auto& s = GetParam();
  const auto dev = at::Device(at::kCUDA, 0);
  const int64_t nW = s.windows, BW = nW ? s.batch * nW : s.batch, H = s.heads, L = s.tokens,
                d = s.dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::manual_seed(0);
  auto proj = [&] {
    return at::randn({BW, L, H * d}, at::TensorOptions().dtype(at::kDouble).device(dev))
        .view({BW, L, H, d})
        .transpose(1, 2);
  };
  const auto q64 = proj(), k64 = proj(), v64 = proj();
  at::Tensor bias64, full64;
  int64_t bias_windows = 0;
  if (nW) {
    bias64 = at::randn({1, H, L, L}, q64.options()) * 2.0;
    if (s.shift) {
      const int64_t ws = std::lround(std::sqrt(double(L)));
      const int64_t side = ws * std::lround(std::sqrt(double(nW)));
      bias64 =
          bias64 + swin::shifted_window_mask(side, side, ws, ws / 2, at::kDouble, dev).unsqueeze(1);
      bias_windows = nW;
      full64 = bias64.unsqueeze(0).expand({s.batch, nW, H, L, L}).reshape({BW, H, L, L});
    } else {
      full64 = bias64;
    }
  }
  const auto reference = dot_product_attention(q64, k64, v64, full64, scale, P::kManual);
  const BiasKind kind = !nW ? BiasKind::kNone : s.shift ? BiasKind::kWindow : BiasKind::kDense;
  for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto q = q64.to(dt), k = k64.to(dt), v = v64.to(dt);
    const auto bias = bias64.defined() ? bias64.to(dt) : at::Tensor();
    const auto manual =
        dot_product_attention(q, k, v, bias, scale, P::kManual, false, bias_windows);
    const double manual_err = (manual.to(at::kDouble) - reference).abs().max().item<double>();
    std::vector<P> paths = {P::kSdpa, P::kSdpaPaddedMask, P::kMemEfficient};
    if (kind == BiasKind::kWindow) paths.push_back(P::kSdpaWindowBatch);
    const P policy = attention_path(c10::DeviceType::CUDA, dt, kind, L, d);
    for (auto path : paths) {
      const auto out = dot_product_attention(q, k, v, bias, scale, path, false, bias_windows);
      ASSERT_EQ(out.sizes(), manual.sizes());
      const double dm = (out.to(at::kDouble) - manual.to(at::kDouble)).abs().max().item<double>();
      const double dr = (out.to(at::kDouble) - reference).abs().max().item<double>();
      std::cout << "[attention cuda] " << s.name << " " << c10::toString(dt) << " "
                << attention_path_name(path) << (path == policy ? " (policy)" : "")
                << ": max|out - manual| = " << dm << ", max|out - fp64| = " << dr
                << " (manual: " << manual_err << ")\n";
      if (dt == at::kFloat) {
        EXPECT_LE(dm, 1e-4) << s.name << " " << attention_path_name(path);
      } else {
        const double ulp = dt == at::kHalf ? 9.8e-4 : 7.9e-3;
        EXPECT_LE(dr, 2.0 * manual_err + ulp) << s.name << " " << attention_path_name(path);
      }
    }
    // The policy's formulation (what the attention slot's sdpa / mem_efficient implementations
    // run: kernels/attention/dot_product_attention.cpp) is the manual math or one checked above.
    EXPECT_TRUE(policy == P::kManual ||
                std::find(paths.begin(), paths.end(), policy) != paths.end())
        << s.name << " " << attention_path_name(policy);
  }
}

INSTANTIATE_TEST_SUITE_P(ShapeClasses, AttentionPathCuda,
                         ::testing::Values(ShapeClass{"vit_b", 4, 12, 197, 64, 0, false, false},
                                           ShapeClass{"swin_shift", 4, 3, 49, 32, 64, true, false},
                                           ShapeClass{"swin_plain", 4, 3, 49, 32, 64, false, true},
                                           ShapeClass{"aifi", 8, 8, 400, 32, 0, false, false}),
                         [](const ::testing::TestParamInfo<ShapeClass>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace libreyolo::models::layers

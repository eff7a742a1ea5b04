// The `cublaslt` linear_act and linear (kernels/gemm/cuda/linear_act_cuda.cpp, cublaslt_gemm.h):
// bias and GELU in the GEMM's epilogue, against the unfused float32 ops (at::linear, exact erf
// GELU) for the MLP shapes of the ViT backbones, in bfloat16 and float16; the plain GEMM against
// at::linear; the timed algorithm choice kept once per problem; float32, other activations and
// CPU tensors decline (counted) and the portable path answers; a float32 model is not bound to
// it. Called through a registry binding, as models call it. Skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>

#include "kernels/gemm/cuda/cublaslt_gemm.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

TEST(LinearActCuda, GeluEpilogueIsWithinTheOutputRoundingOfTheExactOps) {
  REQUIRE_CUDA();
  auto ctx = test::cuda_context();
  ctx.dtype = "bfloat16";
  const auto handle = test::cuda_only().bind(kLinearAct, ctx);
  ASSERT_FALSE(handle.empty());
  at::manual_seed(5);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  // (tokens, K, N): RF-DETR medium's fc1 (DINOv2-small: 384 -> 1536), ViT-B's (768 -> 3072),
  // LW-DETR small's (192 -> 768), and an odd row count.
  const int64_t shapes[][3] = {
      {2 * 1297, 384, 1536}, {197, 768, 3072}, {3 * 1024, 192, 768}, {77, 64, 256}};
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (const auto& s : shapes) {
      const auto x = at::randn({s[0], s[1]}, cuda).view({1, s[0], s[1]});
      const auto w = at::randn({s[2], s[1]}, cuda) * (1.0 / std::sqrt(double(s[1])));
      const auto b = at::randn({s[2]}, cuda) * 0.1;
      const auto out = handle(x.to(dtype), w.to(dtype), b.to(dtype), Activation::gelu);
      ASSERT_TRUE(out.has_value()) << "cublaslt declined";
      EXPECT_EQ(out->sizes(), (std::vector<int64_t>{1, s[0], s[2]}));
      EXPECT_EQ(out->scalar_type(), dtype);
      // The reference: the same rounded inputs, float32 ops with the exact GELU.
      const auto ref = at::gelu(at::linear(x.to(dtype).to(at::kFloat), w.to(dtype).to(at::kFloat),
                                           b.to(dtype).to(at::kFloat)));
      // Unfused in the same dtype (what the portable path returns): the bar is its own error.
      const auto unfused =
          linear_act_portable(x.to(dtype), w.to(dtype), b.to(dtype), Activation::gelu);
      const double ours = (out->to(at::kFloat) - ref).abs().max().item<double>();
      const double aten = (unfused.to(at::kFloat) - ref).abs().max().item<double>();
      std::cout << "[gpu] linear_act " << c10::toString(dtype) << " " << s[0] << "x" << s[1] << "->"
                << s[2] << ": max|cublaslt - fp32 exact| = " << ours
                << ", max|unfused - fp32 exact| = " << aten << "\n";
      // The epilogue's tanh GELU adds at most 4.7e-4 to the GEMM's own rounding.
      EXPECT_LE(ours, aten * 1.5 + 5e-4) << c10::toString(dtype) << " " << s[0];
    }
  }
}

TEST(LinearActCuda, DeclinesWhatItDoesNotComputeAndFloat32ModelsAreNotBound) {
  REQUIRE_CUDA();
  Registry& reg = test::cuda_only();
  auto ctx = test::cuda_context();
  EXPECT_TRUE(reg.bind(kLinearAct, ctx).empty());  // float32 model: exact GELU
  ctx.dtype = "float16";
  const auto handle = reg.bind(kLinearAct, ctx);
  ASSERT_FALSE(handle.empty());
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const auto x = at::randn({4, 32}, cuda), w = at::randn({64, 32}, cuda), b = at::randn({64}, cuda);
  EXPECT_FALSE(handle(x, w, b, Activation::gelu).has_value());  // float32 tensors
  EXPECT_FALSE(
      handle(x.to(at::kHalf), w.to(at::kHalf), b.to(at::kHalf), Activation::silu).has_value());
  // ReLU in the RELU_BIAS epilogue: the unfused ops' numbers within the half output's rounding.
  const auto relu = handle(x.to(at::kHalf), w.to(at::kHalf), b.to(at::kHalf), Activation::relu);
  ASSERT_TRUE(relu.has_value());
  const auto unfused = at::relu(at::linear(x.to(at::kHalf), w.to(at::kHalf), b.to(at::kHalf)));
  EXPECT_LE((relu->to(at::kFloat) - unfused.to(at::kFloat)).abs().max().item<double>(),
            unfused.to(at::kFloat).abs().max().item<double>() * 1e-3);
  EXPECT_TRUE(at::equal(*relu >= 0, at::ones_like(*relu, at::kBool)));
  // No bias: the GELU epilogue alone, the unfused tanh GELU's numbers within the rounding.
  const auto no_bias = handle(x.to(at::kHalf), w.to(at::kHalf), at::Tensor(), Activation::gelu);
  ASSERT_TRUE(no_bias.has_value());
  const auto tanh_gelu = at::gelu(at::linear(x.to(at::kHalf), w.to(at::kHalf)), "tanh");
  EXPECT_LE((no_bias->to(at::kFloat) - tanh_gelu.to(at::kFloat)).abs().max().item<double>(),
            tanh_gelu.to(at::kFloat).abs().max().item<double>() * 2e-3);
  EXPECT_FALSE(
      handle(x.to(at::kHalf).cpu(), w.to(at::kHalf).cpu(), b.to(at::kHalf).cpu(), Activation::gelu)
          .has_value());
  const auto r = test::candidate_report(reg, "linear_act", "cublaslt");
  EXPECT_EQ(r.declined.at("cublaslt: dtype (float16, bfloat16 only)"), 1u);
  EXPECT_EQ(r.declined.at("cublaslt: activation (gelu and relu only)"), 1u);
  EXPECT_EQ(r.declined.at("cublaslt: not a CUDA tensor"), 1u);
  EXPECT_EQ(r.declined.count("cublaslt: no bias"), 0u);
  // The model-facing entry point answers the declined call with the unfused ops.
  EXPECT_TRUE(
      at::equal(linear_act(handle, x, w, b, Activation::gelu), at::gelu(at::linear(x, w, b))));
}

TEST(LinearCuda, TimedAlgorithmMatchesAtenLinearAndIsKeptPerProblem) {
  REQUIRE_CUDA();
  Registry& reg = test::cuda_only();
  auto ctx = test::cuda_context();
  EXPECT_TRUE(reg.bind(kLinear, ctx).empty());  // float32 model: ATen's GEMM
  ctx.dtype = "bfloat16";
  const auto handle = reg.bind(kLinear, ctx);
  ASSERT_FALSE(handle.empty());
  cuda::cublaslt_forget_timed_problems();  // the counts below start from an empty cache
  at::manual_seed(6);
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  // RF-DETR medium's backbone GEMMs at batch 32 (41,600 rows: 12-49 GFLOP, timed): qkv, the
  // output projection, fc2.
  const int64_t shapes[][3] = {{41600, 384, 1152}, {41600, 384, 384}, {41600, 1536, 384}};
  for (const auto& s : shapes) {
    const auto x = at::randn({1, s[0], s[1]}, cuda);
    const auto w = at::randn({s[2], s[1]}, cuda) * (1.0 / std::sqrt(double(s[1])));
    const auto b = at::randn({s[2]}, cuda) * 0.1;
    const auto before = cuda::cublaslt_timed_problems();
    const auto out = handle(x, w, b);
    ASSERT_TRUE(out.has_value());
    EXPECT_EQ(out->sizes(), (std::vector<int64_t>{1, s[0], s[2]}));
    EXPECT_EQ(cuda::cublaslt_timed_problems(), before + 1);  // timed once, then kept
    const auto again = handle(x, w, b);
    EXPECT_EQ(cuda::cublaslt_timed_problems(), before + 1);
    EXPECT_TRUE(at::equal(*out, *again));  // the kept algorithm: the same bits
    // Against float32 math on the same bf16 operands: within the output's rounding, as ATen's
    // heuristic choice (at::linear) is.
    const auto ref = at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat));
    const double ours = (out->to(at::kFloat) - ref).abs().max().item<double>();
    const double aten = (at::linear(x, w, b).to(at::kFloat) - ref).abs().max().item<double>();
    const auto heuristic =
        cuda::cublaslt_linear(x, w, b, cuda::GemmEpilogue::none, cuda::GemmAlgorithm::heuristic);
    const double first = (heuristic.to(at::kFloat) - ref).abs().max().item<double>();
    std::cout << "[gpu] linear bf16 " << s[0] << "x" << s[1] << "->" << s[2]
              << ": max|timed - fp32| = " << ours << ", max|heuristic - fp32| = " << first
              << ", max|at::linear - fp32| = " << aten << "\n";
    EXPECT_LE(ours, aten * 1.5 + 1e-6);
    EXPECT_LE(first, aten * 1.5 + 1e-6);
  }
  // Below 4 GFLOP (batch 1's 1,300 rows) the heuristic's first runs and nothing is timed.
  {
    const auto x = at::randn({1300, 384}, cuda), w = at::randn({384, 384}, cuda) * (1.0 / 20);
    const auto before = cuda::cublaslt_timed_problems();
    const auto out = handle(x, w, at::Tensor());
    ASSERT_TRUE(out.has_value());
    EXPECT_EQ(cuda::cublaslt_timed_problems(), before);
    const auto ref = at::linear(x.to(at::kFloat), w.to(at::kFloat));
    const double ours = (out->to(at::kFloat) - ref).abs().max().item<double>();
    const double aten = (at::linear(x, w).to(at::kFloat) - ref).abs().max().item<double>();
    EXPECT_LE(ours, aten * 1.5 + 1e-6);
  }
  // K not a multiple of 8 declines, here and through the entry point (where ATen answers).
  const auto x = at::randn({4, 12}, cuda), w = at::randn({16, 12}, cuda);
  EXPECT_FALSE(handle(x, w, at::Tensor()).has_value());
  EXPECT_TRUE(at::equal(linear(handle, x, w, at::Tensor()), at::linear(x, w)));
  const auto r = test::candidate_report(reg, "linear", "cublaslt");
  EXPECT_EQ(r.declined.at("cublaslt: K or N not a multiple of 8"), 2u);
}

}  // namespace
}  // namespace libreyolo::kernels

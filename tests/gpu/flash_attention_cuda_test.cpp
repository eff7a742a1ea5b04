// The `cuda` attention (kernels/attention/cuda/flash_attention_cuda.h) against a float64 reference
// of the same rounded inputs: in float16 / bfloat16 its error is at most the manual math's own
// (matmul, float32 softmax, matmul in the dtype: what transformers' eager path computes) plus
// one unit in the last place at 1, on LW-DETR's shapes (12 heads of 16 over 1,600 tokens and
// 100-token windows, q/k/v as views of the packed projection), cross-attention lengths that are
// not multiples of the 64-row tiles (77 queries over 300 keys), one token, and d = 32 (RT-DETR's
// AIFI and decoder self-attention). The result is a transposed view of (B, Lq, H, d). A CUDA-graph
// replay gives the eager call's bits. Declines (a bias, float32, head_dim 64 and 8, CPU, unaligned
// rows) run nothing and are counted with their exact reasons. Skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>

#include "kernels/attention/cuda/flash_attention_cuda.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

struct Case {
  int64_t batch, heads, lq, lk, dim;
};

/// q (or k, v) as AttentionImpl makes them: the packed projection (B, L, H * d) viewed (B, H, L,
/// d).
at::Tensor heads_view(int64_t B, int64_t L, int64_t H, int64_t d, at::ScalarType dtype) {
  return at::randn({B, L, H * d}, at::TensorOptions().device(at::kCUDA).dtype(at::kDouble))
      .to(dtype)
      .view({B, L, H, d})
      .transpose(1, 2);
}

/// max |out - softmax(q k^T scale) v| with the reference in float64 on the same inputs.
double error_against_float64(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, double scale) {
  const auto q64 = q.to(at::kDouble), k64 = k.to(at::kDouble), v64 = v.to(at::kDouble);
  const auto ref = at::matmul(at::softmax(at::matmul(q64, k64.transpose(2, 3)) * scale, -1), v64);
  return (out.to(at::kDouble) - ref).abs().max().item<double>();
}

TEST(FlashAttentionCuda, MatchesFloat64WithinTheManualMathsError) {
  REQUIRE_CUDA();
  c10::InferenceMode guard;
  const auto handle = test::cuda_only().bind(kAttention, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(11);
  int checked = 0;
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    for (const Case& c :
         {Case{2, 12, 1600, 1600, 16}, Case{32, 12, 100, 100, 16}, Case{3, 4, 77, 300, 16},
          Case{1, 1, 1, 1, 16}, Case{2, 8, 400, 400, 32}, Case{3, 4, 77, 300, 32}}) {
      const auto q = heads_view(c.batch, c.lq, c.heads, c.dim, dtype);
      const auto k = heads_view(c.batch, c.lk, c.heads, c.dim, dtype);
      const auto v = heads_view(c.batch, c.lk, c.heads, c.dim, dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
      // Through the slot, as models call it.
      auto got = handle(q, k, v, at::Tensor(), AttentionCall{scale, true, 0});
      ASSERT_TRUE(got.has_value()) << "declined";
      const at::Tensor out = *got;
      ASSERT_EQ(out.sizes(), (at::IntArrayRef{c.batch, c.heads, c.lq, c.dim}));
      // A transposed view of a contiguous (B, Lq, H, d): the caller's reshape is free.
      EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
      const auto manual = dot_product_attention(
          q, k, v, at::Tensor(), scale, AttentionPath::kManual, /*softmax_in_float32=*/true);
      const double ours = error_against_float64(out, q, k, v, scale);
      const double theirs = error_against_float64(manual, q, k, v, scale);
      const double ulp = dtype == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
      const std::string what =
          c10::str(dtype, " B=", c.batch, " H=", c.heads, " Lq=", c.lq, " Lk=", c.lk, " d=", c.dim);
      std::cout << "[flash_attention] " << what << ": max|out - fp64| = " << ours
                << " (manual: " << theirs << ")\n";
      EXPECT_LE(ours, theirs + ulp) << what;
      EXPECT_FALSE(at::isnan(out).any().item<bool>()) << what;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(FlashAttentionCuda, GraphReplayEqualsTheEagerCall) {
  REQUIRE_CUDA();
  c10::InferenceMode guard;
  at::manual_seed(12);
  const auto q = heads_view(4, 300, 12, 16, at::kBFloat16);
  const auto k = heads_view(4, 300, 12, 16, at::kBFloat16);
  const auto v = heads_view(4, 300, 12, 16, at::kBFloat16);
  const auto eager = cuda::flash_attention(q, k, v, 0.25);
  at::cuda::device_synchronize();  // q, k, v and eager were written on the default stream
  const auto stream = at::cuda::getStreamFromPool();
  at::Tensor captured;
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard on(stream);
    graph.capture_begin();
    captured = cuda::flash_attention(q, k, v, 0.25);
    graph.capture_end();
    graph.replay();
  }
  stream.synchronize();
  EXPECT_EQ(test::bit_mismatches(captured.to(at::kFloat), eager.to(at::kFloat)), 0);
}

TEST(FlashAttentionCuda, DeclinesWhatItDoesNotTake) {
  REQUIRE_CUDA();
  c10::InferenceMode guard;
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto h = reg.bind(kAttention, test::cuda_context());
  auto call = [&](const at::Tensor& q, const at::Tensor& bias = at::Tensor()) {
    return h(q, q, q, bias, AttentionCall{0.25, false, 0});
  };
  const auto q = heads_view(2, 64, 2, 16, at::kBFloat16);
  EXPECT_FALSE(call(q, at::zeros({1, 1, 64, 64}, q.options())).has_value());
  EXPECT_FALSE(call(q.to(at::kFloat)).has_value());
  EXPECT_FALSE(call(heads_view(2, 64, 2, 64, at::kBFloat16)).has_value());
  EXPECT_FALSE(call(heads_view(2, 64, 2, 8, at::kBFloat16)).has_value());
  EXPECT_FALSE(call(q.cpu()).has_value());
  // Rows 4 elements apart: the kernel's 16-byte copies would straddle them.
  const auto odd =
      at::randn({2, 64, 2 * 16 + 4}, q.options()).narrow(2, 0, 32).view({2, 64, 2, 16});
  EXPECT_FALSE(call(odd.transpose(1, 2)).has_value());
  EXPECT_FALSE(h(q, q, q, at::Tensor(), AttentionCall{-0.25, false, 0}).has_value());
  EXPECT_TRUE(call(q).has_value());
  test::expect_calls_and_declines(
      reg, "attention", "cuda", 1,
      {{"cuda: a bias or mask (unbiased calls only)", 1},
       {"cuda: dtype (float16, bfloat16 only)", 1},
       {"cuda: head_dim (16 or 32 only)", 2},
       {"cuda: not a CUDA tensor", 1},
       {"cuda: scale not positive", 1},
       {"cuda: rows not contiguous, 16-byte aligned, strides multiples of 8", 1}});
}

TEST(FlashAttentionCuda, EntryPointRejectsAContractViolation) {
  REQUIRE_CUDA();
  const auto q = heads_view(1, 8, 1, 16, at::kBFloat16);
  const auto k = heads_view(1, 9, 1, 16, at::kBFloat16);
  EXPECT_THROW(cuda::flash_attention(q, k, heads_view(1, 8, 1, 16, at::kBFloat16), 0.25),
               c10::Error);
  EXPECT_THROW(cuda::flash_attention(q, q, q.to(at::kHalf), 0.25), c10::Error);
  EXPECT_THROW(cuda::flash_attention(q.narrow(2, 0, 0), q.narrow(2, 0, 0), q.narrow(2, 0, 0), 0.25),
               c10::Error);  // no keys
}

}  // namespace
}  // namespace libreyolo::kernels

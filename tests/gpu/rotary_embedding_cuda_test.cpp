// The `cuda` rotary_embedding (kernels/attention/cuda/rotary_embedding_cuda.h) against the portable
// path (ATen's ops, upstream's roundings) on the same device, bit for bit, in float32 / float16 /
// bfloat16: q and k viewed from one packed qkv GEMM as (2, B, H, L, D) (how DEIMv2's DINOv3 layers
// call it; DINOv3's 5 prefix tokens, CLS and 4 registers, and DEIMv2-S's 64-wide heads), a
// contiguous tensor, no prefix, and a head size whose half is not a multiple of the 16-byte vector
// and an x one element off 16-byte alignment (the one-element path). Declines (CPU tensors,
// autograd, strided last dimension, float64, strided tables) run nothing. Skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/attention/rotary_embedding.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

TEST(RotaryEmbeddingCuda, EqualsThePortablePathBitForBit) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kRotaryEmbedding, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(21);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const int64_t D : {64, 6}) {
      for (const int64_t prefix : {5, 0}) {
        const int64_t B = 3, H = 3, N = 40, L = prefix + N;
        const auto angles = at::rand({N, D}) * 6.3;
        const auto cos = at::cos(angles).to(at::kCUDA).to(dtype);
        // sin with a random sign per entry (signed_sin has both signs in each half).
        const auto sign = (at::rand({N, D}) > 0.5).to(at::kFloat) * 2 - 1;
        const auto sin = (at::sin(angles) * sign).to(at::kCUDA).to(dtype);
        const auto packed = (at::randn({B, L, 3, H, D}) * 4).to(at::kCUDA).to(dtype);
        const auto qk = packed.narrow(2, 0, 2).permute({2, 0, 3, 1, 4});
        for (const auto& x : {qk, qk.select(0, 1).contiguous()}) {
          const std::string what =
              c10::str(dtype, " D=", D, " prefix=", prefix, " x=", x.sizes(), x.strides());
          const auto got = handle(x, cos, sin, prefix);
          ASSERT_TRUE(got.has_value()) << "declined: " << what;
          const auto expected = rotary_embedding_portable(x, cos, sin, prefix);
          ASSERT_EQ(got->sizes(), x.sizes()) << what;
          EXPECT_TRUE(got->is_contiguous()) << what;
          EXPECT_EQ(test::bit_mismatches(got->to(at::kFloat), expected.to(at::kFloat)), 0)
              << what << " max |diff| " << test::max_abs_diff(*got, expected);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 24);
  // An x one element off 16-byte alignment (storage offset 1): the one-element path.
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t L = 45, D = 64, N = 40;
    const auto x = at::randn({2 * L * D + 1}, at::TensorOptions().device(at::kCUDA))
                       .to(dtype)
                       .narrow(0, 1, 2 * L * D)
                       .view({2, L, D});
    const auto cos = at::cos(at::rand({N, D}) * 6.3).to(at::kCUDA).to(dtype);
    const auto sin = at::sin(at::rand({N, D}) * 6.3).to(at::kCUDA).to(dtype);
    const auto got = handle(x, cos, sin, L - N);
    ASSERT_TRUE(got.has_value()) << "declined: misaligned " << dtype;
    EXPECT_EQ(test::bit_mismatches(got->to(at::kFloat),
                                   rotary_embedding_portable(x, cos, sin, L - N).to(at::kFloat)),
              0)
        << "misaligned " << dtype;
  }
  test::expect_calls_and_declines(reg, kRotaryEmbedding.name, "cuda", 26, {});
}

TEST(RotaryEmbeddingCuda, DeclinesWhatItDoesNotHandle) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto handle = reg.bind(kRotaryEmbedding, test::cuda_context());
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const auto x = at::rand({2, 9, 8}, opts), t = at::rand({6, 8}, opts);
  EXPECT_FALSE(handle(x.cpu(), t.cpu(), t.cpu(), 3).has_value());
  {
    const auto g = x.clone().requires_grad_(true);
    EXPECT_FALSE(handle(g, t, t, 3).has_value());
  }
  EXPECT_FALSE(handle(at::rand({2, 9, 8, 2}, opts).select(-1, 0), t, t, 3).has_value());
  EXPECT_FALSE(handle(x.to(at::kDouble), t.to(at::kDouble), t.to(at::kDouble), 3).has_value());
  EXPECT_FALSE(handle(x, at::rand({8, 6}, opts).t(), t, 3).has_value());
  test::expect_calls_and_declines(reg, kRotaryEmbedding.name, "cuda", 0,
                                  {{"cuda: not a CUDA tensor", 1},
                                   {"cuda: autograd (no backward)", 1},
                                   {"cuda: x's last dimension not contiguous", 1},
                                   {"cuda: dtype (float32, float16, bfloat16 only)", 1},
                                   {"cuda: cos or signed_sin not contiguous", 1}});
}

}  // namespace
}  // namespace libreyolo::kernels

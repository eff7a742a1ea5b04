// The rotary_embedding slot (kernels/attention/rotary_embedding.h) as DEIMv2's DINOv3 backbone
// calls it: the portable path gives exactly the values of upstream's apply_rotary_pos_emb
// expression (modeling_dinov3_vit.py: the prefix tokens kept, q * cos + rotate_half(q) * sin on
// the patch tokens) in float32 / bfloat16 / float16, on a strided view of packed q/k rows as the
// qkv_concat layout hands them over and on a contiguous tensor, with and without prefix tokens;
// the entry point calls the bound implementation and falls back when it declines; bad arguments
// get exact messages; the backbone's rope_tables is rope() in the slot's form, kept per geometry.
#include "kernels/attention/rotary_embedding.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/registry.h"
#include "models/deimv2/dinov3_backbone.h"
#include "tests/unit/error_message.h"

namespace {

using libreyolo::kernels::RotaryEmbeddingHandle;
using libreyolo::models::deimv2::RopeTables;

at::Tensor apply_rope(const at::Tensor& t, int64_t /*prefix: L - N*/, const RopeTables& rope) {
  return libreyolo::kernels::rotary_embedding(RotaryEmbeddingHandle(), t, rope.cos,
                                              rope.signed_sin);
}

at::Tensor rotate_half(const at::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

// Upstream's expression on (..., L, hd).
at::Tensor upstream(const at::Tensor& t, int64_t prefix, const at::Tensor& cos,
                    const at::Tensor& sin) {
  const int64_t n = t.size(-2) - prefix;
  const at::Tensor p = t.narrow(-2, prefix, n);
  return at::cat({t.narrow(-2, 0, prefix), p * cos + rotate_half(p) * sin}, -2);
}

class DinoV3Rope : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(DinoV3Rope, ApplyRopeEqualsUpstreamExpression) {
  const auto dtype = GetParam();
  at::manual_seed(11);
  const int64_t B = 2, L = 5 + 12, H = 3, hd = 16;
  for (const int64_t prefix : {int64_t{5}, int64_t{0}}) {
    const int64_t n = L - prefix;
    const auto angles = at::rand({n, hd}) * 6.3;
    const auto cos = at::cos(angles).to(dtype), sin = at::sin(angles).to(dtype);
    const RopeTables rope{cos,
                          at::cat({-sin.narrow(1, 0, hd / 2), sin.narrow(1, hd / 2, hd / 2)}, 1)};
    // The packed (B, L, 3, H, hd) rows of one qkv GEMM, q and k viewed as (2, B, H, L, hd).
    const auto packed = (at::randn({B, L, 3, H, hd}) * 4).to(dtype);
    const auto qk = packed.narrow(2, 0, 2).permute({2, 0, 3, 1, 4});
    const auto got = apply_rope(qk, prefix, rope);
    const auto expected = upstream(qk, prefix, cos, sin);
    const std::string what = c10::str(dtype, " prefix=", prefix);
    ASSERT_EQ(got.sizes(), qk.sizes()) << what;
    EXPECT_TRUE(got.is_contiguous()) << what;
    EXPECT_TRUE(at::equal(got, expected))
        << what << " max |diff| "
        << (got.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
    const auto q = qk.select(0, 0).contiguous();
    EXPECT_TRUE(at::equal(apply_rope(q, prefix, rope), upstream(q, prefix, cos, sin))) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DinoV3Rope,
                         ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(RotaryEmbedding, EntryPointCallsTheBoundImplementationAndFallsBackOnDecline) {
  namespace k = libreyolo::kernels;
  k::Registry r;
  r.declare(k::kRotaryEmbedding);
  int calls = 0;
  bool decline = false;
  r.register_impl(k::kRotaryEmbedding, "marker",
                  [&](const at::Tensor& x, const at::Tensor&, const at::Tensor&,
                      int64_t prefix) -> k::Outcome<at::Tensor> {
                    ++calls;
                    EXPECT_EQ(prefix, 2);
                    if (decline) return k::Decline{"marker: declines"};
                    return at::full(x.sizes(), 0.25, x.options());
                  });
  const auto handle = r.bind(k::kRotaryEmbedding, k::BindContext{});
  at::manual_seed(5);
  const auto x = at::randn({2, 3, 6, 8}), cos = at::randn({4, 8}), sin = at::randn({4, 8});
  EXPECT_TRUE(at::equal(k::rotary_embedding(handle, x, cos, sin), at::full_like(x, 0.25)));
  decline = true;
  EXPECT_TRUE(at::equal(k::rotary_embedding(handle, x, cos, sin),
                        k::rotary_embedding_portable(x, cos, sin, 2)));
  EXPECT_EQ(calls, 2);
}

TEST(RotaryEmbedding, BadArgumentsNameTheProblem) {
  namespace k = libreyolo::kernels;
  using libreyolo::test::message_of;
  const RotaryEmbeddingHandle none;
  const auto x = at::zeros({2, 6, 8}), t = at::zeros({4, 8});
  EXPECT_EQ(message_of([&] {
              k::rotary_embedding(none, at::zeros({2, 6, 7}), t, t);
            }),
            "rotary_embedding: x [2, 6, 7] must be (..., L, D) with D even");
  EXPECT_EQ(message_of([&] {
              k::rotary_embedding(none, x, at::zeros({7, 8}), t);
            }),
            "rotary_embedding: cos [7, 8] must be (N, D) with N <= L for x [2, 6, 8]");
  EXPECT_EQ(message_of([&] {
              k::rotary_embedding(none, x, t, at::zeros({4, 6}));
            }),
            "rotary_embedding: signed_sin [4, 6] and cos [4, 8] must have one shape");
  EXPECT_EQ(
      message_of([&] { k::rotary_embedding(none, x, t, t.to(at::kHalf)); }),
      "rotary_embedding: x (Float), cos (Float) and signed_sin (Half) must share one dtype of "
      "float32, float64, float16 or bfloat16");
  const auto f8 = x.to(at::kFloat8_e4m3fn), t8 = t.to(at::kFloat8_e4m3fn);
  EXPECT_EQ(message_of([&] { k::rotary_embedding(none, f8, t8, t8); }),
            "rotary_embedding: x (Float8_e4m3fn), cos (Float8_e4m3fn) and signed_sin "
            "(Float8_e4m3fn) must share one dtype of float32, float64, float16 or bfloat16");
  EXPECT_EQ(message_of([&] { k::rotary_embedding(none, at::Tensor(), t, t); }),
            "rotary_embedding: x, cos and signed_sin must be defined");
}

// Under autograd the portable path runs the same ops without out= arguments: equal values, and
// gradients flow to x (the out= form throws there).
TEST(RotaryEmbedding, PortablePathIsDifferentiableWithEqualValues) {
  namespace k = libreyolo::kernels;
  at::manual_seed(8);
  const auto x = at::randn({2, 3, 7, 8}), cos = at::randn({5, 8}), sin = at::randn({5, 8});
  const auto expected = k::rotary_embedding(RotaryEmbeddingHandle(), x, cos, sin);
  const auto g = x.clone().requires_grad_(true);
  const auto got = k::rotary_embedding(RotaryEmbeddingHandle(), g, cos, sin);
  ASSERT_TRUE(got.requires_grad());
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_TRUE(at::equal(got.detach(), expected));
  got.sum().backward();
  // d(sum)/dx: 1 on the prefix rows; cos + the other half's signed_sin on the patch rows.
  const auto grad = g.grad();
  EXPECT_TRUE(at::equal(grad.narrow(-2, 0, 2), at::ones({2, 3, 2, 8})));
  const auto patch = cos + at::cat({sin.narrow(1, 4, 4), sin.narrow(1, 0, 4)}, 1);
  EXPECT_TRUE(at::allclose(grad.narrow(-2, 2, 5), patch.expand({2, 3, 5, 8})));
}

TEST(DinoV3RopeTables, AreRopeWithTheFirstHalfOfSinNegatedAndKeptPerGeometry) {
  libreyolo::models::deimv2::Dinov3Config c;
  c.hidden_size = 32;
  c.num_heads = 2;
  c.num_layers = 1;
  c.out_indices = {1};
  libreyolo::models::deimv2::Dinov3BackboneImpl backbone(c);
  const auto [cos, sin] = backbone.rope(3, 4, at::kBFloat16);
  const auto tables = backbone.rope_tables(3, 4, at::kBFloat16);
  const int64_t half = sin.size(1) / 2;
  ASSERT_EQ(tables.cos.sizes(), cos.sizes());
  EXPECT_TRUE(at::equal(tables.cos, cos));
  EXPECT_TRUE(at::equal(tables.signed_sin.narrow(1, 0, half), -sin.narrow(1, 0, half)));
  EXPECT_TRUE(at::equal(tables.signed_sin.narrow(1, half, half), sin.narrow(1, half, half)));
  // The same geometry: the kept tensors; another: new ones.
  EXPECT_EQ(backbone.rope_tables(3, 4, at::kBFloat16).cos.data_ptr(), tables.cos.data_ptr());
  EXPECT_EQ(backbone.rope_tables(4, 4, at::kBFloat16).cos.size(0), 16);
}

}  // namespace

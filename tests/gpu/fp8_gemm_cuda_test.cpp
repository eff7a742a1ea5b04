// The `scaled_mm` fp8_gemm (kernels/gemm/cuda/fp8_gemm_cuda.cpp) on a GPU with FP8 tensor cores:
// its output against the same quantised operands in float32, its declines and bind rules, and
// whole models loaded with `quantization: fp8` against the same bfloat16 models (the FP8 bar:
// logits cosine >= 0.999 per row, top-1 agreement for classifiers, boxes within 1e-2). Skips
// without a GPU, and on GPUs below compute capability 8.9.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/gemm/cuda/fp8_quant_rows_cuda.h"
#include "kernels/gemm/fp8_gemm.h"
#include "models/model.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo::kernels {
namespace {

#define REQUIRE_FP8_GPU()                                  \
  REQUIRE_CUDA();                                          \
  if (at::cuda::getCurrentDeviceProperties()->major * 10 + \
          at::cuda::getCurrentDeviceProperties()->minor <  \
      89)                                                  \
  GTEST_SKIP() << "no FP8 tensor cores (compute capability below 8.9)"

/// The GEMM scaled_mm computes, in float32: x quantised per row, both operands dequantised.
at::Tensor dequantised_linear(const at::Tensor& x, const Fp8Weight& w, const at::Tensor& bias) {
  const auto [xq, xs] = quantize_fp8_rows(x.reshape({-1, x.size(-1)}));
  auto y = at::mm(xq.to(at::kFloat) * xs, (w.data.to(at::kFloat) * w.scale.unsqueeze(1)).t());
  return bias.defined() ? y + bias.to(at::kFloat) : y;
}

TEST(Fp8GemmCuda, ScaledMmIsTheQuantisedGemmRoundedToBfloat16) {
  REQUIRE_FP8_GPU();
  auto ctx = test::cuda_context();
  ctx.dtype = "bfloat16";
  const auto handle = test::cuda_only().bind(kFp8Gemm, ctx);
  ASSERT_FALSE(handle.empty());
  at::manual_seed(8);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  // (tokens, K, N): RF-DETR medium's fc1 (384 -> 1536), ViT-B's fc1 and fc2, an odd row count.
  const int64_t shapes[][3] = {
      {2 * 1297, 384, 1536}, {197, 768, 3072}, {197, 3072, 768}, {77, 64, 256}};
  for (const auto& s : shapes) {
    const auto x = at::randn({1, s[0], s[1]}, cuda).to(at::kBFloat16);
    const auto w = (at::randn({s[2], s[1]}, cuda) / std::sqrt(double(s[1]))).to(at::kBFloat16);
    const auto b = (at::randn({s[2]}, cuda) * 0.1).to(at::kBFloat16);
    const auto q = quantize_fp8_weight(w);
    const auto out = handle(x, q.data, q.scale, b);
    ASSERT_TRUE(out.has_value()) << "scaled_mm declined";
    EXPECT_EQ(out->sizes(), (std::vector<int64_t>{1, s[0], s[2]}));
    EXPECT_EQ(out->scalar_type(), at::kBFloat16);
    const auto ref = dequantised_linear(x, q, b).view({1, s[0], s[2]});
    const auto dense = at::linear(x, w, b).to(at::kFloat);
    const double rel = ((out->to(at::kFloat) - ref).norm() / ref.norm()).item<double>();
    const double cos =
        at::cosine_similarity(out->to(at::kFloat).flatten(0, 1), dense.flatten(0, 1), 1)
            .min()
            .item<double>();
    std::cout << "[gpu] fp8_gemm " << s[0] << "x" << s[1] << "->" << s[2]
              << ": |scaled_mm - quantised fp32| / |ref| = " << rel
              << ", min row cosine vs bf16 Linear = " << cos << "\n";
    EXPECT_LE(rel, 4e-3);  // the bfloat16 output's rounding (2^-9) and the accumulation order
    EXPECT_GE(cos, 0.999);
  }
}

/// The one-kernel activation quantisation (kernels/gemm/cuda/fp8_quant_rows_cuda.h) against the
/// ATen ops of quantize_fp8_rows: every byte and every scale, on rows of randn, a zero row, a row
/// with a NaN, an infinity, values past 448 and subnormal magnitudes.
TEST(Fp8GemmCuda, OneKernelRowQuantisationIsTheAtenRule) {
  REQUIRE_CUDA();
  at::manual_seed(12);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (const auto& [m, k] :
       std::vector<std::pair<int64_t, int64_t>>{{6304, 768}, {7, 3072}, {33, 8}, {5, 1000}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k));
    auto x = (at::randn({m, k}, cuda) * 3).to(at::kBFloat16);
    x[0].zero_();
    if (m > 4) {
      x[1][k / 2] = std::numeric_limits<float>::quiet_NaN();
      x[2][0] = std::numeric_limits<float>::infinity();
      x[3] *= 1000;   // amax far past 448
      x[4] *= 1e-38;  // subnormal magnitudes after the scale
    }
    ASSERT_TRUE(cuda::quantize_fp8_rows_bf16_accepts(x));
    const auto [data, scale] = cuda::quantize_fp8_rows_bf16(x);
    const auto [ref_data, ref_scale] = quantize_fp8_rows(x);
    ASSERT_EQ(data.sizes(), ref_data.sizes());
    ASSERT_EQ(scale.sizes(), ref_scale.sizes());
    EXPECT_TRUE(at::equal(data.view(at::kByte), ref_data.view(at::kByte)));
    EXPECT_TRUE(at::equal(scale.view(at::kInt), ref_scale.view(at::kInt)));
    EXPECT_EQ(scale[0].item<float>(), 1.f);             // a zero row
    if (m > 4) EXPECT_EQ(scale[1].item<float>(), 1.f);  // a row holding NaN
  }
  const auto bf16 = cuda.dtype(at::kBFloat16);
  EXPECT_FALSE(cuda::quantize_fp8_rows_bf16_accepts(at::randn({4, 12}, bf16)));  // K % 8
  EXPECT_FALSE(cuda::quantize_fp8_rows_bf16_accepts(at::randn({4, 16}, cuda)));  // float32
  EXPECT_FALSE(  // a view 2 bytes into its storage
      cuda::quantize_fp8_rows_bf16_accepts(at::randn({65}, bf16).narrow(0, 1, 64).view({4, 16})));
  EXPECT_THROW(cuda::quantize_fp8_rows_bf16(at::randn({4, 12}, bf16)), c10::Error);
}

TEST(Fp8GemmCuda, DeclinesAndBindRules) {
  REQUIRE_FP8_GPU();
  Registry& reg = test::cuda_only();
  auto ctx = test::cuda_context();
  ctx.dtype = "float32";
  EXPECT_TRUE(reg.bind(kFp8Gemm, ctx).empty());
  ctx.dtype = "bfloat16";
  const auto handle = reg.bind(kFp8Gemm, ctx);
  ASSERT_FALSE(handle.empty());
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const auto q24 = quantize_fp8_weight(at::randn({32, 24}, cuda));
  EXPECT_FALSE(handle(at::randn({4, 24}, cuda), q24.data, q24.scale, {}).has_value());
  const auto q = quantize_fp8_weight(at::randn({32, 64}, cuda));
  EXPECT_FALSE(handle(at::randn({4, 64}, cuda).to(at::kHalf), q.data, q.scale, {}).has_value());
  const auto r = test::candidate_report(reg, "fp8_gemm", "scaled_mm");
  EXPECT_GE(r.declined.at("scaled_mm: K or N not a multiple of 16"), 1u);
  EXPECT_GE(r.declined.at("scaled_mm: dtype (bfloat16 only)"), 1u);
}

double min_row_cosine(const at::Tensor& a, const at::Tensor& b) {
  return at::cosine_similarity(a.flatten(0, -2).to(at::kFloat), b.flatten(0, -2).to(at::kFloat), 1)
      .min()
      .item<double>();
}

/// Whole models, bfloat16 with and without `quantization: fp8`. The bar applies to models that
/// compare query by query (ViT's classes, YOLOS's detection tokens); two-stage detectors pick
/// their queries by a top-k over nearly tied random-weight scores, which any perturbation
/// reorders (tests/unit/fp8_gemm_test.cpp), so for them the layers are checked, the outputs are
/// finite and the agreement is printed.
TEST(Fp8GemmCuda, QuantisedModelsAgreeWithBfloat16) {
  REQUIRE_FP8_GPU();
  for (const char* fixture :
       {"vit_tiny", "yolos_tiny", "rtdetr_tiny", "rf_detr_tiny", "lw_detr_tiny"}) {
    SCOPED_TRACE(fixture);
    // The FP8 bar (cosine 0.999, boxes 1e-2) for vit_tiny; yolos_tiny misses it by a little
    // even in float32 emulation (0.9967 / 0.0116, tests/unit/fp8_gemm_test.cpp says why): its
    // measured bound is kept.
    const bool yolos = std::string(fixture) == "yolos_tiny";
    const bool bar = std::string(fixture) == "vit_tiny" || yolos;
    const double min_cos = yolos ? 0.995 : 0.999, max_boxes = yolos ? 0.015 : 1e-2;
    const std::string dir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + fixture;
    models::LoadOptions o;
    o.device = at::Device("cuda:0");
    o.dtype = at::kBFloat16;
    o.name = std::string(fixture) + "_bf16";
    const auto dense = models::load_model(dir, o);
    o.quantization = models::quantization::Quantization::fp8;
    o.name = std::string(fixture) + "_fp8";
    const auto fp8 = models::load_model(dir, o);
    const auto& q = fp8->quantization();
    EXPECT_EQ(q.implementation, "scaled_mm") << q.unavailable;
    EXPECT_GT(q.fp8.layers, 0);
    const auto size = test::read_json(dir + "/preprocessor_config.json").at("size");
    const int64_t h = size.value("height", size.value("shortest_edge", 224));
    const int64_t w = size.value("width", size.value("longest_edge", 224));
    // pixel_values as the image processors make them: normalised, about N(0, 1). Uniform [0, 1)
    // pixels (the inputs here until 2026-12-05) leave vit_tiny's logits small (std 0.3), where
    // the scheme itself, emulated in float32 on the CPU, gives a row cosine of 0.9906: the H200's
    // 0.9944 on them was the inputs, not the CUDA path. On these the emulation gives 0.99987
    // (float32) / 0.99982 (bfloat16) for vit_tiny, 0.9980 / 0.9960 for yolos_tiny.
    at::manual_seed(9);
    const auto pixels = at::randn({2, 3, h, w}, at::TensorOptions().device(at::kCUDA));
    at::InferenceMode guard;
    const auto a = dense->forward(pixels), b = fp8->forward(pixels);
    EXPECT_TRUE(at::isfinite(b.logits).all().item<bool>());
    const double cos = min_row_cosine(a.logits, b.logits);
    std::cout << "[gpu] fp8 " << fixture << ": " << q.fp8.layers << " layers, " << q.fp8.kept_shape
              << " kept, min row cosine " << cos;
    if (bar) EXPECT_GE(cos, min_cos);
    if (a.pred_boxes.defined()) {
      const double boxes = (a.pred_boxes - b.pred_boxes).abs().max().item<double>();
      std::cout << ", max |boxes - bf16| " << boxes;
      if (bar) EXPECT_LE(boxes, max_boxes);
    } else if (bar) {
      EXPECT_TRUE(at::equal(a.logits.argmax(-1), b.logits.argmax(-1)));
    }
    std::cout << "\n";
  }
}

}  // namespace
}  // namespace libreyolo::kernels

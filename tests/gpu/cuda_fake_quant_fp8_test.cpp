// The `cuda` implementation of `fake_quant_fp8` (kernels/quant/cuda/): bit-exact against the
// fixtures (tests/fixtures/ops/fake_quant_fp8) and the reference on special values, identity
// gradient, declines, CUDA graph capture. Skips without a CUDA device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kernels/attention/dot_product_attention.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/kernels.h"
#include "kernels/quant/cuda/fake_quant_fp8_cuda.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "kernels/registry.h"
#include "tests/gpu/cuda_test_util.h"

// The CUDA-only entry points are declared weak: without nvcc (CI) libreyolo_kernels lacks them,
// test_gpu still links, and every test skips (no device, or built_with_cuda() false).
namespace libreyolo::kernels {
void register_cuda_kernels(Registry& registry)  // kernels/attention/cuda/register_cuda_kernels.cpp
    __attribute__((weak));
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

using test::bit_mismatches;

using test::cuda_context;
using test::cuda_only;
using test::declare_with_cuda_only;

at::Tensor run_cuda(const at::Tensor& x, const at::Tensor& scale) {
  auto out = cuda_only().bind(kFakeQuantFp8, cuda_context())(x, scale);
  EXPECT_TRUE(out.has_value()) << "the cuda implementation declined";
  return out ? *out : at::Tensor();
}

const at::Device kCuda(at::kCUDA, 0);

TEST(CudaFakeQuantFp8, BitExactOnFixturesPerTensor) {
  REQUIRE_CUDA();
  const auto f = test::load_safetensors(test::fixture("ops/fake_quant_fp8.safetensors"));
  const auto x = f.at("x").to(kCuda);
  for (const std::string s : {"s1", "s0p5", "s_tiny"}) {
    const auto out = run_cuda(x, f.at("scale_" + s).to(kCuda));
    const auto bad = bit_mismatches(out, f.at("expected_" + s));
    std::cout << "scale " << s << ": " << bad << " of " << x.numel() << " values differ\n";
    EXPECT_EQ(bad, 0) << s;
  }
}

TEST(CudaFakeQuantFp8, BitExactOnFixturePerChannel) {
  REQUIRE_CUDA();
  const auto f = test::load_safetensors(test::fixture("ops/fake_quant_fp8.safetensors"));
  const auto w = f.at("w").to(kCuda);
  const auto scale = f.at("w_scale").view({-1, 1}).to(kCuda);
  const auto bad = bit_mismatches(run_cuda(w, scale), f.at("w_expected"));
  std::cout << "per-channel: " << bad << " of " << w.numel() << " values differ\n";
  EXPECT_EQ(bad, 0);
}

/// Special values, ties, saturation, subnormals and a random sweep, against the reference run on
/// the CPU (c10's software cast) and on the GPU.
TEST(CudaFakeQuantFp8, BitExactAgainstReferenceOnSpecialValues) {
  REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> special = {0.f,           -0.f,           inf,          -inf,          nan,
                                448.f,         -448.f,         464.f,        480.f,         1e30f,
                                -1e30f,        17.f,           19.f,         1e-45f,        1e-38f,
                                0.0009765625f, 0.00146484375f, 0.013671875f, 0.0146484375f, 240.f,
                                248.f,         232.f};
  at::manual_seed(21);
  const auto sweep = at::cat(
      {at::tensor(special), at::randn({1 << 20}) * at::exp2(at::randint(-30, 30, {1 << 20}))});
  for (const float sv : {1.f, 0.5f, 0.f, 3.7e-3f, 1e-30f, 1234.5f, nan}) {
    const auto scale = at::full({1}, sv);
    const auto ref_cpu = fake_quant_fp8_reference(sweep, scale);
    const auto ref_gpu = fake_quant_fp8_reference(sweep.to(kCuda), scale.to(kCuda));
    const auto out = run_cuda(sweep.to(kCuda), scale.to(kCuda));
    const auto bad_cpu = bit_mismatches(out, ref_cpu);
    const auto bad_gpu = bit_mismatches(out, ref_gpu);
    std::cout << "scale " << sv << ": " << bad_cpu << " differ from the CPU reference, " << bad_gpu
              << " from the GPU reference (of " << sweep.numel() << ")\n";
    EXPECT_EQ(bad_cpu, 0) << "scale " << sv;
    EXPECT_EQ(bad_gpu, 0) << "scale " << sv;
  }
  // Per channel, 3-d weights (C, H, W) with a (C, 1, 1) scale, one channel with scale 0.
  auto w = at::randn({17, 9, 13});
  auto ws = (w.abs().amax({1, 2}, true) / 448.0).contiguous();
  ws[3].fill_(0.f);
  EXPECT_EQ(bit_mismatches(run_cuda(w.to(kCuda), ws.to(kCuda)), fake_quant_fp8_reference(w, ws)),
            0);
  // Contiguous but not 16-byte aligned (storage offset 1): the scalar path.
  const auto big = sweep.to(kCuda);
  const auto shifted = big.narrow(0, 1, big.numel() - 1);
  EXPECT_EQ(bit_mismatches(run_cuda(shifted, at::full({1}, 0.25f, big.options())),
                           fake_quant_fp8_reference(sweep.narrow(0, 1, sweep.numel() - 1),
                                                    at::full({1}, 0.25f))),
            0);
}

TEST(CudaFakeQuantFp8, GradientIsIdentity) {
  REQUIRE_CUDA();
  auto x = (at::randn({64, 33}) * 1000).to(kCuda).requires_grad_();  // many saturate
  const auto scale = at::full({1}, 0.5f, x.options().requires_grad(false));
  auto y = run_cuda(x, scale);
  ASSERT_TRUE(y.requires_grad());
  const auto g = at::randn_like(y);
  y.backward(g);
  EXPECT_TRUE(at::equal(x.grad(), g));
}

TEST(CudaFakeQuantFp8, DeclinesAreCountedNotThrown) {
  REQUIRE_CUDA();
  Registry reg;
  declare_with_cuda_only(reg);
  const auto x = at::randn({8, 6}, at::TensorOptions().device(kCuda));
  const auto s = at::full({1}, 0.1f, x.options());
  auto call = [&](const at::Tensor& a, const at::Tensor& b) {
    return reg.bind(kFakeQuantFp8, cuda_context())(a, b);
  };
  EXPECT_FALSE(call(x.cpu(), s.cpu()));
  EXPECT_FALSE(call(x.to(at::kDouble), s.to(at::kDouble)));
  EXPECT_FALSE(call(x.t(), s));
  EXPECT_FALSE(call(x, at::full({6}, 0.1f, x.options())));  // (6) would broadcast over dim 1
  EXPECT_TRUE(call(x, s));
  EXPECT_TRUE(call(x, at::full({8, 1}, 0.1f, x.options())));
  test::expect_calls_and_declines(reg, kFakeQuantFp8.name, "cuda", 2,
                                  {{"cpu tensor", 1},
                                   {"unsupported dtype", 1},
                                   {"non-contiguous", 1},
                                   {"unsupported scale shape", 1}});
}

TEST(CudaFakeQuantFp8, CudaGraphReplayEqualsEager) {
  REQUIRE_CUDA();
  const auto x = at::randn({1 << 16}, at::TensorOptions().device(kCuda)) * 100;
  const auto s = at::full({1}, 0.37f, x.options());
  const auto eager = run_cuda(x, s);
  at::cuda::CUDAGraph graph;
  at::Tensor out;
  auto stream = at::cuda::getStreamFromPool();
  {
    const c10::cuda::CUDAStreamGuard guard(stream);
    run_cuda(x, s);
    graph.capture_begin();
    out = run_cuda(x, s);
    graph.capture_end();
  }
  graph.replay();
  stream.synchronize();
  EXPECT_TRUE(at::equal(out, eager));
}

}  // namespace
}  // namespace libreyolo::kernels

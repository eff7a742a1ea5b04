// The `onednn` implementation of linear_act and of linear (kernels/gemm/cpu/
// linear_act_onednn.cpp): linear_act bound for CPU float32 models and bfloat16 ones on a CPU with
// native bf16, linear for the latter only; at::linear's numbers within a few float32 ulps (the
// activation after the GEMM equal to ATen's), the packed weight reused across calls and made
// again after the weight is written in place, concurrent first calls, and declines that leave
// the portable path to answer. The bfloat16 cases skip on CPUs without AVX-512 BF16 or AMX.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/runtime/cpu_math.h"

namespace libreyolo::kernels {
namespace {

/// The process registry's binding for a CPU model named `model` with `dtype`.
LinearActHandle bind_cpu(const std::string& model, const std::string& dtype = "float32") {
  BindContext c;
  c.model = model;
  c.dtype = dtype;
  return Registry::process_default().bind(kLinearAct, c);
}

/// The process registry's `linear` binding for a CPU model named `model` with `dtype`.
LinearHandle bind_linear(const std::string& model, const std::string& dtype) {
  BindContext c;
  c.model = model;
  c.dtype = dtype;
  return Registry::process_default().bind(kLinear, c);
}

/// The report of `onednn` in the binding of `model` for `slot` (the only one by that name).
CandidateReport onednn_of(const std::string& model, const std::string& slot = "linear_act") {
  for (const auto& b : Registry::process_default().bindings())
    if (b.model == model && b.slot == slot)
      for (const auto& c : b.candidates)
        if (c.name == "onednn") return c;
  ADD_FAILURE() << "no onednn candidate for " << model;
  return {};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Every activation on (batch, tokens, K) inputs, with and without a bias: oneDNN's GEMM sums in
// another order than MKL's (at::linear), so the bound is relative to the output's magnitude
// (|y| ~ 5 here: 1e-5 is ~20 ulps); the activation itself adds nothing (ReLU and the erf GELU
// post-ops equal ATen's on the same GEMM output, SiLU and tanh are ATen's).
TEST(LinearActOnednn, EqualsAtLinearAndActivation) {
  const auto h = bind_cpu("linear_onednn_equals_aten");
  ASSERT_FALSE(h.empty());
  // As models::load_model does (no model is loaded here): without it, this test's first tanh
  // (2 threads) was off by 9e-5 in about one process in ten (models/runtime/cpu_math.h).
  models::initialise_cpu_math();
  at::manual_seed(11);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({2, 37, 64});
  const auto w = at::randn({96, 64}) * 0.6, b = at::randn({96});
  int calls = 0;
  for (auto act :
       {Activation::none, Activation::relu, Activation::silu, Activation::gelu, Activation::tanh}) {
    SCOPED_TRACE(activation_name(act));
    const auto y = linear_act(h, x, w, b, act);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 37, 96}));
    EXPECT_LE(max_diff(y, apply_activation(act, at::linear(x, w, b))), 1e-5);
    const auto no_bias = linear_act(h, x, w, at::Tensor(), act);
    EXPECT_LE(max_diff(no_bias, apply_activation(act, at::linear(x, w))), 1e-5);
    calls += 2;
  }
  // The GEMM output of this implementation, then ATen's activation: the post-ops are exact.
  const auto gemm = linear_act(h, x, w, b, Activation::none);
  EXPECT_TRUE(at::equal(linear_act(h, x, w, b, Activation::relu), at::relu(gemm)));
  EXPECT_TRUE(at::equal(linear_act(h, x, w, b, Activation::gelu), at::gelu(gemm)));
  // A non-contiguous input (a transposed view) and a 2-d one.
  const auto xt = at::randn({64, 5}).t();
  EXPECT_LE(max_diff(linear_act(h, xt, w, b, Activation::gelu), at::gelu(at::linear(xt, w, b))),
            1e-5);
  calls += 4;
  const auto report = onednn_of("linear_onednn_equals_aten");
  EXPECT_EQ(report.calls, static_cast<size_t>(calls));
  EXPECT_TRUE(report.declined.empty());
}

// One packed copy per weight: a second call reuses it; a weight written in place (a layout
// applied after a warm-up forward) is packed again and its new values are used; a new tensor is
// its own entry.
TEST(LinearActOnednn, PackedWeightIsReusedAndMadeAgainAfterAWrite) {
  const auto h = bind_cpu("linear_onednn_repack");
  at::manual_seed(12);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({9, 16});
  auto w = at::randn({24, 16});
  const auto b = at::randn({24});
  const auto first = linear_act(h, x, w, b, Activation::none);
  const size_t entries = linear_act_onednn_packed_weights();
  const auto second = linear_act(h, x, w, b, Activation::relu);
  EXPECT_EQ(linear_act_onednn_packed_weights(), entries);
  EXPECT_TRUE(at::equal(second, at::relu(first)));
  w.mul_(2);
  const auto after = linear_act(h, x, w, b, Activation::none);
  EXPECT_LE(max_diff(after - b, 2 * (first - b)), 1e-5);
  const auto w2 = at::randn({24, 16});
  EXPECT_LE(max_diff(linear_act(h, x, w2, b, Activation::none), at::linear(x, w2, b)), 1e-5);
}

// Concurrent forwards share the table: four threads' first calls on the same weights (each may
// pack it; one entry wins) and their later calls give the same numbers.
TEST(LinearActOnednn, ConcurrentCallsShareThePackedWeights) {
  const auto h = bind_cpu("linear_onednn_threads");
  at::manual_seed(13);
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> ws;
  for (int i = 0; i < 6; ++i) ws.push_back(at::randn({32, 24}));
  const auto x = at::randn({7, 24}), b = at::randn({32});
  std::vector<at::Tensor> expected;
  for (const auto& w : ws) expected.push_back(at::gelu(at::linear(x, w, b)));
  std::vector<double> worst(4, 0.0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const at::NoGradGuard guard;  // per thread
      for (int round = 0; round < 5; ++round)
        for (size_t i = 0; i < ws.size(); ++i)
          worst[t] = std::max(worst[t],
                              max_diff(linear_act(h, x, ws[i], b, Activation::gelu), expected[i]));
    });
  for (auto& t : threads) t.join();
  for (double d : worst) EXPECT_LE(d, 1e-5);
  const auto report = onednn_of("linear_onednn_threads");
  EXPECT_EQ(report.calls, 4u * 5u * ws.size());
  EXPECT_TRUE(report.declined.empty());
}

// Not float32, or an empty input: declined with the reason counted, and the portable path
// answers. Models on another device or in another dtype do not bind it at all.
TEST(LinearActOnednn, DeclinesAndBindRules) {
  const auto h = bind_cpu("linear_onednn_declines");
  const at::NoGradGuard no_grad;
  const auto x = at::randn({3, 8}, at::kDouble), w = at::randn({5, 8}, at::kDouble);
  EXPECT_TRUE(at::equal(linear_act(h, x, w, {}, Activation::relu), at::relu(at::linear(x, w))));
  const auto xf = at::randn({3, 8}), wf = at::randn({5, 8});
  // Mixed dtypes: declined, then at::linear's own error.
  EXPECT_THROW(linear_act(h, xf, w, {}, Activation::none), c10::Error);
  const auto empty = linear_act(h, at::randn({0, 8}), wf, {}, Activation::gelu);
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 5}));
  {
    const at::AutoGradMode grad(true);
    const auto wg = at::randn({5, 8}).requires_grad_();
    const auto y = linear_act(h, xf, wg, {}, Activation::none);
    EXPECT_TRUE(y.requires_grad());
  }
  const auto report = onednn_of("linear_onednn_declines");
  EXPECT_EQ(report.declined.at("onednn: dtype (float32, or bfloat16 on a CPU with native bf16)"),
            1u);
  EXPECT_EQ(report.declined.at("onednn: weight or bias dtype differs"), 1u);
  EXPECT_EQ(report.declined.at("onednn: empty tensor"), 1u);
  EXPECT_EQ(report.declined.at("onednn: autograd (the fused op has no backward)"), 1u);
  EXPECT_FALSE(report.disabled);

  // Bindings are listed while their handle lives.
  const auto f16 = bind_cpu("linear_onednn_float16_model", "float16");
  EXPECT_TRUE(f16.empty());
  EXPECT_EQ(onednn_of("linear_onednn_float16_model").reason,
            "the model is not float32 or bfloat16");
  const auto bf16 = bind_cpu("linear_onednn_bfloat16_model", "bfloat16");
  EXPECT_EQ(bf16.empty(), !cpu_has_native_bfloat16());
  EXPECT_EQ(onednn_of("linear_onednn_bfloat16_model").reason,
            cpu_has_native_bfloat16() ? "" : "bfloat16 on a CPU without avx512_bf16 or amx_bf16");
  BindContext cuda;
  cuda.device = BindContext::Device::cuda;
  cuda.model = "linear_onednn_cuda_model";
  const auto on_cuda = Registry::process_default().bind(kLinearAct, cuda);
  EXPECT_EQ(onednn_of("linear_onednn_cuda_model").reason, "the model is not on the CPU");
}

// bfloat16 on a CPU that computes it natively: every activation against the float32 GEMM of the
// same bfloat16 operands (one bfloat16 rounding of the output: 2^-8 relative, plus oneDNN's
// float32 sum order) and against at::linear in bfloat16.
TEST(LinearActOnednn, Bfloat16OnANativeBfloat16Cpu) {
  if (!cpu_has_native_bfloat16()) GTEST_SKIP() << "this CPU has no avx512_bf16 or amx_bf16";
  const auto h = bind_cpu("linear_onednn_bfloat16", "bfloat16");
  ASSERT_FALSE(h.empty());
  at::manual_seed(14);
  const at::NoGradGuard no_grad;
  const auto x = at::randn({2, 37, 64}).to(at::kBFloat16);
  const auto w = (at::randn({96, 64}) * 0.2).to(at::kBFloat16),
             b = at::randn({96}).to(at::kBFloat16);
  for (auto act : {Activation::none, Activation::relu, Activation::gelu, Activation::silu}) {
    SCOPED_TRACE(activation_name(act));
    const auto exact =
        apply_activation(act, at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat)));
    const auto y = linear_act(h, x, w, b, act);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    const double scale = exact.abs().max().item<double>();
    EXPECT_LE(max_diff(y.to(at::kFloat), exact), scale * 0.008);
    const auto aten = apply_activation(act, at::linear(x, w, b)).to(at::kFloat);
    EXPECT_LE(max_diff(y.to(at::kFloat), aten), scale * 0.016);
  }
  const auto report = onednn_of("linear_onednn_bfloat16");
  EXPECT_EQ(report.calls, 4u);
  EXPECT_TRUE(report.declined.empty());
}

// The `linear` slot: float32 models do not bind it (at::linear, ATen's numbers, no slot call);
// bfloat16 models on a CPU with native bf16 bind `onednn`, whose output is linear_act's without
// an activation, bit for bit; shapes at::linear refuses are declined so that its error reaches
// the caller.
TEST(LinearOnednn, Bfloat16ModelsOnlyAndAtLinearsErrors) {
  const auto f32 = bind_linear("linear_slot_float32", "float32");
  EXPECT_TRUE(f32.empty());
  EXPECT_EQ(onednn_of("linear_slot_float32", "linear").reason, "the model is not bfloat16");
  const at::NoGradGuard no_grad;
  at::manual_seed(15);
  const auto xf = at::randn({5, 16}), wf = at::randn({8, 16}), bf = at::randn({8});
  EXPECT_TRUE(at::equal(linear(f32, xf, wf, bf), at::linear(xf, wf, bf)));
  if (!cpu_has_native_bfloat16()) GTEST_SKIP() << "this CPU has no avx512_bf16 or amx_bf16";
  const auto h = bind_linear("linear_slot_bfloat16", "bfloat16");
  ASSERT_FALSE(h.empty());
  const auto act = bind_cpu("linear_slot_bfloat16_act", "bfloat16");
  const auto x = at::randn({3, 41, 16}).to(at::kBFloat16);
  const auto w = at::randn({8, 16}).to(at::kBFloat16), b = at::randn({8}).to(at::kBFloat16);
  const auto y = linear(h, x, w, b);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 41, 8}));
  EXPECT_TRUE(at::equal(y, linear_act(act, x, w, b, Activation::none)));
  EXPECT_TRUE(at::equal(linear(h, x, w, {}), linear_act(act, x, w, {}, Activation::none)));
  // (3, 41, 16) against a (8, 15) weight: at::linear's own message.
  const auto w15 = at::randn({8, 15}).to(at::kBFloat16);
  try {
    linear(h, x, w15, b);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("cannot be multiplied"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  const auto report = onednn_of("linear_slot_bfloat16", "linear");
  EXPECT_EQ(report.calls, 2u);
  EXPECT_EQ(report.declined.at("onednn: shapes at::linear refuses"), 1u);
}

}  // namespace
}  // namespace libreyolo::kernels

// The linear_act slot: inputs validated before any implementation (exact messages), the portable
// path is at::linear then the activation bit for bit, a declining implementation falls back to
// it, and layers::LinearImpl::forward_act receives its handle from bind_kernels (`onednn`'s own
// tests: linear_act_onednn_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kernels/cpu/packed_weights.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/layers.h"
#include "tests/unit/error_message.h"

namespace libreyolo::kernels {
namespace {

using test::message_of;

TEST(LinearAct, InputsAreCheckedBeforeAnyImplementation) {
  Registry r;
  r.declare(kLinearAct);
  int calls = 0;
  r.register_impl(kLinearAct, "counting",
                  [&calls](const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           Activation) -> Outcome<at::Tensor> {
                    ++calls;
                    return Decline{"never"};
                  });
  const auto h = r.bind(kLinearAct, BindContext{});
  const auto x = at::randn({2, 5, 8}), w = at::randn({16, 8}), b = at::randn({16});
  EXPECT_EQ(message_of([&] { linear_act(h, at::Tensor(), w, b, Activation::gelu); }),
            "linear_act: x must be (..., K), got an undefined tensor");
  EXPECT_EQ(message_of([&] {
              linear_act(h, x, at::randn({16, 7}), b, Activation::gelu);
            }),
            "linear_act: weight must be (N, 8), got [16, 7]");
  EXPECT_EQ(message_of([&] { linear_act(h, x, w, at::randn({15}), Activation::gelu); }),
            "linear_act: bias must be (16), got [15]");
  EXPECT_EQ(calls, 0);
  // A decline runs the portable path: the unfused ops' numbers, and the decline is counted.
  const auto y = linear_act(h, x, w, b, Activation::gelu);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::equal(y, at::gelu(at::linear(x, w, b))));
  for (const auto& slot : r.report())
    if (slot.slot == "linear_act") EXPECT_EQ(slot.candidates.at(0).declined.at("never"), 1u);
}

TEST(LinearAct, PortablePathIsTheUnfusedOpsBitForBit) {
  at::manual_seed(3);
  const auto x = at::randn({3, 7, 24}), w = at::randn({40, 24}), b = at::randn({40});
  const LinearActHandle empty;
  for (auto act :
       {Activation::none, Activation::relu, Activation::silu, Activation::gelu, Activation::tanh}) {
    SCOPED_TRACE(activation_name(act));
    const auto y = linear_act(empty, x, w, b, act);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 7, 40}));
    EXPECT_TRUE(at::equal(y, apply_activation(act, at::linear(x, w, b))));
  }
  EXPECT_TRUE(at::equal(linear_act(empty, x, w, at::Tensor(), Activation::gelu),
                        at::gelu(at::linear(x, w))));
}

TEST(LinearAct, LinearModulesAreBoundToOnednnOnCpuFloat32Models) {
  // The process's built-in slots: a CPU float32 model binds `onednn` for linear_act
  // (kernels/gemm/cpu/) and nothing for linear (at::linear's numbers); a CPU bfloat16 one binds
  // `onednn` for both where the CPU has native bf16; a CPU float16 one nothing (cublaslt is for
  // CUDA float16 / bfloat16 models), so its forward_act is the portable path, bit for bit.
  Registry r;
  register_builtin_slots(r);
  if (auto cuda = make_cuda_provider()) r.add_provider(cuda);
  r.resolve();
  at::InferenceMode guard;  // as models run
  auto fc = std::make_shared<models::layers::LinearImpl>(8, 12);
  fc->weight.copy_(at::randn({12, 8}));
  fc->bias.copy_(at::randn({12}));
  const auto x = at::randn({4, 8});
  const auto bound = models::layers::bind_kernels(*fc, r, BindContext{}, Filter{});
  EXPECT_EQ(bound.linear_act.empty(), !at::hasMKLDNN());
  EXPECT_FALSE(fc->act_kernel.empty() && at::hasMKLDNN());
  EXPECT_TRUE(bound.linear.empty());
  EXPECT_TRUE(fc->kernel.empty());
  EXPECT_LE(
      (fc->forward_act(x, Activation::gelu) - at::gelu(fc->forward(x))).abs().max().item<double>(),
      1e-5);
  BindContext bf16;
  bf16.dtype = "bfloat16";
  const auto on_bf16 = models::layers::bind_kernels(*fc, r, bf16, Filter{});
  const bool native = at::hasMKLDNN() && cpu_has_native_bfloat16();
  EXPECT_EQ(on_bf16.linear_act.empty(), !native);
  EXPECT_EQ(on_bf16.linear.empty(), !native);
  EXPECT_EQ(fc->kernel.empty(), !native);
  BindContext f16;
  f16.dtype = "float16";
  const auto unbound = models::layers::bind_kernels(*fc, r, f16, Filter{});
  EXPECT_TRUE(unbound.linear_act.empty());
  EXPECT_TRUE(unbound.linear.empty());
  EXPECT_TRUE(fc->act_kernel.empty());
  EXPECT_TRUE(at::equal(fc->forward_act(x, Activation::gelu), at::gelu(fc->forward(x))));
}

}  // namespace
}  // namespace libreyolo::kernels

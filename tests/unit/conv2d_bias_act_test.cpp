// The conv2d_bias_act slot: the portable path equals the unfused ATen ops bit for bit, inputs
// are validated before any implementation, a bound implementation is called and counted, and a
// decline runs the portable path.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

struct Conv {
  at::Tensor x, w, b, residual;
  ConvGeometry g;
};

Conv make_conv() {
  at::manual_seed(3);
  Conv c;
  c.x = at::randn({2, 4, 9, 7});
  c.w = at::randn({6, 2, 3, 3});  // groups = 2
  c.b = at::randn({6});
  c.g.stride_h = 2;
  c.g.stride_w = 1;
  c.g.pad_h = 1;
  c.g.pad_w = 1;
  c.g.groups = 2;
  c.residual = at::randn({2, 6, 5, 7});
  return c;
}

TEST(Conv2dBiasAct, PortablePathIsTheUnfusedOpsBitForBit) {
  const auto c = make_conv();
  const auto conv = at::conv2d(c.x, c.w, c.b, {2, 1}, {1, 1}, {1, 1}, 2);
  EXPECT_TRUE(at::equal(conv2d_bias_act_portable(c.x, c.w, c.b, {}, c.g, Activation::none), conv));
  EXPECT_TRUE(at::equal(conv2d_bias_act_portable(c.x, c.w, c.b, {}, c.g, Activation::silu),
                        at::silu(conv)));
  EXPECT_TRUE(at::equal(conv2d_bias_act_portable(c.x, c.w, c.b, c.residual, c.g, Activation::relu),
                        at::relu(conv + c.residual)));
  EXPECT_TRUE(
      at::equal(conv2d_bias_act(Conv2dBiasActHandle{}, c.x, c.w, c.b, {}, c.g, Activation::gelu),
                at::gelu(conv)));
  EXPECT_STREQ(activation_name(Activation::tanh), "tanh");
}

// The residual add and the activation run in place on the convolution's output (no autograd):
// the same bits as the out-of-place ops, and the caller's residual is left untouched. With a
// weight that requires grad, the out-of-place ops run and autograd records them.
TEST(Conv2dBiasAct, InPlaceEpilogueKeepsBitsAndInputs) {
  const auto c = make_conv();
  const auto conv = at::conv2d(c.x, c.w, c.b, {2, 1}, {1, 1}, {1, 1}, 2);
  const auto residual_before = c.residual.clone();
  EXPECT_TRUE(at::equal(conv2d_bias_act_portable(c.x, c.w, c.b, c.residual, c.g, Activation::silu),
                        at::silu(conv + c.residual)));
  EXPECT_TRUE(at::equal(conv2d_bias_act_portable(c.x, c.w, c.b, c.residual, c.g, Activation::tanh),
                        at::tanh(conv + c.residual)));
  EXPECT_TRUE(at::equal(c.residual, residual_before));
  const auto w = c.w.clone().requires_grad_(true);
  const auto y = conv2d_bias_act_portable(c.x, w, c.b, c.residual, c.g, Activation::gelu);
  ASSERT_TRUE(y.requires_grad());
  EXPECT_NE(y.grad_fn(), nullptr);  // recorded by autograd: the out-of-place ops ran
  EXPECT_TRUE(at::equal(y.detach(), at::gelu(conv + c.residual)));
}

TEST(Conv2dBiasAct, InputsAreCheckedBeforeAnyImplementation) {
  const auto c = make_conv();
  Registry r;
  r.declare(kConv2dBiasAct);
  int calls = 0;
  r.register_impl(
      kConv2dBiasAct, "counting",
      [&calls](const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
               const ConvGeometry&, Activation) -> Outcome<at::Tensor> {
        ++calls;
        return Decline{"never"};
      });
  const auto h = r.bind(kConv2dBiasAct, BindContext{});
  auto message = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  EXPECT_EQ(message([&] { conv2d_bias_act(h, c.x[0], c.w, c.b, {}, c.g, Activation::none); }),
            "conv2d_bias_act: input must be (B, C_in, H, W), got [4, 9, 7]");
  ConvGeometry one_group = c.g;
  one_group.groups = 1;
  EXPECT_EQ(message([&] { conv2d_bias_act(h, c.x, c.w, c.b, {}, one_group, Activation::none); }),
            "conv2d_bias_act: input has 4 channels, weight expects 2");
  EXPECT_EQ(
      message([&] { conv2d_bias_act(h, c.x, c.w, at::zeros({5}), {}, c.g, Activation::none); }),
      "conv2d_bias_act: bias must be (C_out) = (6)");
  EXPECT_EQ(calls, 0);
  // A declining implementation is called, then the portable path answers.
  const auto out = conv2d_bias_act(h, c.x, c.w, c.b, {}, c.g, Activation::relu);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::equal(out, conv2d_bias_act_portable(c.x, c.w, c.b, {}, c.g, Activation::relu)));
  EXPECT_EQ(r.bindings().at(0).candidates.at(0).declined.at("never"), 1u);
}

TEST(Conv2dBiasAct, TheCudaImplementationIsNoCandidateOfACpuModel) {
  Registry& r = Registry::process_default();
  BindContext cpu;
  cpu.model = "cpu_conv_model";
  // float32 (and bfloat16 on an AMX / AVX-512 BF16 CPU) would bind `onednn`
  // (conv2d_bias_act_onednn_test.cpp)
  cpu.dtype = "float16";
  const auto h = r.bind(kConv2dBiasAct, cpu);
  EXPECT_TRUE(h.empty());  // no reference: the portable path is the caller's
  for (const auto& b : r.bindings()) {
    if (b.model != "cpu_conv_model") continue;
    EXPECT_EQ(b.selected, kUnavailable);
    for (const auto& c : b.candidates)
      if (c.name == "cuda") EXPECT_EQ(c.reason, "the model is not on a CUDA device");
  }
}

}  // namespace
}  // namespace libreyolo::kernels

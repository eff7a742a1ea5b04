// The `onednn` implementation of linear_act (CPU float32 with an activation, and bfloat16 on CPUs
// with native bf16, AVX-512 BF16 or AMX, with or without one): oneDNN's inner product on a weight
// reordered once into its blocked format, with the bias and the activation as post-ops, through
// the ops PyTorch's Inductor emits for CPU freezing of a linear layer with dynamic shapes
// (torch/_inductor/fx_passes/mkldnn_fusion.py): mkldnn::_reorder_linear_weight without a batch
// size (the token count differs per request) and mkldnn::_linear_pointwise
// (aten/src/ATen/native/mkldnn/Linear.cpp). They are registered in the `mkldnn` namespace of
// LibTorch's dispatcher (no at:: function), so they are called through it.
//
// bfloat16 (CPUs with native bf16 only; elsewhere oneDNN emulates it): the same ops; their
// bfloat16 GEMM sums in float32 and rounds once, as at::linear's oneDNN matmul does, which
// instead reorders the plain weight on every call (kernels/gemm/linear.h says what that costs).
// The `linear` slot (no activation) is served here too, for bfloat16 models only.
//
// Why: at::linear on the CPU is MKL's sgemm on the dense weight, then GELU / ReLU is a second
// pass over the (tokens, N) output. Here the activation is in the GEMM's epilogue. oneDNN's
// post-ops are used where they are exact: ReLU, and GELU with algorithm "none" (the erf form:
// equal to at::gelu of the same GEMM output, bit for bit, measured on 400 x 1024 outputs with
// |y| up to 19). SiLU and tanh run in ATen, in place, after oneDNN's GEMM. oneDNN's GEMM sums in
// another order than MKL's: outputs within a few float32 ulps of at::linear's (2.9e-6 at K = 256,
// 3.8e-6 at K = 1024 for outputs of magnitude ~10).
//
// Packed weights: kernels/cpu/packed_weights.h (one blocked copy of every weight that ran).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

#include <optional>
#include <string_view>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

constexpr const char* kPointwise = "mkldnn::_linear_pointwise";
constexpr const char* kReorder = "mkldnn::_reorder_linear_weight";

/// The packed form of a linear weight depends on nothing else.
struct NoKey {
  bool operator==(const NoKey&) const { return true; }
};

PackedWeights<NoKey>& packed_weights() {
  static auto* table = new PackedWeights<NoKey>();  // never destroyed: forwards may run at exit
  return *table;
}

/// mkldnn::_reorder_linear_weight(W (N, K), batch_size=None): an opaque mkldnn tensor in the
/// blocked format oneDNN's inner product picks for any number of rows.
at::Tensor reorder_weight(const at::Tensor& w) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kReorder, "")
                             .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  return op.call(w.contiguous(), std::nullopt);
}

/// mkldnn::_linear_pointwise(X (..., K), W packed, B?, attr, scalars, algorithm):
/// attr(X W^T + B), (..., N). attr is "none", "relu" or "gelu" (algorithm "none": erf).
at::Tensor linear_pointwise(const at::Tensor& x, const at::Tensor& packed,
                            const std::optional<at::Tensor>& b, Activation act) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kPointwise, "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            std::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<std::string_view>)>();
  const std::optional<std::string_view> algorithm =
      act == Activation::gelu ? std::optional<std::string_view>("none") : std::nullopt;
  return op.call(x, packed, b, activation_name(act), c10::List<std::optional<at::Scalar>>(),
                 algorithm);
}

/// The oneDNN call itself (the checks are the caller's).
at::Tensor run(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
               Activation act) {
  const auto packed = packed_weights().get(weight, NoKey{}, &reorder_weight);
  const std::optional<at::Tensor> b =
      bias.defined() ? std::optional<at::Tensor>(bias.contiguous()) : std::nullopt;
  const bool post_op =
      act == Activation::none || act == Activation::relu || act == Activation::gelu;
  auto y = linear_pointwise(x.contiguous(), packed, b, post_op ? act : Activation::none);
  return post_op ? y : apply_activation_(act, y);
}

Outcome<at::Tensor> linear_act_onednn(const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& bias, Activation act) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() ||
      (bias.defined() && !bias.device().is_cpu()))
    return Decline{"onednn: not a CPU tensor"};
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && (dtype != at::kBFloat16 || !cpu_has_native_bfloat16()))
    return Decline{"onednn: dtype (float32, or bfloat16 on a CPU with native bf16)"};
  if (weight.scalar_type() != dtype || (bias.defined() && bias.scalar_type() != dtype))
    return Decline{"onednn: weight or bias dtype differs"};
  if (x.layout() != at::kStrided || weight.layout() != at::kStrided)
    return Decline{"onednn: not a strided tensor"};
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad())))
    return Decline{"onednn: autograd (the fused op has no backward)"};
  if (x.numel() == 0 || weight.numel() == 0) return Decline{"onednn: empty tensor"};
  try {
    return run(x, weight, bias, act);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the registry's out-of-memory handling (kernels/out_of_memory.h)
  } catch (const c10::Error&) {
    // oneDNN refusing one shape must not disable the implementation for the process, as a
    // throw would: ATen runs this call, the next one tries again.
    return Decline{"onednn: oneDNN refused this linear"};
  }
}

/// The `linear` slot's `onednn`: the same inner product without an activation, for bfloat16
/// (the bind rule keeps float32 models on at::linear). A shape at::linear would refuse is
/// declined, so that its error reaches the caller.
Outcome<at::Tensor> linear_onednn(const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias) {
  if (!x.defined() || !weight.defined() || x.dim() < 1 || weight.dim() != 2 ||
      weight.size(1) != x.size(-1) ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))))
    return Decline{"onednn: shapes at::linear refuses"};
  if (x.scalar_type() != at::kBFloat16) return Decline{"onednn: dtype (bfloat16 only)"};
  return linear_act_onednn(x, weight, bias, Activation::none);
}

/// The mkldnn ops are in this LibTorch (a build without oneDNN has neither).
bool onednn_available() {
  if (!at::hasMKLDNN()) return false;
  auto& d = c10::Dispatcher::singleton();
  return d.findSchema({kPointwise, ""}).has_value() && d.findSchema({kReorder, ""}).has_value();
}

}  // namespace

size_t linear_act_onednn_packed_weights() { return packed_weights().size(); }

void register_linear_act_onednn(Registry& registry) {
  registry.register_impl(kLinearAct, "onednn", &linear_act_onednn, &onednn_available,
                         &cpu_float32_or_native_bfloat16_models);
  registry.register_impl(kLinear, "onednn", &linear_onednn, &onednn_available,
                         &cpu_native_bfloat16_models);
}

}  // namespace libreyolo::kernels

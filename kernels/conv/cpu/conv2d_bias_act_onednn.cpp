// The `onednn` implementation of conv2d_bias_act (CPU, float32, and bfloat16 where the CPU has
// AVX-512 BF16 or AMX: kernels/cpu/packed_weights.h cpu_has_native_bfloat16): oneDNN's convolution
// with the bias, the residual add and the activation as post-ops, on weights reordered once into
// oneDNN's blocked format, through the ops PyTorch's Inductor emits for CPU freezing
// (torch/_inductor/fx_passes/mkldnn_fusion.py): mkldnn::_reorder_convolution_weight and
// mkldnn::_convolution_pointwise (+ its .binary overload for the residual add;
// aten/src/ATen/native/mkldnn/Conv.cpp). They are registered in the `mkldnn` namespace of
// LibTorch's dispatcher (no at:: function), so they are called through it.
//
// Why: ATen's at::conv2d on the CPU reorders the weight into the blocked format on every call,
// and an NCHW activation into and out of nChw8c around every convolution; the bias add, residual
// add and activation are further passes over the map. Here activations stay channels_last (nhwc,
// which oneDNN's kernels read and write directly) from the first convolution on, and each
// convolution is one oneDNN primitive. The results equal ATen's at::conv2d on channels_last
// inputs (the same oneDNN kernels; the post-ops are exact for none, relu and the add, and within
// a float32 ulp of ATen's for SiLU, GELU (erf) and tanh).
//
// Packed weights are kept in a process-wide table keyed by the weight tensor and the geometry
// (kernels/cpu/packed_weights.h): made on a weight's first call, made again when the weight is
// written in place or replaced. Memory: one blocked copy of every convolution weight.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

#include <optional>
#include <string_view>
#include <vector>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

constexpr const char* kPointwise = "mkldnn::_convolution_pointwise";
constexpr const char* kPointwiseInPlace = "mkldnn::_convolution_pointwise_";
constexpr const char* kReorder = "mkldnn::_reorder_convolution_weight";

/// oneDNN's post-op name for `act` (aten/src/ATen/native/mkldnn/Utils.cpp fusion_unary_attr_map):
/// ours but for SiLU, which it calls "swish" (x * sigmoid(x)); "gelu" with algorithm "none" is the
/// erf form.
const char* unary_attr(Activation act) {
  return act == Activation::silu ? "swish" : activation_name(act);
}

/// mkldnn::_convolution_pointwise(X, W, B?, padding, stride, dilation, groups, attr, scalars,
/// algorithm): act(conv(X, W) + B), the output in X's memory format.
at::Tensor convolution_pointwise(const at::Tensor& x, const at::Tensor& w,
                                 const std::optional<at::Tensor>& b, const ConvGeometry& g,
                                 Activation act) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kPointwise, "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t,
                            std::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<std::string_view>)>();
  const std::optional<std::string_view> algorithm =
      act == Activation::gelu ? std::optional<std::string_view>("none") : std::nullopt;
  return op.call(x, w, b, {g.pad_h, g.pad_w}, {g.stride_h, g.stride_w},
                 {g.dilation_h, g.dilation_w}, g.groups, unary_attr(act),
                 c10::List<std::optional<at::Scalar>>(), algorithm);
}

/// act(conv(X, W) + B + residual) with the residual add as a oneDNN binary post-op, then ReLU or
/// nothing (the only unary it fuses after a binary). `into`: the output is written into
/// `residual` (mkldnn::_convolution_pointwise_.binary(other!, X, W, ...): oneDNN's sum post-op
/// accumulates into the destination); else mkldnn::_convolution_pointwise.binary(X, other, W,
/// ...), which first clones the residual into its output.
at::Tensor convolution_add(const at::Tensor& x, at::Tensor& residual, bool into,
                           const at::Tensor& w, const std::optional<at::Tensor>& b,
                           const ConvGeometry& g, Activation act) {
  const std::optional<std::string_view> unary =
      act == Activation::relu ? std::optional<std::string_view>("relu") : std::nullopt;
  // Both schemas take the same arguments after their first two tensors.
  const auto call = [&](const auto& op, auto& first, const at::Tensor& second) -> at::Tensor {
    return op.call(first, second, w, b, {g.pad_h, g.pad_w}, {g.stride_h, g.stride_w},
                   {g.dilation_h, g.dilation_w}, g.groups, "add", std::nullopt, unary,
                   c10::List<std::optional<at::Scalar>>(), std::nullopt);
  };
  if (into) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow(kPointwiseInPlace, "binary")
            .typed<at::Tensor&(
                at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t, std::string_view,
                std::optional<at::Scalar>, std::optional<std::string_view>,
                c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
    return call(op, residual, x);
  }
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kPointwise, "binary")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                            at::IntArrayRef, int64_t, std::string_view, std::optional<at::Scalar>,
                            std::optional<std::string_view>, c10::List<std::optional<at::Scalar>>,
                            std::optional<std::string_view>)>();
  return call(op, x, residual);
}

/// `t` has exactly `references` references and no other tensor shares its memory
/// (kernels/conv/conv2d_bias_act.h: a residual handed over), so the output may go into it.
bool held_only_by(const at::Tensor& t, size_t references) {
  return t.use_count() == references && t.storage().use_count() == 1;
}

/// mkldnn::_reorder_convolution_weight: `w` in the blocked format oneDNN's convolution picks for
/// this geometry and an input of `input_sizes` (an opaque mkldnn tensor).
at::Tensor reorder_weight(const at::Tensor& w, const ConvGeometry& g, at::IntArrayRef input_sizes) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kReorder, "")
          .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                            int64_t, at::OptionalIntArrayRef)>();
  return op.call(w.contiguous(), {g.pad_h, g.pad_w}, {g.stride_h, g.stride_w},
                 {g.dilation_h, g.dilation_w}, g.groups, input_sizes);
}

/// The packed form depends on the geometry too (oneDNN picks the blocked format for it).
struct SameGeometry {
  bool operator()(const ConvGeometry& a, const ConvGeometry& b) const {
    return a.stride_h == b.stride_h && a.stride_w == b.stride_w && a.pad_h == b.pad_h &&
           a.pad_w == b.pad_w && a.dilation_h == b.dilation_h && a.dilation_w == b.dilation_w &&
           a.groups == b.groups;
  }
};

PackedWeights<ConvGeometry, SameGeometry>& packed_weights() {
  // Never destroyed: forwards may run at exit.
  static auto* table = new PackedWeights<ConvGeometry, SameGeometry>();
  return *table;
}

/// The oneDNN call itself (the checks are the caller's).
at::Tensor run(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
               const at::Tensor& residual, const ConvGeometry& g, Activation act) {
  // channels_last from here on: oneDNN reads and writes nhwc directly, and the output follows
  // the input's format, so a backbone converts its first input once.
  const auto x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const auto packed = packed_weights().get(
      weight, g, [&](const at::Tensor& w) { return reorder_weight(w, g, x.sizes()); });
  const std::optional<at::Tensor> b =
      bias.defined() ? std::optional<at::Tensor>(bias.contiguous()) : std::nullopt;
  if (!residual.defined()) return convolution_pointwise(x, packed, b, g, act);
  // The output may go into `r` when it is a channels_last copy made here, or the residual itself
  // handed over by conv2d_bias_act_consuming (its references: the argument and `r`).
  auto r = residual.contiguous(at::MemoryFormat::ChannelsLast);
  const bool writable = !r.is_same(residual) || held_only_by(residual, 2);
  // The binary post-op is fused for ungrouped convolutions (ATen runs grouped ones unfused with
  // the weight made dense again) and takes ReLU only after the add. A residual whose
  // channels_last strides are also NCHW strides (one channel, or 1x1 maps) is refused by
  // oneDNN's memory descriptor ("could not create a memory"): the add runs in ATen.
  const bool unambiguous = r.size(1) > 1 && r.size(2) * r.size(3) > 1;
  if (g.groups == 1 && unambiguous && (act == Activation::none || act == Activation::relu)) {
    // ATen checks the shapes before oneDNN writes ("Add Fusion's inputs should have same
    // shape"): a refusal leaves `r` as it was, and the portable path can still use it.
    return convolution_add(x, r, writable, packed, b, g, act);
  }
  auto y = convolution_pointwise(x, packed, b, g, Activation::none);
  y.add_(r);
  return apply_activation_(act, y);
}

Outcome<at::Tensor> conv2d_bias_act_onednn(const at::Tensor& input, const at::Tensor& weight,
                                           const at::Tensor& bias, const at::Tensor& residual,
                                           const ConvGeometry& g, Activation act) {
  if (!input.device().is_cpu() || !weight.device().is_cpu())
    return Decline{"onednn: not a CPU tensor"};
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && (dtype != at::kBFloat16 || !cpu_has_native_bfloat16()))
    return Decline{"onednn: dtype (float32, or bfloat16 on a CPU with avx512_bf16 or amx_bf16)"};
  if (input.layout() != at::kStrided || weight.layout() != at::kStrided)
    return Decline{"onednn: not a strided tensor"};
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return Decline{"onednn: autograd (the fused op has no backward)"};
  if (bias.defined() && bias.scalar_type() != dtype) return Decline{"onednn: bias dtype differs"};
  if (residual.defined() && residual.scalar_type() != dtype)
    return Decline{"onednn: residual dtype differs"};
  try {
    return run(input, weight, bias, residual, g, act);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the registry's out-of-memory handling (kernels/out_of_memory.h)
  } catch (const c10::Error&) {
    // oneDNN refusing one shape (a request's odd size) must not disable the implementation for
    // the process, as a throw would: ATen runs this call, the next one tries again.
    return Decline{"onednn: oneDNN refused this convolution"};
  }
}

/// The mkldnn ops are in this LibTorch (a build without oneDNN has neither).
bool onednn_available() {
  if (!at::hasMKLDNN()) return false;
  auto& d = c10::Dispatcher::singleton();
  return d.findSchema({kPointwise, ""}).has_value() &&
         d.findSchema({kPointwise, "binary"}).has_value() &&
         d.findSchema({kPointwiseInPlace, "binary"}).has_value() &&
         d.findSchema({kReorder, ""}).has_value();
}

}  // namespace

void register_conv2d_bias_act_onednn(Registry& registry) {
  registry.register_impl(kConv2dBiasAct, "onednn", &conv2d_bias_act_onednn, &onednn_available,
                         &cpu_float32_or_native_bfloat16_models);
}

}  // namespace libreyolo::kernels

// Building blocks shared by every family. Each is a torch::nn::Module whose parameter and
// buffer names are the Hugging Face on-disk names, with a const forward() (a loaded model is
// immutable, so concurrent forward() calls are safe). Parameters are created uninitialised
// (at::empty): load_state_dict() fills them.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/gemm/fp8_gemm.h"
#include "models/layers/bound_kernels.h"

namespace libreyolo::models::layers {

/// transformers ACT2FN subset (one enum with the kernels' one). gelu is the exact (erf) form.
using Activation = kernels::Activation;
/// "relu" | "silu" | "swish" | "gelu" | "tanh" | "" / "identity" / "linear" (= none).
/// Throws std::invalid_argument naming the value otherwise (callers rethrow with the config field).
Activation activation_from_name(const std::string& name);
at::Tensor activate(Activation act, const at::Tensor& x);
/// Same as activate(); call it qualified (layers::apply) inside torch::nn::Module subclasses,
/// where an unqualified `apply` finds torch::nn::Module::apply.
inline at::Tensor apply(Activation act, const at::Tensor& x) { return activate(act, x); }

/// Registers `items` as children "0", "1", ... of a new empty module `name` under `parent`
/// (the on-disk layout of nn.ModuleList / nn.Sequential) and returns them.
template <class T>
std::vector<std::shared_ptr<T>> register_list(torch::nn::Module& parent, const std::string& name,
                                              std::vector<std::shared_ptr<T>> items) {
  auto list = parent.register_module(name, std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < items.size(); ++i) list->register_module(std::to_string(i), items[i]);
  return items;
}

/// nn.Linear: weight (out, in), bias (out) optional. y = x W^T + b.
class LinearImpl : public torch::nn::Module, public UsesKernels {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias = true);
  void bind_kernels(const BoundKernels& k) override {
    kernel = k.linear;
    act_kernel = k.linear_act;
  }
  /// x (..., in) -> (..., out), x's dtype: through the `fp8_gemm` slot when the layer was
  /// quantised at load (models/quantization/fp8.h), else the bound `linear` slot
  /// (kernels/gemm/linear.h; at::linear when unbound).
  at::Tensor forward(const at::Tensor& x) const {
    if (fp8.defined()) return kernels::fp8_linear(fp8_kernel, x, fp8, weight, bias);
    return kernels::linear(kernel, x, weight, bias);
  }
  /// act(forward(x)) through the model's bound `linear_act` slot (kernels/gemm/linear_act.h:
  /// on CUDA float16 / bfloat16 models GELU runs in the GEMM's epilogue; elsewhere the unfused
  /// ops, bit for bit); a quantised layer runs its FP8 GEMM, then the activation.
  /// x (..., in) -> (..., out), x's dtype.
  at::Tensor forward_act(const at::Tensor& x, Activation act) const {
    if (fp8.defined()) return kernels::apply_activation(act, forward(x));
    return kernels::linear_act(act_kernel, x, weight, bias, act);
  }
  at::Tensor weight, bias;
  kernels::LinearHandle kernel;         ///< empty until bound: at::linear runs
  kernels::LinearActHandle act_kernel;  ///< empty until bound: the portable path runs
  /// The FP8 copy of `weight` and the handle it runs through (models/quantization/fp8.h);
  /// undefined unless the model was loaded with `quantization: fp8` on a capable device. The
  /// dense weight stays: it runs whatever the slot declines.
  kernels::Fp8Weight fp8;
  kernels::Fp8GemmHandle fp8_kernel;
};
using Linear = std::shared_ptr<LinearImpl>;

/// nn.LayerNorm over the last dimension: weight, bias (dim). Runs through the model's bound
/// `add_layer_norm` slot (kernels/norm/add_layer_norm.h; the portable ATen ops when unbound).
class LayerNormImpl : public torch::nn::Module, public UsesKernels {
 public:
  LayerNormImpl(int64_t dim, double eps);
  void bind_kernels(const BoundKernels& k) override { kernel = k.add_layer_norm; }
  /// x (..., dim) -> layer_norm(x), x's shape and dtype.
  at::Tensor forward(const at::Tensor& x) const;
  /// The residual step of a pre-norm block and this norm after it, in one slot call:
  /// sum = x + delta * scale (delta, scale optional: without delta sum is x), returns
  /// {sum, layer_norm(sum)}. delta x's shape, scale (dim) (a layer scale); x's dtype.
  kernels::SumAndNorm forward_add(const at::Tensor& x, const at::Tensor& delta,
                                  const at::Tensor& scale = at::Tensor()) const;
  /// forward_add (no layer scale) with the slot's row orders (kernels/norm/add_layer_norm.h,
  /// "Row orders"; one image's indices for x (..., N, dim)): norm_rows (R) int64 gathers the
  /// norm into a window order ((..., R, dim); -1 rows zero), delta_rows (N) int64 reads delta
  /// (..., M, dim) from one. Either may be undefined. Throws c10::Error for indices of another
  /// dtype, shape or device.
  kernels::SumAndNorm forward_rows(const at::Tensor& x, const at::Tensor& delta,
                                   const at::Tensor& norm_rows,
                                   const at::Tensor& delta_rows = at::Tensor()) const;
  at::Tensor weight, bias;
  double eps;
  kernels::AddLayerNormHandle kernel;  ///< empty until bound: the portable ops run
};
using LayerNorm = std::shared_ptr<LayerNormImpl>;

/// The output of a pre-norm transformer block left unsummed, residual + delta * scale, so that
/// the next block's first LayerNorm adds it in the same kernel (LayerNormImpl::forward_add)
/// instead of a multiply, an add and a LayerNorm pass each. delta and scale may be undefined
/// (a plain tensor; scale: no layer scale).
struct PendingResidual {
  at::Tensor residual, delta, scale;
  /// residual + delta * scale, rounded as the unfused ops round it (residual when no delta):
  /// kernels::add_scaled.
  at::Tensor sum() const;
};

/// Runs pre-norm blocks whose forward_pending(PendingResidual) returns {its input summed, its
/// output left pending} on `x`, each block's output summed inside the next block's first
/// LayerNorm. Returns transformers' hidden_states: stages[0] = x, stages[i] = the output of
/// block i - 1 (blocks.size() + 1 tensors, x's shape and dtype).
template <class Block>
std::vector<at::Tensor> run_pending_blocks(const std::vector<std::shared_ptr<Block>>& blocks,
                                           const at::Tensor& x) {
  std::vector<at::Tensor> stages{x};
  PendingResidual pending{x};
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto [input, out] = blocks[i]->forward_pending(pending);
    if (i > 0) stages.push_back(std::move(input));
    pending = std::move(out);
  }
  stages.push_back(pending.sum());
  return stages;
}

/// nn.GroupNorm: weight, bias (channels).
class GroupNormImpl : public torch::nn::Module {
 public:
  GroupNormImpl(int64_t groups, int64_t channels, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t groups;
  double eps;
};
using GroupNorm = std::shared_ptr<GroupNormImpl>;

/// nn.Conv2d: weight (out, in/groups, k, k), bias (out) optional.
struct Conv2dOptions {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, padding = 0, groups = 1, dilation = 1;
  bool bias = false;
};
class Conv2dImpl : public torch::nn::Module {
 public:
  explicit Conv2dImpl(const Conv2dOptions& o);
  at::Tensor forward(const at::Tensor& x) const;
  /// The same convolution for a ViT patch embedding (stride == kernel, no padding, dilation 1,
  /// groups 1): on CUDA as one GEMM over the image's non-overlapping patches, (B * h * w,
  /// C * k * k) x (C * k * k, out) with each patch's values in the weight's memory order
  /// ((C, kh, kw), or (kh, kw, C) for a channels_last weight: no weight copy), returned as the
  /// (B, out, h, w) view of the (B, h, w, out)
  /// result (channels_last strides: the callers' flatten(2).transpose(1, 2) is then free).
  /// cuDNN runs these 3-channel convolutions on a non-tensor-core kernel (precomputed /
  /// implicit_convolve_sgemm; docs/BENCHMARKS.md, "sixth run"). Any
  /// other geometry, input sides not multiples of the kernel, and CPU tensors: forward(x), the
  /// parity path. x (B, C, H, W) in the weight's dtype.
  at::Tensor forward_patches(const at::Tensor& x) const;
  at::Tensor weight, bias;
  Conv2dOptions options;
};
using Conv2d = std::shared_ptr<Conv2dImpl>;

/// The stride / padding / dilation / groups of `conv` (square), for conv2d_bias_act.
kernels::ConvGeometry conv_geometry(const Conv2dImpl& conv);

/// nn.BatchNorm2d in eval mode: parameters weight, bias; buffers running_mean, running_var
/// (the on-disk `num_batches_tracked` is ignored by load_state_dict). at::batch_norm.
class BatchNorm2dImpl : public torch::nn::Module {
 public:
  BatchNorm2dImpl(int64_t channels, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias, running_mean, running_var;
  double eps;
};
using BatchNorm2d = std::shared_ptr<BatchNorm2dImpl>;

/// transformers *FrozenBatchNorm2d (RT-DETR, D-FINE, Deformable DETR backbones): four buffers
/// weight, bias, running_mean, running_var; y = x * scale + shift with
/// scale = weight * rsqrt(running_var + 1e-5), shift = bias - running_mean * scale
/// (eps hard-coded 1e-5, not the config's; not bit-identical to at::batch_norm).
class FrozenBatchNorm2dImpl : public torch::nn::Module {
 public:
  explicit FrozenBatchNorm2dImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias, running_mean, running_var;
};
using FrozenBatchNorm2d = std::shared_ptr<FrozenBatchNorm2dImpl>;

/// Conv2d (no bias) -> BatchNorm2d or FrozenBatchNorm2d -> activation, with configurable child
/// names: RT-DETR hybrid encoder "conv"/"norm", RT-DETR ResNet "convolution"/"normalization".
/// Padding defaults to kernel / 2 (transformers uses (k-1)//2 or k//2: equal for odd k).
struct ConvNormOptions {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, groups = 1;
  int64_t padding = -1;  ///< -1: kernel / 2
  Activation act = Activation::none;
  bool frozen = false;  ///< FrozenBatchNorm2d instead of BatchNorm2d
  double eps = 1e-5;    ///< BatchNorm2d eps (ignored when frozen)
  std::string conv_name = "conv", norm_name = "norm";
};
class ConvNormImpl : public torch::nn::Module, public UsesKernels {
 public:
  explicit ConvNormImpl(const ConvNormOptions& o);
  void bind_kernels(const BoundKernels& k) override { conv_kernel = k.conv2d_bias_act; }
  /// Unfolded: conv -> norm -> act (transformers' order). Folded: one conv2d_bias_act call.
  at::Tensor forward(const at::Tensor& x) const;
  /// act(conv(x) + bias + residual) in one conv2d_bias_act call; requires `folded` (the
  /// residual add of a ResNet layer fused into its last convolution). residual has the output's
  /// shape, handed over: moved in as the last reference, the output may reuse its memory
  /// (kernels::conv2d_bias_act_consuming). `act` replaces this module's activation for the call.
  at::Tensor forward_residual(const at::Tensor& x, at::Tensor residual, Activation block_act) const;
  /// The convolution's stride / padding / dilation / groups.
  kernels::ConvGeometry geometry() const;
  /// act(conv2d(x, pooled.weight, stride 2) + pooled.bias) in one conv2d_bias_act call: the
  /// avgpool_fold layout's form of forward(avg_pool2d(x, 2, 2)) (ResNet-vd shortcut). Requires
  /// `pooled` and even H and W of x (B, C_in, H, W) -> (B, C_out, H/2, W/2).
  at::Tensor forward_pooled(const at::Tensor& x) const;

  Conv2d conv;
  BatchNorm2d norm;               ///< set when !frozen (null once folded)
  FrozenBatchNorm2d frozen_norm;  ///< set when frozen (null once folded)
  Activation act;
  /// Set by the batchnorm_fold layout (models/layouts/): the norm is folded into conv.weight and
  /// conv.bias (the norm child is removed) and forward() calls conv2d_bias_act.
  bool folded = false;
  /// Set by the avgpool_fold layout (child "pooled"; 1x1 stride-1 convolutions only):
  /// AvgPool2d(2, 2) followed by this module as one 2x2 stride-2 convolution with bias, weight
  /// (C_out, C_in, 2, 2) = the norm-folded 1x1 weight / 4 in every tap. Null otherwise; `conv`
  /// and the norm stay as they are for inputs with an odd side (ceil_mode's partial windows).
  Conv2d pooled;
  /// The conv2d_bias_act slot's handle (bound at load; empty = the portable path).
  kernels::Conv2dBiasActHandle conv_kernel;
};
using ConvNorm = std::shared_ptr<ConvNormImpl>;

/// nn.Sequential(nn.Conv2d(in, out, kernel, stride, padding, bias=False), nn.BatchNorm2d(out,
/// eps)) as a ConvNorm without activation, children "0" / "1" (the on-disk names): the
/// encoder_input_proj / decoder_input_proj entries of RT-DETR and D-FINE, so batchnorm_fold
/// folds them like the other conv-norm pairs.
ConvNorm sequential_conv_bn(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                            int64_t padding, double eps);

/// DETR-style MLP ("layers.0" ... "layers.{n-1}" Linear) with `act` between layers, none after
/// the last (RT-DETR/Deformable DETR bbox heads, query_pos_head: ReLU).
class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(int64_t in, int64_t hidden, int64_t out, int64_t num_layers,
          Activation act = Activation::relu);
  at::Tensor forward(const at::Tensor& x) const;
  std::vector<Linear> layers;
  Activation act;
};
using MLP = std::shared_ptr<MLPImpl>;

/// inverse_sigmoid(x, eps=1e-5) = log(clamp(x,0,1).clamp(min=eps) / (1 -
/// clamp(x,0,1)).clamp(min=eps)) (transformers RT-DETR / Deformable DETR).
at::Tensor inverse_sigmoid(const at::Tensor& x, double eps = 1e-5);

}  // namespace libreyolo::models::layers

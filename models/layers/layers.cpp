#include "models/layers/layers.h"

#include <stdexcept>

namespace libreyolo::models::layers {

Activation activation_from_name(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "tanh") return Activation::tanh;
  if (name.empty() || name == "identity" || name == "linear") return Activation::none;
  throw std::invalid_argument("unsupported activation \"" + name +
                              "\" (supported: relu, silu, swish, gelu, tanh)");
}

at::Tensor activate(Activation act, const at::Tensor& x) {
  return kernels::apply_activation(act, x);
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool has_bias) {
  weight = register_parameter("weight", at::empty({out, in}));
  if (has_bias) bias = register_parameter("bias", at::empty({out}));
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
  bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) const {
  return kernels::add_layer_norm(kernel, x, at::Tensor(), at::Tensor(), weight, bias, eps).second;
}

at::Tensor PendingResidual::sum() const { return kernels::add_scaled(residual, delta, scale); }

kernels::SumAndNorm LayerNormImpl::forward_add(const at::Tensor& x, const at::Tensor& delta,
                                               const at::Tensor& scale) const {
  return kernels::add_layer_norm(kernel, x, delta, scale, weight, bias, eps);
}

kernels::SumAndNorm LayerNormImpl::forward_rows(const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& norm_rows,
                                                const at::Tensor& delta_rows) const {
  return kernels::add_layer_norm(kernel, x, delta, at::Tensor(), weight, bias, eps, norm_rows,
                                 delta_rows);
}

GroupNormImpl::GroupNormImpl(int64_t groups_, int64_t channels, double eps_)
    : groups(groups_), eps(eps_) {
  weight = register_parameter("weight", at::ones({channels}));
  bias = register_parameter("bias", at::zeros({channels}));
}

at::Tensor GroupNormImpl::forward(const at::Tensor& x) const {
  return at::group_norm(x, groups, weight, bias, eps);
}

Conv2dImpl::Conv2dImpl(const Conv2dOptions& o) : options(o) {
  weight = register_parameter("weight", at::empty({o.out, o.in / o.groups, o.kernel, o.kernel}));
  if (o.bias) bias = register_parameter("bias", at::empty({o.out}));
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) const {
  return at::conv2d(x, weight, bias, {options.stride, options.stride},
                    {options.padding, options.padding}, {options.dilation, options.dilation},
                    options.groups);
}

at::Tensor Conv2dImpl::forward_patches(const at::Tensor& x) const {
  const int64_t k = options.kernel;
  if (!x.is_cuda() || x.dim() != 4 || options.stride != k || options.padding != 0 ||
      options.dilation != 1 || options.groups != 1 || x.size(2) % k != 0 || x.size(3) % k != 0)
    return forward(x);
  const int64_t B = x.size(0), C = x.size(1), h = x.size(2) / k, w = x.size(3) / k;
  // (B, C, h, k, w, k) -> one row per patch in the weight's memory order, so that its 2-D view
  // is free: (C, kh, kw), or (kh, kw, C) for a channels_last weight (the `channels_last`
  // layout converts every Conv2d).
  const bool cl = !weight.is_contiguous() && weight.is_contiguous(at::MemoryFormat::ChannelsLast);
  static constexpr int64_t kChannelsFirst[] = {0, 2, 4, 1, 3, 5},
                           kChannelsLast[] = {0, 2, 4, 3, 5, 1};
  const auto patches =
      x.reshape({B, C, h, k, w, k})
          .permute(cl ? at::IntArrayRef(kChannelsLast) : at::IntArrayRef(kChannelsFirst))
          .reshape({B * h * w, C * k * k});
  const auto rows = (cl ? weight.permute({0, 2, 3, 1}) : weight).reshape({weight.size(0), -1});
  const auto out = at::linear(patches, rows, bias);
  return out.view({B, h, w, out.size(-1)}).permute({0, 3, 1, 2});
}

BatchNorm2dImpl::BatchNorm2dImpl(int64_t channels, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({channels}));
  bias = register_parameter("bias", at::zeros({channels}));
  running_mean = register_buffer("running_mean", at::zeros({channels}));
  running_var = register_buffer("running_var", at::ones({channels}));
}

at::Tensor BatchNorm2dImpl::forward(const at::Tensor& x) const {
  return at::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/false,
                        /*momentum=*/0.1, eps, /*cudnn_enabled=*/true);
}

FrozenBatchNorm2dImpl::FrozenBatchNorm2dImpl(int64_t channels) {
  weight = register_buffer("weight", at::ones({channels}));
  bias = register_buffer("bias", at::zeros({channels}));
  running_mean = register_buffer("running_mean", at::zeros({channels}));
  running_var = register_buffer("running_var", at::ones({channels}));
}

at::Tensor FrozenBatchNorm2dImpl::forward(const at::Tensor& x) const {
  // transformers RTDetrFrozenBatchNorm2d.forward, same operation order.
  const auto w = weight.reshape({1, -1, 1, 1});
  const auto b = bias.reshape({1, -1, 1, 1});
  const auto rv = running_var.reshape({1, -1, 1, 1});
  const auto rm = running_mean.reshape({1, -1, 1, 1});
  const auto scale = w * (rv + 1e-5).rsqrt();
  const auto shift = b - rm * scale;
  return x * scale + shift;
}

ConvNormImpl::ConvNormImpl(const ConvNormOptions& o) : act(o.act) {
  Conv2dOptions c;
  c.in = o.in;
  c.out = o.out;
  c.kernel = o.kernel;
  c.stride = o.stride;
  c.groups = o.groups;
  c.padding = o.padding >= 0 ? o.padding : o.kernel / 2;
  conv = register_module(o.conv_name, std::make_shared<Conv2dImpl>(c));
  if (o.frozen)
    frozen_norm = register_module(o.norm_name, std::make_shared<FrozenBatchNorm2dImpl>(o.out));
  else
    norm = register_module(o.norm_name, std::make_shared<BatchNorm2dImpl>(o.out, o.eps));
}

kernels::ConvGeometry conv_geometry(const Conv2dImpl& conv) {
  const auto& o = conv.options;
  kernels::ConvGeometry g;
  g.stride_h = g.stride_w = o.stride;
  g.pad_h = g.pad_w = o.padding;
  g.dilation_h = g.dilation_w = o.dilation;
  g.groups = o.groups;
  return g;
}

kernels::ConvGeometry ConvNormImpl::geometry() const { return conv_geometry(*conv); }

at::Tensor ConvNormImpl::forward_residual(const at::Tensor& x, at::Tensor residual,
                                          Activation block_act) const {
  TORCH_CHECK(folded, "ConvNorm::forward_residual needs a folded module");
  return kernels::conv2d_bias_act_consuming(conv_kernel, x, conv->weight, conv->bias,
                                            std::move(residual), geometry(), block_act);
}

at::Tensor ConvNormImpl::forward_pooled(const at::Tensor& x) const {
  TORCH_CHECK(pooled, "ConvNorm::forward_pooled needs the avgpool_fold layout");
  TORCH_CHECK(x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0,
              "ConvNorm::forward_pooled: input must be (B, C, H, W) with even H and W, got ",
              x.sizes());
  kernels::ConvGeometry g;
  g.stride_h = g.stride_w = 2;
  return kernels::conv2d_bias_act(conv_kernel, x, pooled->weight, pooled->bias, at::Tensor(), g,
                                  act);
}

at::Tensor ConvNormImpl::forward(const at::Tensor& x) const {
  if (folded)
    return kernels::conv2d_bias_act(conv_kernel, x, conv->weight, conv->bias, at::Tensor(),
                                    geometry(), act);
  auto y = conv->forward(x);
  y = frozen_norm ? frozen_norm->forward(y) : norm->forward(y);
  return activate(act, y);
}

ConvNorm sequential_conv_bn(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                            int64_t padding, double eps) {
  ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.padding = padding;
  o.eps = eps;
  o.conv_name = "0";
  o.norm_name = "1";
  return std::make_shared<ConvNormImpl>(o);
}

MLPImpl::MLPImpl(int64_t in, int64_t hidden, int64_t out, int64_t num_layers, Activation act_)
    : act(act_) {
  std::vector<Linear> items;
  for (int64_t i = 0; i < num_layers; ++i)
    items.push_back(
        std::make_shared<LinearImpl>(i == 0 ? in : hidden, i == num_layers - 1 ? out : hidden));
  layers = register_list(*this, "layers", items);
}

at::Tensor MLPImpl::forward(const at::Tensor& x) const {
  at::Tensor y = x;
  // The hidden layers' activation through the linear_act slot (oneDNN's post-op on the CPU:
  // RT-DETR's bbox head on 8,400 anchors spent 0.45 ms per unfused ReLU in bfloat16).
  for (size_t i = 0; i < layers.size(); ++i)
    y = i + 1 < layers.size() ? layers[i]->forward_act(y, act) : layers[i]->forward(y);
  return y;
}

at::Tensor inverse_sigmoid(const at::Tensor& x, double eps) {
  const auto c = x.clamp(0, 1);
  const auto x1 = c.clamp_min(eps);
  const auto x2 = (1 - c).clamp_min(eps);
  return at::log(x1 / x2);
}

}  // namespace libreyolo::models::layers

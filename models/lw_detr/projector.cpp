// LwDetrMultiScaleProjector forward, in transformers 5.17's operation order.
#include "models/lw_detr/projector.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace libreyolo::models::lw_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

layers::ConvNormOptions conv_norm_options(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                                          double eps, layers::Activation act) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.padding = kernel / 2;
  o.act = act;
  o.eps = eps;
  return o;
}

ConvNormLayer conv_norm(const DetrConfig& c, int64_t in, int64_t out, int64_t kernel,
                        int64_t stride, layers::Activation act) {
  return make<ConvNormLayerImpl>(in, out, kernel, stride, c.conv_norm_eps, c.conv_layer_norm, act);
}

}  // namespace

ConvNormLayerImpl::ConvNormLayerImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                                     double eps, bool use_layer_norm, layers::Activation act_)
    : layers::ConvNormImpl(conv_norm_options(in, out, kernel, stride, eps, act_)) {
  if (use_layer_norm) {
    unregister_module("norm");
    norm = nullptr;
    layer_norm = register_module("norm", make<layers::LayerNormImpl>(out, eps));
  }
}

at::Tensor ConvNormLayerImpl::forward(const at::Tensor& x) const {
  if (!layer_norm) return layers::ConvNormImpl::forward(x);
  return layers::activate(act, layer_norm_channels_first(*layer_norm, conv->forward(x)));
}

at::Tensor layer_norm_channels_first(const layers::LayerNormImpl& norm, const at::Tensor& x) {
  return norm.forward(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
}

ConvTranspose2x2Impl::ConvTranspose2x2Impl(int64_t in, int64_t out) {
  weight = register_parameter("weight", at::empty({in, out, 2, 2}));
  bias = register_parameter("bias", at::empty({out}));
}

at::Tensor ConvTranspose2x2Impl::forward(const at::Tensor& x) const {
  return at::conv_transpose2d(x, weight, bias, /*stride=*/{2, 2});
}

C2FLayerImpl::C2FLayerImpl(const DetrConfig& c, int64_t in)
    : hidden(static_cast<int64_t>(c.d_model * c.hidden_expansion)) {
  conv1 = register_module("conv1", conv_norm(c, in, 2 * hidden, 1, 1, c.projector_act));
  conv2 = register_module(
      "conv2", conv_norm(c, (2 + c.c2f_blocks) * hidden, c.d_model, 1, 1, c.projector_act));
  auto list = register_module("bottlenecks", make<torch::nn::Module>());
  for (int64_t i = 0; i < c.c2f_blocks; ++i) {
    auto block = list->register_module(std::to_string(i), make<torch::nn::Module>());
    bottlenecks.emplace_back(
        block->register_module("conv1", conv_norm(c, hidden, hidden, 3, 1, c.projector_act)),
        block->register_module("conv2", conv_norm(c, hidden, hidden, 3, 1, c.projector_act)));
  }
}

at::Tensor C2FLayerImpl::forward(const at::Tensor& x) const {
  const auto h = conv1->forward(x);
  auto parts = h.split(hidden, 1);
  std::vector<at::Tensor> all(parts.begin(), parts.end());
  auto y = all.back().contiguous(all.back().suggest_memory_format());
  for (const auto& [a, b] : bottlenecks) {
    y = b->forward(a->forward(y));
    all.push_back(y);
  }
  return conv2->forward(at::cat(all, 1));
}

bool C2FLayerImpl::channels_last() const {
  if (bottlenecks.empty()) return false;
  const auto& w = bottlenecks.front().first->conv->weight;
  return !w.is_contiguous() && w.is_contiguous(at::MemoryFormat::ChannelsLast);
}

ScaleProjectorImpl::ScaleProjectorImpl(const DetrConfig& c, const std::vector<int64_t>& in_channels,
                                       double scale) {
  auto list = register_module("sampling_layers", make<torch::nn::Module>());
  int64_t last = 0;
  for (size_t i = 0; i < in_channels.size(); ++i) {
    const int64_t ch = in_channels[i];
    auto layer = list->register_module(std::to_string(i), make<torch::nn::Module>());
    auto steps = layer->register_module("layers", make<torch::nn::Module>());
    std::vector<std::shared_ptr<torch::nn::Module>> s;
    int64_t out = ch;
    if (scale == 2.0) {
      if (ch > 512) {
        s.push_back(
            steps->register_module("0", conv_norm(c, ch, ch / 2, 1, 1, layers::Activation::relu)));
        s.push_back(steps->register_module("1", make<ConvTranspose2x2Impl>(ch / 2, ch / 4)));
        out = ch / 4;
      } else {
        s.push_back(steps->register_module("0", make<ConvTranspose2x2Impl>(ch, ch / 2)));
        out = ch / 2;
      }
    } else if (scale == 0.5) {
      s.push_back(
          steps->register_module("0", conv_norm(c, ch, ch, 3, 2, layers::Activation::relu)));
    }
    sampling.push_back(std::move(s));
    last = out;
  }
  // Upstream sizes the C2F input as the last map's resampled channels times the number of maps
  // (the concatenation's width when the maps are equally wide, as LW-DETR's are).
  const auto n = static_cast<int64_t>(in_channels.size());
  projector_layer = register_module("projector_layer", make<C2FLayerImpl>(c, last * n));
  layer_norm = register_module("layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-6));
}

at::Tensor ScaleProjectorImpl::forward(const std::vector<at::Tensor>& maps) const {
  if (maps.size() != sampling.size())
    throw std::invalid_argument(c10::str("lw_detr projector: expected ", sampling.size(),
                                         " feature maps, got ", maps.size()));
  std::vector<at::Tensor> sampled;
  for (size_t i = 0; i < maps.size(); ++i) {
    at::Tensor h = maps[i];
    for (const auto& step : sampling[i]) {
      if (const auto* t = dynamic_cast<const ConvTranspose2x2Impl*>(step.get()))
        h = t->forward(h);
      else
        h = static_cast<const ConvNormLayerImpl*>(step.get())->forward(h);
    }
    sampled.push_back(h);
  }
  return layer_norm_channels_first(*layer_norm, projector_layer->forward(at::cat(sampled, 1)));
}

MultiScaleProjectorImpl::MultiScaleProjectorImpl(const DetrConfig& c,
                                                 const std::vector<int64_t>& in_channels) {
  std::vector<std::shared_ptr<ScaleProjectorImpl>> s;
  for (const double f : c.scale_factors) s.push_back(make<ScaleProjectorImpl>(c, in_channels, f));
  scale_layers = layers::register_list(*this, "scale_layers", s);
}

std::vector<at::Tensor> MultiScaleProjectorImpl::forward(
    const std::vector<at::Tensor>& maps) const {
  std::vector<at::Tensor> out;
  for (const auto& s : scale_layers) out.push_back(s->forward(maps));
  return out;
}

bool MultiScaleProjectorImpl::channels_last() const {
  return !scale_layers.empty() && scale_layers.front()->projector_layer->channels_last();
}

}  // namespace libreyolo::models::lw_detr

// ResNet-vd backbone of RT-DETR (transformers modeling_rt_detr_resnet.py; original:
// lyuwenyu/RT-DETR rtdetr_pytorch/src/nn/backbone/presnet.py).
#include "models/rtdetr/modules.h"

namespace libreyolo::models::rtdetr {
namespace {

// RTDetrResNetConvLayer: Conv2d(k, stride, padding k//2, no bias) -> BN -> act. The backbone's
// BNs are FrozenBatchNorm2d when freeze_backbone_batch_norms (the default).
layers::ConvNorm conv_layer(const Config& c, int64_t in, int64_t out, int64_t kernel,
                            int64_t stride, Activation act) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.padding = kernel / 2;
  o.act = act;
  o.frozen = c.freeze_backbone_batch_norms;
  o.eps = 1e-5;  // nn.BatchNorm2d default
  o.conv_name = "convolution";
  o.norm_name = "normalization";
  return std::make_shared<layers::ConvNormImpl>(o);
}

}  // namespace

ResNetLayerImpl::ResNetLayerImpl(const Config& c, int64_t in, int64_t out, int64_t stride,
                                 bool first_of_stage)
    : act_(c.hidden_act) {
  // Inner ConvLayers use their default activation "relu", not config.hidden_act (upstream).
  std::vector<layers::ConvNorm> convs;
  bool projection = false;
  if (c.bottleneck) {
    projection = in != out || stride != 1;
    const int64_t r = out / 4;
    convs.push_back(
        conv_layer(c, in, r, 1, c.downsample_in_bottleneck ? stride : 1, Activation::relu));
    convs.push_back(
        conv_layer(c, r, r, 3, c.downsample_in_bottleneck ? 1 : stride, Activation::relu));
    convs.push_back(conv_layer(c, r, out, 1, 1, Activation::none));
    avg_pool_ = stride == 2;
  } else {
    projection = first_of_stage;
    convs.push_back(conv_layer(c, in, out, 3, stride, Activation::relu));
    convs.push_back(conv_layer(c, out, out, 3, 1, Activation::none));
    avg_pool_ = projection && in != out;
  }
  layer_ = layers::register_list(*this, "layer", convs);
  if (projection) {
    // RTDetrResNetShortCut: 1x1 conv (stride 1 after the AvgPool, else the layer's stride) + BN.
    auto sc = conv_layer(c, in, out, 1, avg_pool_ ? 1 : stride, Activation::none);
    if (avg_pool_) {
      auto seq = register_module("shortcut", std::make_shared<torch::nn::Module>());
      seq->register_module("1", sc);  // "0" is the AvgPool2d
    } else {
      register_module("shortcut", sc);
    }
    shortcut_ = sc;
  }
}

at::Tensor ResNetLayerImpl::forward(at::Tensor x) const {
  at::Tensor residual = x;
  if (avg_pool_ && shortcut_->pooled && x.size(2) % 2 == 0 && x.size(3) % 2 == 0) {
    // avgpool_fold layout: with even sides every 2x2 window is whole, so the pool and the 1x1
    // projection are one 2x2 stride-2 convolution (weights / 4). Odd sides keep the pool:
    // ceil_mode's last window is partial and divides by fewer elements.
    residual = shortcut_->forward_pooled(x);
  } else {
    // transformers RTDetrResNetBottleNeckLayer / BasicLayer: nn.AvgPool2d(2, 2, 0,
    // ceil_mode=True) (count_include_pad's default True; with padding 0 the divisor of a
    // partial window is its in-bounds count).
    if (avg_pool_)
      residual = at::avg_pool2d(residual, {2, 2}, {2, 2}, {0, 0}, /*ceil_mode=*/true,
                                /*count_include_pad=*/true);
    if (shortcut_) residual = shortcut_->forward(residual);
  }
  at::Tensor h = x;
  if (layer_.back()->folded) {
    // batchnorm_fold layout: the residual add and the layer's activation run inside the last
    // convolution's conv2d_bias_act call (same order: conv + bias, + residual, act). With an
    // identity shortcut `residual` is x: both references are dropped first, so a caller that
    // moved x in hands its memory over.
    for (size_t i = 0; i + 1 < layer_.size(); ++i) h = layer_[i]->forward(h);
    x.reset();
    return layer_.back()->forward_residual(h, std::move(residual), act_);
  }
  for (const auto& conv : layer_) h = conv->forward(h);
  return layers::activate(act_, h + residual);
}

ResNetBackboneImpl::ResNetBackboneImpl(const Config& c) : out_indices_(c.out_indices) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  auto embedder = model->register_module("embedder", std::make_shared<torch::nn::Module>());
  const int64_t e = c.embedding_size;
  stem_ = layers::register_list(*embedder, "embedder",
                                std::vector<layers::ConvNorm>{
                                    conv_layer(c, c.num_channels, e / 2, 3, 2, c.hidden_act),
                                    conv_layer(c, e / 2, e / 2, 3, 1, c.hidden_act),
                                    conv_layer(c, e / 2, e, 3, 1, c.hidden_act),
                                });
  pooler_ = embedder->register_module(
      "pooler", std::make_shared<layers::MaxPool2dImpl>(layers::square_pool(3, 2, 1)));
  auto encoder = model->register_module("encoder", std::make_shared<torch::nn::Module>());
  auto stages = encoder->register_module("stages", std::make_shared<torch::nn::Module>());
  std::vector<int64_t> channels{e};
  for (size_t s = 0; s < c.hidden_sizes.size(); ++s) {
    const int64_t in = s == 0 ? e : c.hidden_sizes[s - 1];
    const int64_t out = c.hidden_sizes[s];
    const int64_t stride = s == 0 ? (c.downsample_in_first_stage ? 2 : 1) : 2;
    std::vector<std::shared_ptr<ResNetLayerImpl>> ls;
    for (int64_t l = 0; l < c.depths[s]; ++l)
      ls.push_back(std::make_shared<ResNetLayerImpl>(c, l == 0 ? in : out, out, l == 0 ? stride : 1,
                                                     l == 0));
    auto stage = stages->register_module(std::to_string(s), std::make_shared<torch::nn::Module>());
    stages_.push_back(layers::register_list(*stage, "layers", ls));
    channels.push_back(out);
  }
  for (auto i : out_indices_) out_channels.push_back(channels[i]);
}

std::vector<at::Tensor> ResNetBackboneImpl::forward(const at::Tensor& pixel_values) const {
  std::vector<at::Tensor> hidden;  // hidden[0] = stem output, hidden[s] = after stage s
  at::Tensor h = pixel_values;
  for (const auto& conv : stem_) h = conv->forward(h);
  h = pooler_->forward(h);
  hidden.push_back(h);
  for (const auto& stage : stages_) {
    for (const auto& layer : stage) h = layer->forward(std::move(h));
    hidden.push_back(h);
  }
  std::vector<at::Tensor> out;
  for (auto i : out_indices_) out.push_back(hidden[i]);
  return out;
}

}  // namespace libreyolo::models::rtdetr

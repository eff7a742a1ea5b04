// RfDetrForInstanceSegmentation's mask head, in transformers 5.17's operation order.
#include "models/rf_detr/segmentation_head.h"

namespace libreyolo::models::rf_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

SegmentationBlockImpl::SegmentationBlockImpl(int64_t d, layers::Activation act_) : act(act_) {
  layers::Conv2dOptions o;
  o.in = o.out = o.groups = d;
  o.kernel = 3;
  o.padding = 1;
  o.bias = true;
  depthwise_conv = register_module("depthwise_conv", make<layers::Conv2dImpl>(o));
  layernorm = register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-6));
  pointwise_conv = register_module("pointwise_conv", make<layers::LinearImpl>(d, d));
}

at::Tensor SegmentationBlockImpl::forward(const at::Tensor& x) const {
  auto h = depthwise_conv->forward(x).permute({0, 2, 3, 1});
  h = layers::activate(act, pointwise_conv->forward(layernorm->forward(h)));
  return h.permute({0, 3, 1, 2}) + x;
}

SegmentationHead::SegmentationHead(torch::nn::Module& root, const Config& c)
    : act(c.segmentation_act), downsample_ratio(c.mask_downsample_ratio) {
  const int64_t d = c.detr.d_model;
  std::vector<std::shared_ptr<SegmentationBlockImpl>> bs;
  for (int64_t i = 0; i < c.detr.decoder_layers; ++i)
    bs.push_back(make<SegmentationBlockImpl>(d, c.segmentation_act));
  blocks = layers::register_list(root, "blocks", bs);
  layers::Conv2dOptions o;
  o.in = o.out = d;
  o.bias = true;
  spatial_features_proj =
      root.register_module("spatial_features_proj", make<layers::Conv2dImpl>(o));
  auto block = root.register_module("query_features_block", make<torch::nn::Module>());
  query_norm = block->register_module("norm", make<layers::LayerNormImpl>(d, 1e-5));
  auto mlp = block->register_module("mlp", make<torch::nn::Module>());
  query_fc1 = mlp->register_module("fc1", make<layers::LinearImpl>(d, c.intermediate_size));
  query_fc2 = mlp->register_module("fc2", make<layers::LinearImpl>(c.intermediate_size, d));
  query_features_proj = root.register_module("query_features_proj", make<layers::LinearImpl>(d, d));
  segmentation_bias = root.register_parameter("segmentation_bias", at::empty({1}));
}

at::Tensor SegmentationHead::forward(const at::Tensor& features, const at::Tensor& queries,
                                     int64_t height, int64_t width) const {
  const int64_t h = height / downsample_ratio, w = width / downsample_ratio;
  at::Tensor s = at::upsample_bilinear2d(features, {h, w}, /*align_corners=*/false);
  for (const auto& b : blocks) s = b->forward(s);
  s = spatial_features_proj->forward(s);
  auto q =
      query_fc2->forward(layers::activate(act, query_fc1->forward(query_norm->forward(queries))));
  q = query_features_proj->forward(q + queries);
  const int64_t B = queries.size(0), Q = queries.size(1);
  return at::matmul(q, s.flatten(2)).view({B, Q, h, w}) + segmentation_bias;
}

}  // namespace libreyolo::models::rf_detr

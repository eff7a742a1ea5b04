// DETR's transformer and heads (models/detr/detr.h): transformers 5.17 modeling_detr.py and
// modeling_table_transformer.py, inference only. Every step keeps transformers' operation order
// so that float32 results match.

#include "models/detr/detr.h"

#include "models/core/pixel_mask.h"
#include "models/module_model.h"

namespace libreyolo::models::detr {

DecoderLayerImpl::DecoderLayerImpl(const Config& c) : pre_norm(c.pre_norm) {
  self_attn = register_module("self_attn", attention(c.d_model, c.decoder_heads));
  self_attn_layer_norm =
      register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  encoder_attn = register_module("encoder_attn", attention(c.d_model, c.decoder_heads));
  encoder_attn_layer_norm =
      register_module("encoder_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  ffn = FeedForward(*this, c, c.decoder_ffn);
  final_layer_norm =
      register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& query_pos,
                                     const at::Tensor& memory, const at::Tensor& memory_keys,
                                     const at::Tensor& bias) const {
  if (pre_norm) {  // TableTransformerDecoderLayer: the values are the normalised input too
    auto n = self_attn_layer_norm->forward(x);
    const auto qk = n + query_pos;
    auto h = x + self_attn->forward(qk, qk, n);
    n = encoder_attn_layer_norm->forward(h);
    h = h + encoder_attn->forward(n + query_pos, memory_keys, memory, bias);
    return h + ffn.forward(final_layer_norm->forward(h));
  }
  const auto qk = x + query_pos;  // DetrDecoderLayer
  auto h = x + self_attn->forward(qk, qk, x);
  h = self_attn_layer_norm->forward(h);
  h = h + encoder_attn->forward(h + query_pos, memory_keys, memory, bias);
  h = encoder_attn_layer_norm->forward(h);
  h = h + ffn.forward(h);
  return final_layer_norm->forward(h);
}

DetrImpl::DetrImpl(const Config& c, std::string type, bool with_encoder_layernorm)
    : config(c), model_type(std::move(type)) {
  const int64_t d = c.d_model;
  auto model = register_module("model", make<torch::nn::Module>());
  // Registered before the stem: a checkpoint of another width is named by its object queries
  // first (shape mismatches are listed in registration order).
  auto qpe = model->register_module("query_position_embeddings", make<torch::nn::Module>());
  query_position_embeddings = qpe->register_parameter("weight", at::empty({c.num_queries, d}));
  stem = ConvStem(*model, c);
  auto encoder = model->register_module("encoder", make<torch::nn::Module>());
  std::vector<std::shared_ptr<EncoderLayerImpl>> el;
  for (int64_t i = 0; i < c.encoder_layers; ++i) el.push_back(make<EncoderLayerImpl>(c));
  encoder_layers = layers::register_list(*encoder, "layers", el);
  if (with_encoder_layernorm)
    encoder_layernorm = encoder->register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-5));
  auto decoder = model->register_module("decoder", make<torch::nn::Module>());
  std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
  for (int64_t i = 0; i < c.decoder_layers; ++i) dl.push_back(make<DecoderLayerImpl>(c));
  decoder_layers = layers::register_list(*decoder, "layers", dl);
  decoder_layernorm = decoder->register_module("layernorm", make<layers::LayerNormImpl>(d, 1e-5));
  class_labels_classifier =
      register_module("class_labels_classifier", make<layers::LinearImpl>(d, c.num_labels + 1));
  bbox_predictor = register_module("bbox_predictor",
                                   make<layers::MLPImpl>(d, d, 4, 3, layers::Activation::relu));
}

DetrForwardResult DetrImpl::forward(const ConvStem::Output& s, at::ScalarType dtype) const {
  DetrForwardResult r;
  r.stem = s;
  const int64_t B = s.source.size(0);
  const auto pos = stem.position_embedding(s.mask, dtype);
  at::Tensor memory = s.source;
  for (const auto& layer : encoder_layers) memory = layer->forward(memory, pos, s.bias);
  if (encoder_layernorm) memory = encoder_layernorm->forward(memory);
  r.memory = memory;
  const auto query_pos = query_position_embeddings.unsqueeze(0).repeat({B, 1, 1});
  at::Tensor x = at::zeros_like(query_pos);
  const auto memory_keys = memory + pos;
  for (const auto& layer : decoder_layers)
    x = layer->forward(x, query_pos, memory, memory_keys, s.bias);
  r.hidden = decoder_layernorm->forward(x);
  r.logits = class_labels_classifier->forward(r.hidden);
  r.pred_boxes = bbox_predictor->forward(r.hidden).sigmoid();
  return r;
}

namespace {

class DetectionModel : public ModuleModel<DetrImpl> {
 public:
  DetectionModel(std::shared_ptr<DetrImpl> net, const LoadOptions& options)
      : ModuleModel(net->model_type, Task::object_detection, net, options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    const at::Tensor mask = core::checked_pixel_mask(model_type_, x, pixel_mask, options_.device);
    const auto r = net_->forward(net_->stem.forward(x, mask), x.scalar_type());
    ModelOutput out;
    out.logits = r.logits.to(at::kFloat);
    out.pred_boxes = r.pred_boxes.to(at::kFloat);
    return out;
  }
};

}  // namespace

std::unique_ptr<Model> make_detection_model(std::shared_ptr<DetrImpl> net,
                                            const LoadOptions& options) {
  return std::make_unique<DetectionModel>(std::move(net), options);
}

}  // namespace libreyolo::models::detr

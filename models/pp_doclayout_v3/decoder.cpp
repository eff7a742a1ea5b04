// PP-DocLayoutV3's decoder (modeling_pp_doclayout_v3.py PPDocLayoutV3Decoder.forward and the
// model-level heads it is handed: order head, global pointer, decoder norm, mask query head),
// over RT-DETR's decoder layers (rtdetr::DecoderLayerImpl, ms_deform_attn slot).

#include <cmath>

#include "models/pp_doclayout_v3/modules.h"

#include "kernels/box/refine_boxes.h"

namespace libreyolo::models::pp_doclayout_v3 {

DecoderImpl::DecoderImpl(const Config& c, torch::nn::Module& model)
    : head_size_(c.global_pointer_head_size) {
  const int64_t d = c.d_model;
  std::vector<std::shared_ptr<rtdetr::DecoderLayerImpl>> ls;
  for (int64_t i = 0; i < c.decoder_layers; ++i)
    ls.push_back(std::make_shared<rtdetr::DecoderLayerImpl>(c));
  layers_ = layers::register_list(*this, "layers", ls);
  query_pos_head_ =
      register_module("query_pos_head", std::make_shared<layers::MLPImpl>(4, 2 * d, d, 2));
  class_embed_ =
      register_module("class_embed", std::make_shared<layers::LinearImpl>(d, c.num_labels));
  bbox_embed_ = register_module("bbox_embed", std::make_shared<layers::MLPImpl>(d, d, 4, 3));

  std::vector<layers::Linear> order;
  for (int64_t i = 0; i < c.decoder_layers; ++i)
    order.push_back(std::make_shared<layers::LinearImpl>(d, d));
  order_head_ = layers::register_list(model, "decoder_order_head", order);
  auto pointer =
      model.register_module("decoder_global_pointer", std::make_shared<torch::nn::Module>());
  global_pointer_ = pointer->register_module(
      "dense", std::make_shared<layers::LinearImpl>(d, 2 * c.global_pointer_head_size));
  norm_ = model.register_module("decoder_norm",
                                std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  mask_query_head_ = model.register_module(
      "mask_query_head", std::make_shared<layers::MLPImpl>(d, d, c.num_prototypes, 3));
}

at::Tensor DecoderImpl::masks(const at::Tensor& queries, const at::Tensor& mask_feat) const {
  const at::Tensor embed = mask_query_head_->forward(norm_->forward(queries));
  const int64_t B = embed.size(0), Q = embed.size(1);
  return at::bmm(embed, mask_feat.flatten(2)).reshape({B, Q, mask_feat.size(2), mask_feat.size(3)});
}

DecoderOutput DecoderImpl::forward(const at::Tensor& target, const at::Tensor& reference_logits,
                                   const at::Tensor& memory, const kernels::SpatialShapes& shapes,
                                   const at::Tensor& mask_feat) const {
  at::Tensor h = target;
  at::Tensor ref = at::sigmoid(reference_logits);
  for (const auto& layer : layers_) {
    const at::Tensor pos = query_pos_head_->forward(ref);
    h = layer->forward(h, pos, memory, ref.unsqueeze(2), shapes);
    ref = kernels::refine_boxes(refine_boxes_kernel_, bbox_embed_->forward(h), ref);
  }
  DecoderOutput out;
  out.pred_boxes = ref;
  out.masks = masks(h, mask_feat);
  const at::Tensor query = norm_->forward(h);
  out.logits = class_embed_->forward(query);
  out.order_logits = global_pointer_logits(
      global_pointer_->forward(order_head_.back()->forward(query)), head_size_);
  return out;
}

at::Tensor global_pointer_logits(const at::Tensor& projection, int64_t head_size) {
  // dense -> (B, Q, 2, head) -> queries @ keys^T / sqrt(head), the lower triangle masked.
  const int64_t B = projection.size(0), Q = projection.size(1);
  const at::Tensor qk = projection.reshape({B, Q, 2, head_size});
  const at::Tensor q = qk.select(2, 0), k = qk.select(2, 1);
  const at::Tensor logits =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_size));
  const at::Tensor lower =
      at::ones({Q, Q}, at::TensorOptions().device(logits.device()).dtype(at::kBool)).tril();
  return logits.masked_fill(lower.unsqueeze(0), -1e4);
}

}  // namespace libreyolo::models::pp_doclayout_v3

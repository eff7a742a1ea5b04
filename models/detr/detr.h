// DETR's transformer and heads (transformers 5.17 models/detr/modeling_detr.py
// DetrForObjectDetection), shared by the families that keep its architecture:
// Table Transformer (models/table_transformer/, modeling_table_transformer.py: pre-norm layers
// and a final encoder LayerNorm) and DetrForSegmentation (models/detr/detr_segmentation.h).
// The stem, config and encoder layer are models/detr/detr_common.h.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/detr/detr_common.h"
#include "models/model.h"

namespace libreyolo::models::detr {

/// DetrDecoderLayer (post-norm) / TableTransformerDecoderLayer (config.pre_norm): self-attention
/// (object query embeddings added to queries and keys), cross-attention (query embeddings on the
/// queries, spatial embeddings on the keys), MLP.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c);
  /// x (B, Q, D), query_pos (B, Q, D), memory (B, S, D), memory_keys = memory + spatial pos,
  /// bias (B, 1, 1, S).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& memory,
                     const at::Tensor& memory_keys, const at::Tensor& bias) const;
  layers::Attention self_attn, encoder_attn;
  layers::LayerNorm self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm;
  FeedForward ffn;
  bool pre_norm = false;
};

/// What one forward pass computes (the segmentation head reads the intermediate tensors).
struct DetrForwardResult {
  at::Tensor logits;      ///< (B, Q, num_labels + 1), the model's dtype
  at::Tensor pred_boxes;  ///< (B, Q, 4) sigmoid (cx, cy, w, h)
  at::Tensor hidden;      ///< the decoder's output after its layernorm (B, Q, D)
  ConvStem::Output stem;  ///< the projected map and the mask
  at::Tensor memory;      ///< the encoder's output (B, S, D)
};

/// The module tree with the on-disk names ("model.*", "class_labels_classifier.*",
/// "bbox_predictor.*"): DetrForObjectDetection, or TableTransformerForObjectDetection with
/// config.pre_norm and `encoder_layernorm` (model.encoder.layernorm).
class DetrImpl : public torch::nn::Module {
 public:
  DetrImpl(const Config& c, std::string model_type, bool encoder_layernorm = false);

  /// pixel_values (B, C, H, W), pixel_mask (B, H, W) (nonzero = valid); `stem` computed by
  /// stem.forward (DetrForSegmentation keeps the backbone's maps).
  DetrForwardResult forward(const ConvStem::Output& stem, at::ScalarType dtype) const;

  Config config;
  std::string model_type;  ///< in messages
  ConvStem stem;
  at::Tensor query_position_embeddings;
  std::vector<std::shared_ptr<EncoderLayerImpl>> encoder_layers;
  layers::LayerNorm encoder_layernorm;  ///< Table Transformer only
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  layers::LayerNorm decoder_layernorm;
  layers::Linear class_labels_classifier;
  layers::MLP bbox_predictor;
};

/// DetrImpl as a Model (object detection): logits and pred_boxes, float32; model_type()
/// is net->model_type. forward throws std::invalid_argument for bad pixel_values / pixel_mask.
std::unique_ptr<Model> make_detection_model(std::shared_ptr<DetrImpl> net,
                                            const LoadOptions& options);

}  // namespace libreyolo::models::detr

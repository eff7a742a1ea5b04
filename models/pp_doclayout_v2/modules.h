// PP-DocLayoutV2 module tree (internal to models/pp_doclayout_v2). Names are the on-disk keys of
// transformers 5.17 PPDocLayoutV2ForObjectDetection checkpoints; forward passes follow
// modeling_pp_doclayout_v2.py / modular_pp_doclayout_v2.py. The detector is RTDetrModel
// (rtdetr::DetectorImpl: hybrid encoder, query selection, decoder with per-layer heads) around
// D-FINE's HGNetV2 backbone (dfine::BackboneImpl), configured as PP-DocLayoutV3's
// (pp_doclayout_v3::HGNetV2DetectorConfig); what is new is the reading-order transformer
// ("reading_order.*", reading_order.cpp): LayoutLMv3-style post-norm layers over the kept
// detections' boxes and labels, a box-relation attention bias and V3's global pointer.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/core/config.h"
#include "models/layers/attention.h"
#include "models/layers/bert_model.h"
#include "models/layers/layers.h"
#include "models/model.h"
#include "models/pp_doclayout_v3/modules.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models::pp_doclayout_v2 {

/// config.json `reading_order_config` (PPDocLayoutV2ReadingOrderConfig; defaults are its).
struct ReadingOrderConfig {
  int64_t hidden_size = 512, num_attention_heads = 8, intermediate_size = 2048,
          num_hidden_layers = 6;
  layers::Activation hidden_act = layers::Activation::gelu;
  double layer_norm_eps = 1e-5;
  bool has_spatial_attention_bias = true;  ///< the box-relation bias (rel_bias_module)
  int64_t max_position_embeddings = 514, max_2d_position_embeddings = 1024, type_vocab_size = 1,
          vocab_size = 4;
  int64_t start_token_id = 0, pad_token_id = 1, end_token_id = 2, pred_token_id = 3;
  int64_t coordinate_size = 171, shape_size = 170;  ///< x/y and h/w embedding widths
  int64_t num_classes = 20;                         ///< label_embeddings rows
  int64_t relation_bias_embed_dim = 16;
  double relation_bias_theta = 10000, relation_bias_scale = 100;
  int64_t global_pointer_head_size = 64;

  /// Parses the `reading_order_config` view `r`; throws core::ConfigError naming the field
  /// (has_relative_attention_bias true is refused: transformers 5.17 computes that bias from
  /// position_ids it never passes and fails).
  static ReadingOrderConfig parse(const core::ConfigView& r);
};

/// config.json of model_type pp_doclayout_v2: HGNetV2DetectorConfig (backbone outputs = the
/// encoder levels) plus the per-class score thresholds that select the detections the reading
/// order sees and the reading-order category of each class.
struct Config : pp_doclayout_v3::HGNetV2DetectorConfig {
  std::vector<double> class_thresholds;  ///< one per label: keep max sigmoid(logit) >= this
  std::vector<int64_t> class_order;      ///< one per label: its reading_order label index
  ReadingOrderConfig reading_order;

  /// Parses and validates; throws core::ConfigError naming the file and field.
  static Config parse(const core::ConfigView& cfg);
};

/// PPDocLayoutV2ReadingOrder: "embeddings.{word,token_type,position,x_position,y_position,
/// h_position,w_position}_embeddings", "embeddings.{norm,spatial_proj}", "label_embeddings",
/// "label_features_projection", "encoder.layer.{i}", "encoder.rel_bias_module.pos_proj",
/// "relative_head.dense". The file's "encoder.rel_pos_{x,y}_bias" are never used upstream. The
/// layers (PPDocLayoutV2ReadingOrderLayer = LayoutLMv3Layer with "norm" for "LayerNorm") are
/// BERT's: layers::BertLayerImpl.
class ReadingOrderImpl : public torch::nn::Module {
 public:
  explicit ReadingOrderImpl(const ReadingOrderConfig& c);
  /// boxes (B, N, 4) x0, y0, x1, y1 on the [0, 1000] scale (kept detections first, zeros
  /// after), labels (B, N) int64 reading-order categories, mask (B, N) bool (only its row sums
  /// are read: the kept count) -> order logits (B, N, N), the lower triangle -1e4. Boxes'
  /// dtype is the computation's.
  at::Tensor forward(const at::Tensor& boxes, const at::Tensor& labels,
                     const at::Tensor& mask) const;

 private:
  /// PPDocLayoutV2PositionRelationEmbedding of the padded boxes (B, L, 4) -> (B, heads, L, L).
  at::Tensor relation_bias(const at::Tensor& boxes) const;

  ReadingOrderConfig config_;
  at::Tensor word_, token_type_, position_, x_, y_, h_, w_, label_;
  layers::LayerNorm norm_;
  layers::Linear spatial_proj_, label_projection_, pointer_;
  layers::Conv2d pos_proj_;
  std::vector<std::shared_ptr<layers::BertLayerImpl>> layers_;
};

/// Root module: RT-DETR's "model.*" with the HGNetV2 backbone, and "reading_order.*".
class DetectorImpl : public rtdetr::DetectorImpl {
 public:
  explicit DetectorImpl(const Config& c);
  /// pixel_values (B, 3, H, W) in the parameters' dtype/device -> PPDocLayoutV2ForObjectDetection's
  /// logits (B, Q, C), pred_boxes (B, Q, 4) and order_logits (B, Q, Q) in that dtype, the
  /// queries sorted kept-first (argsort(mask, descending), ATen's unstable sort, as upstream).
  ModelOutput forward(const at::Tensor& pixel_values) const;

 private:
  std::shared_ptr<ReadingOrderImpl> reading_order_;
  /// class_thresholds as float32 bits in an int32 buffer (integer buffers keep their dtype
  /// when the model loads in half precision; upstream compares in float32), class_order int64.
  at::Tensor threshold_bits_, class_order_;
};

}  // namespace libreyolo::models::pp_doclayout_v2

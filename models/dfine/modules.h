// D-FINE module tree (internal to models/dfine). Names are the on-disk keys of transformers 5.17
// DFineForObjectDetection checkpoints (hf-models.md 4.3); forward passes follow
// modeling_d_fine.py. Shared with RT-DETR (models/rtdetr/modules.h): the config fields, the AIFI
// encoder layer, the CCFM wiring, CSPRepLayer, anchors and query selection.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "models/core/state_dict.h"
#include "models/dfine/hgnetv2.h"
#include "models/layers/bound_kernels.h"
#include "models/rtdetr/detector_model.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models::dfine {

using layers::Activation;

/// config.json of model_type d_fine: the RT-DETR fields (rtdetr::Config::parse_shared, same
/// defaults) plus the D-FINE ones (DFineConfig defaults, hf-models.md 4.1).
struct Config : rtdetr::Config {
  HGNetV2Config backbone;
  std::vector<int64_t> decoder_points;  ///< per level (decoder_n_points int or list)
  int64_t max_num_bins = 32, top_prob_values = 4, lqe_hidden_dim = 64, lqe_layers = 2;
  double depth_mult = 1.0, reg_scale = 4.0, up = 0.5;

  /// Parses and validates; throws core::ConfigError naming the file and field.
  static Config parse(const core::ConfigView& cfg);
  /// Every field of parse() but model_type, with its checks (DEIMv2 shares them). `hybrid_levels`
  /// as rtdetr::Config::parse_shared: false skips the checks of decoder_in_channels against the
  /// backbone outputs (DEIMv2's lite encoder makes one more level). `hgnet_backbone` false: the
  /// caller parses backbone_config (DEIMv2's DINOv3 backbone) and sets c.backbone.out_indices
  /// (one entry per map) and num_channels first. Throws core::ConfigError.
  static void parse_fields(const core::ConfigView& cfg, Config& c, bool hybrid_levels = true,
                           bool hgnet_backbone = true);
};

/// D-FINE weighting function W(n) (modeling_d_fine.py weighting_function, hf-models.md 4.5):
/// `up` and `reg_scale` are the decoder's (1,) parameters; returns (max_num_bins + 1) values in
/// their dtype, computed with the same tensor operations (float32 pow), e.g. for (32, 0.5, 4):
/// [-4, -1.9999990463, ..., 0, ..., 4].
at::Tensor weighting_function(int64_t max_num_bins, const at::Tensor& up,
                              const at::Tensor& reg_scale);

/// distance2bbox: points (..., 4) cxcywh, distance (..., 4) (left, top, right, bottom in units of
/// w / |reg_scale|, h / |reg_scale|), reg_scale (1,) -> (..., 4) cxcywh.
at::Tensor distance2bbox(const at::Tensor& points, const at::Tensor& distance,
                         const at::Tensor& reg_scale);

// ---- hybrid encoder blocks ---------------------------------------------------------------

/// DFineRepNCSPELAN4 (E = encoder_hidden_dim, c4 = round(hidden_expansion * E // 2)):
/// conv1 (1x1 2E -> 2E, silu), split [y1, y2], b1 = conv2(csp_rep1(y2)), b2 = conv3(csp_rep2(b1))
/// (3x3, silu), conv4(cat[y1, y2, b1, b2]) (1x1 -> E, silu).
class RepNCSPELAN4Impl : public torch::nn::Module {
 public:
  explicit RepNCSPELAN4Impl(const Config& c);
  /// (B, 2E, H, W) -> (B, E, H, W).
  at::Tensor forward(const at::Tensor& x) const;

 private:
  layers::ConvNorm conv1_, conv2_, conv3_, conv4_;
  std::shared_ptr<rtdetr::CSPRepLayerImpl> csp_rep1_, csp_rep2_;
  int64_t half_;
};

/// DFineSCDown: conv1 1x1 then conv2 depthwise 3x3 stride 2, both without activation.
class SCDownImpl : public torch::nn::Module {
 public:
  explicit SCDownImpl(const Config& c);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  layers::ConvNorm conv1_, conv2_;
};

/// D-FINE's CCFM blocks: lateral 1x1 ConvNorm without activation, RepNCSPELAN4, SCDown.
rtdetr::CCFMFactories dfine_ccfm(const Config& c);

// ---- decoder ---------------------------------------------------------------------------------

/// DFineMultiscaleDeformableAttention: sampling_offsets, attention_weights, buffer
/// num_points_scale (1 / P_l per point); no value/output projections (the value is the encoder
/// memory split into heads). Bilinear sampling runs through the ms_deform_attn slot, ragged
/// per-level point counts padded to the largest with zero attention weights.
class MSDeformAttnImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  /// Takes the `ms_deform_attn` and `sampling_locations` handles the model was bound to.
  void bind_kernels(const layers::BoundKernels& k) override {
    ms_deform_attn_kernel_ = k.ms_deform_attn;
    sampling_locations_kernel_ = k.sampling_locations;
  }

 private:
  kernels::MsDeformAttnHandle ms_deform_attn_kernel_;
  kernels::SamplingLocationsHandle sampling_locations_kernel_;

 public:
  explicit MSDeformAttnImpl(const Config& c);
  /// query (B, Q, D) (position embedding added), value (B, S, H, D/H), reference_boxes
  /// (B, Q, 1, 4) cxcywh -> (B, Q, D).
  at::Tensor forward(const at::Tensor& query, const at::Tensor& value,
                     const at::Tensor& reference_boxes, const kernels::SpatialShapes& shapes) const;

 private:
  layers::Linear sampling_offsets_, attention_weights_;
  at::Tensor num_points_scale_;
  std::vector<int64_t> points_;
  int64_t heads_, total_points_;
  double offset_scale_;
  kernels::SamplingMethod method_;
};

/// What DecoderImpl runs per layer (D-FINE's DecoderLayerImpl, DEIMv2's deimv2::DecoderLayerImpl).
class DecoderLayerBase : public torch::nn::Module {
 public:
  /// h (B, Q, D), pos (B, Q, D) query position embedding, value (B, S, H, D/H) the encoder
  /// memory split into heads, reference_boxes (B, Q, 1, 4) cxcywh -> (B, Q, D).
  virtual at::Tensor forward(const at::Tensor& h, const at::Tensor& pos, const at::Tensor& value,
                             const at::Tensor& reference_boxes,
                             const kernels::SpatialShapes& shapes) const = 0;
};

/// DFineDecoderLayer: self_attn + self_attn_layer_norm, encoder_attn, gateway (gate Linear 2D ->
/// 2D, norm LayerNorm(D)), fc1/fc2, final_layer_norm.
class DecoderLayerImpl : public DecoderLayerBase {
 public:
  explicit DecoderLayerImpl(const Config& c);
  at::Tensor forward(const at::Tensor& h, const at::Tensor& pos, const at::Tensor& value,
                     const at::Tensor& reference_boxes,
                     const kernels::SpatialShapes& shapes) const override;
  layers::Attention self_attn;

 private:
  layers::LayerNorm self_attn_layer_norm_, gate_norm_, final_layer_norm_;
  std::shared_ptr<MSDeformAttnImpl> encoder_attn_;
  layers::Linear gate_, fc1_, fc2_;
  Activation act_;
};

/// DFineDecoder (fine-grained distribution refinement) with the heads class_embed.{i},
/// bbox_embed.{i} (distributions over max_num_bins + 1 bins per edge), pre_bbox_head,
/// lqe_layers.{i}.reg_conf, query_pos_head and the (1,) parameters reg_scale, up.
/// The per-family parts of DecoderImpl: the layer and the query position head.
struct DecoderParts {
  std::function<std::shared_ptr<DecoderLayerBase>()> make_layer;
  int64_t query_pos_hidden = 0, query_pos_layers = 2;  ///< hidden 0: 2 * d_model
  Activation query_pos_act = Activation::relu;
  bool share_bbox_head = false;  ///< one bbox_embed MLP for every layer, stored as index 0
};

class DecoderImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  /// Takes the `refine_boxes` handle the model was bound to (the first layer's refinement).
  void bind_kernels(const layers::BoundKernels& k) override {
    refine_boxes_kernel_ = k.refine_boxes;
  }
  /// D-FINE's: DFineDecoderLayer, query_pos_head MLP(4, 2D, D, 2) with ReLU.
  explicit DecoderImpl(const Config& c);
  /// With the family's parts (DEIMv2: Deimv2DecoderLayer, Deimv2Decoder's query_pos_head).
  DecoderImpl(const Config& c, const DecoderParts& parts);
  /// target (B, Q, D), reference_logits (B, Q, 4) (unactivated), memory (B, S, D) ->
  /// (logits (B, Q, C) with the LQE quality term, boxes (B, Q, 4) cxcywh) of the last layer
  /// (eval_idx -1).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& target,
                                            const at::Tensor& reference_logits,
                                            const at::Tensor& memory,
                                            const kernels::SpatialShapes& shapes) const;
  /// Caches weighting_function(max_num_bins, up, reg_scale); call after loading the weights.
  void prepare();

 private:
  std::vector<std::shared_ptr<DecoderLayerBase>> layers_;
  layers::MLP query_pos_head_, pre_bbox_head_;
  std::vector<layers::Linear> class_embed_;
  std::vector<layers::MLP> bbox_embed_, lqe_;
  at::Tensor reg_scale_, up_, project_;
  int64_t heads_, bins_, top_prob_values_;
  kernels::RefineBoxesHandle refine_boxes_kernel_;
};

// ---- the whole detector ----------------------------------------------------------------------

/// Root module "model.{backbone.model, encoder_input_proj, encoder, enc_output, enc_score_head,
/// enc_bbox_head, decoder_input_proj (absent when d_model == decoder_in_channels[-1]), decoder}".
class DetectorImpl : public torch::nn::Module {
 public:
  explicit DetectorImpl(const Config& c);
  /// pixel_values (B, C, H, W) in the parameters' dtype/device -> (logits, pred_boxes) in that
  /// dtype. Throws std::invalid_argument when the anchors do not match.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// See DecoderImpl::prepare.
  void prepare() { decoder_->prepare(); }

 private:
  Config config_;
  std::shared_ptr<BackboneImpl> backbone_;
  std::vector<layers::ConvNorm> encoder_input_proj_,
      decoder_input_proj_;  ///< decoder_input_proj_ empty: identity
  std::shared_ptr<rtdetr::HybridEncoderImpl> encoder_;
  rtdetr::QuerySelectionHeads heads_;
  std::shared_ptr<DecoderImpl> decoder_;
};

/// DFineModel.forward after the encoder: decoder_input_proj (empty: identity) of the encoder
/// maps `pan` (B, E, H_l, W_l), extra levels from the last map, flattening, anchors and top-k
/// query selection, the decoder -> (logits (B, Q, C), pred_boxes (B, Q, 4) cxcywh).
std::pair<at::Tensor, at::Tensor> decode(const Config& c, const std::vector<at::Tensor>& pan,
                                         const std::vector<layers::ConvNorm>& decoder_input_proj,
                                         const rtdetr::QuerySelectionHeads& heads,
                                         const DecoderImpl& decoder);

/// The loading rules of D-FINE-lineage checkpoints (D-FINE, DEIMv2): denoising embeddings and
/// top-level heads ignored, the num_points_scale buffers optional, rtdetr::head_aliases(tie).
core::LoadRules load_rules(bool tie);

/// The input check's geometry: feature levels at `strides` (the largest is the input stride),
/// then num_feature_levels - len(strides) extra levels (3x3 stride 2 of the last map when
/// d_model != decoder_in_channels[-1], else the map itself).
rtdetr::DetectorGeometry detector_geometry(const Config& c, std::vector<int64_t> strides);

}  // namespace libreyolo::models::dfine

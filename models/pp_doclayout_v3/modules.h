// PP-DocLayoutV3 module tree (internal to models/pp_doclayout_v3). Names are the on-disk keys of
// transformers 5.17 PPDocLayoutV3ForObjectDetection checkpoints (the rt_detr conversion mapping:
// "encoder.encoder.{i}.layers", "out_proj", "fc1"/"fc2", as RT-DETR's files); forward passes
// follow modeling_pp_doclayout_v3.py / modular_pp_doclayout_v3.py. Shared with RT-DETR
// (models/rtdetr/modules.h): the config fields, the hybrid encoder (AIFI + CCFM), the decoder
// layers and their ms_deform_attn slot, anchors and query selection; with D-FINE
// (models/dfine/hgnetv2.h): the HGNetV2 backbone.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/dfine/hgnetv2.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models::pp_doclayout_v3 {

using layers::Activation;

/// The detector both PP-DocLayout versions build (PPDocLayoutV2Config, PPDocLayoutV3Config):
/// RT-DETR's fields (rtdetr::Config::parse_shared; their defaults are RTDetrConfig's) with an
/// hgnet_v2 backbone_config.
struct HGNetV2DetectorConfig : rtdetr::Config {
  dfine::HGNetV2Config backbone;

  /// Reads config.json `model_type` (must be `model_type`), backbone_config (required: the
  /// class default `config_class` names is HGNetV2 arch "L") and RT-DETR's fields into `c`,
  /// and checks encoder_in_channels / feat_strides against the backbone's outputs after the
  /// first `skip` (PP-DocLayoutV3's stride-4 map: 1; V2: 0) and decoder_in_channels against
  /// encoder_hidden_dim. Throws core::ConfigError naming the file and field.
  static void parse_detector(const core::ConfigView& cfg, HGNetV2DetectorConfig& c,
                             const std::string& model_type, const std::string& config_class,
                             size_t skip);
};

/// config.json of model_type pp_doclayout_v3: HGNetV2DetectorConfig with a backbone returning
/// stage1..stage4, plus the mask and reading-order heads' sizes.
struct Config : HGNetV2DetectorConfig {
  int64_t x4_feat_dim = 128;    ///< channels of the stride-4 map (backbone stage1)
  int64_t num_prototypes = 32;  ///< mask prototypes (mask_query_head's output)
  std::vector<int64_t> mask_feature_channels{64, 64};
  int64_t global_pointer_head_size = 64;
  bool mask_enhanced = true;  ///< reference boxes from the encoder queries' masks

  /// Parses and validates; throws core::ConfigError naming the file and field.
  static Config parse(const core::ConfigView& cfg);
};

/// PPDocLayoutV3ConvLayer (= ResNetConvLayer): "convolution" (no bias, padding k // 2) ->
/// "normalization" (BatchNorm2d, eps 1e-5) -> SiLU.
layers::ConvNorm conv_layer(int64_t in, int64_t out, int64_t kernel);

/// PPDocLayoutV3MaskFeatFPN: per level a scale head ("scale_heads.{i}.layers.{k}": ConvLayer 3x3
/// then x2 bilinear upsampling until the finest stride; nn.Upsample entries have no keys), the
/// sum of the heads (each bilinearly resized to the finest head's size) and "output_conv".
class MaskFeatFPNImpl : public torch::nn::Module {
 public:
  /// `in_channels` per level, `strides` per level (any order: sorted ascending as upstream).
  MaskFeatFPNImpl(std::vector<int64_t> in_channels, std::vector<int64_t> strides,
                  int64_t feature_channels, int64_t out_channels);
  /// PAN maps (B, C_l, H_l, W_l) in config level order -> (B, out, H_finest, W_finest).
  at::Tensor forward(const std::vector<at::Tensor>& maps) const;

 private:
  std::vector<int64_t> order_;  ///< argsort of the strides
  std::vector<std::vector<layers::ConvNorm>> heads_;
  std::vector<std::vector<bool>> upsample_after_;  ///< per head layer: x2 upsampling follows
  layers::ConvNorm output_conv_;
};

/// The encoder's mask branch (PPDocLayoutV3HybridEncoder.forward after the PAN), registered on
/// the RT-DETR hybrid encoder module itself so that its keys are "model.encoder.{mask_feature_head,
/// encoder_mask_lateral, encoder_mask_output.{base_conv,conv}}".
struct MaskBranch {
  std::shared_ptr<MaskFeatFPNImpl> mask_feature_head;
  layers::ConvNorm encoder_mask_lateral, mask_output_base_conv;
  layers::Conv2d mask_output_conv;  ///< 1x1 with bias -> num_prototypes
  /// PAN maps + x4 (B, x4_feat_dim, H/4, W/4) -> mask_feat (B, num_prototypes, H/4, W/4):
  /// upsample(fpn(pan), x2 bilinear) + lateral(x4), then base_conv and conv.
  at::Tensor forward(const std::vector<at::Tensor>& pan, const at::Tensor& x4) const;
};
MaskBranch register_mask_branch(torch::nn::Module& encoder, const Config& c);

/// transformers mask_to_box_coordinate(mask, dtype): mask (B, Q, h, w) bool -> the tight box of
/// each mask as (cx, cy, w, h) normalised by (w, h) (B, Q, 4) in `dtype`; an empty mask gives 0.
at::Tensor mask_to_box_coordinate(const at::Tensor& mask, at::ScalarType dtype);

/// PPDocLayoutV3GlobalPointer / PPDocLayoutV2GlobalPointer after their `dense` layer:
/// projection (B, Q, 2 * head_size) -> queries @ keys^T / sqrt(head_size), (B, Q, Q), with the
/// lower triangle (diagonal included) filled with -1e4 (modeling_pp_doclayout_v3.py).
at::Tensor global_pointer_logits(const at::Tensor& projection, int64_t head_size);

/// The decoder's outputs of its last layer (PPDocLayoutV3ForObjectDetection keeps [:, -1]).
struct DecoderOutput {
  at::Tensor logits;        ///< (B, Q, num_labels)
  at::Tensor pred_boxes;    ///< (B, Q, 4) cxcywh in [0, 1]
  at::Tensor order_logits;  ///< (B, Q, Q) global-pointer logits, lower triangle -1e4
  at::Tensor masks;         ///< (B, Q, H/4, W/4) mask logits
};

/// PPDocLayoutV3Decoder with the model-level heads it is handed: "model.decoder.{layers,
/// query_pos_head, class_embed, bbox_embed}" (one class/box head shared by every layer; files
/// saved with tie_word_embeddings hold them as enc_score_head / enc_bbox_head),
/// "model.decoder_order_head.{i}", "model.decoder_global_pointer.dense", "model.decoder_norm",
/// "model.mask_query_head" (registered on `model` by the constructor).
class DecoderImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  DecoderImpl(const Config& c, torch::nn::Module& model);
  /// Takes the `refine_boxes` handle the model was bound to (the per-layer box refinement).
  void bind_kernels(const layers::BoundKernels& k) override {
    refine_boxes_kernel_ = k.refine_boxes;
  }
  /// target (B, Q, D), reference_logits (B, Q, 4) unactivated, memory (B, S, D), mask_feat
  /// (B, P, h, w) -> the last layer's outputs (masks, logits and order are computed for the last
  /// layer only: the intermediate ones feed training losses).
  DecoderOutput forward(const at::Tensor& target, const at::Tensor& reference_logits,
                        const at::Tensor& memory, const kernels::SpatialShapes& shapes,
                        const at::Tensor& mask_feat) const;
  /// mask_query_head(decoder_norm(queries)) x mask_feat: (B, Q, D), (B, P, h, w) -> (B, Q, h, w).
  at::Tensor masks(const at::Tensor& queries, const at::Tensor& mask_feat) const;

 private:
  std::vector<std::shared_ptr<rtdetr::DecoderLayerImpl>> layers_;
  layers::MLP query_pos_head_, bbox_embed_, mask_query_head_;
  layers::Linear class_embed_, global_pointer_;
  std::vector<layers::Linear> order_head_;
  layers::LayerNorm norm_;
  int64_t head_size_;
  kernels::RefineBoxesHandle refine_boxes_kernel_;
};

/// Root module: "model.{backbone.model, encoder_input_proj, encoder, enc_output, enc_score_head,
/// enc_bbox_head, decoder_input_proj, decoder, decoder_order_head, decoder_global_pointer,
/// decoder_norm, mask_query_head}".
class DetectorImpl : public torch::nn::Module {
 public:
  explicit DetectorImpl(const Config& c);
  /// pixel_values (B, 3, H, W) in the parameters' dtype/device -> the last decoder layer's
  /// outputs in that dtype.
  DecoderOutput forward(const at::Tensor& pixel_values) const;

 private:
  Config config_;
  std::shared_ptr<dfine::BackboneImpl> backbone_;
  std::vector<layers::ConvNorm> encoder_input_proj_, decoder_input_proj_;
  std::shared_ptr<rtdetr::HybridEncoderImpl> encoder_;
  MaskBranch mask_branch_;
  rtdetr::QuerySelectionHeads heads_;
  std::shared_ptr<DecoderImpl> decoder_;
};

}  // namespace libreyolo::models::pp_doclayout_v3

// The pieces DETR (models/detr/detr.cpp), Conditional DETR (models/conditional_detr/) and
// DAB-DETR (models/dab_detr/) share, as transformers 5.17 shares them: the config.json fields of
// DetrConfig / ConditionalDetrConfig / DabDetrConfig (backbone in both of its forms), the
// convolutional stem (DetrConvEncoder with timm's or transformers' ResNet, the downsampled
// pixel_mask, DetrSinePositionEmbedding / DetrLearnedPositionEmbedding, input_projection), the
// additive key padding mask and DetrEncoderLayer (DabDetrEncoderLayer: the same with a PReLU).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/resnet.h"
#include "models/detr/timm_resnet.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"

namespace libreyolo::models::detr {

/// The on-disk prefix of the backbone (DetrConvEncoder.model; transformers 5.17 renames it to
/// model.backbone.model in memory and back on save_pretrained: conversion_mapping.py DetrModel,
/// ConditionalDetrModel; DabDetrModel keeps it in memory too).
inline constexpr const char* kBackbonePrefix = "model.backbone.conv_encoder.model.";

/// The fields of DetrConfig that the three families read.
struct Config {
  int64_t d_model = 256, encoder_layers = 6, decoder_layers = 6;
  int64_t encoder_heads = 8, decoder_heads = 8, encoder_ffn = 2048, decoder_ffn = 2048;
  int64_t num_queries = 100, num_labels = 2, num_channels = 3;
  bool learned_positions = false;
  layers::Activation act = layers::Activation::relu;
  /// activation_function "prelu" (DabDetrConfig's default): nn.PReLU, one learned slope per
  /// module ("activation_fn.weight"); `act` is then unused.
  bool prelu = false;
  /// Pre-norm encoder and decoder layers (TableTransformerEncoderLayer / DecoderLayer:
  /// LayerNorm before each sub-layer, the residual added after) instead of post-norm ones.
  bool pre_norm = false;
  /// Which backbone: timm's ResNet (use_timm_backbone, facebook/detr-resnet-50) or transformers'
  /// ResNetBackbone (backbone_config model_type "resnet").
  bool timm = true;
  std::string timm_name;
  int64_t timm_last_stage = 4;
  int64_t timm_output_stride = 32;  ///< 16: DC5 (`dilation`)
  TimmResNetConfig timm_backbone;   ///< filled from the checkpoint by read_backbone()
  /// The timm ResNet sits one level deeper, at conv_encoder.model._backbone (transformers'
  /// TimmBackbone wrapper, which DabDetrConvEncoder's load_backbone builds), rather than at
  /// conv_encoder.model (DetrConvEncoder's timm.create_model); read_backbone() decides from the
  /// checkpoint's keys.
  bool timm_wrapped = false;
  deformable_detr::ResNetConfig hf_backbone;
  std::map<int64_t, std::string> id2label;
};

/// What parse_config reads beyond the common fields (the families differ).
struct ConfigSchema {
  const char* hidden_field = "d_model";  ///< DabDetrConfig: "hidden_size"
  int64_t default_num_queries = 100;     ///< Conditional DETR, DAB-DETR: 300
  const char* default_activation = "relu";
  bool allow_prelu = false;                 ///< DAB-DETR
  bool has_position_embedding_type = true;  ///< DAB-DETR: sine only, its own fields
};

/// config.json, both backbone forms: the Hub's (facebook/detr-resnet-50,
/// microsoft/conditional-detr-resnet-50, IDEA-Research/dab-detr-resnet-50: use_timm_backbone
/// true, backbone "resnet50", backbone_config null) and transformers 5.17's save_pretrained
/// (backbone_config {model_type "timm_backbone", backbone, out_indices} or {model_type
/// "resnet", ...}). Without either, the configs' defaults: timm "resnet50". Throws
/// core::ConfigError naming the file and the field.
Config parse_config(const core::ConfigView& v, const ConfigSchema& schema = {});

/// Fills c.timm_backbone from the checkpoint's tensors under kBackbonePrefix (or its
/// "_backbone." level: c.timm_wrapped) when c.timm (timm's architecture is not in config.json).
/// Throws core::CheckpointError naming the file and key.
void read_backbone(Config& c, const core::SafetensorsFile& file);

/// The batchnorm_fold rules of a DETR-lineage ResNet backbone, for whichever form the checkpoint
/// holds: timm's (the stem "ResNet" at conv_encoder.model, "Bottleneck" / "BasicBlock" at
/// layer{s}.{i}: TimmResNetImpl / TimmBlockImpl, whose conv/bn pairs are siblings) and
/// transformers' ResNetBackbone ("ResNetShortCut", "ResNetConvLayer"). Shared by DETR,
/// Conditional DETR, DAB-DETR and Table Transformer: returns those rules, then `rules` (the
/// family's own, e.g. its qkv_concat class).
std::vector<LayoutClassRule> with_resnet_backbone_rules(std::vector<LayoutClassRule> rules);

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// The additive key padding mask of eager_attention_forward (create_bidirectional_mask): 0 where
/// flat_mask (B, S) bool is true, the dtype's lowest value where padded; (B, 1, 1, S) in
/// `like`'s dtype and device.
at::Tensor key_padding_bias(const at::Tensor& flat_mask, const at::Tensor& like);

/// The image side of the model, registered into the caller's "model" module with the on-disk
/// names: model.backbone.conv_encoder.model (the ResNet), model.position_embedding
/// (row_embeddings / column_embeddings, position_embedding_type "learned" only) and
/// model.input_projection (1x1 conv to d_model). Not a module itself: those are siblings of
/// the encoder and decoder.
class ConvStem {
 public:
  ConvStem() = default;
  ConvStem(torch::nn::Module& model, const Config& c);

  struct Output {
    at::Tensor source;     ///< (B, S = h*w, D) projected feature map, flattened
    at::Tensor mask;       ///< (B, h, w) bool, true = valid (the interpolated pixel_mask)
    at::Tensor flat_mask;  ///< (B, S) bool
    at::Tensor bias;       ///< (B, 1, 1, S) key_padding_bias(flat_mask)
  };
  /// pixel_values (B, C, H, W), pixel_mask (B, H, W) nonzero = valid. DetrConvEncoder: the last
  /// feature map, interpolate(pixel_mask[None].float(), size).to(bool)[0] (nearest).
  Output forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const;
  /// forward() from the backbone's last map `feature` (B, C, h, w) already computed
  /// (DetrForSegmentation runs the backbone itself: its mask head reads the earlier stages).
  Output from_feature(const at::Tensor& feature, const at::Tensor& pixel_mask) const;

  /// DetrSinePositionEmbedding (normalize, 2*pi, temperature 10000, no offset) or
  /// DetrLearnedPositionEmbedding of `mask` (B, h, w): (B, S, D) in `dtype`. Throws
  /// std::invalid_argument when a learned embedding's 50x50 table is too small.
  at::Tensor position_embedding(const at::Tensor& mask, at::ScalarType dtype) const;

  std::shared_ptr<TimmResNetImpl> timm_backbone;
  std::shared_ptr<deformable_detr::ResNetBackboneImpl> hf_backbone;
  at::Tensor row_embeddings, column_embeddings;  ///< (50, D/2), learned positions only
  layers::Conv2d input_projection;
  int64_t d_model = 0;
  bool learned_positions = false;
};

/// Learned position embeddings: transformers 5.17 keeps them at model.position_embedding;
/// checkpoints of transformers 4 (DetrConvModel) at model.backbone.position_embedding.
core::LoadRules position_embedding_load_rules();

/// nn.PReLU with one slope ("weight", (1)): max(0, x) + weight * min(0, x).
class PReLUImpl : public torch::nn::Module {
 public:
  PReLUImpl();
  at::Tensor forward(const at::Tensor& x) const { return at::prelu(x, weight); }
  at::Tensor weight;
};

/// fc1 -> activation -> fc2 of the post-norm layers: `act`, or the layer's PReLU when
/// config.prelu (registered as "activation_fn" in `owner`).
class FeedForward {
 public:
  FeedForward() = default;
  FeedForward(torch::nn::Module& owner, const Config& c, int64_t ffn_dim);
  at::Tensor forward(const at::Tensor& x) const;
  layers::Linear fc1, fc2;
  std::shared_ptr<PReLUImpl> prelu;
  layers::Activation act = layers::Activation::relu;
};

/// DetrEncoderLayer (post-norm; ConditionalDetrEncoderLayer is the same class, and
/// DabDetrEncoderLayer too with its PReLU): position embeddings added to queries and keys.
/// config.pre_norm: TableTransformerEncoderLayer (the same modules, normalised first).
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const Config& c);
  /// x (B, S, D), pos (B, S, D), bias (B, 1, 1, S) additive key padding mask.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& bias) const;
  layers::Attention self_attn;
  layers::LayerNorm self_attn_layer_norm, final_layer_norm;
  FeedForward ffn;
  bool pre_norm = false;
};

/// A multi-head attention whose q_proj/k_proj/v_proj/out_proj are the on-disk names.
layers::Attention attention(int64_t d, int64_t heads);

}  // namespace libreyolo::models::detr

// RT-DETR / RT-DETRv2 module tree (internal to models/rtdetr). Names are the on-disk keys of
// transformers 5.17 RTDetrForObjectDetection / RTDetrV2ForObjectDetection checkpoints
// (hf-models.md 2.3); forward passes follow modeling_rt_detr.py / modeling_rt_detr_v2.py.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "models/core/config.h"
#include "models/layers/attention.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/layers.h"
#include "models/layers/layout_targets.h"
#include "models/layers/max_pool.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::rtdetr {

using layers::Activation;

/// config.json of model_type rt_detr / rt_detr_v2 with its rt_detr_resnet backbone_config.
struct Config {
  bool v2 = false;
  // backbone_config (RTDetrResNetConfig)
  int64_t num_channels = 3, embedding_size = 64;
  std::vector<int64_t> hidden_sizes{256, 512, 1024, 2048}, depths{3, 4, 6, 3};
  bool bottleneck = true;  ///< layer_type "bottleneck" (else "basic")
  Activation hidden_act = Activation::relu;
  bool downsample_in_first_stage = false, downsample_in_bottleneck = false;
  std::vector<int64_t> out_indices{2, 3, 4};  ///< stage_names indices: 0 = stem, s = stage s
  bool freeze_backbone_batch_norms = true;
  // hybrid encoder
  int64_t encoder_hidden_dim = 256, encoder_layers = 1, encoder_ffn_dim = 1024,
          encoder_attention_heads = 8;
  std::vector<int64_t> encoder_in_channels{512, 1024, 2048}, feat_strides{8, 16, 32},
      encode_proj_layers{2};
  double positional_encoding_temperature = 10000;
  Activation encoder_activation = Activation::gelu, activation = Activation::silu;
  bool normalize_before = false, eval_size_set = false;
  double hidden_expansion = 1.0, layer_norm_eps = 1e-5, batch_norm_eps = 1e-5;
  // decoder
  int64_t d_model = 256, num_queries = 300, decoder_ffn_dim = 1024, num_feature_levels = 3,
          decoder_n_points = 4, decoder_layers = 6, decoder_attention_heads = 8, num_labels = 2;
  std::vector<int64_t> decoder_in_channels{256, 256, 256};
  Activation decoder_activation = Activation::relu;
  std::optional<std::vector<int64_t>> anchor_image_size;  ///< (H, W)
  // RT-DETRv2
  double decoder_offset_scale = 0.5;
  kernels::SamplingMethod decoder_method = kernels::SamplingMethod::bilinear;

  /// Parses and validates; throws core::ConfigError naming the file and field.
  static Config parse(const core::ConfigView& cfg);
  /// The fields RT-DETR shares with D-FINE (hybrid encoder, query selection, decoder sizes;
  /// not the backbone, decoder_n_points or the v2 fields), read into `c` with the checks that do
  /// not depend on the family. `hybrid_levels` false (DEIMv2's lite encoder) skips the checks
  /// that tie encoder_in_channels, decoder_in_channels and encode_proj_layers to the hybrid
  /// encoder's levels. Throws core::ConfigError naming the file and field.
  static void parse_shared(const core::ConfigView& cfg, Config& c, bool hybrid_levels = true);
};

/// RTDetrConvNormLayer / DFineConvNormLayer: conv (no bias, padding (kernel-1)/2 unless given,
/// `groups`) + BatchNorm2d(batch_norm_eps) + act, children "conv" / "norm".
layers::ConvNorm conv_norm(const Config& c, int64_t in, int64_t out, int64_t kernel, int64_t stride,
                           Activation act, int64_t padding = -1, int64_t groups = 1);

// ---- backbone (modeling_rt_detr_resnet.py) ----------------------------------------------

/// Bottleneck or basic residual layer: "layer.{k}" ConvLayers + optional "shortcut" /
/// "shortcut.1" (index 0 = AvgPool2d(2, 2, ceil_mode) without parameters).
class ResNetLayerImpl : public torch::nn::Module, public layers::PooledShortcut {
 public:
  ResNetLayerImpl(const Config& c, int64_t in, int64_t out, int64_t stride, bool first_of_stage);
  /// (B, C_in, H, W) -> (B, C_out, H', W'). `x` by value: moved in as the last reference, an
  /// identity shortcut hands it to the last convolution, whose output may reuse its memory.
  at::Tensor forward(at::Tensor x) const;
  /// The 1x1 projection behind "shortcut.0" = AvgPool2d(2, 2, ceil_mode=True) (what the
  /// avgpool_fold layout rewrites), or null when this layer has no pooled shortcut.
  layers::ConvNorm pooled_shortcut() const override { return avg_pool_ ? shortcut_ : nullptr; }

 private:
  std::vector<layers::ConvNorm> layer_;
  layers::ConvNorm shortcut_;  ///< null: identity projection
  bool avg_pool_ = false;      ///< AvgPool2d(2, 2, ceil_mode=True) before shortcut_
  Activation act_;
};

class ResNetBackboneImpl : public torch::nn::Module {
 public:
  explicit ResNetBackboneImpl(const Config& c);
  /// Feature maps at out_indices (strides 8/16/32 by default).
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// Channels of each returned map.
  std::vector<int64_t> out_channels;

 private:
  std::vector<layers::ConvNorm> stem_;
  layers::MaxPool2d pooler_;  ///< RTDetrResNetEmbeddings.pooler: 3x3, stride 2, padding 1
  std::vector<std::vector<std::shared_ptr<ResNetLayerImpl>>> stages_;
  std::vector<int64_t> out_indices_;
};

// ---- hybrid encoder ------------------------------------------------------------------------

/// RTDetrEncoderLayer: self_attn (q/k/v/out_proj), self_attn_layer_norm, fc1, fc2,
/// final_layer_norm; `v5_names` (transformers v5 in memory = on disk for DEIMv2, which has no
/// conversion mapping): self_attn.o_proj and mlp.layers.{0,1} (Deimv2MLP, same forward).
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const Config& c, bool v5_names = false);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& pos) const;
  layers::Attention self_attn;

 private:
  layers::LayerNorm self_attn_layer_norm_, final_layer_norm_;
  layers::Linear fc1_, fc2_;
  Activation act_;
  bool normalize_before_;
};

/// RTDetrRepVggBlock / DFineRepVggBlock / Deimv2RepVggBlock: act(convnorm3x3(x) +
/// convnorm1x1(x)) (layers::RepVggBranches: what the repvgg layout re-parameterises into one 3x3
/// convolution with bias).
class RepVggBlockImpl : public torch::nn::Module, public layers::RepVggBranches {
 public:
  RepVggBlockImpl(const Config& c, int64_t channels);
  /// (B, C, H, W) -> (B, C, H, W).
  at::Tensor forward(const at::Tensor& x) const;
};

/// CSPRepLayer (conv1 -> RepVGG bottlenecks, conv2, conv3 or identity); conv1/conv2/conv3 use
/// config.activation_function, the RepVGG blocks act(convnorm3x3(x) + convnorm1x1(x)).
class CSPRepLayerImpl : public torch::nn::Module {
 public:
  /// RT-DETR's: 2E -> E (E = encoder_hidden_dim), 3 blocks, hidden = int(E * hidden_expansion).
  explicit CSPRepLayerImpl(const Config& c);
  /// in -> out channels with `num_blocks` RepVGG blocks of int(out * expansion) channels
  /// (D-FINE's RepNCSPELAN4 branches: expansion 1, round(3 * depth_mult) blocks).
  CSPRepLayerImpl(const Config& c, int64_t in, int64_t out, int64_t num_blocks, double expansion);
  /// input (B, in, H, W) -> (B, out, H, W) in input's dtype and the convolutions' memory format
  /// (channels_last on the CPU).
  at::Tensor forward(const at::Tensor& input) const;

 private:
  layers::ConvNorm conv1_, conv2_, conv3_;
  std::vector<std::shared_ptr<RepVggBlockImpl>> bottlenecks_;
};

/// A CCFM block: the module to register and its forward (B, C, H, W) -> (B, C', H', W').
struct CCFMBlock {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};
/// Wraps any module with a `forward(const at::Tensor&) const`.
template <class T>
CCFMBlock ccfm_block(std::shared_ptr<T> m) {
  return {m, [m](const at::Tensor& x) { return m->forward(x); }};
}
/// Factories of the four CCFM block kinds; each call makes one new block.
struct CCFMFactories {
  std::function<CCFMBlock()> lateral_conv, fpn_block, downsample_conv, pan_block;
  /// FPN/PAN fusion: element-wise sum (DEIMv2 encoder_fuse_op "sum") instead of concatenation.
  bool fuse_sum = false;
  /// AIFI as "aifi.{i}.layers.{j}" with EncoderLayerImpl's v5 names (DEIMv2) instead of
  /// "encoder.{i}.layers.{j}".
  bool v5_names = false;
  /// The AIFI position embedding (1, h*w, dim) for an h x w map in `dtype` on `device`; null =
  /// sincos_position_embedding_2d (OmDet-Turbo has its own, computed in the map's dtype).
  std::function<at::Tensor(int64_t h, int64_t w, int64_t dim, double temperature,
                           at::ScalarType dtype, const at::Device& device)>
      position_embedding;
};
/// RT-DETR's: lateral 1x1 ConvNorm (activation), CSPRepLayer(2E -> E), 3x3 stride-2 ConvNorm.
CCFMFactories rtdetr_ccfm(const Config& c);

/// RTDetrHybridEncoder / DFineHybridEncoder: AIFI ("encoder.{i}.layers.{j}") + CCFM (FPN + PAN)
/// with the family's blocks ("lateral_convs", "fpn_blocks", "downsample_convs", "pan_blocks").
class HybridEncoderImpl : public torch::nn::Module {
 public:
  explicit HybridEncoderImpl(const Config& c) : HybridEncoderImpl(c, rtdetr_ccfm(c)) {}
  HybridEncoderImpl(const Config& c, const CCFMFactories& blocks);
  /// feature maps (B, E, H_l, W_l) per level -> PAN outputs, same shapes.
  std::vector<at::Tensor> forward(std::vector<at::Tensor> feature_maps) const;

 private:
  std::vector<std::vector<std::shared_ptr<EncoderLayerImpl>>> aifi_;
  std::vector<CCFMBlock> lateral_convs_, downsample_convs_, fpn_blocks_, pan_blocks_;
  std::vector<int64_t> encode_proj_layers_;
  int64_t hidden_dim_;
  double temperature_;
  bool use_pos_, fuse_sum_;
  decltype(CCFMFactories::position_embedding) position_embedding_;
  /// The AIFI position embedding per (H, W, dtype): about ten float64 kernels per forward
  /// otherwise, for a constant.
  ConstantCache positions_;
};

/// transformers build_2d_sinusoidal_position_embedding (v5.17): (1, h*w, dim), computed in
/// float64 and cast to `dtype`; layout [sin_h | cos_h | sin_w | cos_w], row-major positions.
at::Tensor sincos_position_embedding_2d(int64_t h, int64_t w, int64_t dim, double temperature,
                                        at::ScalarType dtype, const at::Device& device);

// ---- decoder -------------------------------------------------------------------------------

/// RTDetrMultiscaleDeformableAttention / RTDetrV2MultiscaleDeformableAttention (4-d reference
/// boxes, as RT-DETR's decoder uses): sampling_offsets, attention_weights, value_proj,
/// output_proj (+ buffer n_points_scale for v2). The sampling itself goes through the
/// ms_deform_attn slot (kernels/attention/ms_deform_attn.h).
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
  /// query (B, Q, D) (position embedding already added), memory (B, S, D),
  /// reference_boxes (B, Q, 1, 4) cxcywh in [0, 1] -> (B, Q, D).
  at::Tensor forward(const at::Tensor& query, const at::Tensor& memory,
                     const at::Tensor& reference_boxes, const kernels::SpatialShapes& shapes) const;

 private:
  layers::Linear sampling_offsets_, attention_weights_, value_proj_, output_proj_;
  at::Tensor n_points_scale_;
  int64_t heads_, levels_, points_;
  bool v2_;
  double offset_scale_;
  kernels::SamplingMethod method_;
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c);
  at::Tensor forward(const at::Tensor& h, const at::Tensor& pos, const at::Tensor& memory,
                     const at::Tensor& reference_boxes, const kernels::SpatialShapes& shapes) const;
  layers::Attention self_attn;

 private:
  layers::LayerNorm self_attn_layer_norm_, encoder_attn_layer_norm_, final_layer_norm_;
  std::shared_ptr<MSDeformAttnImpl> encoder_attn_;
  layers::Linear fc1_, fc2_;
  Activation act_;
};

/// RTDetrDecoder with its per-layer heads class_embed.{i} / bbox_embed.{i} (iterative box
/// refinement).
class DecoderImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  explicit DecoderImpl(const Config& c);
  /// Takes the `refine_boxes` handle the model was bound to (the per-layer box refinement).
  void bind_kernels(const layers::BoundKernels& k) override {
    refine_boxes_kernel_ = k.refine_boxes;
  }
  /// target (B, Q, D), reference_logits (B, Q, 4) (unactivated), memory (B, S, D) ->
  /// (logits (B, Q, C), boxes (B, Q, 4)) of the last layer.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& target,
                                            const at::Tensor& reference_logits,
                                            const at::Tensor& memory,
                                            const kernels::SpatialShapes& shapes) const;

 private:
  std::vector<std::shared_ptr<DecoderLayerImpl>> layers_;
  layers::MLP query_pos_head_;
  std::vector<layers::Linear> class_embed_;
  std::vector<layers::MLP> bbox_embed_;
  kernels::RefineBoxesHandle refine_boxes_kernel_;
};

/// Flattens decoder sources (B, D, H_l, W_l) to (B, sum H_l W_l, D) (level-major, row-major
/// positions) and returns their sizes in `shapes`.
at::Tensor flatten_sources(const std::vector<at::Tensor>& sources, kernels::SpatialShapes& shapes);

/// The encoder heads of the two-stage query selection (RTDetrModel / DFineModel "enc_output",
/// "enc_score_head", "enc_bbox_head").
struct QuerySelectionHeads {
  layers::Linear enc_output_linear, enc_score_head;
  layers::LayerNorm enc_output_norm;
  layers::MLP enc_bbox_head;
  /// The anchors and their valid mask (in the model's dtype) per geometry: about 45 small
  /// kernels per forward otherwise (generate_anchors), which a batch-1 forward pays in launches.
  std::shared_ptr<ConstantCache> anchors = std::make_shared<ConstantCache>();
};

/// Registers "enc_output.{0,1}", "enc_score_head", "enc_bbox_head" (d_model wide) under `model`.
QuerySelectionHeads register_query_selection(torch::nn::Module& model, const Config& c);

/// Anchors + top-k query selection (RTDetrModel.forward / DFineModel.forward, eval):
/// source_flatten (B, S, D) -> (target (B, Q, D), reference_points_unact (B, Q, 4)), Q =
/// num_queries; anchors from `shapes` or config anchor_image_size / feat_strides. The score head
/// runs on every token; the box head on the Q selected ones only (row-wise: the same rows as
/// upstream's whole-memory head, gathered). Throws std::invalid_argument when the anchors do not
/// match the tokens.
std::pair<at::Tensor, at::Tensor> select_queries(const Config& c, const QuerySelectionHeads& heads,
                                                 const at::Tensor& source_flatten,
                                                 const kernels::SpatialShapes& shapes);

// ---- the whole detector ----------------------------------------------------------------------

/// The backbone a DetectorImpl runs, registered as "model.backbone": RT-DETR's ResNet-vd
/// (ResNetBackboneImpl) or PP-DocLayoutV2's HGNetV2 (below "model.backbone.model").
struct Backbone {
  std::shared_ptr<torch::nn::Module> module;
  /// pixel_values (B, C, H, W) -> one map per encoder level, (B, out_channels[l], H_l, W_l).
  std::function<std::vector<at::Tensor>(const at::Tensor&)> forward;
  std::vector<int64_t> out_channels;
};

/// Root module: "model.{backbone.model, encoder_input_proj, encoder, enc_output, enc_score_head,
/// enc_bbox_head, decoder_input_proj, decoder}".
class DetectorImpl : public torch::nn::Module {
 public:
  /// RTDetrModel with the ResNet-vd backbone of `c`.
  explicit DetectorImpl(const Config& c);
  /// RTDetrModel's code around another backbone (PPDocLayoutV2Model: load_backbone(config)).
  DetectorImpl(const Config& c, Backbone backbone);
  /// pixel_values (B, 3, H, W) in the parameters' dtype/device -> (logits, pred_boxes) in that
  /// dtype. Throws std::invalid_argument for unacceptable shapes.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values) const;

 private:
  Config config_;
  Backbone backbone_;
  std::vector<layers::ConvNorm> encoder_input_proj_, decoder_input_proj_;
  std::shared_ptr<HybridEncoderImpl> encoder_;
  QuerySelectionHeads heads_;
  std::shared_ptr<DecoderImpl> decoder_;
};

/// RT-DETR anchors (RTDetrModel.generate_anchors, grid_size 0.05): (1, S, 4) logits in `dtype`
/// with invalid rows set to finfo(dtype).max, and the valid mask (1, S, 1) bool.
std::pair<at::Tensor, at::Tensor> generate_anchors(const kernels::SpatialShapes& shapes,
                                                   at::ScalarType dtype, const at::Device& device);

/// LoadRules::aliases of the decoder heads (hf-models.md 1.3): a module key
/// "model.decoder.{class_embed,bbox_embed}.{i}.*" is also looked up as "{head}.{i}.*" and, when
/// `tie` (tie_word_embeddings of RT-DETRv2 / D-FINE), as index 0 of both spellings.
std::function<std::vector<std::string>(const std::string&)> head_aliases(bool tie);

}  // namespace libreyolo::models::rtdetr

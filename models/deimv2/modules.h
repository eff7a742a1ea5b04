// DEIMv2 module tree (internal to models/deimv2). Names are the on-disk keys of transformers 5.17
// Deimv2ForObjectDetection checkpoints (no conversion mapping: the in-memory names); forward
// passes follow modeling_deimv2.py (modular_deimv2.py shows what differs from D-FINE). Shared
// with D-FINE (models/dfine/modules.h): the config fields, the HGNetV2 backbone, SCDown, the
// deformable attention, the FDR decoder loop; with RT-DETR: the AIFI layer, the CCFM wiring,
// the RepVGG block, anchors and query selection.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "models/deimv2/dinov3_backbone.h"
#include "models/dfine/modules.h"

namespace libreyolo::models::deimv2 {

using layers::Activation;

/// config.json of model_type deimv2: the D-FINE fields (dfine::Config::parse_fields, same
/// defaults) plus Deimv2Config's own.
struct Config : dfine::Config {
  bool lite = false;             ///< encoder_type "lite" (Deimv2LiteEncoder), else "hybrid"
  bool use_gateway = true;       ///< Deimv2Gate, else encoder_attn_layer_norm (RMSNorm)
  bool share_bbox_head = false;  ///< one bbox_embed MLP for every decoder layer
  bool trailing_conv = true;     ///< encoder_has_trailing_conv: CSPRepLayer conv2 (3x3)
  /// backbone_config.model_type "dinov3_vit" (Deimv2DINOv3ConvEncoder); `backbone` (HGNetV2)
  /// then only carries the level count (out_indices) and num_channels.
  std::optional<Dinov3Config> dinov3;

  /// Parses and validates. Throws core::ConfigError naming the file and field, e.g. for a
  /// backbone_config.model_type other than hgnet_v2 or dinov3_vit, or the lite encoder on a
  /// DINOv3 backbone (not implemented).
  static Config parse(const core::ConfigView& cfg);
  /// The feature strides of the encoder's input maps: HGNetV2's out_strides, or 8, 16, 32 for
  /// the DINOv3 encoder.
  std::vector<int64_t> backbone_strides() const;
};

/// Deimv2RMSNorm (LlamaRMSNorm, eps 1e-6): weight * (x / sqrt(mean(x^2) + eps)), the
/// normalisation in float32, cast back before the weight. (..., D) -> (..., D), x's dtype.
/// On the CPU upstream's seven ops, bit for bit; on CUDA ATen's one-kernel _fused_rms_norm
/// (aten/src/ATen/native/cuda/layer_norm_kernel.cu), which applies the weight before its one
/// cast to 16 bits where upstream casts first: at most one rounding apart in float16 / bfloat16,
/// the same float32 values up to the sum's order (DEIMv2-S batch 32: 12 norms of 8 kernels each).
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  at::Tensor weight_;
  double eps_;
};
using RMSNorm = std::shared_ptr<RMSNormImpl>;

/// Deimv2SwiGLUFFN: down_proj(silu(gate_proj(x)) * up_proj(x)), hidden decoder_ffn_dim / 2.
class SwiGLUFFNImpl : public torch::nn::Module {
 public:
  explicit SwiGLUFFNImpl(const Config& c);
  /// (B, Q, D) -> (B, Q, D).
  at::Tensor forward(const at::Tensor& x) const;

 private:
  layers::Linear gate_proj_, up_proj_, down_proj_;
};

/// Deimv2DecoderLayer: self_attn (q/k/v/o_proj) + self_attn_layer_norm (RMSNorm), encoder_attn
/// (D-FINE's deformable attention through the ms_deform_attn slot), gateway (gate, norm RMSNorm)
/// or encoder_attn_layer_norm (use_gateway false), mlp (SwiGLU), final_layer_norm (RMSNorm).
class DecoderLayerImpl : public dfine::DecoderLayerBase {
 public:
  explicit DecoderLayerImpl(const Config& c);
  /// As dfine::DecoderLayerBase::forward.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& pos, const at::Tensor& value,
                     const at::Tensor& reference_boxes,
                     const kernels::SpatialShapes& shapes) const override;
  layers::Attention self_attn;  ///< o_proj; the attention slot when fused_attn is on

 private:
  RMSNorm self_attn_layer_norm_, gate_norm_, encoder_attn_layer_norm_, final_layer_norm_;
  std::shared_ptr<dfine::MSDeformAttnImpl> encoder_attn_;
  layers::Linear gate_;  ///< null without the gateway
  std::shared_ptr<SwiGLUFFNImpl> mlp_;
};

/// Deimv2's decoder: dfine::DecoderImpl with Deimv2DecoderLayer and query_pos_head
/// MLP(4, D, D, 3, decoder_activation_function).
std::shared_ptr<dfine::DecoderImpl> make_decoder(const Config& c);

// ---- encoders ---------------------------------------------------------------------------------

/// Deimv2CSPRepLayer: conv1 (1x1 in -> 2h, act) split into [residual, x], x through `blocks`
/// RepVGG blocks, conv2 (3x3 h -> out, act; identity without encoder_has_trailing_conv) of
/// residual + x. h = int(out * expansion), expansion 1.
class CSPRepLayerImpl : public torch::nn::Module {
 public:
  CSPRepLayerImpl(const Config& c, int64_t in, int64_t out, int64_t blocks);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  layers::ConvNorm conv1_, conv2_;
  std::vector<std::shared_ptr<rtdetr::RepVggBlockImpl>> bottlenecks_;
  int64_t hidden_;
};

/// Deimv2RepNCSPELAN5 (E = encoder_hidden_dim, c = round(hidden_expansion * E // 2)): conv1
/// (1x1 E -> 2E, act) split [y1, y2], b1 = csp_rep1(y2), b2 = csp_rep2(b1), conv2 (1x1
/// cat[y1, y2, b1, b2] -> E, act); act = activation_function. (B, E, H, W) -> (B, E, H, W).
class RepNCSPELAN5Impl : public torch::nn::Module {
 public:
  explicit RepNCSPELAN5Impl(const Config& c);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  layers::ConvNorm conv1_, conv2_;
  std::shared_ptr<CSPRepLayerImpl> csp_rep1_, csp_rep2_;
  int64_t half_;
};

/// Deimv2HybridEncoder's blocks for rtdetr::HybridEncoderImpl: lateral 1x1 ConvNorm without
/// activation, RepNCSPELAN5, D-FINE's SCDown; sum fusion, v5 AIFI names.
rtdetr::CCFMFactories deimv2_ccfm(const Config& c);

/// Deimv2LiteEncoder: input_proj.{i} (1x1 encoder_in_channels[i] -> E), down_conv1 of
/// avg_pool(3, 2, 1) of the last, bi_fusion_conv(x + global average) on it, then one FPN
/// (fpn_block of p0 + nearest-2x(p1)) and one PAN (pan_block of p1 + down_conv2(avg_pool(fpn)))
/// step. Backbone maps (B, C_i, H_i, W_i) -> 2 maps (B, E, .., ..).
class LiteEncoderImpl : public torch::nn::Module {
 public:
  explicit LiteEncoderImpl(const Config& c);
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& features) const;

 private:
  std::vector<layers::ConvNorm> input_proj_;
  layers::ConvNorm down_conv1_, down_conv2_, bi_fusion_conv_;
  std::shared_ptr<RepNCSPELAN5Impl> fpn_block_, pan_block_;
};

// ---- the whole detector ----------------------------------------------------------------------

/// Root module "model.{conv_encoder.{model, encoder_input_proj (hybrid only)} (HGNetV2) or
/// conv_encoder.{backbone, spatial_tuning_adapter, fusion_proj} (DINOv3), encoder,
/// enc_output, enc_score_head, enc_bbox_head, decoder_input_proj (absent when d_model ==
/// decoder_in_channels[-1]), decoder}".
class DetectorImpl : public torch::nn::Module {
 public:
  explicit DetectorImpl(const Config& c);
  /// pixel_values (B, C, H, W) in the parameters' dtype/device -> (logits (B, Q, num_labels),
  /// pred_boxes (B, Q, 4) cxcywh) in that dtype. Throws std::invalid_argument when the anchors
  /// do not match.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// See dfine::DecoderImpl::prepare and Dinov3ConvEncoderImpl::prepare.
  void prepare() {
    decoder_->prepare();
    if (dinov3_) dinov3_->prepare();
  }

 private:
  Config config_;
  std::shared_ptr<dfine::BackboneImpl> backbone_;  ///< null with the DINOv3 encoder
  std::shared_ptr<Dinov3ConvEncoderImpl> dinov3_;  ///< null with HGNetV2
  std::vector<layers::ConvNorm> encoder_input_proj_, decoder_input_proj_;
  std::shared_ptr<rtdetr::HybridEncoderImpl> hybrid_;  ///< null for the lite encoder
  std::shared_ptr<LiteEncoderImpl> lite_;
  rtdetr::QuerySelectionHeads heads_;
  std::shared_ptr<dfine::DecoderImpl> decoder_;
};

}  // namespace libreyolo::models::deimv2

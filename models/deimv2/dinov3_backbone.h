// DEIMv2's DINOv3 conv encoder (internal to models/deimv2): transformers 5.17
// Deimv2DINOv3ConvEncoder (models/deimv2/modeling_deimv2.py) around a DINOv3ViTBackbone
// (models/dinov3_vit/modeling_dinov3_vit.py: patch embedding + CLS + register tokens, 2-D RoPE on
// the patch tokens, layer-scaled pre-norm blocks with an MLP or gated MLP, LayerNorm), the
// Deimv2SpatialTuningAdapter (a small strided CNN on the pixels) and the fusion_proj ConvNorms.
// Module names are the on-disk keys under "model.conv_encoder": backbone.{embeddings.{cls_token,
// mask_token, register_tokens, patch_embeddings}, layer.{i}.{norm1, attention.{q,k,v,o}_proj,
// layer_scale1.lambda1, norm2, mlp.{gate_proj, up_proj, down_proj}, layer_scale2.lambda1},
// norm}, spatial_tuning_adapter.{stem_conv, conv2, conv3, conv4}, fusion_proj.{0,1,2}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/layers/max_pool.h"
#include "models/rtdetr/modules.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::deimv2 {

/// The DINOv3ViTConfig fields the backbone uses (configuration_dinov3_vit.py defaults), plus
/// Deimv2Config.spatial_tuning_adapter_inplanes. pos_embed_shift / jitter / rescale are
/// training-only augmentations of the RoPE coordinates: not read (eval uses none).
struct Dinov3Config {
  int64_t hidden_size = 384, intermediate_size = 1536, num_layers = 12, num_heads = 6;
  int64_t patch_size = 16, num_channels = 3, num_register_tokens = 0;
  double layer_norm_eps = 1e-5, rope_theta = 100.0;
  bool query_bias = true, key_bias = false, value_bias = true, proj_bias = true, mlp_bias = true;
  bool use_gated_mlp = false, apply_layernorm = true;
  layers::Activation act = layers::Activation::gelu;
  std::vector<int64_t> out_indices;  ///< stage indices, ascending: 0 = embeddings, i = layer i
  int64_t adapter_inplanes = 16;     ///< spatial_tuning_adapter_inplanes

  /// Reads `cfg`.backbone_config (model_type "dinov3_vit") and
  /// `cfg`.spatial_tuning_adapter_inplanes. out_indices from out_indices, else out_features
  /// ("stem", "stageN"), else BackboneMixin's default (the last stage). Throws core::ConfigError
  /// naming the field for what upstream cannot run or this port does not: not exactly 3
  /// out_indices (fusion_proj has 3 entries), patch_size other than 16 (the adapter's maps are
  /// at strides 8, 16, 32), reshape_hidden_states false, num_channels other than 3, a head
  /// size not a multiple of 4 (RoPE), an unknown hidden_act.
  static Dinov3Config parse(const core::ConfigView& cfg);
};

/// The RoPE tables of an h x w patch grid as the layers take them, (N, head_dim) each in the
/// model's dtype: cos, and sin with its first half negated (signed_sin), so that upstream's
/// rotate_half(p) * sin = cat(-p2, p1) * sin is two products on p's halves, without the negation
/// and the concatenation (the negation is exact: it commutes with rounding).
struct RopeTables {
  at::Tensor cos, signed_sin;
};

/// DINOv3ViTLayer: x + ls1 * o_proj(attention(norm1(x))) with RoPE on the patch tokens' queries
/// and keys, then + ls2 * mlp(norm2(.)). Attention through layers::AttentionImpl's projections
/// and its `attention` slot (fused_attn flag); eager math: softmax in the input dtype. RoPE
/// (apply_rotary_pos_emb) through the `rotary_embedding` slot
/// (kernels/attention/rotary_embedding.h).
class Dinov3LayerImpl : public torch::nn::Module, public layers::UsesKernels {
 public:
  explicit Dinov3LayerImpl(const Dinov3Config& c);
  /// Takes the `rotary_embedding` handle the model was bound to.
  void bind_kernels(const layers::BoundKernels& k) override { rope_kernel = k.rotary_embedding; }
  /// x (B, 1 + registers + N, C); rope: the grid's tables (N, head_dim) in x's dtype -> x's
  /// shape and dtype.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope) const {
    return forward_pending({x}, rope).sum();
  }
  /// The same on an input left pending by the previous block, returning this block's output
  /// left pending (y + mlp * lambda2): each layer-scaled residual add and the LayerNorm after it
  /// run as one add_layer_norm call.
  layers::PendingResidual forward_pending(const layers::PendingResidual& in,
                                          const RopeTables& rope) const;

  layers::Attention attention;  ///< q/k/v/o_proj, biases per query/key/value/proj_bias
  layers::LayerNorm norm1, norm2;
  layers::Linear gate_proj, up_proj, down_proj;  ///< gate_proj null without use_gated_mlp
  at::Tensor lambda1, lambda2;
  layers::Activation act;
  kernels::RotaryEmbeddingHandle rope_kernel;  ///< empty until bound: the portable path
};

/// DINOv3ViTBackbone (inference: no mask, no RoPE augmentation).
class Dinov3BackboneImpl : public torch::nn::Module {
 public:
  explicit Dinov3BackboneImpl(const Dinov3Config& c);
  /// DINOv3ViTRopePositionEmbedding for an h x w patch grid: (cos, sin), each (h * w, head_dim),
  /// computed in float32 and cast to `dtype`.
  std::pair<at::Tensor, at::Tensor> rope(int64_t h, int64_t w, at::ScalarType dtype) const;
  /// rope()'s tables in the form the layers take, kept per (h, w, dtype) (on inv_freq's device,
  /// the model's): computed once per input geometry instead of every forward.
  RopeTables rope_tables(int64_t h, int64_t w, at::ScalarType dtype) const;
  /// pixel_values (B, 3, H, W) in the weights' dtype -> one (B, hidden_size, H / 16, W / 16)
  /// map per out_indices entry (LayerNorm'ed as upstream: always the last stage, the others
  /// with apply_layernorm), in stage order. Each map is a view of the token rows (channels-last
  /// strides, not contiguous): the consumer chooses its memory format with one copy.
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// After loading: moves inv_freq (computed on the CPU, as upstream's buffer) to the weights'
  /// device.
  void prepare();

  Dinov3Config config;
  at::Tensor cls_token, mask_token, register_tokens;  ///< mask_token: loaded, unused
  layers::Conv2d patch_embeddings;
  std::vector<std::shared_ptr<Dinov3LayerImpl>> blocks;
  layers::LayerNorm norm;
  /// (head_dim / 4,) float32: upstream's non-persistent buffer, not a checkpoint key (so not a
  /// registered buffer here: the loader would require it).
  at::Tensor inv_freq;

 private:
  ConstantCache rope_cache_;  ///< (2, N, head_dim): cos, signed_sin
};

/// Deimv2SpatialTuningAdapter: stem_conv (3x3 s2, gelu) + max pool (3, 2, 1), conv2, conv3 and
/// conv4 (3x3 s2, gelu between them) -> maps of 2, 4, 4 x inplanes channels at strides 8, 16, 32.
class SpatialTuningAdapterImpl : public torch::nn::Module {
 public:
  SpatialTuningAdapterImpl(const rtdetr::Config& c, int64_t inplanes);
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;

 private:
  layers::ConvNorm stem_conv_, conv2_, conv3_, conv4_;
  layers::MaxPool2d pool_;  ///< after stem_conv: 3x3, stride 2, padding 1
};

/// Deimv2DINOv3ConvEncoder: the backbone's maps bilinearly resized (align_corners false) to
/// (h, w) * 2^(1 - i), concatenated with the adapter's maps, each through fusion_proj[i]
/// (1x1 ConvNorm to encoder_hidden_dim, no activation).
class Dinov3ConvEncoderImpl : public torch::nn::Module {
 public:
  Dinov3ConvEncoderImpl(const rtdetr::Config& c, const Dinov3Config& b);
  /// pixel_values (B, 3, H, W), H and W multiples of 32, in the weights' dtype -> 3 maps
  /// (B, encoder_hidden_dim, H / s, W / s), s = 8, 16, 32. Throws std::invalid_argument when
  /// the sides are not multiples of 32 (upstream's concatenation fails there).
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;
  /// See Dinov3BackboneImpl::prepare.
  void prepare();

 private:
  std::shared_ptr<Dinov3BackboneImpl> backbone_;
  std::shared_ptr<SpatialTuningAdapterImpl> adapter_;
  std::vector<layers::ConvNorm> fusion_proj_;
};

}  // namespace libreyolo::models::deimv2

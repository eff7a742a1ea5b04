// HGNetV2 backbone (PaddlePaddle PP-HGNetV2, as transformers 5.17 modeling_hgnet_v2.py
// HGNetV2Backbone) for D-FINE. Module names are the on-disk keys below
// "model.backbone.model." (hf-models.md 4.3).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/layers/max_pool.h"

namespace libreyolo::models::dfine {

/// backbone_config of model_type "hgnet_v2" (HGNetV2Config defaults, hf-models.md 4.1).
struct HGNetV2Config {
  int64_t num_channels = 3, embedding_size = 64;
  std::vector<int64_t> stem_channels{3, 32, 48}, stem_strides{2, 1, 1, 2, 1};
  std::vector<int64_t> stage_in_channels{48, 128, 512, 1024}, stage_mid_channels{48, 96, 192, 384},
      stage_out_channels{128, 512, 1024, 2048}, stage_num_blocks{1, 1, 3, 1},
      stage_downsample_strides{2, 2, 2, 2}, stage_kernel_size{3, 3, 5, 5},
      stage_numb_of_layers{6, 6, 6, 6};
  std::vector<bool> stage_downsample{false, true, true, true},
      stage_light_block{false, false, true, true};
  /// BackboneMixin.channels comes from these (not stage_out_channels): parse() requires equality
  /// for the stages in out_indices.
  std::vector<int64_t> hidden_sizes{256, 512, 1024, 2048};
  std::vector<int64_t> out_indices{2, 3, 4};  ///< stage_names indices: 0 = stem, s = stage s
  bool use_learnable_affine_block = false;
  layers::Activation hidden_act = layers::Activation::relu;
  /// DFineConfig.freeze_backbone_batch_norms: FrozenBatchNorm2d (4 buffers) vs BatchNorm2d.
  bool frozen_batch_norm = true;

  /// Parses `backbone_config` (`b` is its view); throws core::ConfigError naming the field.
  /// The first `unchecked_outputs` entries of out_indices are exempt from the hidden_sizes check
  /// (PP-DocLayoutV3's stride-4 map, whose channels transformers never reads from hidden_sizes).
  static HGNetV2Config parse(const core::ConfigView& b, size_t unchecked_outputs = 0);
  /// Channels of the maps at out_indices (what forward() returns).
  std::vector<int64_t> out_channels() const;
  /// Total stride of each returned map (stem strides x stage downsample strides).
  std::vector<int64_t> out_strides() const;
};

/// HGNetV2ConvLayer: "convolution" (no bias, padding (k-1)/2) -> "normalization" -> activation
/// -> "lab" (HGNetV2LearnableAffineBlock: scale * x + bias, both (1,)) when the layer has an
/// activation and use_learnable_affine_block is set.
class ConvLayerImpl : public layers::ConvNormImpl {
 public:
  ConvLayerImpl(const HGNetV2Config& c, int64_t in, int64_t out, int64_t kernel, int64_t stride,
                int64_t groups, layers::Activation act);
  /// (B, in, H, W) -> (B, out, H', W').
  at::Tensor forward(const at::Tensor& x) const;

 private:
  at::Tensor lab_scale_, lab_bias_;  ///< undefined without LAB
};
using ConvLayer = std::shared_ptr<ConvLayerImpl>;

/// HGNetV2BasicLayer: `layer_num` conv layers (light: 1x1 "conv1" without activation, then
/// depthwise kxk "conv2"), concatenation of the input and every layer output, "aggregation"
/// 1x1 -> out/2 -> 1x1 -> out, plus the input when `residual`.
class BasicLayerImpl : public torch::nn::Module {
 public:
  BasicLayerImpl(const HGNetV2Config& c, int64_t in, int64_t mid, int64_t out, int64_t layer_num,
                 int64_t kernel, bool residual, bool light);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::vector<std::vector<ConvLayer>> layers_;  ///< one (plain) or two (light) convs per layer
  ConvLayer squeeze_, excitation_;
  bool residual_;
};

/// HGNetV2Backbone: "embedder.stem{1,2a,2b,3,4}" and "encoder.stages.{s}.{downsample,blocks}".
class BackboneImpl : public torch::nn::Module {
 public:
  explicit BackboneImpl(const HGNetV2Config& c);
  /// pixel_values (B, num_channels, H, W) -> the maps at out_indices.
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values) const;

 private:
  ConvLayer stem1_, stem2a_, stem2b_, stem3_, stem4_;
  layers::MaxPool2d pool_;  ///< HGNetV2Embeddings.pool: 2x2, stride 1, ceil_mode
  struct Stage {
    ConvLayer downsample;  ///< null: identity
    std::vector<std::shared_ptr<BasicLayerImpl>> blocks;
  };
  std::vector<Stage> stages_;
  std::vector<int64_t> out_indices_;
};

}  // namespace libreyolo::models::dfine

// timm's plain ResNet (timm.models.resnet.ResNet: resnet18/26/34/50/101/152 and any widths and
// depths of that layout) as DETR's timm backbone wraps it (transformers 5.17 TimmBackbone,
// features_only, every BatchNorm2d replaced by DetrFrozenBatchNorm2d): 7x7/2 conv1 + bn1 + ReLU,
// 3x3/2 max-pool, layer1..layer4 of BasicBlock (3x3 conv1 with the stride, 3x3 conv2) or
// Bottleneck (1x1 conv1, 3x3 conv2 with the stride, 1x1 conv3) blocks, a 1x1 strided
// downsample.0 conv + downsample.1 norm where the shape changes. Module names are timm's
// (conv1, bn1, layer{s}.{i}.conv1, ..., downsample.{0,1}), the on-disk names of
// facebook/detr-resnet-50 under model.backbone.conv_encoder.model. output_stride 16 (DETR-DC5,
// `dilation`) runs the last stage at stride 1 with dilation 2 (timm's make_blocks: its first
// block's first 3x3 keeps dilation 1). Deep stems (timm's resnet50d, resnet10t ...) and
// average-pool downsampling are not this layout.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/core/safetensors.h"
#include "models/layers/layers.h"
#include "models/layers/layout_targets.h"
#include "models/layers/max_pool.h"

namespace libreyolo::models::detr {

/// The architecture of a timm ResNet checkpoint, read from its tensors.
struct TimmResNetConfig {
  int64_t num_channels = 3;
  int64_t stem_width = 64;
  bool bottleneck = true;
  std::vector<int64_t> depths;  ///< blocks per stage, stages 1..last
  std::vector<int64_t> widths;  ///< conv1 output channels of each stage's blocks
  std::vector<int64_t> outs;    ///< output channels of each stage
  int64_t output_stride = 32;   ///< 32, or 16: the last stage dilated (DETR-DC5)
};

/// Reads the architecture from the keys and shapes of `file` under `prefix` (e.g.
/// "model.backbone.conv_encoder.model."), stages 1..`last_stage`: the blocks of stage s are
/// layer{s}.0, layer{s}.1, ... while `<prefix>layer{s}.{i}.conv1.weight` exists; Bottleneck when
/// layer1.0.conv3.weight exists. Throws core::CheckpointError naming the file and the first key
/// it needed that is absent (strict loading then checks every other tensor).
/// `name` (config.json `backbone`, e.g. "resnet50", "timm/resnet50.a1_in1k"): for timm's
/// resnet18, resnet26, resnet34, resnet50, resnet101 and resnet152 the block type and the
/// blocks per stage must be that model's, else a CheckpointError "<file>: checkpoint does not
/// match the model: backbone \"resnet50\" has Bottleneck blocks [3, 4, 6, 3] per stage, the
/// checkpoint Bottleneck blocks [3, 4, 5, 3]" (a checkpoint short of a whole block would
/// otherwise load as a shallower network); other names are taken as the checkpoint says.
TimmResNetConfig read_timm_resnet_config(const core::SafetensorsFile& file,
                                         const std::string& prefix, int64_t num_channels,
                                         int64_t last_stage, const std::string& name = "");

/// One timm BasicBlock / Bottleneck with frozen norms: act(body(x) + shortcut(x)). Its conv/bn
/// pairs are siblings (conv1 + bn1, ..., downsample.0 + downsample.1): batchnorm_fold folds them
/// (layers::SiblingConvNorms), after which each convolution is one conv2d_bias_act call and the
/// residual add and ReLU run in the last one.
class TimmBlockImpl : public torch::nn::Module, public layers::SiblingConvNorms {
 public:
  /// first_dilation: the dilation of the first 3x3 (the strided one); dilation: the others'.
  TimmBlockImpl(bool bottleneck, int64_t in, int64_t width, int64_t out, int64_t stride,
                int64_t first_dilation = 1, int64_t dilation = 1);
  at::Tensor forward(const at::Tensor& x) const;
  std::vector<Pair> conv_norm_pairs() override;
  std::string upstream_class() const override { return bottleneck ? "Bottleneck" : "BasicBlock"; }
  bool bottleneck;
  std::vector<layers::Conv2d> convs;
  std::vector<layers::FrozenBatchNorm2d> norms;
  layers::Conv2d down_conv;  ///< downsample.0, null = identity shortcut
  layers::FrozenBatchNorm2d down_norm;
};

/// The backbone: forward returns the last stage's map (B, outs.back(), H/32, W/32 for 4 stages).
/// Its own sibling pair is the stem's conv1 + bn1.
class TimmResNetImpl : public torch::nn::Module, public layers::SiblingConvNorms {
 public:
  explicit TimmResNetImpl(const TimmResNetConfig& c);
  std::vector<Pair> conv_norm_pairs() override;
  std::string upstream_class() const override { return "ResNet"; }
  at::Tensor forward(const at::Tensor& pixel_values) const;
  /// Every stage's map, stage 1 first (TimmBackbone features_only, out_indices 1..last): the
  /// segmentation head's FPN reads stages 1-3.
  std::vector<at::Tensor> forward_stages(const at::Tensor& pixel_values) const;
  int64_t channels() const { return config.outs.back(); }

  TimmResNetConfig config;
  layers::Conv2d conv1;
  layers::FrozenBatchNorm2d bn1;
  layers::MaxPool2d maxpool;
  std::vector<std::vector<std::shared_ptr<TimmBlockImpl>>> stages;
};

}  // namespace libreyolo::models::detr

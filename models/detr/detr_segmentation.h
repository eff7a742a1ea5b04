// DetrForSegmentation (transformers 5.17 models/detr/modeling_detr.py): DETR
// (models/detr/detr.h) under "detr.", the bbox attention (DetrMHAttentionMap) of the decoder's
// output over the encoder's memory, and the mask head (DetrMaskHeadSmallConv: an FPN over the
// backbone's stages 3, 2, 1) giving one mask logit map per query at 1/4 of the input. Module
// names are the Hub's (facebook/detr-resnet-50-panoptic: bbox_attention.q_linear / k_linear,
// mask_head.lay1..5, gn1..5, adapter1..3, out_lay), which save_pretrained writes back.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/detr/detr.h"

namespace libreyolo::models::detr {

/// DetrMHAttentionMap: the attention probabilities of the queries over the memory map, softmax
/// jointly over heads and positions (upstream's flatten(2)); no values.
class AttentionMapImpl : public torch::nn::Module {
 public:
  AttentionMapImpl(int64_t d_model, int64_t heads);
  /// hidden (B, Q, D), memory (B, D, h, w), valid (B, h, w) bool. Returns (B, Q, heads, h, w).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& memory,
                     const at::Tensor& valid) const;
  layers::Linear q_linear, k_linear;
  int64_t heads;
};

/// DetrMaskHeadSmallConv (FPN fusion stages; conv -> GroupNorm(min(8, C)) -> activation).
class MaskHeadImpl : public torch::nn::Module {
 public:
  /// `fpn_channels`: the channels of stages 3, 2, 1 (in that order). Throws
  /// std::invalid_argument when d_model + heads is not a multiple of 8 or d_model < 16.
  MaskHeadImpl(int64_t d_model, int64_t heads, const std::vector<int64_t>& fpn_channels,
               layers::Activation act);
  /// projected (B, D, h, w), attention (B, Q, heads, h, w), fpn: stages 3, 2, 1 maps (B, C, ...).
  /// Returns (B, Q, H1, W1) mask logits at stage 1's resolution.
  at::Tensor forward(const at::Tensor& projected, const at::Tensor& attention,
                     const std::vector<at::Tensor>& fpn) const;
  std::vector<layers::Conv2d> lays;      ///< lay1..lay5
  std::vector<layers::GroupNorm> gns;    ///< gn1..gn5
  std::vector<layers::Conv2d> adapters;  ///< adapter1..3
  layers::Conv2d out_lay;
  layers::Activation act;
};

/// The module tree with the on-disk names ("detr.*", "bbox_attention.*", "mask_head.*").
class DetrSegmentationImpl : public torch::nn::Module {
 public:
  explicit DetrSegmentationImpl(const Config& c);
  /// pixel_values (B, C, H, W), pixel_mask (B, H, W) nonzero = valid. Returns DETR's result
  /// and pred_masks (B, Q, H/4, W/4) in the model's dtype.
  std::pair<DetrForwardResult, at::Tensor> forward(const at::Tensor& pixel_values,
                                                   const at::Tensor& pixel_mask) const;
  Config config;
  std::shared_ptr<DetrImpl> detr;
  std::shared_ptr<AttentionMapImpl> bbox_attention;
  std::shared_ptr<MaskHeadImpl> mask_head;
};

/// Whether `dir`'s checkpoint is a DetrForSegmentation: config.json `architectures` names it,
/// or (no architectures) the checkpoint's keys are under "detr.model.".
bool is_segmentation_checkpoint(const nlohmann::json& config, const core::SafetensorsFile& file);

/// Loads DetrForSegmentation (timm backbones only: the Hub's panoptic checkpoints) as a Model of
/// Task::panoptic_segmentation: logits, pred_boxes, pred_masks (float32). Throws
/// core::ConfigError / core::CheckpointError naming the file and the field or key.
std::unique_ptr<Model> load_segmentation(const std::string& dir, const core::ConfigView& view,
                                         const core::SafetensorsFile& file,
                                         const LoadOptions& options, bool fused_attention);

}  // namespace libreyolo::models::detr

// The RF-DETR backbone (transformers 5.17 models/rf_detr/modeling_rf_detr.py:
// RfDetrDinov2Backbone, RfDetrDinov2Embeddings, RfDetrDinov2Layer, RfDetrDinov2Attention,
// RfDetrDinov2LayerScale, RfDetrDinov2MLP / RfDetrDinov2SwiGLUFFN): DINOv2 with windowed
// attention. The [CLS] token plus patch tokens (position embeddings bicubic-antialias resized
// from the pretraining grid) are split into num_windows^2 windows, each with its own copy of the
// [CLS] token; window blocks attend within a window, the others over all windows of an image.
// The out stages are layer-normed, stripped of [CLS] and reassembled into (B, C, h, w) maps with
// upstream's (transposed, for non-square grids) window order.
// On-disk children (transformers module names; models/rf_detr/checkpoint_keys.h maps the
// original RF-DETR names): embeddings.{cls_token, mask_token, position_embeddings,
// patch_embeddings.projection}, encoder.layer.N.{norm1, attention.attention.{query, key, value},
// attention.output.dense, layer_scale1.lambda1, norm2, mlp.{fc1, fc2} | mlp.{weights_in,
// weights_out}, layer_scale2.lambda1}, layernorm.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/rf_detr/config.h"
#include "models/runtime/constant_cache.h"

namespace libreyolo::models::rf_detr {

/// One RfDetrDinov2Layer (pre-norm, layer-scaled residuals). Its attention goes through
/// layers::AttentionImpl (the `attention` slot when fused_attn is on).
class Dinov2LayerImpl : public torch::nn::Module {
 public:
  Dinov2LayerImpl(const Dinov2Config& c, bool global);
  /// x (B * num_windows^2, window tokens, C), window-major. Global blocks attend over the
  /// (B, num_windows^2 * window tokens, C) view. Returns x's shape and dtype.
  at::Tensor forward(const at::Tensor& x) const { return forward_pending({x}).second.sum(); }
  /// The same on an input left pending by the previous block: returns {the input summed, this
  /// block's output left pending (y + mlp * lambda2)}, so that each layer-scaled residual add
  /// and the LayerNorm after it run as one add_layer_norm call.
  std::pair<at::Tensor, layers::PendingResidual> forward_pending(
      const layers::PendingResidual& in) const;

  layers::Attention attention;
  layers::Linear output, fc1, fc2;  ///< fc1 / fc2: weights_in / weights_out with SwiGLU
  layers::LayerNorm norm1, norm2;
  at::Tensor lambda1, lambda2;
  layers::Activation act;
  bool global, swiglu;
  int64_t windows;  ///< num_windows^2
};

class Dinov2BackboneImpl : public torch::nn::Module {
 public:
  explicit Dinov2BackboneImpl(const Dinov2Config& c);
  /// pixel_values (B, num_channels, H, W) in the weights' dtype -> one (B, hidden_size,
  /// H / patch, W / patch) map per out_indices entry, in that order. Throws
  /// std::invalid_argument when the patch grid is not divisible by num_windows in both
  /// directions (upstream's view fails there too). channels_last_maps: the maps in
  /// channels_last memory format (the same values; the final LayerNorm's rows as they are),
  /// for a channels_last projector, instead of a transposing copy into NCHW each.
  std::vector<at::Tensor> forward(const at::Tensor& pixel_values,
                                  bool channels_last_maps = false) const;
  /// Channels of each returned map (hidden_size per out_indices entry).
  std::vector<int64_t> channels() const;

  Dinov2Config config;
  at::Tensor cls_token, mask_token, position_embeddings;  ///< mask_token: loaded, unused
  layers::Conv2d projection;
  std::vector<std::shared_ptr<Dinov2LayerImpl>> blocks;
  layers::LayerNorm layernorm;

 private:
  /// interpolate_pos_encoding: the stored embeddings when the input has as many patches as
  /// the grid and is square, else the patch rows resized with bicubic antialias
  /// (align_corners false, float32) to (h, w). (1, 1 + h * w, C).
  at::Tensor position_embedding(int64_t num_patches, int64_t height, int64_t width, int64_t h,
                                int64_t w) const;
  /// position_embedding per input geometry and dtype: a function of the weights alone, kept.
  ConstantCache positions_;
  /// unwindow_rows per patch grid.
  ConstantCache unwindow_;
};

/// One image's row gather from the windowed layout (num_windows^2 windows of 1 + window_h *
/// window_w tokens, [CLS] first, window-major) to its (h, w) patch grid, row-major: (h * w)
/// int64 (upstream's window_unpartition, transposed for non-square grids as upstream's view is;
/// with one window, the rows after [CLS]). On `device`.
at::Tensor unwindow_rows(int64_t windows, int64_t window_h, int64_t window_w,
                         const at::Device& device);

}  // namespace libreyolo::models::rf_detr

// timm's SwinTransformer as transformers' TimmBackbone builds it for a detector
// (transformers 5.17 models/timm_backbone/modeling_timm_backbone.py: timm.create_model(backbone,
// features_only=True, out_indices=..., **kwargs)), read into the shared swin::BackboneConfig
// with swin.timm set (swin.h: timm's names and block order).
#pragma once

#include <cstdint>
#include <vector>

#include "models/core/config.h"
#include "models/swin/backbone.h"

namespace libreyolo::models::swin {

/// What the caller's config gives timm.create_model when the kwargs do not: TimmBackboneConfig's
/// out_indices (-1, the last stage), the name's img_size (0: 224, 384 for *_384), timm's
/// always_partition false. OmDet-Turbo with empty backbone_kwargs: [1, 2, 3], image_size, true
/// (OmDetTurboConfig's timm_default_kwargs).
struct TimmDefaults {
  const char* name = nullptr;  ///< the timm model when "backbone" is absent (nullptr: required)
  std::vector<int64_t> out_indices{-1};
  int64_t img_size = 0;
  bool always_partition = false;
};

/// The timm Swin named by `named`'s field "backbone": swin_tiny_patch4_window7_224,
/// swin_small_patch4_window7_224, swin_base_patch4_window7_224, swin_base_patch4_window12_384,
/// swin_large_patch4_window7_224 or swin_large_patch4_window12_384 (timm 1.0
/// swin_transformer.py's model_args; a pretrained tag after '.' is ignored), changed by the
/// timm.create_model arguments in `kwargs`: out_indices (0-based stages, negative from the end;
/// made 1-based stage numbers), img_size (an int or [h, w]: the only input size, strict_img_size
/// being timm's default), always_partition, embed_dim, depths, num_heads, window_size,
/// patch_size, mlp_ratio, qkv_bias, in_chans, strict_img_size (true only), dynamic_img_size
/// (false only), the drop rates (no effect at inference). transformers 5.17 passes only img_size
/// and always_partition of them to timm (OmDetTurboConfig.timm_kwargs), 4.x all: a checkpoint
/// whose architecture keys disagree with its name loads in neither the same way, and these
/// follow 4.x. `kwargs_field` (backbone_kwargs: absent = empty) is a field of `named` whose every
/// key must be such an argument; nullptr: the arguments are `named`'s own fields, others
/// ignored (a timm_backbone backbone_config's PreTrainedConfig fields; there features_only must
/// be true and output_stride null, num_channels is in_chans). Throws core::ConfigError naming
/// the field.
BackboneConfig parse_timm_backbone(const core::ConfigView& named, const char* kwargs_field,
                                   const TimmDefaults& defaults);

}  // namespace libreyolo::models::swin

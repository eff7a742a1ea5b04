#include "models/rf_detr/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "models/layers/activation_field.h"

namespace libreyolo::models::rf_detr {
namespace {

/// An int, or a list of two equal ints (RfDetrDinov2Config image_size / patch_size).
int64_t square_side(const core::ConfigView& v, const std::string& field, int64_t fallback) {
  const auto l = v.get_int_or_list(field, fallback);
  if (l.size() == 1 || (l.size() == 2 && l[0] == l[1])) return l[0];
  v.fail(field, "only square sizes are supported");
}

void positive(const core::ConfigView& v, const std::string& field, int64_t value) {
  if (value <= 0) v.fail(field, "must be positive, got " + std::to_string(value));
}

}  // namespace

Dinov2Config parse_dinov2_config(const core::ConfigView& v) {
  Dinov2Config c;
  v.get_enum("model_type", "rf_detr_dinov2", {"rf_detr_dinov2"});
  c.hidden_size = v.get_int("hidden_size", 768);
  c.num_layers = v.get_int("num_hidden_layers", 12);
  c.num_heads = v.get_int("num_attention_heads", 12);
  c.mlp_ratio = v.get_int("mlp_ratio", 4);
  c.num_channels = v.get_int("num_channels", 3);
  c.layer_norm_eps = v.get_double("layer_norm_eps", 1e-6);
  c.qkv_bias = v.get_bool("qkv_bias", true);
  c.use_swiglu_ffn = v.get_bool("use_swiglu_ffn", false);
  c.use_mask_token = v.get_bool("use_mask_token", true);
  c.apply_layernorm = v.get_bool("apply_layernorm", true);
  if (!v.get_bool("reshape_hidden_states", true))
    v.fail("reshape_hidden_states", "must be true (the projector takes 2-D feature maps)");
  c.act = layers::activation_field(v, "hidden_act", "gelu");
  c.patch_size = square_side(v, "patch_size", 14);
  c.image_size = square_side(v, "image_size", 224);
  c.num_windows = v.get_int("num_windows", 4);
  positive(v, "hidden_size", c.hidden_size);
  positive(v, "num_hidden_layers", c.num_layers);
  positive(v, "mlp_ratio", c.mlp_ratio);
  positive(v, "patch_size", c.patch_size);
  positive(v, "num_windows", c.num_windows);
  positive(v, "num_channels", c.num_channels);
  if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
    v.fail("num_attention_heads", "must divide hidden_size");
  if (c.grid() <= 0) v.fail("image_size", "must be at least patch_size");
  c.out_indices = lw_detr::parse_out_indices(v, c.num_layers);
  // RfDetrDinov2Config.__post_init__: blocks 0..out_indices[-1] minus the out stages.
  const std::set<int64_t> outs(c.out_indices.begin(), c.out_indices.end());
  for (int64_t i = 0; i <= c.out_indices.back(); ++i)
    if (!outs.count(i)) c.window_block_indexes.push_back(i);
  return c;
}

Config parse_config(const core::ConfigView& v) {
  Config c;
  if (v.has("architectures")) {
    const auto& a = v.raw("architectures");
    const bool ok = a.is_array() && !a.empty() &&
                    (a[0] == "RfDetrForObjectDetection" || a[0] == "RfDetrForInstanceSegmentation");
    if (!ok)
      v.fail("architectures",
             "only RfDetrForObjectDetection and RfDetrForInstanceSegmentation are supported");
    c.segmentation = a[0] == "RfDetrForInstanceSegmentation";
  }
  if (!v.has("backbone_config"))
    v.fail("backbone_config",
           "missing (the RF-DETR DINOv2 backbone, model_type \"rf_detr_dinov2\")");
  c.backbone = parse_dinov2_config(v.child("backbone_config"));
  c.detr = lw_detr::parse_detr_config(v, /*rf_detr=*/true);
  c.mask_downsample_ratio = v.get_int("mask_downsample_ratio", 4);
  c.intermediate_size = v.get_int("intermediate_size", 1024);
  c.segmentation_act = layers::activation_field(v, "segmentation_head_activation_function", "gelu");
  positive(v, "mask_downsample_ratio", c.mask_downsample_ratio);
  positive(v, "intermediate_size", c.intermediate_size);
  c.id2label = v.id2label();
  c.detr.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  positive(v, "num_labels", c.detr.num_labels);
  return c;
}

}  // namespace libreyolo::models::rf_detr

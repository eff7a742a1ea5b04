#include "models/lw_detr/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "models/layers/activation_field.h"

namespace libreyolo::models::lw_detr {
namespace {

/// An int or a list of two ints (patch_size, pretrain_image_size) as (height, width).
std::pair<int64_t, int64_t> int_or_pair(const core::ConfigView& v, const std::string& field,
                                        int64_t fallback) {
  const auto l = v.get_int_or_list(field, fallback);
  if (l.size() == 1) return {l[0], l[0]};
  if (l.size() == 2) return {l[0], l[1]};
  v.fail(field, "must be an integer or a list of two integers");
}

void positive(const core::ConfigView& v, const std::string& field, int64_t value) {
  if (value <= 0) v.fail(field, "must be positive, got " + std::to_string(value));
}

}  // namespace

std::vector<int64_t> parse_out_indices(const core::ConfigView& v, int64_t num_layers) {
  std::vector<int64_t> out;
  if (v.has("out_indices")) {
    out = v.get_int_list("out_indices");
  } else if (v.has("out_features")) {
    const auto& f = v.raw("out_features");
    if (!f.is_array()) v.fail("out_features", "must be a list of stage names");
    for (const auto& name : f) {
      const std::string s = name.is_string() ? name.get<std::string>() : "";
      if (s == "stem")
        out.push_back(0);
      else if (s.rfind("stage", 0) == 0 && s.size() > 5 &&
               std::all_of(s.begin() + 5, s.end(), ::isdigit))
        out.push_back(std::stoll(s.substr(5)));
      else
        v.fail("out_features", "unknown stage name " + name.dump());
    }
  } else {
    out = {num_layers};  // BackboneConfigMixin default: the last stage
  }
  if (out.empty()) v.fail("out_indices", "must not be empty");
  for (const auto i : out)
    if (i < 0 || i > num_layers)
      v.fail("out_indices",
             "stage " + std::to_string(i) + " outside 0.." + std::to_string(num_layers));
  return out;
}

ViTConfig parse_vit_config(const core::ConfigView& v) {
  ViTConfig c;
  v.get_enum("model_type", "lw_detr_vit", {"lw_detr_vit"});
  c.hidden_size = v.get_int("hidden_size", 768);
  c.num_layers = v.get_int("num_hidden_layers", 12);
  c.num_heads = v.get_int("num_attention_heads", 12);
  c.mlp_ratio = v.get_int("mlp_ratio", 4);
  c.num_channels = v.get_int("num_channels", 3);
  c.layer_norm_eps = v.get_double("layer_norm_eps", 1e-6);
  c.qkv_bias = v.get_bool("qkv_bias", true);
  c.absolute_position_embeddings = v.get_bool("use_absolute_position_embeddings", true);
  c.act = layers::activation_field(v, "hidden_act", "gelu");
  const auto [ph, pw] = int_or_pair(v, "patch_size", 16);
  if (ph != pw) v.fail("patch_size", "only square patches are supported");
  c.patch_size = ph;
  std::tie(c.pretrain_height, c.pretrain_width) = int_or_pair(v, "pretrain_image_size", 224);
  c.num_windows = v.get_int("num_windows", 16);
  c.num_windows_side = static_cast<int64_t>(std::sqrt(static_cast<double>(c.num_windows)));
  positive(v, "hidden_size", c.hidden_size);
  positive(v, "num_hidden_layers", c.num_layers);
  positive(v, "mlp_ratio", c.mlp_ratio);
  positive(v, "patch_size", c.patch_size);
  positive(v, "num_windows", c.num_windows);
  if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
    v.fail("num_attention_heads", "must divide hidden_size");
  if (c.num_windows_side * c.num_windows_side != c.num_windows)
    v.fail("num_windows", "must be a perfect square");
  const int64_t gh = c.pretrain_height / c.patch_size, gw = c.pretrain_width / c.patch_size;
  if (c.absolute_position_embeddings && (gh != gw || gh <= 0))
    v.fail("pretrain_image_size", "the absolute position embeddings need a square patch grid");
  c.window_block_indices = v.get_int_list("window_block_indices", {});
  c.out_indices = parse_out_indices(v, c.num_layers);
  return c;
}

DetrConfig parse_detr_config(const core::ConfigView& v, bool rf_detr) {
  DetrConfig c;
  c.d_model = v.get_int("d_model", 256);
  c.decoder_layers = v.get_int("decoder_layers", 3);
  c.decoder_ffn = v.get_int("decoder_ffn_dim", 2048);
  c.decoder_points = v.get_int("decoder_n_points", 4);
  c.self_heads = v.get_int("decoder_self_attention_heads", 8);
  c.cross_heads = v.get_int("decoder_cross_attention_heads", 16);
  c.num_queries = v.get_int("num_queries", 300);
  c.group_detr = v.get_int("group_detr", 13);
  c.c2f_blocks = v.get_int("c2f_num_blocks", 3);
  c.hidden_expansion = v.get_double("hidden_expansion", 0.5);
  c.conv_norm_eps = v.get_double(rf_detr ? "layer_norm_eps" : "batch_norm_eps", 1e-5);
  c.attention_bias = v.get_bool("attention_bias", true);
  c.projector_act = layers::activation_field(v, "activation_function", "silu");
  c.decoder_act = layers::activation_field(v, "decoder_activation_function", "relu");
  if (rf_detr) {
    c.model_type = "rf_detr";
    // RfDetrConfig: a single projector scale (RfDetrScaleProjector), num_feature_levels 1.
    c.scale_factors = {1.0};
    c.conv_layer_norm = true;
    c.softmax_in_float32 = false;
    if (v.get_int("num_feature_levels", 1) != 1)
      v.fail("num_feature_levels", "RF-DETR supports one feature level only");
  } else {
    c.scale_factors = v.get_double_list("projector_scale_factors", {});
  }
  if (c.scale_factors.empty()) v.fail("projector_scale_factors", "must not be empty");
  for (const double s : c.scale_factors)
    if (s != 0.5 && s != 1.0 && s != 2.0)
      v.fail("projector_scale_factors",
             "unsupported scale factor " + std::to_string(s) + " (0.5, 1.0, 2.0)");
  positive(v, "d_model", c.d_model);
  positive(v, "decoder_layers", c.decoder_layers);
  positive(v, "decoder_ffn_dim", c.decoder_ffn);
  positive(v, "decoder_n_points", c.decoder_points);
  positive(v, "num_queries", c.num_queries);
  positive(v, "group_detr", c.group_detr);
  if (c.c2f_blocks < 0) v.fail("c2f_num_blocks", "must not be negative");
  if (static_cast<int64_t>(c.d_model * c.hidden_expansion) <= 0)
    v.fail("hidden_expansion", "d_model * hidden_expansion must be at least 1");
  if (c.self_heads <= 0 || c.d_model % c.self_heads != 0)
    v.fail("decoder_self_attention_heads", "must divide d_model");
  if (c.cross_heads <= 0 || c.d_model % c.cross_heads != 0)
    v.fail("decoder_cross_attention_heads", "must divide d_model");
  return c;
}

Config parse_config(const core::ConfigView& v) {
  Config c;
  if (v.has("architectures")) {
    const auto& a = v.raw("architectures");
    if (!a.is_array() || a.empty() || a[0] != "LwDetrForObjectDetection")
      v.fail("architectures", "only LwDetrForObjectDetection is supported");
  }
  if (!v.has("backbone_config"))
    v.fail("backbone_config", "missing (the LW-DETR ViT backbone, model_type \"lw_detr_vit\")");
  c.backbone = parse_vit_config(v.child("backbone_config"));
  c.detr = parse_detr_config(v);
  c.id2label = v.id2label();
  c.detr.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  positive(v, "num_labels", c.detr.num_labels);
  return c;
}

}  // namespace libreyolo::models::lw_detr

#include "models/omdet_turbo/config.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "models/core/state_dict.h"
#include "models/layers/activation_field.h"
#include "models/swin/timm_config.h"

namespace libreyolo::models::omdet_turbo {
namespace {

void positive(const core::ConfigView& v, const char* field, int64_t value) {
  if (value <= 0) v.fail(field, "must be positive, found " + std::to_string(value));
}

/// The vision backbone as transformers 5.17 OmDetTurboConfig builds it
/// (consolidate_backbone_kwargs_to_config): a backbone_config of model_type "swin" (SwinBackbone)
/// or "timm_backbone" (what 5.17 saves for the timm form); without one, use_timm_backbone
/// (default true) with the timm model `backbone` (default swin_tiny_patch4_window7_224) and
/// backbone_kwargs (the Hub checkpoints' form), OmDet's timm defaults when those are empty.
swin::BackboneConfig vision_backbone(const core::ConfigView& v) {
  if (v.has("backbone_config")) {
    const auto bc = v.child("backbone_config");
    if (bc.get_enum("model_type", "", {"swin", "timm_backbone"}) == "swin")
      return swin::parse_backbone_config(bc);
    return swin::parse_timm_backbone(bc, nullptr, {});
  }
  if (!v.get_bool("use_timm_backbone", true))
    v.fail("backbone_config",
           "null with use_timm_backbone false (transformers' default SwinConfig) is not "
           "supported; give the backbone_config");
  if (v.has("backbone_kwargs") && !v.raw("backbone_kwargs").empty())
    return swin::parse_timm_backbone(v, "backbone_kwargs", {"swin_tiny_patch4_window7_224"});
  const auto size = v.get_int_or_list("image_size", 640);
  if (size.empty() || size.front() != size.back())
    v.fail("image_size", "must be square with a timm backbone (its img_size)");
  return swin::parse_timm_backbone(v, "backbone_kwargs",
                                   {"swin_tiny_patch4_window7_224", {1, 2, 3}, size.front(), true});
}

}  // namespace

Config parse_config(const core::ConfigView& v) {
  Config c;
  c.backbone = vision_backbone(v);
  const bool layer_norms = v.get_bool("apply_layernorm_after_vision_backbone", true);
  if (c.backbone.swin.timm && !layer_norms)
    v.fail("apply_layernorm_after_vision_backbone",
           "must be true with a timm backbone (its maps are channels-last; upstream would feed "
           "them to the encoder's convolutions as they are)");
  if (!c.backbone.swin.timm && layer_norms)
    v.fail("apply_layernorm_after_vision_backbone",
           "must be false with a Swin backbone_config (upstream's layer_norms normalise the last "
           "axis of timm's channels-last maps; SwinBackbone returns channels-first ones)");
  if (!v.has("text_config")) v.fail("text_config", "a CLIP text_config is required");
  const auto tc = v.child("text_config");
  tc.get_enum("model_type", "clip_text_model", {"clip_text_model"});
  c.text = clip::parse_text_config(tc);
  // CLIPTextConfig's default (parse_text_config's is OWL-ViT's 16).
  if (!tc.has("max_position_embeddings")) c.text.max_position_embeddings = 77;
  if (c.text.max_position_embeddings < kTextLength)
    tc.fail("max_position_embeddings",
            "must be at least 77 (OmDetTurboProcessor pads every text to 77 tokens)");
  if (v.has("eval_size") && !v.raw("eval_size").is_null())
    v.fail("eval_size", "only null is supported (the encoder then has position embeddings)");

  auto& h = c.hybrid;
  h.encoder_hidden_dim = v.get_int("encoder_hidden_dim", v.get_int("d_model", 256));
  h.d_model = h.encoder_hidden_dim;
  h.encoder_in_channels = v.get_int_list("encoder_in_channels", {192, 384, 768});
  h.encode_proj_layers = v.get_int_list("encoder_projection_indices", {2});
  h.encoder_layers = v.get_int("encoder_layers", 1);
  h.encoder_ffn_dim = v.get_int("encoder_dim_feedforward", 2048);
  h.encoder_attention_heads = v.get_int("encoder_attention_heads", 8);
  h.positional_encoding_temperature = v.get_double("positional_encoding_temperature", 10000);
  h.encoder_activation = layers::activation_field(v, "encoder_feedforward_activation", "relu");
  h.activation = layers::activation_field(v, "csp_activation", "silu");
  h.normalize_before = false;
  h.hidden_expansion = static_cast<double>(v.get_int("hidden_expansion", 1));
  h.layer_norm_eps = v.get_double("layer_norm_eps", 1e-5);
  h.batch_norm_eps = v.get_double("batch_norm_eps", 1e-5);
  h.num_feature_levels = v.get_int("num_feature_levels", 3);
  h.decoder_n_points = v.get_int("decoder_num_points", 4);
  h.decoder_attention_heads = v.get_int("decoder_num_heads", 8);
  c.conv_norm_activation = layers::activation_field(v, "conv_norm_activation", "gelu");
  c.decoder_activation = layers::activation_field(v, "decoder_activation", "relu");
  c.layer_norm_eps = h.layer_norm_eps;
  if (c.backbone.swin.timm) c.backbone.norm_eps = c.layer_norm_eps;  // OmDet's layer_norms

  c.text_projection_in_dim = v.get_int("text_projection_in_dim", 512);
  c.text_projection_out_dim = v.get_int("text_projection_out_dim", 512);
  c.task_encoder_hidden_dim = v.get_int("task_encoder_hidden_dim", 1024);
  c.class_embed_dim = v.get_int("class_embed_dim", 512);
  c.decoder_hidden_dim = v.get_int("decoder_hidden_dim", 256);
  c.decoder_layers = v.get_int("decoder_num_layers", 6);
  c.decoder_ffn = v.get_int("decoder_dim_feedforward", 2048);
  c.num_queries = v.get_int("num_queries", 900);
  c.vision_features_channels = v.get_int_list("vision_features_channels", {256, 256, 256});
  c.cosine = v.get_enum("class_distance_type", "cosine", {"cosine", "dot"}) == "cosine";
  c.learn_initial_query = v.get_bool("learn_initial_query", false);
  c.id2label = v.id2label();

  for (const char* f : {"encoder_hidden_dim", "encoder_layers", "encoder_dim_feedforward",
                        "task_encoder_hidden_dim", "class_embed_dim", "decoder_num_layers",
                        "decoder_dim_feedforward", "num_queries", "decoder_num_points"})
    positive(v, f, v.get_int(f, 1));
  const auto channels = c.backbone.swin.embed_dim;  // stage i has embed_dim * 2^(i-1)
  std::vector<int64_t> stage_channels;
  for (const auto i : c.backbone.out_indices) stage_channels.push_back(channels << (i - 1));
  if (h.encoder_in_channels != stage_channels)
    v.fail("encoder_in_channels",
           "must be the backbone's out_indices channels " + core::shape_string(stage_channels));
  const auto levels = static_cast<int64_t>(h.encoder_in_channels.size());
  if (levels < 2) v.fail("encoder_in_channels", "needs at least two levels (FPN/PAN)");
  for (const auto i : h.encode_proj_layers)
    if (i < 0 || i >= levels)
      v.fail("encoder_projection_indices", "an index outside the encoder's levels");
  if (h.num_feature_levels != levels)
    v.fail("num_feature_levels", "must equal the encoder's levels (len(encoder_in_channels))");
  if (static_cast<int64_t>(c.vision_features_channels.size()) != levels)
    v.fail("vision_features_channels", "needs one entry per encoder level");
  for (const auto ch : c.vision_features_channels)
    if (ch != h.encoder_hidden_dim)
      v.fail("vision_features_channels", "every entry must be encoder_hidden_dim");
  if (h.encoder_hidden_dim != c.decoder_hidden_dim)
    v.fail("decoder_hidden_dim",
           "must equal encoder_hidden_dim (the deformable attention's "
           "d_model)");
  if (h.encoder_attention_heads <= 0 || h.encoder_hidden_dim % h.encoder_attention_heads != 0)
    v.fail("encoder_attention_heads", "must divide encoder_hidden_dim");
  if (h.decoder_attention_heads <= 0 || c.decoder_hidden_dim % h.decoder_attention_heads != 0)
    v.fail("decoder_num_heads", "must divide decoder_hidden_dim");
  if (h.encoder_hidden_dim % 4 != 0)
    v.fail("encoder_hidden_dim", "must be a multiple of 4 (2D sine-cosine position embedding)");
  if (c.text_projection_in_dim != c.text.hidden_size)
    v.fail("text_projection_in_dim", "must equal text_config.hidden_size");
  if (c.class_embed_dim != c.text.hidden_size)
    v.fail("class_embed_dim",
           "must equal text_config.hidden_size (the task encoder reads the "
           "text encoder's hidden states)");
  if (c.text_projection_out_dim != c.class_embed_dim)
    v.fail("text_projection_out_dim", "must equal class_embed_dim");
  if (c.class_embed_dim == c.decoder_hidden_dim)
    v.fail("class_embed_dim",
           "must differ from decoder_hidden_dim (transformers 5.17 then builds no task_project "
           "and fails)");
  return c;
}

}  // namespace libreyolo::models::omdet_turbo

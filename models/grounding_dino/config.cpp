#include "models/grounding_dino/config.h"

#include <stdexcept>

namespace libreyolo::models::grounding_dino {

Config parse_config(const core::ConfigView& v, bool mm) {
  Config c;
  c.mm = mm;
  c.d_model = v.get_int("d_model", c.d_model);
  c.encoder_layers = v.get_int("encoder_layers", c.encoder_layers);
  c.decoder_layers = v.get_int("decoder_layers", c.decoder_layers);
  c.encoder_heads = v.get_int("encoder_attention_heads", c.encoder_heads);
  c.decoder_heads = v.get_int("decoder_attention_heads", c.decoder_heads);
  c.encoder_ffn = v.get_int("encoder_ffn_dim", c.encoder_ffn);
  c.decoder_ffn = v.get_int("decoder_ffn_dim", c.decoder_ffn);
  c.num_queries = v.get_int("num_queries", c.num_queries);
  c.num_levels = v.get_int("num_feature_levels", c.num_levels);
  c.encoder_points = v.get_int("encoder_n_points", c.encoder_points);
  c.decoder_points = v.get_int("decoder_n_points", c.decoder_points);
  c.max_text_len = v.get_int("max_text_len", c.max_text_len);
  c.temperature = v.get_double("positional_embedding_temperature", c.temperature);
  c.layer_norm_eps = v.get_double("layer_norm_eps", c.layer_norm_eps);
  if (!mm) c.decoder_bbox_embed_share = v.get_bool("decoder_bbox_embed_share", true);
  try {
    c.act = layers::activation_from_name(v.get_string("activation_function", "relu"));
  } catch (const std::invalid_argument& e) {
    v.fail("activation_function", e.what());
  }
  c.id2label = v.id2label();
  v.get_enum("position_embedding_type", "sine", {"sine"});
  if (!v.get_bool("two_stage", true))
    v.fail("two_stage", "only two-stage checkpoints are supported");
  if (!v.get_bool("embedding_init_target", true))
    v.fail("embedding_init_target", "only embedding_init_target true is supported");
  if (v.get_int("query_dim", 4) != 4) v.fail("query_dim", "must be 4");
  if (v.get_bool("use_timm_backbone", false) || !v.has("backbone_config"))
    v.fail("backbone_config", "only a Hugging Face Swin backbone_config is supported");
  const auto bc = v.child("backbone_config");
  bc.get_enum("model_type", "", {"swin"});
  c.backbone = swin::parse_backbone_config(bc);
  if (!v.has("text_config")) v.fail("text_config", "a BERT text_config is required");
  c.text = layers::parse_bert_config(v.child("text_config"));
  if (c.d_model <= 0 || c.d_model % 32 != 0)
    v.fail("d_model", "must be a positive multiple of 32 (GroupNorm(32, d_model))");
  if (c.encoder_heads < 2 || c.encoder_heads % 2 != 0 || c.d_model % c.encoder_heads != 0 ||
      (c.encoder_ffn / 2) % (c.encoder_heads / 2) != 0)
    v.fail("encoder_attention_heads",
           "must be even and divide d_model, with half of it dividing encoder_ffn_dim / 2");
  if (c.decoder_heads <= 0 || c.d_model % c.decoder_heads != 0)
    v.fail("decoder_attention_heads", "must divide d_model");
  if (c.encoder_layers < 1) v.fail("encoder_layers", "must be at least 1");
  if (c.decoder_layers < 1) v.fail("decoder_layers", "must be at least 1");
  if (c.num_queries < 1) v.fail("num_queries", "must be positive");
  if (c.max_text_len < 1) v.fail("max_text_len", "must be positive");
  if (c.num_levels < static_cast<int64_t>(c.backbone.out_indices.size()))
    v.fail("num_feature_levels", "fewer levels than backbone feature maps");
  return c;
}

}  // namespace libreyolo::models::grounding_dino

// Original RF-DETR checkpoint names: the inverse of transformers 5.17's conversion_mapping.py
// renames for RfDetrModel / RfDetrForObjectDetection / RfDetrForInstanceSegmentation.
#include "models/rf_detr/checkpoint_keys.h"

#include <regex>
#include <utility>
#include <vector>

namespace libreyolo::models::rf_detr {
namespace {

using Rules = std::vector<std::pair<std::regex, std::string>>;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// The first rule whose pattern matches at the start of `key`, applied; `key` when none does.
std::string apply_first(const Rules& rules, const std::string& key) {
  for (const auto& [pattern, replacement] : rules) {
    if (std::regex_search(key, pattern, std::regex_constants::match_continuous))
      return std::regex_replace(key, pattern, replacement, std::regex_constants::format_first_only);
  }
  return key;
}

/// RfDetrModel's children (the key after "model.").
const Rules& model_rules() {
  static const Rules rules = [] {
    const std::pair<const char*, const char*> text[] = {
        {R"(backbone\.backbone\.)", "backbone.0.encoder.encoder."},
        {R"(backbone\.projector\.layer_norm\.)", "backbone.0.projector.stages.0.1."},
        {R"(backbone\.projector\.projector_layer\.bottlenecks\.(\d+)\.conv([12])\.conv\.)",
         "backbone.0.projector.stages.0.0.m.$1.cv$2.conv."},
        {R"(backbone\.projector\.projector_layer\.bottlenecks\.(\d+)\.conv([12])\.norm\.)",
         "backbone.0.projector.stages.0.0.m.$1.cv$2.bn."},
        {R"(backbone\.projector\.projector_layer\.conv([12])\.conv\.)",
         "backbone.0.projector.stages.0.0.cv$1.conv."},
        {R"(backbone\.projector\.projector_layer\.conv([12])\.norm\.)",
         "backbone.0.projector.stages.0.0.cv$1.bn."},
        {R"(reference_point_embed\.)", "refpoint_embed."},
        {R"(decoder\.layers\.(\d+)\.self_attn_layer_norm\.)",
         "transformer.decoder.layers.$1.norm1."},
        {R"(decoder\.layers\.(\d+)\.cross_attn_layer_norm\.)",
         "transformer.decoder.layers.$1.norm2."},
        {R"(decoder\.layers\.(\d+)\.layer_norm\.)", "transformer.decoder.layers.$1.norm3."},
        {R"(decoder\.layers\.(\d+)\.mlp\.fc1\.)", "transformer.decoder.layers.$1.linear1."},
        {R"(decoder\.layers\.(\d+)\.mlp\.fc2\.)", "transformer.decoder.layers.$1.linear2."},
        {R"(decoder\.layers\.(\d+)\.self_attn\.o_proj\.)",
         "transformer.decoder.layers.$1.self_attn.out_proj."},
        {R"(decoder\.layernorm\.)", "transformer.decoder.norm."},
        {R"(decoder\.)", "transformer.decoder."},
        {R"((enc_output|enc_output_norm|enc_out_class_embed|enc_out_bbox_embed)\.)",
         "transformer.$1."},
    };
    Rules r;
    for (const auto& [p, s] : text) r.emplace_back(std::regex(p), s);
    return r;
  }();
  return rules;
}

/// RfDetrForInstanceSegmentation's own children.
const Rules& head_rules() {
  static const Rules rules = [] {
    const std::pair<const char*, const char*> text[] = {
        {R"(segmentation_bias$)", "segmentation_head.bias"},
        {R"(blocks\.(\d+)\.layernorm\.)", "segmentation_head.blocks.$1.norm."},
        {R"(blocks\.(\d+)\.depthwise_conv\.)", "segmentation_head.blocks.$1.dwconv."},
        {R"(blocks\.(\d+)\.pointwise_conv\.)", "segmentation_head.blocks.$1.pwconv1."},
        {R"(spatial_features_proj\.)", "segmentation_head.spatial_features_proj."},
        {R"(query_features_block\.norm\.)", "segmentation_head.query_features_block.norm_in."},
        {R"(query_features_block\.mlp\.fc1\.)", "segmentation_head.query_features_block.layers.0."},
        {R"(query_features_block\.mlp\.fc2\.)", "segmentation_head.query_features_block.layers.2."},
        {R"(query_features_proj\.)", "segmentation_head.query_features_proj."},
    };
    Rules r;
    for (const auto& [p, s] : text) r.emplace_back(std::regex(p), s);
    return r;
  }();
  return rules;
}

}  // namespace

std::string original_key(const std::string& module_key, bool segmentation) {
  std::string k = module_key;
  if (segmentation) {
    if (!starts_with(k, "model.")) return apply_first(head_rules(), k);
    k = k.substr(6);  // the detector's key
  }
  // RfDetrForObjectDetection: class_embed / bbox_embed keep their names.
  if (!starts_with(k, "model.")) return k;
  return apply_first(model_rules(), k.substr(6));
}

}  // namespace libreyolo::models::rf_detr

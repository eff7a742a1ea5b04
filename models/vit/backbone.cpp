// ViTModel / DeiTModel backbone (transformers 5.17 modeling_vit.py, modeling_deit.py), inference
// only.
#include "models/vit/backbone.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/core/safetensors.h"

namespace libreyolo::models::vit {

Config parse_config(const core::ConfigView& v) {
  Config c = parse_encoder_config(v);
  c.image_size = v.get_int("image_size", 224);
  if (c.image_size < c.patch_size)
    v.fail("patch_size", "must be positive and not larger than image_size");
  return c;
}

Config parse_encoder_config(const core::ConfigView& v) {
  Config c;
  c.hidden_size = v.get_int("hidden_size", 768);
  c.num_layers = v.get_int("num_hidden_layers", 12);
  c.num_heads = v.get_int("num_attention_heads", 12);
  c.intermediate_size = v.get_int("intermediate_size", 3072);
  c.patch_size = v.get_int("patch_size", 16);
  c.num_channels = v.get_int("num_channels", 3);
  c.layer_norm_eps = v.get_double("layer_norm_eps", 1e-12);
  c.qkv_bias = v.get_bool("qkv_bias", true);
  try {
    c.act = layers::activation_from_name(v.get_string("hidden_act", "gelu"));
  } catch (const std::invalid_argument& e) {
    v.fail("hidden_act", e.what());
  }
  c.id2label = v.id2label();
  c.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
    v.fail("num_attention_heads", "hidden_size must be a positive multiple of it");
  // (the message parse_config gives when image_size < patch_size too)
  if (c.patch_size <= 0) v.fail("patch_size", "must be positive and not larger than image_size");
  return c;
}

at::Tensor interpolate_patch_positions(const at::Tensor& patch_positions, int64_t grid_height,
                                       int64_t grid_width, int64_t out_height, int64_t out_width) {
  const int64_t n = patch_positions.size(0), dim = patch_positions.size(2);
  auto grid = patch_positions.reshape({n, grid_height, grid_width, dim}).permute({0, 3, 1, 2});
  grid = at::upsample_bicubic2d(grid, {out_height, out_width}, /*align_corners=*/false);
  return grid.permute({0, 2, 3, 1}).reshape({n, -1, dim});
}

std::string architecture(const core::ConfigView& v, const std::vector<std::string>& supported) {
  if (!v.has("architectures")) return supported.at(0);
  const auto& a = v.raw("architectures");
  if (a.is_array() && !a.empty() && a[0].is_string())
    for (const auto& s : supported)
      if (a[0] == s) return s;
  std::string list;
  for (const auto& s : supported) list += (list.empty() ? "" : " or ") + s;
  v.fail("architectures", "only " + list + " is supported");
}

LayerImpl::LayerImpl(const Config& c) : act(c.act) {
  auto attention_parent = register_module("attention", std::make_shared<torch::nn::Module>());
  layers::AttentionOptions o;
  o.embed_dim = c.hidden_size;
  o.num_heads = c.num_heads;
  o.bias = c.qkv_bias;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "";
  o.softmax_in_float32 = true;  // eager softmax(dtype=float32)
  attention =
      attention_parent->register_module("attention", std::make_shared<layers::AttentionImpl>(o));
  auto output = attention_parent->register_module("output", std::make_shared<torch::nn::Module>());
  attention_out = output->register_module(
      "dense", std::make_shared<layers::LinearImpl>(c.hidden_size, c.hidden_size));
  auto intermediate = register_module("intermediate", std::make_shared<torch::nn::Module>());
  fc1 = intermediate->register_module(
      "dense", std::make_shared<layers::LinearImpl>(c.hidden_size, c.intermediate_size));
  auto out = register_module("output", std::make_shared<torch::nn::Module>());
  fc2 = out->register_module(
      "dense", std::make_shared<layers::LinearImpl>(c.intermediate_size, c.hidden_size));
  layernorm_before = register_module(
      "layernorm_before", std::make_shared<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  layernorm_after = register_module(
      "layernorm_after", std::make_shared<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor LayerImpl::forward(const at::Tensor& x) const {
  auto h = layernorm_before->forward(x);
  h = attention_out->forward(attention->forward(h, h, h));
  auto y = h + x;
  auto m = fc2->forward(fc1->forward_act(layernorm_after->forward(y), act));
  return m + y;
}

BackboneImpl::BackboneImpl(const Config& c, const std::vector<std::string>& extra_tokens)
    : config(c) {
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  const int64_t grid = c.image_size / c.patch_size;
  prefix_tokens.push_back(
      embeddings->register_parameter("cls_token", at::empty({1, 1, c.hidden_size})));
  for (const auto& name : extra_tokens)
    prefix_tokens.push_back(embeddings->register_parameter(name, at::empty({1, 1, c.hidden_size})));
  position_embeddings = embeddings->register_parameter(
      "position_embeddings", at::empty({1, grid * grid + num_prefix_tokens(), c.hidden_size}));
  auto patch =
      embeddings->register_module("patch_embeddings", std::make_shared<torch::nn::Module>());
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = c.hidden_size;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = true;
  projection = patch->register_module("projection", std::make_shared<layers::Conv2dImpl>(po));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  std::vector<std::shared_ptr<LayerImpl>> ls;
  for (int64_t i = 0; i < c.num_layers; ++i) ls.push_back(std::make_shared<LayerImpl>(c));
  blocks = layers::register_list(*encoder, "layer", ls);
  layernorm = register_module(
      "layernorm", std::make_shared<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor BackboneImpl::position_embedding(int64_t height, int64_t width,
                                            int64_t num_patches) const {
  const int64_t prefix = num_prefix_tokens();
  const int64_t num_positions = position_embeddings.size(1) - prefix;
  if (num_patches == num_positions && height == width) return position_embeddings;
  const auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(num_positions)));
  auto prefix_pos = position_embeddings.slice(1, 0, prefix);
  auto patch_pos =
      interpolate_patch_positions(position_embeddings.slice(1, prefix), side, side,
                                  height / config.patch_size, width / config.patch_size);
  return at::cat({prefix_pos, patch_pos}, 1);
}

at::Tensor BackboneImpl::forward(const at::Tensor& pixel_values) const {
  const int64_t B = pixel_values.size(0), H = pixel_values.size(2), W = pixel_values.size(3);
  auto x = projection->forward_patches(pixel_values).flatten(2).transpose(1, 2);
  const int64_t num_patches = x.size(1);
  std::vector<at::Tensor> seq;
  for (const auto& t : prefix_tokens) seq.push_back(t.expand({B, -1, -1}));
  seq.push_back(x);
  x = at::cat(seq, 1);
  x = x + position_embedding(H, W, num_patches);
  for (const auto& b : blocks) x = b->forward(x);
  return layernorm->forward(x);
}

void load_weights(torch::nn::Module& net, const std::string& dir, const std::string& prefix,
                  bool fused_attention, const LoadOptions& options) {
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  rules.ignored_file_keys = {prefix + R"(\.pooler\..*)"};
  core::load_state_dict(net, *file, rules, options.dtype, options.device);
  layers::set_fused_attention(net, fused_attention);
}

}  // namespace libreyolo::models::vit

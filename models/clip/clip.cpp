// CLIP text and vision towers (see clip.h): transformers 5.17 modeling_owlvit.py
// OwlViTTextEmbeddings / OwlViTVisionEmbeddings / OwlViTEncoderLayer / OwlViTTextTransformer /
// OwlViTVisionTransformer, inference only.
#include "models/clip/clip.h"

#include <c10/util/StringUtil.h>

#include <limits>
#include <stdexcept>

#include "models/vit/backbone.h"  // interpolate_patch_positions

namespace libreyolo::models::clip {
namespace {

/// The fields both towers have.
TowerConfig parse_common(const core::ConfigView& v, TowerConfig c) {
  c.hidden_size = v.get_int("hidden_size", c.hidden_size);
  c.intermediate_size = v.get_int("intermediate_size", c.intermediate_size);
  c.num_layers = v.get_int("num_hidden_layers", c.num_layers);
  c.num_heads = v.get_int("num_attention_heads", c.num_heads);
  c.layer_norm_eps = v.get_double("layer_norm_eps", 1e-5);
  const std::string act = v.get_string("hidden_act", "quick_gelu");
  c.quick_gelu = act == "quick_gelu";
  if (!c.quick_gelu) {
    try {
      c.act = layers::activation_from_name(act);
    } catch (const std::invalid_argument& e) {
      v.fail("hidden_act", std::string(e.what()) + " or quick_gelu");
    }
  }
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
    v.fail("num_attention_heads", "hidden_size must be a positive multiple of it");
  if (c.intermediate_size <= 0) v.fail("intermediate_size", "must be positive");
  if (c.num_layers < 0) v.fail("num_hidden_layers", "must not be negative");
  return c;
}

/// torch.finfo(dtype).min of the floating dtypes the models compute in.
double lowest(at::ScalarType t) {
  if (t == at::kHalf) return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
  if (t == at::kBFloat16) return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
  return static_cast<double>(std::numeric_limits<float>::lowest());
}

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

std::vector<std::shared_ptr<EncoderLayerImpl>> register_encoder(torch::nn::Module& parent,
                                                                const TowerConfig& c) {
  auto encoder = parent.register_module("encoder", make<torch::nn::Module>());
  std::vector<std::shared_ptr<EncoderLayerImpl>> ls;
  for (int64_t i = 0; i < c.num_layers; ++i) ls.push_back(make<EncoderLayerImpl>(c));
  return layers::register_list(*encoder, "layers", ls);
}

}  // namespace

TowerConfig parse_text_config(const core::ConfigView& v) {
  TowerConfig c;
  c = parse_common(v, c);
  c.vocab_size = v.get_int("vocab_size", 49408);
  c.max_position_embeddings = v.get_int("max_position_embeddings", 16);
  if (c.vocab_size <= 0) v.fail("vocab_size", "must be positive");
  if (c.max_position_embeddings < 2) v.fail("max_position_embeddings", "must be at least 2");
  return c;
}

TowerConfig parse_vision_config(const core::ConfigView& v) {
  TowerConfig c;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.num_heads = 12;
  c = parse_common(v, c);
  c.image_size = v.get_int("image_size", 768);
  c.patch_size = v.get_int("patch_size", 32);
  c.num_channels = v.get_int("num_channels", 3);
  if (c.patch_size <= 0 || c.patch_size > c.image_size)
    v.fail("patch_size", "must be positive and not larger than image_size");
  if (c.num_channels <= 0) v.fail("num_channels", "must be positive");
  return c;
}

EncoderLayerImpl::EncoderLayerImpl(const TowerConfig& c) : quick_gelu(c.quick_gelu), act(c.act) {
  layers::AttentionOptions o;  // q_proj / k_proj / v_proj / out_proj, biases, head_dim^-0.5
  o.embed_dim = c.hidden_size;
  o.num_heads = c.num_heads;
  self_attn = register_module("self_attn", make<layers::AttentionImpl>(o));
  layer_norm1 =
      register_module("layer_norm1", make<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  auto mlp = register_module("mlp", make<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", make<layers::LinearImpl>(c.hidden_size, c.intermediate_size));
  fc2 = mlp->register_module("fc2", make<layers::LinearImpl>(c.intermediate_size, c.hidden_size));
  layer_norm2 =
      register_module("layer_norm2", make<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor EncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& bias) const {
  auto h = layer_norm1->forward(x);
  auto y = x + self_attn->forward(h, h, h, bias);
  auto m = fc1->forward(layer_norm2->forward(y));
  // QuickGELUActivation (activations.py): input * sigmoid(1.702 * input).
  m = quick_gelu ? m * at::sigmoid(m * 1.702) : layers::activate(act, m);
  return y + fc2->forward(m);
}

TextTransformerImpl::TextTransformerImpl(const TowerConfig& c) : config(c) {
  auto embeddings = register_module("embeddings", make<torch::nn::Module>());
  auto token = embeddings->register_module("token_embedding", make<torch::nn::Module>());
  token_embedding = token->register_parameter("weight", at::empty({c.vocab_size, c.hidden_size}));
  auto position = embeddings->register_module("position_embedding", make<torch::nn::Module>());
  position_embedding =
      position->register_parameter("weight", at::empty({c.max_position_embeddings, c.hidden_size}));
  layers = register_encoder(*this, c);
  final_layer_norm = register_module("final_layer_norm",
                                     make<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor TextTransformerImpl::pooled(const at::Tensor& input_ids) const {
  const auto x = forward(input_ids);
  // input_ids.to(torch.int).argmax(dim=-1): the first position of the row's largest id.
  const auto end = input_ids.to(at::kInt).argmax(-1);
  return x.index({at::arange(input_ids.size(0), end.options().dtype(at::kLong)), end});
}

at::Tensor TextTransformerImpl::forward(const at::Tensor& input_ids) const {
  if (input_ids.dim() != 2 || input_ids.size(1) < 1 ||
      input_ids.size(1) > config.max_position_embeddings)
    throw std::invalid_argument(
        c10::str("text: input_ids must be (N, L) with 1 <= L <= ", config.max_position_embeddings,
                 ", got ", input_ids.sizes()));
  const int64_t len = input_ids.size(1);
  auto x = at::embedding(token_embedding, input_ids) + position_embedding.slice(0, 0, len);
  // create_causal_mask: 0 on and below the diagonal, the dtype's lowest above it.
  const auto bias = at::full({len, len}, lowest(x.scalar_type()), x.options()).triu(1);
  for (const auto& l : layers) x = l->forward(x, bias.view({1, 1, len, len}));
  return final_layer_norm->forward(x);
}

VisionTransformerImpl::VisionTransformerImpl(const TowerConfig& c, const std::string& pre_norm_name)
    : config(c) {
  auto embeddings = register_module("embeddings", make<torch::nn::Module>());
  class_embedding = embeddings->register_parameter("class_embedding", at::empty({c.hidden_size}));
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = c.hidden_size;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = false;
  patch_embedding = embeddings->register_module("patch_embedding", make<layers::Conv2dImpl>(po));
  const int64_t grid = c.image_size / c.patch_size;
  auto position = embeddings->register_module("position_embedding", make<torch::nn::Module>());
  position_embedding =
      position->register_parameter("weight", at::empty({grid * grid + 1, c.hidden_size}));
  pre_layernorm =
      register_module(pre_norm_name, make<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  layers = register_encoder(*this, c);
  post_layernorm = register_module("post_layernorm",
                                   make<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor VisionTransformerImpl::forward(const at::Tensor& pixel_values) const {
  const int64_t b = pixel_values.size(0), h = pixel_values.size(2), w = pixel_values.size(3);
  auto x = patch_embedding->forward_patches(pixel_values).flatten(2).transpose(1, 2);
  x = at::cat({class_embedding.view({1, 1, -1}).expand({b, 1, -1}), x}, 1);
  const int64_t grid = config.image_size / config.patch_size;
  at::Tensor positions = position_embedding.unsqueeze(0);
  if (h != config.image_size || w != config.image_size) {
    // interpolate_pos_encoding: the class row kept, the square grid resampled bicubically.
    positions =
        at::cat({positions.slice(1, 0, 1),
                 vit::interpolate_patch_positions(positions.slice(1, 1), grid, grid,
                                                  h / config.patch_size, w / config.patch_size)},
                1);
  }
  x = pre_layernorm->forward(x + positions);
  for (const auto& l : layers) x = l->forward(x, at::Tensor());
  return x;
}

}  // namespace libreyolo::models::clip

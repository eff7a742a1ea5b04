// ViTForImageClassification (transformers 5.17 models/vit/modeling_vit.py), inference only.
#include "models/vit/vit.h"

#include "models/module_model.h"

#include <torch/nn/module.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models {
namespace vit {
namespace {

using layers::Activation;

struct Config {
  int64_t hidden_size = 768, num_layers = 12, num_heads = 12, intermediate_size = 3072;
  int64_t image_size = 224, patch_size = 16, num_channels = 3, num_labels = 2;
  double layer_norm_eps = 1e-12;
  bool qkv_bias = true;
  Activation act = Activation::gelu;
  std::map<int64_t, std::string> id2label;
};

Config parse_config(const core::ConfigView& v) {
  Config c;
  c.hidden_size = v.get_int("hidden_size", 768);
  c.num_layers = v.get_int("num_hidden_layers", 12);
  c.num_heads = v.get_int("num_attention_heads", 12);
  c.intermediate_size = v.get_int("intermediate_size", 3072);
  c.image_size = v.get_int("image_size", 224);
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
  if (c.patch_size <= 0 || c.image_size < c.patch_size)
    v.fail("patch_size", "must be positive and not larger than image_size");
  if (v.has("architectures")) {
    const auto& a = v.raw("architectures");
    if (!a.is_array() || a.empty() || a[0] != "ViTForImageClassification")
      v.fail("architectures", "only ViTForImageClassification is supported");
  }
  return c;
}

/// transformers ViTLayer: pre-norm attention and MLP blocks with residuals.
class LayerImpl : public torch::nn::Module {
 public:
  explicit LayerImpl(const Config& c) : act(c.act) {
    auto attention_parent = register_module("attention", std::make_shared<torch::nn::Module>());
    layers::AttentionOptions o;
    o.embed_dim = c.hidden_size;
    o.num_heads = c.num_heads;
    o.bias = c.qkv_bias;
    o.q_name = "query";
    o.k_name = "key";
    o.v_name = "value";
    o.o_name = "";
    o.softmax_in_float32 = true;  // ViT eager softmax(dtype=float32)
    attention =
        attention_parent->register_module("attention", std::make_shared<layers::AttentionImpl>(o));
    auto output =
        attention_parent->register_module("output", std::make_shared<torch::nn::Module>());
    attention_out = output->register_module(
        "dense", std::make_shared<layers::LinearImpl>(c.hidden_size, c.hidden_size));
    auto intermediate = register_module("intermediate", std::make_shared<torch::nn::Module>());
    fc1 = intermediate->register_module(
        "dense", std::make_shared<layers::LinearImpl>(c.hidden_size, c.intermediate_size));
    auto out = register_module("output", std::make_shared<torch::nn::Module>());
    fc2 = out->register_module(
        "dense", std::make_shared<layers::LinearImpl>(c.intermediate_size, c.hidden_size));
    layernorm_before = register_module("layernorm_before", std::make_shared<layers::LayerNormImpl>(
                                                               c.hidden_size, c.layer_norm_eps));
    layernorm_after = register_module("layernorm_after", std::make_shared<layers::LayerNormImpl>(
                                                             c.hidden_size, c.layer_norm_eps));
  }

  at::Tensor forward(const at::Tensor& x) const {
    auto h = layernorm_before->forward(x);
    h = attention_out->forward(attention->forward(h, h, h));
    auto y = h + x;
    auto m = fc2->forward(layers::activate(act, fc1->forward(layernorm_after->forward(y))));
    return m + y;
  }

  layers::Attention attention;
  layers::Linear attention_out, fc1, fc2;
  layers::LayerNorm layernorm_before, layernorm_after;
  Activation act;
};

/// The module tree with the on-disk names ("vit.*", "classifier.*").
class ViTImpl : public torch::nn::Module {
 public:
  explicit ViTImpl(const Config& c) : config(c) {
    auto vit = register_module("vit", std::make_shared<torch::nn::Module>());
    auto embeddings = vit->register_module("embeddings", std::make_shared<torch::nn::Module>());
    const int64_t grid = c.image_size / c.patch_size;
    cls_token = embeddings->register_parameter("cls_token", at::empty({1, 1, c.hidden_size}));
    position_embeddings = embeddings->register_parameter(
        "position_embeddings", at::empty({1, grid * grid + 1, c.hidden_size}));
    auto patch =
        embeddings->register_module("patch_embeddings", std::make_shared<torch::nn::Module>());
    layers::Conv2dOptions po;
    po.in = c.num_channels;
    po.out = c.hidden_size;
    po.kernel = c.patch_size;
    po.stride = c.patch_size;
    po.bias = true;
    projection = patch->register_module("projection", std::make_shared<layers::Conv2dImpl>(po));
    auto encoder = vit->register_module("encoder", std::make_shared<torch::nn::Module>());
    std::vector<std::shared_ptr<LayerImpl>> ls;
    for (int64_t i = 0; i < c.num_layers; ++i) ls.push_back(std::make_shared<LayerImpl>(c));
    blocks = layers::register_list(*encoder, "layer", ls);
    layernorm = vit->register_module(
        "layernorm", std::make_shared<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
    classifier = register_module("classifier",
                                 std::make_shared<layers::LinearImpl>(c.hidden_size, c.num_labels));
  }

  /// transformers ViTEmbeddings.interpolate_pos_encoding: bicubic (align_corners=False) on the
  /// square grid of stored patch positions; the cls position is kept.
  at::Tensor position_embedding(int64_t height, int64_t width, int64_t num_patches) const {
    const int64_t num_positions = position_embeddings.size(1) - 1;
    if (num_patches == num_positions && height == width) return position_embeddings;
    const int64_t dim = position_embeddings.size(2);
    const auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(num_positions)));
    auto cls_pos = position_embeddings.slice(1, 0, 1);
    auto patch_pos =
        position_embeddings.slice(1, 1).reshape({1, side, side, dim}).permute({0, 3, 1, 2});
    patch_pos =
        at::upsample_bicubic2d(patch_pos, {height / config.patch_size, width / config.patch_size},
                               /*align_corners=*/false);
    patch_pos = patch_pos.permute({0, 2, 3, 1}).reshape({1, -1, dim});
    return at::cat({cls_pos, patch_pos}, 1);
  }

  at::Tensor forward(const at::Tensor& pixel_values) const {
    const int64_t B = pixel_values.size(0), H = pixel_values.size(2), W = pixel_values.size(3);
    auto x = projection->forward(pixel_values).flatten(2).transpose(1, 2);
    const int64_t num_patches = x.size(1);
    x = at::cat({cls_token.expand({B, -1, -1}), x}, 1);
    x = x + position_embedding(H, W, num_patches);
    for (const auto& b : blocks) x = b->forward(x);
    x = layernorm->forward(x);
    return classifier->forward(x.select(1, 0));
  }

  Config config;
  at::Tensor cls_token, position_embeddings;
  layers::Conv2d projection;
  std::vector<std::shared_ptr<LayerImpl>> blocks;
  layers::LayerNorm layernorm;
  layers::Linear classifier;
};

class ViTModel : public ModuleModel<ViTImpl> {
 public:
  ViTModel(std::shared_ptr<ViTImpl> net, const LoadOptions& options)
      : ModuleModel("vit", Task::image_classification, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const auto& c = net_->config;
    const at::Tensor x = checked_input(pixel_values, c.num_channels, c.patch_size);  // >= 1 patch
    ModelOutput out;
    out.logits = net_->forward(x).to(at::kFloat);
    return out;
  }
};

}  // namespace
}  // namespace vit

std::unique_ptr<Model> load_vit(const std::string& dir, const nlohmann::json& config,
                                const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = vit::parse_config(view);
  auto net = std::make_shared<vit::ViTImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  // ViTModel checkpoints carry a pooler the classification head does not use (hf-models.md 6).
  rules.ignored_file_keys = {R"(vit\.pooler\..*)"};
  core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  layers::set_fused_attention(*net, vit::kFusedAttentionDefault);
  return std::make_unique<vit::ViTModel>(std::move(net), options);
}

}  // namespace libreyolo::models

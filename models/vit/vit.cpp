// ViTForImageClassification (transformers 5.17 models/vit/modeling_vit.py), inference only.

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"
#include "models/vit/backbone.h"

namespace libreyolo::models {
namespace vit {
namespace {

/// The module tree with the on-disk names ("vit.*", "classifier.*").
class ViTImpl : public torch::nn::Module {
 public:
  explicit ViTImpl(const Config& c) : config(c) {
    backbone =
        register_module("vit", std::make_shared<BackboneImpl>(c, std::vector<std::string>{}));
    classifier = register_module("classifier",
                                 std::make_shared<layers::LinearImpl>(c.hidden_size, c.num_labels));
  }

  at::Tensor forward(const at::Tensor& pixel_values) const {
    return classifier->forward(backbone->forward(pixel_values).select(1, 0));
  }

  Config config;
  std::shared_ptr<BackboneImpl> backbone;
  layers::Linear classifier;
};

}  // namespace
}  // namespace vit

namespace {

/// Default of every ViT attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the vit_tiny fixture. It is not (max |SDPA - manual| ~1e-7), so: manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "vit" (`config` is the parsed
/// config.json; the architecture must be ViTForImageClassification). Inputs whose size differs
/// from config `image_size` get bicubically interpolated position embeddings (transformers'
/// `interpolate_pos_encoding=True`). Throws core::ConfigError / core::CheckpointError
/// (std::runtime_error) naming the file and the field or tensor key.
std::unique_ptr<Model> load_vit(const std::string& dir, const nlohmann::json& config,
                                const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = vit::parse_config(view);
  vit::architecture(view, {"ViTForImageClassification"});
  auto net = std::make_shared<vit::ViTImpl>(c);
  vit::load_weights(*net, dir, "vit", kFusedAttentionDefault, options);
  return std::make_unique<vit::ImageClassifier<vit::ViTImpl>>("vit", std::move(net), options);
}

// Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021) as
// transformers 5.17 ViTForImageClassification (models/vit/modeling_vit.py), on-disk (legacy)
// parameter names: vit.embeddings.*, vit.encoder.layer.{i}.*, vit.layernorm.*, classifier.*.
// forward(): pixel_values (B, num_channels, H, W) float -> logits (B, num_labels) float32.
const FamilyRegistrar registered{
    Family{"vit", {"vit"}, /*order=*/70, load_vit}
        .fused_attention(kFusedAttentionDefault)
        .predicts({Task::image_classification})
        .layouts({{"qkv_concat", {"ViTAttention", "ViTSelfAttention"}}}, {"qkv_concat"})};

}  // namespace
}  // namespace libreyolo::models

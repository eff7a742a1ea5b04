// DeiTForImageClassification / DeiTForImageClassificationWithTeacher (transformers 5.17
// models/deit/modeling_deit.py), inference only.

#include <nlohmann/json.hpp>

#include "models/registry/family.h"
#include "models/vit/backbone.h"  // Config, BackboneImpl, load_weights, ImageClassifier

namespace libreyolo::models {
namespace deit {
namespace {

constexpr const char* kPlain = "DeiTForImageClassification";
constexpr const char* kWithTeacher = "DeiTForImageClassificationWithTeacher";

/// The module tree with the on-disk names ("deit.*", then "classifier.*" or "cls_classifier.*"
/// and "distillation_classifier.*").
class DeiTImpl : public torch::nn::Module {
 public:
  DeiTImpl(const vit::Config& c, bool with_teacher) : config(c) {
    backbone = register_module("deit", std::make_shared<vit::BackboneImpl>(
                                           c, std::vector<std::string>{"distillation_token"}));
    auto head = [&](const char* name) {
      return register_module(name,
                             std::make_shared<layers::LinearImpl>(c.hidden_size, c.num_labels));
    };
    if (with_teacher) {
      cls_classifier = head("cls_classifier");
      distillation_classifier = head("distillation_classifier");
    } else {
      classifier = head("classifier");
    }
  }

  at::Tensor forward(const at::Tensor& pixel_values) const {
    const at::Tensor x = backbone->forward(pixel_values);
    if (classifier) return classifier->forward(x.select(1, 0));
    // DeiTForImageClassificationWithTeacher.forward: (cls_logits + distillation_logits) / 2.
    return (cls_classifier->forward(x.select(1, 0)) +
            distillation_classifier->forward(x.select(1, 1))) /
           2;
  }

  vit::Config config;
  std::shared_ptr<vit::BackboneImpl> backbone;
  layers::Linear classifier, cls_classifier, distillation_classifier;  ///< by the head
};

}  // namespace
}  // namespace deit

namespace {

/// Default of every DeiT attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the deit_tiny fixtures. It is not (max |SDPA - manual| 5e-7..8e-7): manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "deit" (`config` is the parsed
/// config.json). The head follows `architectures[0]`: DeiTForImageClassification (absent: this
/// one, as AutoModelForImageClassification) classifies the CLS token's final state;
/// DeiTForImageClassificationWithTeacher returns (cls_classifier(CLS) +
/// distillation_classifier(distillation token)) / 2, upstream's `logits`. Inputs whose size
/// differs from config `image_size` get bicubically interpolated position embeddings
/// (transformers' `interpolate_pos_encoding=True`; upstream raises without it). Throws
/// core::ConfigError / core::CheckpointError (std::runtime_error) naming the file and the field
/// or tensor keys (every missing and unexpected key; `deit.pooler.*` is ignored).
std::unique_ptr<Model> load_deit(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = vit::parse_config(view);
  const bool with_teacher =
      vit::architecture(view, {deit::kPlain, deit::kWithTeacher}) == deit::kWithTeacher;
  auto net = std::make_shared<deit::DeiTImpl>(c, with_teacher);
  vit::load_weights(*net, dir, "deit", kFusedAttentionDefault, options);
  return std::make_unique<vit::ImageClassifier<deit::DeiTImpl>>("deit", std::move(net), options);
}

// DeiT (Touvron et al., "Training data-efficient image transformers & distillation through
// attention", ICML 2021) as transformers 5.17 DeiTForImageClassification and
// DeiTForImageClassificationWithTeacher (models/deit/modeling_deit.py), on-disk (legacy)
// parameter names: deit.embeddings.{cls_token, distillation_token, position_embeddings,
// patch_embeddings.projection.*}, deit.encoder.layer.{i}.*, deit.layernorm.*, and classifier.*
// or cls_classifier.* + distillation_classifier.*. The encoder is the ViT one
// (models/vit/backbone.h). forward(): pixel_values (B, num_channels, H, W) float -> logits
// (B, num_labels) float32.
// (transformers 5.17 has no DeiTSelfAttention.)
const FamilyRegistrar registered{Family{"deit", {"deit"}, /*order=*/80, load_deit}
                                     .predicts({Task::image_classification})
                                     .fused_attention(kFusedAttentionDefault)
                                     .layouts({{"qkv_concat", {"DeiTAttention"}}}, {"qkv_concat"})};

}  // namespace
}  // namespace libreyolo::models

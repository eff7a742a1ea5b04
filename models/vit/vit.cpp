// ViTForImageClassification (transformers 5.17 models/vit/modeling_vit.py), inference only.
#include "models/vit/vit.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include "models/core/config.h"
#include "models/layers/layers.h"
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

std::unique_ptr<Model> load_vit(const std::string& dir, const nlohmann::json& config,
                                const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = vit::parse_config(view);
  vit::architecture(view, {"ViTForImageClassification"});
  auto net = std::make_shared<vit::ViTImpl>(c);
  vit::load_weights(*net, dir, "vit", vit::kFusedAttentionDefault, options);
  return std::make_unique<vit::ImageClassifier<vit::ViTImpl>>("vit", std::move(net), options);
}

}  // namespace libreyolo::models

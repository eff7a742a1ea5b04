// DeiTForImageClassification / DeiTForImageClassificationWithTeacher (transformers 5.17
// models/deit/modeling_deit.py), inference only.
#include "models/deit/deit.h"

#include <nlohmann/json.hpp>

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

std::unique_ptr<Model> load_deit(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = vit::parse_config(view);
  const bool with_teacher =
      vit::architecture(view, {deit::kPlain, deit::kWithTeacher}) == deit::kWithTeacher;
  auto net = std::make_shared<deit::DeiTImpl>(c, with_teacher);
  vit::load_weights(*net, dir, "deit", deit::kFusedAttentionDefault, options);
  return std::make_unique<vit::ImageClassifier<deit::DeiTImpl>>("deit", std::move(net), options);
}

}  // namespace libreyolo::models
